//! HF MXFP4 experts (`*_blocks` / `*_scales`, as OpenAI ships gpt-oss) through the loader: the
//! tiny reference model's experts quantised to MXFP4 give the logits of the same model whose
//! experts are stored as the dequantised values in HF's bf16 layout (`x @ W`, gate and up
//! interleaved), up to the Q8_0 rounding of the activations the MXFP4 products use.

use berth_gpt_oss::{GptOssFamily, GptOssModel};
use berth_kernels::quant::{f32_to_bf16, quantize_row_mxfp4, WeightType, MXFP4_BYTES};
use berth_plugin_api::{Family, LoadConfig};
use berth_plugin_common::testing::{argmax, decode, tiny_fixture, TINY_IDS};
use serde_json::{json, Map, Value};
use std::collections::BTreeMap;
use std::path::Path;

/// A tensor: safetensors dtype, shape, little-endian bytes.
type Tensor = (String, Vec<usize>, Vec<u8>);

/// Every tensor of a safetensors file.
fn read(path: &Path) -> BTreeMap<String, Tensor> {
    let bytes = std::fs::read(path).unwrap();
    let n = u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
    let header: Map<String, Value> = serde_json::from_slice(&bytes[8..8 + n]).unwrap();
    header
        .into_iter()
        .filter(|(k, _)| k != "__metadata__")
        .map(|(k, v)| {
            let off: Vec<usize> = (v["data_offsets"].as_array().unwrap().iter())
                .map(|x| x.as_u64().unwrap() as usize)
                .collect();
            let shape = (v["shape"].as_array().unwrap().iter())
                .map(|d| d.as_u64().unwrap() as usize)
                .collect();
            let data = bytes[8 + n + off[0]..8 + n + off[1]].to_vec();
            (k, (v["dtype"].as_str().unwrap().to_string(), shape, data))
        })
        .collect()
}

/// Writes tensors as a safetensors file (header padded to 8 bytes).
fn write(path: &Path, tensors: &BTreeMap<String, Tensor>) {
    let (mut header, mut data) = (Map::new(), Vec::new());
    for (name, (dtype, shape, bytes)) in tensors {
        header.insert(
            name.clone(),
            json!({"dtype": dtype, "shape": shape, "data_offsets": [data.len(), data.len() + bytes.len()]}),
        );
        data.extend_from_slice(bytes);
    }
    let mut h = serde_json::to_vec(&Value::Object(header)).unwrap();
    while !h.len().is_multiple_of(8) {
        h.push(b' ');
    }
    let mut out = (h.len() as u64).to_le_bytes().to_vec();
    out.extend(h);
    out.extend(data);
    std::fs::write(path, out).unwrap();
}

fn f32s(b: &[u8]) -> Vec<f32> {
    b.chunks_exact(4)
        .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
        .collect()
}

/// One row as MXFP4: HF's packing (a scale byte per 32 values; values `2j`, `2j + 1` in the
/// low and high nibble of byte `j`) and the values it stands for.
fn quantise(row: &[f32]) -> (Vec<u8>, Vec<u8>, Vec<f32>) {
    let q = quantize_row_mxfp4(row);
    let mut deq = vec![0.0; row.len()];
    WeightType::Mxfp4.dequantize_row(&q, &mut deq);
    let (mut codes, mut scales) = (Vec::new(), Vec::new());
    for b in q.chunks_exact(MXFP4_BYTES) {
        // GGUF: value `i` in the low nibble of byte `1 + i`, value `i + 16` in its high nibble.
        let code = |i: usize| {
            if i < 16 {
                b[1 + i] & 0xf
            } else {
                b[1 + i - 16] >> 4
            }
        };
        scales.push(b[0]);
        codes.extend((0..16).map(|j| code(2 * j) | (code(2 * j + 1) << 4)));
    }
    (codes, scales, deq)
}

