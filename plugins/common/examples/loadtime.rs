//! Load phases of a real GGUF decoder: reading the tensors into owned memory, then packing them
//! for serving, with the bytes held after each: `cargo run --release -p berth-plugin-common
//! --example loadtime -- MODEL.gguf [PACK_DIR]`. With a pack directory the load reads through
//! its cache of packed weights (`.packed.bin`, written by the first such run): run it twice to
//! see a cold and a warm load.

use berth_plugin_common::decoder::DecoderWeights;
use berth_plugin_common::family::GgufKeys;
use berth_plugin_common::Weights;
use std::time::Instant;

fn main() {
    let path = std::env::args().nth(1).expect("a GGUF path");
    let t0 = Instant::now();
    let mut w = Weights::open_gguf(&path).unwrap();
    if let Some(dir) = std::env::args().nth(2) {
        w = w.with_pack_cache(std::path::Path::new(&dir)).unwrap();
    }
    let cfg = GgufKeys::new(&w).unwrap().decoder_config().unwrap();
    let t1 = Instant::now();
    let mut dw = DecoderWeights::load(&w, &cfg).unwrap();
    let t2 = Instant::now();
    let read = dw.held_bytes();
    dw.for_serving();
    let t3 = Instant::now();
    let report = dw.store_packed();
    let t4 = Instant::now();
    println!(
        "header {:.3} s, read {:.3} s ({} MiB), pack {:.3} s (held {} MiB, embedding rows {} MiB, tied head: {})",
        (t1 - t0).as_secs_f64(),
        (t2 - t1).as_secs_f64(),
        read >> 20,
        (t3 - t2).as_secs_f64(),
        dw.held_bytes() >> 20,
        (dw.embed.rows * dw.embed.row_bytes()) >> 20,
        dw.output.same_as(&dw.embed)
    );
    println!(
        "pack cache: {} matrices read back, {} packed, written: {} ({:.3} s){}",
        report.read,
        report.packed,
        report.written,
        (t4 - t3).as_secs_f64(),
        report.error.map_or(String::new(), |e| format!(", error: {e}"))
    );
}
