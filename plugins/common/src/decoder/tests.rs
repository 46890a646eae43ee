//! The decoder's own checks: given embeddings, the snapshot budget.

use super::*;
use crate::weights::Matrix;
use berth_plugin_api::{BatchView, LogitsOut};

/// A random two-layer decoder (a short convolution, then attention) of hidden size 16.
fn tiny_decoder() -> Decoder {
    let (cfg, weights) = tiny_weights(16, 24, false);
    Decoder::new(cfg, weights, 2, 16, 1)
}

/// The weights of a random two-layer decoder (a short convolution, then attention) of hidden
/// size `h` and feed-forward width `ff`, f32, with a head of its own or tied to the embedding.
fn tiny_weights(h: usize, ff: usize, tied: bool) -> (DecoderConfig, DecoderWeights) {
    let mut seed = 0x2545_f491_4f6c_dd1du64;
    let mut rand = |n: usize| -> Vec<f32> {
        (0..n)
            .map(|_| {
                seed ^= seed << 13;
                seed ^= seed >> 7;
                seed ^= seed << 17;
                ((seed >> 40) as f32 / (1u64 << 24) as f32 - 0.5) * 0.6
            })
            .collect()
    };
    let vocab = 32;
    let mut mat = |r: usize, c: usize| Matrix::from_f32(r, c, &rand(r * c));
    let ffn = |mat: &mut dyn FnMut(usize, usize) -> Matrix| {
        Ffn::Dense(GatedFfn {
            gate: mat(ff, h),
            up: mat(ff, h),
            down: mat(h, ff),
        })
    };
    let cfg = DecoderConfig::new(2, h, 4, 2, 4);
    let conv = LayerWeights {
        attn_norm: vec![1.0; h],
        mixer: Mixer::ShortConv(ShortConv {
            in_proj: mat(3 * h, h),
            conv: vec![0.3; h * 3],
            kernel: 3,
            out_proj: mat(h, h),
        }),
        post_attn_norm: None,
        ffn_norm: vec![1.0; h],
        post_ffw_norm: None,
        ffn: ffn(&mut mat),
    };
    let attn = LayerWeights {
        attn_norm: vec![1.0; h],
        mixer: Mixer::Attention(Box::new(AttnWeights::new(
            mat(16, h),
            mat(8, h),
            mat(8, h),
            mat(h, 16),
        ))),
        post_attn_norm: None,
        ffn_norm: vec![1.0; h],
        post_ffw_norm: None,
        ffn: ffn(&mut mat),
    };
    let embed = mat(vocab, h);
    let output = if tied { embed.clone() } else { mat(vocab, h) };
    let weights = DecoderWeights::new(&cfg, embed, vec![conv, attn], vec![1.0; h], output).unwrap();
    (cfg, weights)
}

/// Logits of every row of a batch: sequence 0 takes three rows, sequence 1 one (between
/// sequence 0's first and second), with `embeds` given.
fn run(tokens: &[i32; 4], embeds: &[(usize, &[f32])]) -> Vec<f32> {
    run_on(tiny_decoder(), tokens, embeds)
}

/// [`run`] on decoder `d`.
fn run_on(mut d: Decoder, tokens: &[i32; 4], embeds: &[(usize, &[f32])]) -> Vec<f32> {
    let vocab = d.vocab_size();
    let mut out = vec![0.0; 4 * vocab];
    let batch = BatchView {
        tokens,
        positions: &[0, 0, 1, 2],
        seq_ids: &[0, 1, 0, 0],
        want_logits: &[1; 4],
    };
    d.decode_with_embeddings(&batch, embeds, &mut LogitsOut::new(&mut out, vocab))
        .unwrap();
    out
}

