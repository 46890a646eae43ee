//! Fuzzes the chat parser and the stream: any model output, in any format, from any parse start,
//! with or without tools, flushed in any chunk sizes. Parsing must not panic, no streamed field
//! may shrink, and the deltas must add up to the non-streamed message.
//!
//! Input layout: byte 0 picks the format by its stable id (`ChatFormat::BY_ID`, counted from the
//! digit `0`, modulo their number; the seeds' `0`..`6` are content_only, harmony, gemma4, lfm2,
//! minicpm, qwen_xml, hermes, and keep that meaning when a format is added),
//! byte 1 the parse start (`0` content, `1` reasoning, `2` closed, `3` harmony header), byte 2
//! whether the request has tools (odd = yes), byte 3 the flush size in characters; the rest
//! (lossy UTF-8) is the model output.

#![no_main]

use berth_chat::ChatFormat;
use libfuzzer_sys::fuzz_target;

#[path = "common/stream.rs"]
mod stream;

fuzz_target!(|data: &[u8]| {
    if data.len() < 4 {
        return;
    }
    let format = ChatFormat::BY_ID[data[0].wrapping_sub(b'0') as usize % ChatFormat::BY_ID.len()];
    let start = stream::STARTS[data[1] as usize % stream::STARTS.len()];
    let all_tools = stream::tools();
    let tools = (data[2] & 1 == 1).then_some(&all_tools[..]);
    let chunk = 1 + data[3] as usize % 16;
    let text = String::from_utf8_lossy(&data[4..]);
    stream::check(format, start, tools, chunk, &text);
});
