//! A warm single-token decode step allocates nothing (activation quantization buffers,
//! attention scores and the thread pool are all reused), on the tiny Gemma 3 reference.

use berth_plugin_api::{BatchView, LogitsOut};
use berth_plugin_common::{Activation, Decoder, DecoderConfig, DecoderWeights, HfNames, Weights};
use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicUsize, Ordering};

struct Counting;
static ALLOCS: AtomicUsize = AtomicUsize::new(0);

// SAFETY: forwards every call to the system allocator unchanged; only counts allocations.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, l: Layout) -> *mut u8 {
        ALLOCS.fetch_add(1, Ordering::Relaxed);
        // SAFETY: same contract as the caller's.
        unsafe { System.alloc(l) }
    }
    unsafe fn dealloc(&self, p: *mut u8, l: Layout) {
        // SAFETY: same contract as the caller's.
        unsafe { System.dealloc(p, l) }
    }
    unsafe fn realloc(&self, p: *mut u8, l: Layout, n: usize) -> *mut u8 {
        ALLOCS.fetch_add(1, Ordering::Relaxed);
        // SAFETY: same contract as the caller's.
        unsafe { System.realloc(p, l, n) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

#[test]
fn warm_decode_step_does_not_allocate() {
    let dir = berth_plugin_common::npy::shared_fixtures().join("reference-tiny/gemma3");
    let w = Weights::open_safetensors(&[dir.join("model.safetensors")])
        .unwrap()
        .with_hf_names(HfNames::Sandwich);
    let mut cfg = DecoderConfig::new(6, 64, 4, 1, 16);
    cfg.norm_add_one = true;
    cfg.qk_norm = true;
    cfg.post_norms = true;
    cfg.activation = Activation::GeluTanh;
    cfg.tie_embeddings = true;
    let weights = DecoderWeights::load(&w, &cfg).unwrap();
    for threads in [1, 2] {
        let mut d = Decoder::new(cfg.clone(), weights.clone(), 1, 64, threads);
        let mut row = vec![0.0; 512];
        let mut step = |d: &mut Decoder, i: usize| {
            let b = BatchView {
                tokens: &[(7 * i % 500) as i32],
                positions: &[i as i32],
                seq_ids: &[0],
                want_logits: &[1],
            };
            d.decode(&b, &mut LogitsOut::new(&mut row, 512)).unwrap();
        };
        // Warm up past the measured positions (buffers grow with the context), then rewind.
        for i in 0..16 {
            step(&mut d, i);
        }
        // Steady state: a pool worker that first joins a job late (on a loaded machine the
        // caller may claim every chunk during warm-up) may make a one-time per-thread
        // allocation; a window of steps that allocates nothing shows the step itself does not.
        let mut counts = Vec::new();
        for _ in 0..3 {
            d.seq_truncate(0, 8).unwrap();
            let before = ALLOCS.load(Ordering::Relaxed);
            for i in 8..12 {
                step(&mut d, i);
            }
            counts.push(ALLOCS.load(Ordering::Relaxed) - before);
            if counts.last() == Some(&0) {
                break;
            }
        }
        assert_eq!(
            counts.last(),
            Some(&0),
            "{threads} threads: allocations per window {counts:?}"
        );
    }
}
