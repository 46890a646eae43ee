//! Loading tensors from GGUF or HF safetensors, with the standard decoder's tensor names mapped
//! both ways between the two conventions.
//!
//! Tensors are read from their files (positioned reads, not a mapping) into memory the process
//! owns, so nothing a loaded model holds refers to its files: a file truncated, rewritten or
//! deleted under a running server cannot reach the model (a file cut while it loads is a load
//! error naming it), and the next load reads whatever the file then holds. The files' headers
//! are read and parsed once at open ([`GgufFile::read_header`],
//! [`SafetensorsFile::read_header`]): no step of a plugin's load maps a weights file.

use crate::pack_cache::{PackCache, SourceId};
/// A parsed GGUF file (metadata and tensor index), as [`Weights::gguf`] returns it.
pub use berth_formats::GgufFile;
use berth_formats::{Dtype, SafetensorsFile};
use berth_kernels::packed::PackedMatrix;
use berth_kernels::quant::WeightType;
use berth_plugin_api::PluginError;
use std::fs::File;
use std::os::unix::fs::{FileExt, MetadataExt};
use std::path::{Path, PathBuf};
use std::sync::{Arc, OnceLock};

/// Something that owns a block of bytes tensors can point into (memory the process owns: a
/// tensor read from its file, or bytes a loader made).
pub trait ByteSource: Send + Sync {
    /// All the bytes.
    fn bytes(&self) -> &[u8];
}

impl ByteSource for Vec<u8> {
    fn bytes(&self) -> &[u8] {
        self
    }
}

/// The raw rows of a matrix: `len` bytes at `start` of a shared source.
#[derive(Clone)]
struct Rows {
    source: Arc<dyn ByteSource>,
    start: usize,
    len: usize,
}

impl Rows {
    fn bytes(&self) -> &[u8] {
        &self.source.bytes()[self.start..self.start + self.len]
    }
}

/// A 2-D weight matrix of any [`WeightType`]: `rows` output rows of `cols` inputs each. It holds
/// the rows row-major in the weight type's block format, or the rows repacked for the packed
/// kernels, or both (see [`Matrix::for_serving`]). Cloning is cheap (the storage is shared).
#[derive(Clone)]
pub struct Matrix {
    /// Storage type of the rows.
    pub wtype: WeightType,
    /// Number of rows (output dimension).
    pub rows: usize,
    /// Elements per row (input dimension).
    pub cols: usize,
    /// The raw rows; None once [`Matrix::for_serving`] dropped them for the packed form.
    raw: Option<Rows>,
    /// The rows repacked for the packed kernels, and where they came from.
    packed: Arc<Packed>,
}

/// A matrix's packed form, shared by its clones.
#[derive(Default)]
struct Packed {
    /// The rows repacked for the packed kernels, made on first use or by
    /// [`Matrix::for_serving`] (None inside: not packable here).
    cell: OnceLock<Option<PackedMatrix>>,
    /// The GGUF tensor the matrix was read as and the pack's cache of packed weights, when the
    /// weights were opened with one ([`Weights::with_pack_cache`]).
    origin: Option<Origin>,
}

/// Where a matrix came from, for the pack's cache of packed weights.
struct Origin {
    cache: Arc<PackCache>,
    name: String,
    /// Read back packed from the cache (not packed by this load).
    from_cache: bool,
}

impl std::fmt::Debug for Matrix {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Matrix({} {}x{})", self.wtype.name(), self.rows, self.cols)
    }
}

impl Matrix {
    /// A matrix over `source.bytes()[start..]`; checks that the bytes are there.
    pub fn new(
        source: Arc<dyn ByteSource>,
        start: usize,
        wtype: WeightType,
        rows: usize,
        cols: usize,
    ) -> Result<Matrix, PluginError> {
        if !cols.is_multiple_of(wtype.block_size()) {
            return Err(PluginError::failed(format!(
                "{} rows of {cols} elements are not whole blocks of {}",
                wtype.name(),
                wtype.block_size()
            )));
        }
        let len = rows * wtype.row_bytes(cols);
        if start + len > source.bytes().len() {
            return Err(PluginError::failed(format!(
                "matrix {rows}x{cols} {} needs {len} bytes at {start}; the source holds {}",
                wtype.name(),
                source.bytes().len()
            )));
        }
        Ok(Matrix {
            wtype,
            rows,
            cols,
            raw: Some(Rows { source, start, len }),
            packed: Arc::default(),
        })
    }

    /// A matrix held only packed (read back from a pack's cache), from `origin`.
    fn from_packed(p: PackedMatrix, origin: Origin) -> Matrix {
        Matrix {
            wtype: p.wtype(),
            rows: p.rows(),
            cols: p.k(),
            raw: None,
            packed: Arc::new(Packed {
                cell: OnceLock::from(Some(p)),
                origin: Some(origin),
            }),
        }
    }

    /// This matrix (not yet packed) remembered as read from `origin`, when there is one.
    fn with_origin(mut self, origin: Option<Origin>) -> Matrix {
        if origin.is_some() {
            self.packed = Arc::new(Packed {
                cell: OnceLock::new(),
                origin,
            });
        }
        self
    }

    /// The pack's cache and tensor name of a matrix held only packed, for
    /// [`crate::decoder::DecoderWeights::store_packed`].
    /// (The cache, the tensor's name, the packed form, and whether it was read from the cache.)
    pub(crate) fn cache_entry(&self) -> Option<(&Arc<PackCache>, &str, &PackedMatrix, bool)> {
        let o = self.packed.origin.as_ref()?;
        if self.raw.is_some() {
            return None;
        }
        Some((
            &o.cache,
            o.name.as_str(),
            self.packed.cell.get()?.as_ref()?,
            o.from_cache,
        ))
    }

