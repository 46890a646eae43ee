//! LFM2 and LFM2-MoE against the tiny transformers reference models (safetensors): logits of the
//! full prefill and token by token through the convolution state, and the multi-sequence
//! contract of a recurrent model (batching, fork, rewind to snapshots).

use berth_lfm2::{Lfm2Family, Lfm2Model};
use berth_plugin_api::{Family, LoadConfig, Model, Rewind};
use berth_plugin_common::testing::{
    check_batched_equals_alone, check_fork, check_rewind, check_tiny_reference, tiny_fixture,
};

fn load(name: &str) -> Lfm2Model {
    let cfg = LoadConfig {
        pack_dir: tiny_fixture(name),
        family: "lfm2".into(),
        architecture: name.into(),
        format: "safetensors".into(),
        threads: Some(2),
        ..Default::default()
    };
    Lfm2Family::create(&cfg).unwrap_or_else(|e| panic!("{name}: {e}"))
}

#[test]
fn lfm2_tiny_matches_reference_logits() {
    check_tiny_reference(&mut load("lfm2"), "lfm2");
}

#[test]
fn lfm2_moe_tiny_matches_reference_logits() {
    check_tiny_reference(&mut load("lfm2_moe"), "lfm2_moe");
}

#[test]
fn lfm2_reports_snapshot_rewinds() {
    let m = load("lfm2");
    assert_eq!(m.describe().rewind, Rewind::Snapshots { every: 64 });
}

#[test]
fn lfm2_batched_sequences_decode_as_alone() {
    check_batched_equals_alone(&mut load("lfm2"), 512);
    check_batched_equals_alone(&mut load("lfm2_moe"), 512);
}

#[test]
fn lfm2_fork_continues_like_a_fresh_prefill() {
    check_fork(&mut load("lfm2"), 512);
}

#[test]
fn lfm2_rewind_to_a_snapshot_matches_a_fresh_prefill() {
    check_rewind(&mut load("lfm2"), 512);
    check_rewind(&mut load("lfm2_moe"), 512);
}