#[test]
fn given_embeddings_replace_the_token_rows_they_name() {
    let tokens = [3, 7, 11, 5];
    let plain = run(&tokens, &[]);
    let d = tiny_decoder();
    let h = d.cfg.hidden;
    let row_of = |t: i32| {
        let mut r = vec![0.0; h];
        d.weights.embed.dequantize_row(t as usize, &mut r);
        r
    };
    // A row's own embedding changes nothing, bit for bit.
    let (e7, e11) = (row_of(7), row_of(11));
    assert_eq!(run(&tokens, &[(1, &e7), (2, &e11)]), plain);
    // Another token's embedding is that token: rows 1 (alone in its sequence) and 2 (inside
    // a prompt) each take the given vector, and the rest of sequence 0 sees it.
    let (e20, e9) = (row_of(20), row_of(9));
    let swapped = run(&tokens, &[(2, &e20), (1, &e9)]);
    assert_eq!(swapped, run(&[3, 9, 20, 5], &[]));
    assert_ne!(swapped, plain);
    // A wrong width, a row outside the batch or a row given twice is refused.
    let mut dd = tiny_decoder();
    let mut out = vec![0.0; 32];
    let batch = BatchView {
        tokens: &[1],
        positions: &[0],
        seq_ids: &[0],
        want_logits: &[1],
    };
    let mut lo = LogitsOut::new(&mut out, 32);
    assert!(dd
        .decode_with_embeddings(&batch, &[(0, &e7[..8])], &mut lo)
        .is_err());
    assert!(dd.decode_with_embeddings(&batch, &[(1, &e7)], &mut lo).is_err());
    assert!(dd
        .decode_with_embeddings(&batch, &[(0, &e7), (0, &e9)], &mut lo)
        .is_err());
    assert!(dd.decode_with_embeddings(&batch, &[(0, &e7)], &mut lo).is_ok());
}

#[test]
fn snapshots_per_sequence_follow_the_memory_budget() {
    let tiny = [LayerStateDims {
        conv: 10,
        recurrent: 100,
    }; 2];
    assert_eq!(budgeted_snapshots(&tiny, 16, 16, 1 << 30), 16);
    // A Qwen3.5-9B-like state: 24 delta-net layers of 32 heads × 128 × 128.
    let big = vec![
        LayerStateDims {
            conv: 3 * 8192,
            recurrent: 32 * 128 * 128
        };
        24
    ];
    assert_eq!(budgeted_snapshots(&big, 16, 16, 1 << 30), 1);
    assert_eq!(budgeted_snapshots(&big, 64, 16, 1 << 30), 0);
    assert_eq!(budgeted_snapshots(&[LayerStateDims::default()], 16, 16, 0), 16);
}

#[test]
fn weights_for_serving_are_packed_held_once_and_give_the_same_logits() {
    use berth_kernels::packed::PackedMatrix;
    use berth_kernels::quant::WeightType;
    for tied in [false, true] {
        // Q8_0 matrices of whole 16-row groups and 32-column blocks: the packed kernels take them.
        let (cfg, mut w) = tiny_weights(32, 32, tied);
        w.quantize_q8_0();
        let lazy = run_on(
            Decoder::new(cfg.clone(), w.clone(), 2, 16, 1),
            &[3, 7, 11, 5],
            &[],
        );
        let (cfg, mut w) = tiny_weights(32, 32, tied);
        w.quantize_q8_0();
        w.for_serving();
        let packs = PackedMatrix::covers(WeightType::Q8_0);
        // An untied embedding keeps its rows (looked up by row); a tied one is the packed head,
        // held once, its rows read back from the packed form.
        assert_eq!(w.embed.has_rows(), !tied || !packs);
        assert_eq!(w.output.same_as(&w.embed), tied);
        assert_eq!(w.output.has_rows(), !packs);
        let Mixer::ShortConv(c) = &w.layers[0].mixer else {
            panic!("layer 0 is the short convolution")
        };
        assert_eq!(c.in_proj.has_rows(), !packs);
        let served = run_on(Decoder::new(cfg, w, 2, 16, 1), &[3, 7, 11, 5], &[]);
        let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
        assert_eq!(bits(&served), bits(&lazy), "tied {tied}");
    }
}