    /// An owned f32 matrix from row-major values.
    pub fn from_f32(rows: usize, cols: usize, data: &[f32]) -> Matrix {
        assert_eq!(data.len(), rows * cols, "matrix data length");
        let bytes: Vec<u8> = data.iter().flat_map(|v| v.to_le_bytes()).collect();
        Matrix::new(Arc::new(bytes), 0, WeightType::F32, rows, cols).expect("sized above")
    }

    /// An owned f32 copy of this matrix (every row dequantised), for reference runs.
    pub fn to_f32(&self) -> Matrix {
        if self.wtype == WeightType::F32 {
            return self.clone();
        }
        let mut data = vec![0.0; self.rows * self.cols];
        for (r, row) in data.chunks_exact_mut(self.cols).enumerate() {
            self.dequantize_row(r, row);
        }
        Matrix::from_f32(self.rows, self.cols, &data)
    }

    /// An owned Q8_0 copy of a float matrix (f32, f16, bf16) whose rows are whole 32-element
    /// blocks, quantized as llama.cpp's `quantize_row_q8_0` does; any other matrix is returned
    /// as it is.
    pub fn to_q8_0(&self) -> Matrix {
        let float = matches!(self.wtype, WeightType::F32 | WeightType::F16 | WeightType::BF16);
        if !float || !self.cols.is_multiple_of(WeightType::Q8_0.block_size()) {
            return self.clone();
        }
        let mut bytes = Vec::with_capacity(self.rows * WeightType::Q8_0.row_bytes(self.cols));
        let mut row = vec![0.0; self.cols];
        for r in 0..self.rows {
            self.dequantize_row(r, &mut row);
            bytes.extend(berth_kernels::quant::quantize_row_q8_0(&row));
        }
        Matrix::new(Arc::new(bytes), 0, WeightType::Q8_0, self.rows, self.cols).expect("sized above")
    }

    /// The matrix as a loaded model serves it: packed now where the packed kernels take it (so
    /// no request waits for packing), and then, unless `keep_rows`, without its raw rows, so the
    /// weights are held once. A matrix the packed kernels do not take keeps its rows. Use
    /// `keep_rows` for a matrix whose raw rows are still wanted ([`Matrix::dequantize_row`]
    /// reads rows from the packed form too).
    pub fn for_serving(&self, keep_rows: bool) -> Matrix {
        let packed = self.packed().is_some();
        Matrix {
            raw: if packed && !keep_rows {
                None
            } else {
                self.raw.clone()
            },
            ..self.clone()
        }
    }

    /// Whether the raw rows are held ([`Matrix::bytes`], [`Matrix::row`] and the row slices
    /// need them).
    pub fn has_rows(&self) -> bool {
        self.raw.is_some()
    }

    /// Whether `other` is this matrix (a clone of it: the same storage).
    pub fn same_as(&self, other: &Matrix) -> bool {
        Arc::ptr_eq(&self.packed, &other.packed)
    }

    /// Bytes this matrix holds: its raw rows (the whole shared buffer's share of them) and its
    /// packed form where made.
    pub fn held_bytes(&self) -> usize {
        let raw = self.raw.as_ref().map_or(0, |r| r.len);
        let packed = self
            .packed
            .cell
            .get()
            .and_then(Option::as_ref)
            .map_or(0, PackedMatrix::size_bytes);
        raw + packed
    }

    /// The raw bytes of all rows. Panics on a matrix kept only packed ([`Matrix::for_serving`]),
    /// whose rows are read through [`Matrix::packed`].
    pub fn bytes(&self) -> &[u8] {
        self.raw
            .as_ref()
            .map(Rows::bytes)
            .unwrap_or_else(|| panic!("{self:?} is held packed only; its raw rows were dropped"))
    }

    /// The rows repacked into 16-row interleaved groups for the packed kernels, made on first
    /// call (at load for a model's matrices, see [`Matrix::for_serving`]); None where this CPU or
    /// `BERTH_KERNELS` rules them out or the type or shape is not covered (see
    /// [`berth_kernels::packed`]).
    pub fn packed(&self) -> Option<&PackedMatrix> {
        self.packed
            .cell
            .get_or_init(|| PackedMatrix::pack(self.wtype, self.bytes(), self.rows, self.cols))
            .as_ref()
    }

    /// Bytes per row.
    pub fn row_bytes(&self) -> usize {
        self.wtype.row_bytes(self.cols)
    }

    /// The raw bytes of row `r`.
    #[inline]
    pub fn row(&self, r: usize) -> &[u8] {
        let rb = self.row_bytes();
        &self.bytes()[r * rb..(r + 1) * rb]
    }

    /// Rows `start..start + n` as a matrix of their own (sharing the raw rows).
    pub fn slice_rows(&self, start: usize, n: usize) -> Matrix {
        assert!(start + n <= self.rows, "row slice beyond the matrix");
        let rb = self.row_bytes();
        let raw = self
            .raw
            .as_ref()
            .unwrap_or_else(|| panic!("{self:?} is held packed only"));
        Matrix {
            wtype: self.wtype,
            rows: n,
            cols: self.cols,
            raw: Some(Rows {
                source: raw.source.clone(),
                start: raw.start + start * rb,
                len: n * rb,
            }),
            packed: Arc::default(),
        }
    }

    /// Dequantizes row `r` into `out` (`cols` floats): an embedding lookup. A matrix held only
    /// packed gives the same values from its packed form.
    pub fn dequantize_row(&self, r: usize, out: &mut [f32]) {
        if self.raw.is_none() {
            if let Some(p) = self.packed() {
                return p.dequantize_row(r, &mut out[..self.cols]);
            }
        }
        self.wtype.dequantize_row(self.row(r), &mut out[..self.cols]);
    }
}

