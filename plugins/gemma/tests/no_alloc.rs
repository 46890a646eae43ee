//! A warm single-token decode step of Gemma 4 (per-layer embeddings, KV sharing, the MoE block)
//! allocates nothing, like the common decoder's other paths (plugins/common/tests/no_alloc.rs).

use berth_gemma::GemmaFamily;
use berth_plugin_api::{Family, LoadConfig};
use berth_plugin_common::testing::{tiny_fixture, warm_step_allocations};
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
fn warm_gemma4_decode_step_does_not_allocate() {
    for name in ["gemma4", "gemma4_moe"] {
        for threads in [1, 2] {
            let cfg = LoadConfig {
                pack_dir: tiny_fixture(name),
                family: "gemma".into(),
                architecture: name.into(),
                format: "safetensors".into(),
                threads: Some(threads),
                max_sequences: Some(1),
                context_length: Some(64),
                ..Default::default()
            };
            let mut m = GemmaFamily::create(&cfg).unwrap();
            let counts = warm_step_allocations(&mut m, || ALLOCS.load(Ordering::Relaxed));
            assert_eq!(
                counts.last(),
                Some(&0),
                "{name}, {threads} threads: allocations per window {counts:?}"
            );
        }
    }
}
