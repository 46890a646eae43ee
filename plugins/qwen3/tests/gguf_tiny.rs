//! The GGUF path on the tiny references: each HF checkpoint is rewritten as an F32 GGUF with
//! llama.cpp names and metadata (experts stacked into 3-D tensors) and must give the same logits.

use berth_formats::SafetensorsFile;
use berth_plugin_api::{BatchView, Family, LoadConfig, LogitsOut, Model};
use berth_plugin_common::npy::read_npy_f32;
use berth_plugin_common::{HfNames, TensorId};
use berth_qwen3::QwenFamily;
use serde_json::Value;
use std::collections::BTreeMap;
use std::path::Path;

/// One expert's slice of a stacked tensor: index, dims, bytes.
type Expert = (usize, Vec<u64>, Vec<u8>);

enum Meta {
    U32(u32),
    F32(f32),
    Str(String),
}

/// Writes a GGUF v3 file with F32 tensors (`dims` innermost first).
fn write_gguf(path: &Path, meta: &[(String, Meta)], tensors: &[(String, Vec<u64>, Vec<u8>)]) {
    fn s(out: &mut Vec<u8>, v: &str) {
        out.extend_from_slice(&(v.len() as u64).to_le_bytes());
        out.extend_from_slice(v.as_bytes());
    }
    let mut out = b"GGUF".to_vec();
    out.extend_from_slice(&3u32.to_le_bytes());
    out.extend_from_slice(&(tensors.len() as u64).to_le_bytes());
    out.extend_from_slice(&(meta.len() as u64).to_le_bytes());
    for (k, v) in meta {
        s(&mut out, k);
        match v {
            Meta::U32(x) => {
                out.extend_from_slice(&4u32.to_le_bytes());
                out.extend_from_slice(&x.to_le_bytes());
            }
            Meta::F32(x) => {
                out.extend_from_slice(&6u32.to_le_bytes());
                out.extend_from_slice(&x.to_le_bytes());
            }
            Meta::Str(x) => {
                out.extend_from_slice(&8u32.to_le_bytes());
                s(&mut out, x);
            }
        }
    }
    let mut off = 0u64;
    for (name, dims, data) in tensors {
        s(&mut out, name);
        out.extend_from_slice(&(dims.len() as u32).to_le_bytes());
        dims.iter().for_each(|d| out.extend_from_slice(&d.to_le_bytes()));
        out.extend_from_slice(&0u32.to_le_bytes()); // F32
        out.extend_from_slice(&off.to_le_bytes());
        off += (data.len() as u64).div_ceil(32) * 32;
    }
    out.resize(out.len().div_ceil(32) * 32, 0);
    for (_, _, data) in tensors {
        out.extend_from_slice(data);
        out.resize(out.len().div_ceil(32) * 32, 0);
    }
    std::fs::write(path, out).unwrap();
}

/// Converts a tiny HF Qwen3 / Qwen3-MoE checkpoint to GGUF.
fn convert(dir: &Path, out: &Path) {
    let c: Value = serde_json::from_str(&std::fs::read_to_string(dir.join("config.json")).unwrap()).unwrap();
    let st = SafetensorsFile::open(dir.join("model.safetensors")).unwrap();
    let moe = c["model_type"] == "qwen3_moe";
    let arch = if moe { "qwen3moe" } else { "qwen3" };
    let u = |k: &str| Meta::U32(c[k].as_u64().unwrap() as u32);
    let mut meta = vec![
        ("general.architecture".to_string(), Meta::Str(arch.into())),
        (format!("{arch}.block_count"), u("num_hidden_layers")),
        (format!("{arch}.embedding_length"), u("hidden_size")),
        (format!("{arch}.feed_forward_length"), u("intermediate_size")),
        (format!("{arch}.attention.head_count"), u("num_attention_heads")),
        (
            format!("{arch}.attention.head_count_kv"),
            u("num_key_value_heads"),
        ),
        (format!("{arch}.attention.key_length"), u("head_dim")),
        (format!("{arch}.context_length"), u("max_position_embeddings")),
        (
            format!("{arch}.rope.freq_base"),
            Meta::F32(c["rope_parameters"]["rope_theta"].as_f64().unwrap() as f32),
        ),
        (
            format!("{arch}.attention.layer_norm_rms_epsilon"),
            Meta::F32(c["rms_norm_eps"].as_f64().unwrap() as f32),
        ),
        ("tokenizer.ggml.eos_token_id".to_string(), Meta::U32(1)),
    ];
    if moe {
        meta.push((format!("{arch}.expert_count"), u("num_local_experts")));
        meta.push((format!("{arch}.expert_used_count"), u("num_experts_per_tok")));
    }
    let mut tensors = Vec::new();
    let mut experts: BTreeMap<String, Vec<Expert>> = BTreeMap::new();
    for t in st.tensors() {
        let id = TensorId::from_hf_name(&t.name, HfNames::Standard).unwrap_or_else(|| panic!("{}", t.name));
        let dims: Vec<u64> = t.shape.iter().rev().copied().collect();
        let data = st.tensor_data(&t.name).unwrap().to_vec();
        match id.expert {
            Some(e) => experts.entry(id.gguf_name()).or_default().push((e, dims, data)),
            None => tensors.push((id.gguf_name(), dims, data)),
        }
    }
    for (name, mut list) in experts {
        list.sort_by_key(|x| x.0);
        let mut dims = list[0].1.clone();
        dims.push(list.len() as u64);
        let data = list.into_iter().flat_map(|x| x.2).collect();
        tensors.push((name, dims, data));
    }
    write_gguf(out, &meta, &tensors);
}

fn check(name: &str) {
    let dir = berth_plugin_common::npy::shared_fixtures()
        .join("reference-tiny")
        .join(name);
    let tmp = tempfile::tempdir().unwrap();
    let path = tmp.path().join("model.gguf");
    convert(&dir, &path);
    let cfg = LoadConfig {
        pack_dir: tmp.path().to_path_buf(),
        family: "qwen3".into(),
        format: "gguf".into(),
        ..Default::default()
    };
    let mut m = QwenFamily::create(&cfg).unwrap();
    assert_eq!(m.describe().stop_tokens, vec![1]);
    let want = read_npy_f32(dir.join("logits.npy")).unwrap();
    let mut got = vec![0.0; 8 * 512];
    let b = BatchView {
        tokens: &[1, 17, 42, 256, 100, 31, 7, 511],
        positions: &[0, 1, 2, 3, 4, 5, 6, 7],
        seq_ids: &[0; 8],
        want_logits: &[1; 8],
    };
    m.decode(&b, &mut LogitsOut::new(&mut got, 512)).unwrap();
    let max_logit = want.data.iter().fold(0.0f32, |a, b| a.max(b.abs()));
    let diff = got
        .iter()
        .zip(&want.data)
        .fold(0.0f32, |a, (x, y)| a.max((x - y).abs()));
    assert!(diff <= 1e-3 * max_logit, "{name}: max|diff| {diff}");
}

#[test]
fn qwen3_tiny_as_gguf_matches_reference_logits() {
    check("qwen3");
}

#[test]
fn qwen3_moe_tiny_as_gguf_matches_reference_logits() {
    check("qwen3_moe");
}