/// What a tensor is for, independent of the file's naming convention.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Role {
    /// Token embedding table (`token_embd` / `model.embed_tokens`).
    TokenEmbd,
    /// Final norm (`output_norm` / `model.norm`).
    OutputNorm,
    /// LM head (`output` / `lm_head`).
    Output,
    /// Pre-attention norm (`attn_norm` / `input_layernorm`).
    AttnNorm,
    /// Query projection.
    AttnQ,
    /// Key projection.
    AttnK,
    /// Value projection.
    AttnV,
    /// Attention output projection.
    AttnOut,
    /// Per-head query RMSNorm.
    AttnQNorm,
    /// Per-head key RMSNorm.
    AttnKNorm,
    /// Pre-FFN norm (`ffn_norm`; HF `post_attention_layernorm`, or `pre_feedforward_layernorm`
    /// with sandwich norms).
    FfnNorm,
    /// Norm on the attention output (Gemma `post_attention_layernorm`).
    PostAttnNorm,
    /// Norm on the FFN output (Gemma `post_feedforward_layernorm`).
    PostFfwNorm,
    /// FFN gate projection.
    FfnGate,
    /// FFN up projection.
    FfnUp,
    /// FFN down projection.
    FfnDown,
    /// MoE router (`ffn_gate_inp` / `mlp.gate`).
    FfnGateInp,
    /// MoE expert gate projections (3-D in GGUF).
    FfnGateExps,
    /// MoE expert up projections (3-D in GGUF).
    FfnUpExps,
    /// MoE expert down projections (3-D in GGUF).
    FfnDownExps,
}

/// How HF checkpoints name the per-layer norms.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum HfNames {
    /// Llama/Qwen: `input_layernorm` and `post_attention_layernorm` (= the pre-FFN norm).
    #[default]
    Standard,
    /// Gemma: `post_attention_layernorm` is the attention-output norm and the FFN has
    /// `pre_feedforward_layernorm` / `post_feedforward_layernorm`.
    Sandwich,
}

const GLOBAL_ROLES: [(Role, &str, &str); 3] = [
    (Role::TokenEmbd, "token_embd", "model.embed_tokens"),
    (Role::OutputNorm, "output_norm", "model.norm"),
    (Role::Output, "output", "lm_head"),
];

/// Per-layer roles: (role, GGUF stem, HF stem standard, HF stem sandwich). `{e}` is the expert.
const LAYER_ROLES: [(Role, &str, &str, &str); 17] = [
    (Role::AttnNorm, "attn_norm", "input_layernorm", "input_layernorm"),
    (Role::AttnQ, "attn_q", "self_attn.q_proj", "self_attn.q_proj"),
    (Role::AttnK, "attn_k", "self_attn.k_proj", "self_attn.k_proj"),
    (Role::AttnV, "attn_v", "self_attn.v_proj", "self_attn.v_proj"),
    (
        Role::AttnOut,
        "attn_output",
        "self_attn.o_proj",
        "self_attn.o_proj",
    ),
    (
        Role::AttnQNorm,
        "attn_q_norm",
        "self_attn.q_norm",
        "self_attn.q_norm",
    ),
    (
        Role::AttnKNorm,
        "attn_k_norm",
        "self_attn.k_norm",
        "self_attn.k_norm",
    ),
    (
        Role::FfnNorm,
        "ffn_norm",
        "post_attention_layernorm",
        "pre_feedforward_layernorm",
    ),
    (
        Role::PostAttnNorm,
        "post_attention_norm",
        "post_attention_norm",
        "post_attention_layernorm",
    ),
    (
        Role::PostFfwNorm,
        "post_ffw_norm",
        "post_feedforward_layernorm",
        "post_feedforward_layernorm",
    ),
    (Role::FfnGate, "ffn_gate", "mlp.gate_proj", "mlp.gate_proj"),
    (Role::FfnUp, "ffn_up", "mlp.up_proj", "mlp.up_proj"),
    (Role::FfnDown, "ffn_down", "mlp.down_proj", "mlp.down_proj"),
    (Role::FfnGateInp, "ffn_gate_inp", "mlp.gate", "mlp.gate"),
    (
        Role::FfnGateExps,
        "ffn_gate_exps",
        "mlp.experts.{e}.gate_proj",
        "mlp.experts.{e}.gate_proj",
    ),
    (
        Role::FfnUpExps,
        "ffn_up_exps",
        "mlp.experts.{e}.up_proj",
        "mlp.experts.{e}.up_proj",
    ),
    (
        Role::FfnDownExps,
        "ffn_down_exps",
        "mlp.experts.{e}.down_proj",
        "mlp.experts.{e}.down_proj",
    ),
];

/// A tensor identified by role, layer, weight-or-bias and (HF only) expert index.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct TensorId {
    /// What the tensor is for.
    pub role: Role,
    /// Layer index, for per-layer tensors.
    pub layer: Option<usize>,
    /// Whether this is the `.bias` rather than the `.weight`.
    pub bias: bool,
    /// Expert index (HF per-expert tensors; GGUF stacks experts in one tensor).
    pub expert: Option<usize>,
}

impl TensorId {
    /// A model-wide weight (`token_embd`, `output_norm`, `output`).
    pub fn global(role: Role) -> TensorId {
        TensorId {
            role,
            layer: None,
            bias: false,
            expert: None,
        }
    }

    /// The weight of layer `layer`.
    pub fn layer(role: Role, layer: usize) -> TensorId {
        TensorId {
            role,
            layer: Some(layer),
            bias: false,
            expert: None,
        }
    }

    /// The same tensor's bias.
    pub fn bias(mut self) -> TensorId {
        self.bias = true;
        self
    }

    /// The same tensor for expert `e` (HF naming).
    pub fn expert(mut self, e: usize) -> TensorId {
        self.expert = Some(e);
        self
    }

