//! Test helpers: a tiny GGUF writer and a safetensors writer (public with the `testutil` feature,
//! for other crates' tests; `berth-registry`'s `testutil` re-exports them).

use crate::gguf::{GgmlType, GgufValue};

/// Builds a GGUF file in memory.
pub struct GgufWriter {
    /// GGUF version.
    pub version: u32,
    /// Tensor data alignment.
    pub alignment: u64,
    /// Key-value metadata, in order.
    pub metadata: Vec<(String, GgufValue)>,
    /// Tensors: name, dims, type, data.
    pub tensors: Vec<(String, Vec<u64>, GgmlType, Vec<u8>)>,
}

impl GgufWriter {
    /// An empty version-3 file.
    pub fn new() -> Self {
        GgufWriter {
            version: 3,
            alignment: 32,
            metadata: Vec::new(),
            tensors: Vec::new(),
        }
    }

    /// Adds a metadata value.
    pub fn kv(mut self, key: &str, value: GgufValue) -> Self {
        self.metadata.push((key.to_string(), value));
        self
    }

    /// Adds a string metadata value.
    pub fn str(self, key: &str, value: &str) -> Self {
        self.kv(key, GgufValue::String(value.to_string()))
    }

    /// Adds a tensor whose data is a deterministic byte pattern of the right size.
    pub fn tensor(mut self, name: &str, dims: &[u64], ty: GgmlType) -> Self {
        let n: u64 = dims.iter().product();
        let bytes = ty.bytes_for(n).expect("whole blocks");
        let seed = self.tensors.len() as u8;
        let data = (0..bytes)
            .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed))
            .collect();
        self.tensors.push((name.to_string(), dims.to_vec(), ty, data));
        self
    }

    /// The file's bytes.
    pub fn build(&self) -> Vec<u8> {
        let mut out = Vec::new();
        out.extend_from_slice(b"GGUF");
        out.extend_from_slice(&self.version.to_le_bytes());
        out.extend_from_slice(&(self.tensors.len() as u64).to_le_bytes());
        out.extend_from_slice(&(self.metadata.len() as u64).to_le_bytes());
        for (k, v) in &self.metadata {
            write_str(&mut out, k);
            out.extend_from_slice(&type_id(v).to_le_bytes());
            write_value(&mut out, v);
        }
        let align = self.alignment as usize;
        let mut offsets = Vec::new();
        let mut rel = 0usize;
        for (_, _, _, data) in &self.tensors {
            offsets.push(rel);
            rel = (rel + data.len()).div_ceil(align) * align;
        }
        for ((name, dims, ty, _), off) in self.tensors.iter().zip(&offsets) {
            write_str(&mut out, name);
            out.extend_from_slice(&(dims.len() as u32).to_le_bytes());
            for d in dims {
                out.extend_from_slice(&d.to_le_bytes());
            }
            out.extend_from_slice(&ty.id().to_le_bytes());
            out.extend_from_slice(&(*off as u64).to_le_bytes());
        }
        let start = out.len().div_ceil(align) * align;
        out.resize(start, 0);
        for ((_, _, _, data), off) in self.tensors.iter().zip(&offsets) {
            out.resize(start + off, 0);
            out.extend_from_slice(data);
        }
        out
    }
}

fn write_str(out: &mut Vec<u8>, s: &str) {
    out.extend_from_slice(&(s.len() as u64).to_le_bytes());
    out.extend_from_slice(s.as_bytes());
}

fn type_id(v: &GgufValue) -> u32 {
    match v {
        GgufValue::U8(_) => 0,
        GgufValue::I8(_) => 1,
        GgufValue::U16(_) => 2,
        GgufValue::I16(_) => 3,
        GgufValue::U32(_) => 4,
        GgufValue::I32(_) => 5,
        GgufValue::F32(_) => 6,
        GgufValue::Bool(_) => 7,
        GgufValue::String(_) => 8,
        GgufValue::Array(_) => 9,
        GgufValue::U64(_) => 10,
        GgufValue::I64(_) => 11,
        GgufValue::F64(_) => 12,
    }
}

