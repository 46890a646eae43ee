//! A warm single-token decode step allocates nothing (activation quantization buffers,
//! attention scores and the thread pool are all reused), on the tiny Gemma 3 reference.

use berth_plugin_api::LoadConfig;
use berth_plugin_common::family::Loaded;
use berth_plugin_common::testing::warm_step_allocations;
use berth_plugin_common::{Activation, DecoderConfig, DecoderModel, DecoderWeights, HfNames, Weights};
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
        let loaded = Loaded {
            architecture: "gemma3".into(),
            cfg: cfg.clone(),
            weights: weights.clone(),
            context_length: 64,
            specials: Default::default(),
            tools: false,
        };
        let load = LoadConfig {
            threads: Some(threads),
            max_sequences: Some(1),
            ..Default::default()
        };
        let mut m = DecoderModel::new(loaded, &load).unwrap();
        let counts = warm_step_allocations(&mut m, || ALLOCS.load(Ordering::Relaxed));
        assert_eq!(
            counts.last(),
            Some(&0),
            "{threads} threads: allocations per window {counts:?}"
        );
    }
}