    fn suffix(&self) -> &'static str {
        if self.bias {
            "bias"
        } else {
            "weight"
        }
    }

    /// The GGUF (llama.cpp) name, e.g. `blk.3.attn_q.bias`.
    pub fn gguf_name(&self) -> String {
        match self.layer {
            None => {
                let stem = GLOBAL_ROLES
                    .iter()
                    .find(|r| r.0 == self.role)
                    .map_or("?", |r| r.1);
                format!("{stem}.{}", self.suffix())
            }
            Some(i) => {
                let stem = LAYER_ROLES.iter().find(|r| r.0 == self.role).map_or("?", |r| r.1);
                format!("blk.{i}.{stem}.{}", self.suffix())
            }
        }
    }

    /// The HF transformers name, e.g. `model.layers.3.self_attn.q_proj.bias`.
    pub fn hf_name(&self, names: HfNames) -> String {
        match self.layer {
            None => {
                let stem = GLOBAL_ROLES
                    .iter()
                    .find(|r| r.0 == self.role)
                    .map_or("?", |r| r.2);
                format!("{stem}.{}", self.suffix())
            }
            Some(i) => {
                let row = LAYER_ROLES.iter().find(|r| r.0 == self.role);
                let stem = row.map_or("?", |r| if names == HfNames::Standard { r.2 } else { r.3 });
                let stem = stem.replace("{e}", &self.expert.unwrap_or(0).to_string());
                format!("model.layers.{i}.{stem}.{}", self.suffix())
            }
        }
    }

    /// Parses a GGUF name.
    pub fn from_gguf_name(name: &str) -> Option<TensorId> {
        let (stem, bias) = split_suffix(name)?;
        if let Some(rest) = stem.strip_prefix("blk.") {
            let (layer, stem) = rest.split_once('.')?;
            let layer = layer.parse().ok()?;
            let role = LAYER_ROLES.iter().find(|r| r.1 == stem)?.0;
            Some(TensorId {
                role,
                layer: Some(layer),
                bias,
                expert: None,
            })
        } else {
            let role = GLOBAL_ROLES.iter().find(|r| r.1 == stem)?.0;
            Some(TensorId {
                role,
                layer: None,
                bias,
                expert: None,
            })
        }
    }

    /// Parses an HF name.
    pub fn from_hf_name(name: &str, names: HfNames) -> Option<TensorId> {
        let (stem, bias) = split_suffix(name)?;
        if let Some(rest) = stem.strip_prefix("model.layers.") {
            let (layer, stem) = rest.split_once('.')?;
            let layer = layer.parse().ok()?;
            let (stem, expert) = match stem.strip_prefix("mlp.experts.") {
                Some(r) => {
                    let (e, tail) = r.split_once('.')?;
                    (format!("mlp.experts.{{e}}.{tail}"), Some(e.parse().ok()?))
                }
                None => (stem.to_string(), None),
            };
            let role = LAYER_ROLES
                .iter()
                .find(|r| (if names == HfNames::Standard { r.2 } else { r.3 }) == stem)?
                .0;
            Some(TensorId {
                role,
                layer: Some(layer),
                bias,
                expert,
            })
        } else {
            let role = GLOBAL_ROLES.iter().find(|r| r.2 == stem)?.0;
            Some(TensorId {
                role,
                layer: None,
                bias,
                expert: None,
            })
        }
    }
}

fn split_suffix(name: &str) -> Option<(&str, bool)> {
    if let Some(s) = name.strip_suffix(".weight") {
        Some((s, false))
    } else {
        name.strip_suffix(".bias").map(|s| (s, true))
    }
}

/// Which file format the weights come from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WeightFormat {
    /// A llama.cpp GGUF file.
    Gguf,
    /// HF safetensors (one or more shards).
    Safetensors,
}

/// A weights file open for reading: its parsed header and the handle tensors are read through.
struct Source<F> {
    /// The parsed header (metadata and tensor index).
    index: Arc<F>,
    /// The file the header was parsed from (checked to be the same file at open).
    file: File,
    /// The path, for errors.
    path: PathBuf,
}

impl<F> Source<F> {
    /// Opens `path` and parses it with `parse`, checking the parsed file is the one opened (not
    /// one renamed over it in between).
    fn open(
        path: &Path,
        parse: impl FnOnce(&Path) -> Result<F, PluginError>,
    ) -> Result<Source<F>, PluginError> {
        let io = |e: std::io::Error| PluginError::failed(format!("{}: {e}", path.display()));
        let file = File::open(path).map_err(io)?;
        let index = parse(path)?;
        let (opened, now) = (file.metadata().map_err(io)?, std::fs::metadata(path).map_err(io)?);
        if (opened.dev(), opened.ino()) != (now.dev(), now.ino()) {
            return Err(PluginError::failed(format!(
                "{}: the file was replaced while it was opened",
                path.display()
            )));
        }
        Ok(Source {
            index: Arc::new(index),
            file,
            path: path.to_path_buf(),
        })
    }

    /// `len` bytes at `offset` of the file, for tensor `name`, into memory the process owns; a
    /// file cut short since its header was read is an error naming it.
    fn read(&self, name: &str, offset: usize, len: usize) -> Result<Vec<u8>, PluginError> {
        let mut buf = vec![0u8; len];
        self.file.read_exact_at(&mut buf, offset as u64).map_err(|e| {
            let now = self.file.metadata().map_or(0, |m| m.len());
            if e.kind() == std::io::ErrorKind::UnexpectedEof {
                PluginError::failed(format!(
                    "{}: truncated: tensor {name} needs bytes {offset}..{}, the file now holds {now}",
                    self.path.display(),
                    offset + len
                ))
            } else {
                PluginError::failed(format!("{}: reading tensor {name}: {e}", self.path.display()))
            }
        })?;
        Ok(buf)
    }
}

enum Files {
    Gguf(Source<GgufFile>),
    Safetensors(Vec<Source<SafetensorsFile>>),
}