/// An HF `x @ W` expert tensor `[E, in, out]` (f32) as MXFP4 `[E, out, in/32, 16]` blocks and
/// `[E, out, in/32]` scales, and the dequantised values back in the `[E, in, out]` layout.
fn to_mxfp4(t: &Tensor) -> (Tensor, Tensor, Vec<f32>) {
    let (e, inp, out) = (t.1[0], t.1[1], t.1[2]);
    let w = f32s(&t.2);
    let (mut blocks, mut scales, mut deq) = (Vec::new(), Vec::new(), vec![0.0; w.len()]);
    for x in 0..e {
        for j in 0..out {
            let row: Vec<f32> = (0..inp).map(|c| w[(x * inp + c) * out + j]).collect();
            let (b, s, d) = quantise(&row);
            blocks.extend(b);
            scales.extend(s);
            for (c, v) in d.into_iter().enumerate() {
                deq[(x * inp + c) * out + j] = v;
            }
        }
    }
    let g = inp / 32;
    (
        ("U8".into(), vec![e, out, g, 16], blocks),
        ("U8".into(), vec![e, out, g], scales),
        deq,
    )
}

fn load(dir: &Path) -> GptOssModel {
    let cfg = LoadConfig {
        pack_dir: dir.to_path_buf(),
        family: "gpt-oss".into(),
        format: "safetensors".into(),
        threads: Some(2),
        ..Default::default()
    };
    GptOssFamily::create(&cfg).unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
}

#[test]
fn mxfp4_experts_match_their_dequantised_bf16_values() {
    let src = tiny_fixture("gpt_oss");
    let tensors = read(&src.join("model.safetensors"));
    let (mx, bf) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let (mut a, mut b) = (BTreeMap::new(), BTreeMap::new());
    for (name, t) in &tensors {
        let fused = name.ends_with("experts.gate_up_proj") || name.ends_with("experts.down_proj");
        if !fused {
            a.insert(name.clone(), t.clone());
            b.insert(name.clone(), t.clone());
            continue;
        }
        let (blocks, scales, deq) = to_mxfp4(t);
        a.insert(format!("{name}_blocks"), blocks);
        a.insert(format!("{name}_scales"), scales);
        // The MXFP4 values are exact in bf16 (at most two mantissa bits).
        let bytes = deq.iter().flat_map(|&v| f32_to_bf16(v).to_le_bytes()).collect();
        b.insert(name.clone(), ("BF16".into(), t.1.clone(), bytes));
    }
    assert!(a.keys().any(|k| k.ends_with("gate_up_proj_blocks")));
    for (dir, ts) in [(&mx, &a), (&bf, &b)] {
        write(&dir.path().join("model.safetensors"), ts);
        std::fs::copy(src.join("config.json"), dir.path().join("config.json")).unwrap();
    }
    let pos: Vec<i32> = (0..8).collect();
    let got = decode(&mut load(mx.path()), &TINY_IDS, &pos, &[0; 8], &[1; 8]);
    let want = decode(&mut load(bf.path()), &TINY_IDS, &pos, &[0; 8], &[1; 8]);
    let max_logit = want.iter().fold(0.0f32, |m, v| m.max(v.abs()));
    let max_diff = got
        .iter()
        .zip(&want)
        .fold(0.0f32, |m, (x, y)| m.max((x - y).abs()));
    eprintln!(
        "MXFP4 vs dequantised bf16 experts: max|diff| / max|logit| {:.1e}",
        max_diff / max_logit
    );
    // Q8_0 activations in the MXFP4 products move logits by ~1e-3 here; a wrong gate/up split
    // or a transposed expert moves them by the logits' own size.
    assert!(
        max_diff <= 2e-2 * max_logit,
        "max|diff| {max_diff} (max|logit| {max_logit})"
    );
    let top = |l: &[f32]| l.chunks(512).map(argmax).collect::<Vec<_>>();
    assert_eq!(top(&got), top(&want));
}