fn write_value(out: &mut Vec<u8>, v: &GgufValue) {
    match v {
        GgufValue::U8(x) => out.push(*x),
        GgufValue::I8(x) => out.extend_from_slice(&x.to_le_bytes()),
        GgufValue::U16(x) => out.extend_from_slice(&x.to_le_bytes()),
        GgufValue::I16(x) => out.extend_from_slice(&x.to_le_bytes()),
        GgufValue::U32(x) => out.extend_from_slice(&x.to_le_bytes()),
        GgufValue::I32(x) => out.extend_from_slice(&x.to_le_bytes()),
        GgufValue::U64(x) => out.extend_from_slice(&x.to_le_bytes()),
        GgufValue::I64(x) => out.extend_from_slice(&x.to_le_bytes()),
        GgufValue::F32(x) => out.extend_from_slice(&x.to_le_bytes()),
        GgufValue::F64(x) => out.extend_from_slice(&x.to_le_bytes()),
        GgufValue::Bool(x) => out.push(*x as u8),
        GgufValue::String(s) => write_str(out, s),
        GgufValue::Array(items) => {
            let elem = items.first().map(type_id).unwrap_or(4);
            out.extend_from_slice(&elem.to_le_bytes());
            out.extend_from_slice(&(items.len() as u64).to_le_bytes());
            for item in items {
                write_value(out, item);
            }
        }
    }
}

/// A small model-like GGUF: qwen2 metadata, a chat template and a few tensors of mixed types.
pub fn sample_gguf(template: Option<&str>) -> Vec<u8> {
    let mut w = GgufWriter::new()
        .str("general.architecture", "qwen2")
        .str("general.name", "Tiny Coder")
        .str("general.size_label", "0.5B")
        .kv("general.file_type", GgufValue::U32(15))
        .kv("qwen2.context_length", GgufValue::U32(4096))
        .kv("qwen2.rope.freq_base", GgufValue::F32(1_000_000.0))
        .kv("qwen2.block_count", GgufValue::U64(2))
        .kv(
            "tokenizer.ggml.tokens",
            GgufValue::Array(vec![GgufValue::String("a".into()), GgufValue::String("b".into())]),
        );
    if let Some(t) = template {
        w = w.str("tokenizer.chat_template", t);
    }
    w.tensor("token_embd.weight", &[64, 4], GgmlType::Q8_0)
        .tensor("blk.0.attn_q.weight", &[256, 2], GgmlType::Q4_K)
        .tensor("blk.0.attn_norm.weight", &[64], GgmlType::F32)
        .tensor("output_norm.weight", &[64], GgmlType::F32)
        .build()
}

/// Write a safetensors file from (name, dtype, shape, data) entries plus `__metadata__`.
pub fn safetensors_bytes(tensors: &[(&str, &str, &[u64], Vec<u8>)], meta: &[(&str, &str)]) -> Vec<u8> {
    let mut header = serde_json::Map::new();
    if !meta.is_empty() {
        let m: serde_json::Map<String, serde_json::Value> = meta
            .iter()
            .map(|(k, v)| (k.to_string(), serde_json::Value::String(v.to_string())))
            .collect();
        header.insert("__metadata__".into(), m.into());
    }
    let mut data = Vec::new();
    for (name, dtype, shape, bytes) in tensors {
        let begin = data.len();
        data.extend_from_slice(bytes);
        header.insert(
            name.to_string(),
            serde_json::json!({"dtype": dtype, "shape": shape, "data_offsets": [begin, data.len()]}),
        );
    }
    let mut h = serde_json::to_vec(&header).unwrap();
    while !h.len().is_multiple_of(8) {
        h.push(b' ');
    }
    let mut out = (h.len() as u64).to_le_bytes().to_vec();
    out.extend_from_slice(&h);
    out.extend_from_slice(&data);
    out
}

/// Every file under a folder, as paths relative to it, sorted (empty when it does not exist):
/// what a test compares to show a store or cache unchanged.
pub fn file_tree(dir: &std::path::Path) -> Vec<String> {
    fn walk(root: &std::path::Path, dir: &std::path::Path, out: &mut Vec<String>) {
        let Ok(rd) = std::fs::read_dir(dir) else { return };
        for e in rd.flatten() {
            let p = e.path();
            if p.is_dir() {
                walk(root, &p, out);
            } else {
                out.push(p.strip_prefix(root).unwrap().to_string_lossy().into_owned());
            }
        }
    }
    let mut out = Vec::new();
    walk(dir, dir, &mut out);
    out.sort();
    out
}