/// Opened weight files, answering tensor requests by [`TensorId`]. Every matrix and vector it
/// returns is a copy in memory the process owns; dropping the `Weights` closes the files.
pub struct Weights {
    files: Files,
    hf_names: HfNames,
    /// Prefix of every HF decoder tensor name (e.g. `llm.` in MiniCPM-V packs); empty by default.
    hf_prefix: String,
    /// The pack's cache of packed weights (GGUF only), see [`Weights::with_pack_cache`].
    pack_cache: Option<Arc<PackCache>>,
}

fn fail(e: impl std::fmt::Display) -> PluginError {
    PluginError::failed(e.to_string())
}

/// A safetensors tensor found by name: its file, dtype, shape and absolute byte offset.
type StTensor<'a> = (&'a Source<SafetensorsFile>, Dtype, Vec<usize>, usize);

impl Weights {
    /// Opens a GGUF file (its header parsed; tensors are read when asked for).
    pub fn open_gguf(path: impl AsRef<Path>) -> Result<Weights, PluginError> {
        let gguf = Source::open(path.as_ref(), |p| GgufFile::read_header(p).map_err(fail))?;
        Ok(Weights {
            files: Files::Gguf(gguf),
            hf_names: HfNames::Standard,
            hf_prefix: String::new(),
            pack_cache: None,
        })
    }

    /// Opens safetensors shards (their headers parsed; tensors are read when asked for).
    pub fn open_safetensors(paths: &[PathBuf]) -> Result<Weights, PluginError> {
        if paths.is_empty() {
            return Err(PluginError::failed("no safetensors files"));
        }
        let files = paths
            .iter()
            .map(|p| Source::open(p, |p| SafetensorsFile::read_header(p).map_err(fail)))
            .collect::<Result<Vec<_>, _>>()?;
        Ok(Weights {
            files: Files::Safetensors(files),
            hf_names: HfNames::Standard,
            hf_prefix: String::new(),
            pack_cache: None,
        })
    }

    /// Reads matrices through the cache of packed weights in `pack_dir` ([`crate::pack_cache`]):
    /// a GGUF matrix the cache holds for this very file comes back held only packed, without
    /// reading its rows; every other one is read as usual and remembered, so that
    /// [`crate::decoder::DecoderWeights::store_packed`] can write the cache after packing.
    /// Safetensors weights have no cache (they are converted at load, not only packed).
    pub fn with_pack_cache(mut self, pack_dir: &Path) -> Result<Weights, PluginError> {
        if let Files::Gguf(g) = &self.files {
            let meta = g
                .file
                .metadata()
                .map_err(|e| PluginError::failed(format!("{}: {e}", g.path.display())))?;
            self.pack_cache = Some(Arc::new(PackCache::open(pack_dir, SourceId::of(&meta))));
        }
        Ok(self)
    }

    /// The cache of packed weights these weights read through, if any.
    pub fn pack_cache(&self) -> Option<&Arc<PackCache>> {
        self.pack_cache.as_ref()
    }

    /// Sets how HF norm names are read (default [`HfNames::Standard`]).
    pub fn with_hf_names(mut self, names: HfNames) -> Weights {
        self.hf_names = names;
        self
    }

    /// Puts `prefix` before every HF decoder tensor name looked up by [`TensorId`] (the language
    /// model of a multimodal pack, e.g. `llm.` for `llm.model.layers.0.…`); names given in full
    /// (`*_named`) are unaffected.
    pub fn with_hf_prefix(mut self, prefix: &str) -> Weights {
        self.hf_prefix = prefix.to_string();
        self
    }

    /// The file format.
    pub fn format(&self) -> WeightFormat {
        match self.files {
            Files::Gguf(_) => WeightFormat::Gguf,
            Files::Safetensors(_) => WeightFormat::Safetensors,
        }
    }

    /// The GGUF file's header (metadata and tensor index), when reading GGUF.
    pub fn gguf(&self) -> Option<&GgufFile> {
        match &self.files {
            Files::Gguf(g) => Some(&g.index),
            Files::Safetensors(_) => None,
        }
    }

    /// The file-format name of a tensor.
    pub fn name_of(&self, id: &TensorId) -> String {
        match self.files {
            Files::Gguf(_) => id.gguf_name(),
            Files::Safetensors(_) => format!("{}{}", self.hf_prefix, id.hf_name(self.hf_names)),
        }
    }

