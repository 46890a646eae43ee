//! Fuzzes the harmony (gpt-oss) reply parser, whole and streamed (`berth_chat`'s harmony format):
//! any model output from the assistant header or inside a message, with or without tools, in any
//! flush sizes. Parsing must not panic, no streamed field may shrink, and the deltas must add up
//! to the non-streamed message (`common/stream.rs`).
//!
//! Input layout: byte 0 the parse start (`0` content, `1` reasoning, `2` closed, `3` the
//! assistant header, modulo 4), byte 1 whether the request has tools (odd = yes), byte 2 the
//! flush size in characters; the rest (lossy UTF-8) is the model output.

#![no_main]

use berth_chat::ChatFormat;
use libfuzzer_sys::fuzz_target;

#[path = "common/stream.rs"]
mod stream;

fuzz_target!(|data: &[u8]| {
    if data.len() < 3 {
        return;
    }
    let start = stream::STARTS[data[0].wrapping_sub(b'0') as usize % stream::STARTS.len()];
    let all_tools = stream::tools();
    let tools = (data[1] & 1 == 1).then_some(&all_tools[..]);
    let chunk = 1 + data[2] as usize % 16;
    let text = String::from_utf8_lossy(&data[3..]);
    stream::check(ChatFormat::Harmony, start, tools, chunk, &text);
});