    fn find_st(&self, name: &str) -> Option<StTensor<'_>> {
        let Files::Safetensors(files) = &self.files else {
            return None;
        };
        // A headless checkpoint (transformers' `AutoModel`, e.g. an embedding model's
        // `Gemma3TextModel`) names its tensors without the `model.` of the language model.
        let bare = name.strip_prefix("model.");
        files.iter().find_map(|f| {
            let t = f
                .index
                .tensor(name)
                .or_else(|| bare.and_then(|b| f.index.tensor(b)))?;
            let shape = t.shape.iter().map(|&d| d as usize).collect();
            Some((f, t.dtype.clone(), shape, t.data_offsets.0 as usize))
        })
    }

    /// Whether the tensor exists.
    pub fn has(&self, id: &TensorId) -> bool {
        self.has_named(&self.name_of(id))
    }

    /// The shape of a tensor, innermost (GGUF) or outermost (safetensors) first as stored.
    pub fn shape(&self, id: &TensorId) -> Option<Vec<usize>> {
        let name = self.name_of(id);
        match &self.files {
            Files::Gguf(g) => Some(g.index.tensor(&name)?.dims.iter().map(|&d| d as usize).collect()),
            Files::Safetensors(_) => self.find_st(&name).map(|t| t.2),
        }
    }

    /// The storage type of a matrix or vector, without reading it.
    pub fn wtype(&self, id: &TensorId) -> Result<WeightType, PluginError> {
        let name = self.name_of(id);
        let missing = || PluginError::failed(format!("missing tensor {name}"));
        match &self.files {
            Files::Gguf(g) => gguf_wtype(&name, g.index.tensor(&name).ok_or_else(missing)?.ggml_type.id()),
            Files::Safetensors(_) => st_wtype(&name, &self.find_st(&name).ok_or_else(missing)?.1),
        }
    }

    /// A 2-D tensor as a [`Matrix`] (read into memory the process owns).
    pub fn matrix(&self, id: &TensorId) -> Result<Matrix, PluginError> {
        self.matrix_named(&self.name_of(id))
    }

    /// A 2-D tensor by its file-format name (for tensors outside the [`Role`] table).
    pub fn matrix_named(&self, name: &str) -> Result<Matrix, PluginError> {
        // Set for a GGUF matrix read through the pack's cache (kept for it after packing).
        let mut origin_of_read = None;
        let (wtype, rows, cols, bytes) = match &self.files {
            Files::Gguf(g) => {
                let t = g
                    .index
                    .tensor(name)
                    .ok_or_else(|| PluginError::failed(format!("missing tensor {name}")))?;
                if t.dims.len() != 2 {
                    return Err(PluginError::failed(format!(
                        "{name}: expected 2-D, got {:?}",
                        t.dims
                    )));
                }
                let wtype = gguf_wtype(name, t.ggml_type.id())?;
                let (rows, cols) = (t.dims[1] as usize, t.dims[0] as usize);
                let len = whole_rows(name, wtype, rows, cols)?;
                if let Some(cache) = &self.pack_cache {
                    let origin = |from_cache| Origin {
                        cache: cache.clone(),
                        name: name.to_string(),
                        from_cache,
                    };
                    if let Some(p) = cache.read(name, wtype, rows, cols) {
                        return Ok(Matrix::from_packed(p, origin(true)));
                    }
                    origin_of_read = Some(origin(false));
                }
                let bytes = g.read(name, t.offset as usize, len)?;
                (wtype, rows, cols, bytes)
            }
            Files::Safetensors(_) => {
                let (f, dtype, shape, start) = self
                    .find_st(name)
                    .ok_or_else(|| PluginError::failed(format!("missing tensor {name}")))?;
                if shape.len() != 2 {
                    return Err(PluginError::failed(format!(
                        "{name}: expected 2-D, got {shape:?}"
                    )));
                }
                let wtype = st_wtype(name, &dtype)?;
                let bytes = f.read(name, start, whole_rows(name, wtype, shape[0], shape[1])?)?;
                (wtype, shape[0], shape[1], bytes)
            }
        };
        Ok(Matrix::new(Arc::new(bytes), 0, wtype, rows, cols)
            .map_err(|e| PluginError::failed(format!("{name}: {}", e.message)))?
            .with_origin(origin_of_read))
    }

    /// A tensor of any shape as f32 values (norm weights, biases).
    pub fn vector(&self, id: &TensorId) -> Result<Vec<f32>, PluginError> {
        self.vector_named(&self.name_of(id))
    }

    /// A tensor of any shape as f32 values, by its file-format name.
    pub fn vector_named(&self, name: &str) -> Result<Vec<f32>, PluginError> {
        let missing = || PluginError::failed(format!("missing tensor {name}"));
        let bad_size = || PluginError::failed(format!("{name}: bad size"));
        let (wtype, bytes, n) = match &self.files {
            Files::Gguf(g) => {
                let t = g.index.tensor(name).ok_or_else(missing)?;
                let wtype = gguf_wtype(name, t.ggml_type.id())?;
                let n = t.n_elements() as usize;
                if !n.is_multiple_of(wtype.block_size()) || (t.n_bytes as usize) < wtype.row_bytes(n) {
                    return Err(bad_size());
                }
                (wtype, g.read(name, t.offset as usize, wtype.row_bytes(n))?, n)
            }
            Files::Safetensors(_) => {
                let (f, dtype, shape, start) = self.find_st(name).ok_or_else(missing)?;
                let wtype = st_wtype(name, &dtype)?;
                let n: usize = shape.iter().product();
                if !n.is_multiple_of(wtype.block_size()) {
                    return Err(bad_size());
                }
                (wtype, f.read(name, start, wtype.row_bytes(n))?, n)
            }
        };
        let mut out = vec![0.0; n];
        wtype.dequantize_row(&bytes, &mut out);
        Ok(out)
    }

    /// An optional vector: `None` when absent.
    pub fn vector_opt(&self, id: &TensorId) -> Result<Option<Vec<f32>>, PluginError> {
        if self.has(id) {
            self.vector(id).map(Some)
        } else {
            Ok(None)
        }
    }

    /// The `n_experts` matrices of an expert role in layer `layer`: slices of the GGUF 3-D tensor
    /// (`[cols, rows, experts]`, read once), or the per-expert HF tensors.
    pub fn experts(&self, role: Role, layer: usize, n_experts: usize) -> Result<Vec<Matrix>, PluginError> {
        let id = TensorId::layer(role, layer);
        match &self.files {
            Files::Gguf(g) => {
                let name = id.gguf_name();
                let t = g
                    .index
                    .tensor(&name)
                    .ok_or_else(|| PluginError::failed(format!("missing tensor {name}")))?;
                if t.dims.len() != 3 || t.dims[2] as usize != n_experts {
                    return Err(PluginError::failed(format!(
                        "{name}: expected [cols, rows, {n_experts}], got {:?}",
                        t.dims
                    )));
                }
                let wtype = gguf_wtype(&name, t.ggml_type.id())?;
                let dims = [n_experts, t.dims[1] as usize, t.dims[0] as usize];
                self.gguf_stack(&name, g, t.offset as usize, wtype, dims)
            }
            Files::Safetensors(_) => (0..n_experts).map(|e| self.matrix(&id.expert(e))).collect(),
        }
    }

    /// The shape and raw bytes of a one-byte-per-element safetensors tensor (`U8`, `I8`, `F8_*`)
    /// by name: packed formats such as MXFP4's `*_blocks` and `*_scales` (see [`crate::mxfp4`]).
    pub fn bytes_named(&self, name: &str) -> Result<(Vec<usize>, Vec<u8>), PluginError> {
        let (f, dtype, shape, start) = self
            .find_st(name)
            .ok_or_else(|| PluginError::failed(format!("missing tensor {name}")))?;
        if !matches!(
            dtype,
            Dtype::U8 | Dtype::I8 | Dtype::F8_E4M3 | Dtype::F8_E5M2 | Dtype::F8_E8M0
        ) {
            return Err(PluginError::failed(format!(
                "{name}: dtype {} is not one byte per element",
                dtype.name()
            )));
        }
        let t = f
            .index
            .tensor(name)
            .or_else(|| f.index.tensor(name.strip_prefix("model.")?));
        let stored = t.map_or(0, |t| (t.data_offsets.1 - t.data_offsets.0) as usize);
        let len = shape.iter().product::<usize>();
        if stored != len {
            return Err(PluginError::failed(format!(
                "{name}: data does not match shape {shape:?}"
            )));
        }
        Ok((shape, f.read(name, start, len)?))
    }

    /// Whether a tensor exists, by its file-format name.
    pub fn has_named(&self, name: &str) -> bool {
        match &self.files {
            Files::Gguf(g) => g.index.tensor(name).is_some(),
            Files::Safetensors(_) => self.find_st(name).is_some(),
        }
    }

    /// [`stack`] of a GGUF tensor through the pack's cache: matrix `e` of tensor `name` is
    /// `name#e` there; when the cache holds every one of them, all come back held only packed
    /// and the tensor is not read.
    fn gguf_stack(
        &self,
        name: &str,
        g: &Source<GgufFile>,
        start: usize,
        wtype: WeightType,
        dims: [usize; 3],
    ) -> Result<Vec<Matrix>, PluginError> {
        let Some(cache) = &self.pack_cache else {
            return stack(name, g, start, wtype, dims);
        };
        let [n, rows, cols] = dims;
        let origin = |e: usize, from_cache| Origin {
            cache: cache.clone(),
            name: format!("{name}#{e}"),
            from_cache,
        };
        let cached: Option<Vec<Matrix>> = (0..n)
            .map(|e| {
                let p = cache.read(&format!("{name}#{e}"), wtype, rows, cols)?;
                Some(Matrix::from_packed(p, origin(e, true)))
            })
            .collect();
        if let Some(all) = cached {
            return Ok(all);
        }
        let all = stack(name, g, start, wtype, dims)?;
        Ok(all
            .into_iter()
            .enumerate()
            .map(|(e, m)| m.with_origin(Some(origin(e, false))))
            .collect())
    }

    /// The matrices of a 3-D tensor by name, split along its outermost dimension: safetensors
    /// `[n, rows, cols]` or GGUF `[cols, rows, n]` (stacked experts); the tensor is read once and
    /// the matrices share it.
    pub fn stacked_named(&self, name: &str) -> Result<Vec<Matrix>, PluginError> {
        let missing = || PluginError::failed(format!("missing tensor {name}"));
        let not_3d = |dims: String| PluginError::failed(format!("{name}: expected 3-D, got {dims}"));
        match &self.files {
            Files::Gguf(g) => {
                let t = g.index.tensor(name).ok_or_else(missing)?;
                if t.dims.len() != 3 {
                    return Err(not_3d(format!("{:?}", t.dims)));
                }
                let wtype = gguf_wtype(name, t.ggml_type.id())?;
                let dims = [t.dims[2] as usize, t.dims[1] as usize, t.dims[0] as usize];
                self.gguf_stack(name, g, t.offset as usize, wtype, dims)
            }
            Files::Safetensors(_) => {
                let (f, dtype, shape, start) = self.find_st(name).ok_or_else(missing)?;
                if shape.len() != 3 {
                    return Err(not_3d(format!("{shape:?}")));
                }
                stack(
                    name,
                    f,
                    start,
                    st_wtype(name, &dtype)?,
                    [shape[0], shape[1], shape[2]],
                )
            }
        }
    }
}

/// The bytes of `rows` rows of `cols` elements of `wtype`, or an error when the rows are not
/// whole blocks.
fn whole_rows(name: &str, wtype: WeightType, rows: usize, cols: usize) -> Result<usize, PluginError> {
    if !cols.is_multiple_of(wtype.block_size()) {
        return Err(PluginError::failed(format!(
            "{name}: {} rows of {cols} elements are not whole blocks of {}",
            wtype.name(),
            wtype.block_size()
        )));
    }
    Ok(rows * wtype.row_bytes(cols))
}

/// `n` consecutive `rows × cols` matrices of `wtype` at `start` of `file` (`dims = [n, rows,
/// cols]`), read in one piece that the matrices share.
fn stack<F>(
    name: &str,
    file: &Source<F>,
    start: usize,
    wtype: WeightType,
    [n, rows, cols]: [usize; 3],
) -> Result<Vec<Matrix>, PluginError> {
    let per = whole_rows(name, wtype, rows, cols)?;
    let source: Arc<dyn ByteSource> = Arc::new(file.read(name, start, n * per)?);
    (0..n)
        .map(|e| {
            Matrix::new(source.clone(), e * per, wtype, rows, cols)
                .map_err(|e| PluginError::failed(format!("{name}: {}", e.message)))
        })
        .collect()
}

fn gguf_wtype(name: &str, id: u32) -> Result<WeightType, PluginError> {
    WeightType::from_ggml_id(id)
        .ok_or_else(|| PluginError::failed(format!("{name}: unsupported ggml type {id}")))
}

fn st_wtype(name: &str, dtype: &Dtype) -> Result<WeightType, PluginError> {
    match dtype {
        Dtype::F32 => Ok(WeightType::F32),
        Dtype::F16 => Ok(WeightType::F16),
        Dtype::BF16 => Ok(WeightType::BF16),
        d => Err(PluginError::failed(format!(
            "{name}: unsupported dtype {}",
            d.name()
        ))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_map_both_ways() {
        let id = TensorId::layer(Role::AttnQ, 3).bias();
        assert_eq!(id.gguf_name(), "blk.3.attn_q.bias");
        assert_eq!(
            id.hf_name(HfNames::Standard),
            "model.layers.3.self_attn.q_proj.bias"
        );
        assert_eq!(TensorId::from_gguf_name("blk.3.attn_q.bias"), Some(id));
        let ffn = TensorId::layer(Role::FfnNorm, 0);
        assert_eq!(
            ffn.hf_name(HfNames::Standard),
            "model.layers.0.post_attention_layernorm.weight"
        );
        assert_eq!(
            ffn.hf_name(HfNames::Sandwich),
            "model.layers.0.pre_feedforward_layernorm.weight"
        );
        assert_eq!(
            TensorId::from_hf_name(
                "model.layers.0.post_attention_layernorm.weight",
                HfNames::Sandwich
            )
            .unwrap()
            .role,
            Role::PostAttnNorm
        );
        let e = TensorId::layer(Role::FfnUpExps, 1).expert(5);
        assert_eq!(
            e.hf_name(HfNames::Standard),
            "model.layers.1.mlp.experts.5.up_proj.weight"
        );
        assert_eq!(e.gguf_name(), "blk.1.ffn_up_exps.weight");
        assert_eq!(
            TensorId::from_hf_name(&e.hf_name(HfNames::Standard), HfNames::Standard),
            Some(e)
        );
        for g in [Role::TokenEmbd, Role::OutputNorm, Role::Output] {
            let id = TensorId::global(g);
            assert_eq!(TensorId::from_gguf_name(&id.gguf_name()), Some(id));
            assert_eq!(
                TensorId::from_hf_name(&id.hf_name(HfNames::Standard), HfNames::Standard),
                Some(id)
            );
        }
        assert_eq!(
            TensorId::global(Role::Output).hf_name(HfNames::Standard),
            "lm_head.weight"
        );
    }

    #[test]
    fn matrix_rows_dequantize() {
        let m = Matrix::from_f32(2, 3, &[1.0, 2.0, 3.0, 4.0, 5.0, 6.0]);
        let mut out = [0.0; 3];
        m.dequantize_row(1, &mut out);
        assert_eq!(out, [4.0, 5.0, 6.0]);
    }

    #[test]
    fn slice_rows_shares_the_bytes() {
        let m = Matrix::from_f32(3, 2, &[1.0, 2.0, 3.0, 4.0, 5.0, 6.0]);
        let s = m.slice_rows(1, 2);
        let mut out = [0.0; 2];
        s.dequantize_row(1, &mut out);
        assert_eq!((s.rows, out), (2, [5.0, 6.0]));
    }

    /// A GGUF of two 16 × 32 matrices, `a.weight` (f32) then `b.weight` (Q8_0), in `dir`.
    fn two_matrices(dir: &Path) -> PathBuf {
        use berth_formats::testutil::GgufWriter;
        use berth_formats::GgmlType;
        let bytes = GgufWriter::new()
            .str("general.architecture", "test")
            .tensor("a.weight", &[32, 16], GgmlType::F32)
            .tensor("b.weight", &[32, 16], GgmlType::Q8_0)
            .build();
        let path = dir.join("model.gguf");
        std::fs::write(&path, bytes).unwrap();
        path
    }

    #[test]
    fn tensors_read_survive_their_file_and_a_file_cut_while_loading_is_an_error_naming_it() {
        let dir = tempfile::tempdir().unwrap();
        let path = two_matrices(dir.path());
        let w = Weights::open_gguf(&path).unwrap();
        let a = w.matrix_named("a.weight").unwrap();
        let mut want = [0.0; 32];
        a.dequantize_row(15, &mut want);
        let b_at = w.gguf().unwrap().tensor("b.weight").unwrap().offset;
        // Cut inside `b` after the header was read: reading it is an error, not a signal.
        std::fs::OpenOptions::new()
            .write(true)
            .open(&path)
            .unwrap()
            .set_len(b_at + 10)
            .unwrap();
        let e = w.matrix_named("b.weight").unwrap_err().message;
        assert!(
            e.contains("model.gguf") && e.contains("truncated") && e.contains("b.weight"),
            "{e}"
        );
        // What was read is the process's own: the file's fate does not reach it.
        drop(w);
        std::fs::remove_file(&path).unwrap();
        let mut got = [0.0; 32];
        a.dequantize_row(15, &mut got);
        assert_eq!(got.map(f32::to_bits), want.map(f32::to_bits));
    }

    #[test]
    fn a_matrix_for_serving_is_packed_once_and_keeps_its_rows_only_when_asked() {
        let dir = tempfile::tempdir().unwrap();
        let w = Weights::open_gguf(two_matrices(dir.path())).unwrap();
        let b = w.matrix_named("b.weight").unwrap();
        let packs = PackedMatrix::covers(WeightType::Q8_0);
        let served = b.for_serving(false);
        assert_eq!(served.has_rows(), !packs);
        assert_eq!(served.packed().is_some(), packs);
        let tied = b.for_serving(true);
        assert!(tied.has_rows() && tied.same_as(&b) && tied.row(3) == b.row(3));
        // A type the packed kernels do not take keeps its rows.
        let a = w.matrix_named("a.weight").unwrap().for_serving(false);
        assert!(a.has_rows() && a.packed().is_none());
    }
}
