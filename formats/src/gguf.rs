//! A GGUF (v2 and v3) reader over a memory map.
//!
//! The header, metadata and tensor table are parsed once at open time and every count, length and
//! offset is checked against the file size first, so a truncated or hostile file gives a
//! [`GgufError`] instead of a panic or a huge allocation. Tensor data stays in the map.

use std::cell::Cell;
use std::fmt;
use std::fs::File;
use std::path::{Path, PathBuf};

use memmap2::Mmap;

/// The four bytes every GGUF file starts with.
pub const GGUF_MAGIC: [u8; 4] = *b"GGUF";
/// Tensor data alignment when `general.alignment` is absent.
pub const DEFAULT_ALIGNMENT: u64 = 32;

/// Arrays nested deeper than this are rejected (guards the recursive parser's stack).
const MAX_ARRAY_DEPTH: usize = 8;
/// Bytes [`GgufFile::read_header`] reads first (a test lowers it to make the header outgrow it).
#[cfg(not(test))]
const FIRST_HEADER_READ: u64 = 16 << 20;
#[cfg(test)]
const FIRST_HEADER_READ: u64 = 1 << 20;

/// ggml supports 4 dimensions; leave room, but refuse absurd counts.
const MAX_DIMS: u32 = 8;

/// Why a GGUF file could not be read.
#[derive(Debug, thiserror::Error)]
pub enum GgufError {
    /// The file could not be opened or mapped.
    #[error("{path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The underlying error.
        source: std::io::Error,
    },
    /// The file does not start with `GGUF`.
    #[error("{path}: not a GGUF file (magic {found:02x?})")]
    BadMagic {
        /// The file.
        path: PathBuf,
        /// The first bytes found.
        found: Vec<u8>,
    },
    /// The GGUF version is not 2 or 3.
    #[error("{path}: unsupported GGUF version {version} (supported: 2, 3)")]
    UnsupportedVersion {
        /// The file.
        path: PathBuf,
        /// The version found.
        version: u32,
    },
    /// The file ends before the structure it announces.
    #[error("{path}: truncated: {what} at byte {offset} runs past the end of the file ({file_len} bytes)")]
    Truncated {
        /// The file.
        path: PathBuf,
        /// What was being read.
        what: String,
        /// Where it starts.
        offset: u64,
        /// The file's length.
        file_len: u64,
    },
    /// The file is structurally invalid.
    #[error("{path}: invalid GGUF: {msg}")]
    Invalid {
        /// The file.
        path: PathBuf,
        /// What is wrong.
        msg: String,
    },
}

/// The type tag of a metadata value, as stored in the file.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum GgufValueType {
    /// 8-bit unsigned.
    U8,
    /// 8-bit signed.
    I8,
    /// 16-bit unsigned.
    U16,
    /// 16-bit signed.
    I16,
    /// 32-bit unsigned.
    U32,
    /// 32-bit signed.
    I32,
    /// 32-bit float.
    F32,
    /// Boolean (one byte).
    Bool,
    /// Length-prefixed UTF-8 string.
    String,
    /// Typed array.
    Array,
    /// 64-bit unsigned.
    U64,
    /// 64-bit signed.
    I64,
    /// 64-bit float.
    F64,
}

impl GgufValueType {
    /// The type for a tag id, if it is one of the thirteen defined ones.
    pub fn from_id(id: u32) -> Option<Self> {
        use GgufValueType::*;
        Some(match id {
            0 => U8,
            1 => I8,
            2 => U16,
            3 => I16,
            4 => U32,
            5 => I32,
            6 => F32,
            7 => Bool,
            8 => String,
            9 => Array,
            10 => U64,
            11 => I64,
            12 => F64,
            _ => return None,
        })
    }

    /// The smallest number of bytes a value of this type occupies.
    fn min_size(self) -> u64 {
        use GgufValueType::*;
        match self {
            U8 | I8 | Bool => 1,
            U16 | I16 => 2,
            U32 | I32 | F32 => 4,
            U64 | I64 | F64 | String => 8,
            Array => 12,
        }
    }
}

/// A metadata value.
#[derive(Debug, Clone, PartialEq)]
pub enum GgufValue {
    /// 8-bit unsigned.
    U8(u8),
    /// 8-bit signed.
    I8(i8),
    /// 16-bit unsigned.
    U16(u16),
    /// 16-bit signed.
    I16(i16),
    /// 32-bit unsigned.
    U32(u32),
    /// 32-bit signed.
    I32(i32),
    /// 64-bit unsigned.
    U64(u64),
    /// 64-bit signed.
    I64(i64),
    /// 32-bit float.
    F32(f32),
    /// 64-bit float.
    F64(f64),
    /// Boolean.
    Bool(bool),
    /// String (invalid UTF-8 replaced, not rejected).
    String(String),
    /// Array of values of one type (possibly nested arrays).
    Array(Vec<GgufValue>),
}

impl GgufValue {
    /// The value as an unsigned integer, for any integer type holding a non-negative value.
    pub fn as_u64(&self) -> Option<u64> {
        match *self {
            GgufValue::U8(v) => Some(v.into()),
            GgufValue::U16(v) => Some(v.into()),
            GgufValue::U32(v) => Some(v.into()),
            GgufValue::U64(v) => Some(v),
            GgufValue::I8(v) => u64::try_from(v).ok(),
            GgufValue::I16(v) => u64::try_from(v).ok(),
            GgufValue::I32(v) => u64::try_from(v).ok(),
            GgufValue::I64(v) => u64::try_from(v).ok(),
            _ => None,
        }
    }

    /// The value as a signed integer, for any integer type that fits.
    pub fn as_i64(&self) -> Option<i64> {
        match *self {
            GgufValue::I8(v) => Some(v.into()),
            GgufValue::I16(v) => Some(v.into()),
            GgufValue::I32(v) => Some(v.into()),
            GgufValue::I64(v) => Some(v),
            _ => self.as_u64().and_then(|v| i64::try_from(v).ok()),
        }
    }

    /// The value as a float, for `F32` and `F64` values.
    pub fn as_f32(&self) -> Option<f32> {
        match *self {
            GgufValue::F32(v) => Some(v),
            GgufValue::F64(v) => Some(v as f32),
            _ => None,
        }
    }

    /// The value as a boolean.
    pub fn as_bool(&self) -> Option<bool> {
        match *self {
            GgufValue::Bool(v) => Some(v),
            _ => None,
        }
    }

    /// The value as a string slice.
    pub fn as_str(&self) -> Option<&str> {
        match self {
            GgufValue::String(s) => Some(s),
            _ => None,
        }
    }

    /// The value as an array.
    pub fn as_array(&self) -> Option<&[GgufValue]> {
        match self {
            GgufValue::Array(v) => Some(v),
            _ => None,
        }
    }

    /// A short description for listings: scalars in full, arrays as `[type; len]`.
    pub fn summary(&self) -> String {
        match self {
            GgufValue::Array(v) => {
                let inner = v.first().map(GgufValue::type_name).unwrap_or("?");
                format!("[{inner}; {}]", v.len())
            }
            GgufValue::String(s) if s.chars().count() > 60 => {
                let head: String = s.chars().take(57).collect();
                format!("{head:?}...")
            }
            other => other.to_string(),
        }
    }

    /// The name of the value's type (`u32`, `string`, `array`, ...).
    pub fn type_name(&self) -> &'static str {
        match self {
            GgufValue::U8(_) => "u8",
            GgufValue::I8(_) => "i8",
            GgufValue::U16(_) => "u16",
            GgufValue::I16(_) => "i16",
            GgufValue::U32(_) => "u32",
            GgufValue::I32(_) => "i32",
            GgufValue::U64(_) => "u64",
            GgufValue::I64(_) => "i64",
            GgufValue::F32(_) => "f32",
            GgufValue::F64(_) => "f64",
            GgufValue::Bool(_) => "bool",
            GgufValue::String(_) => "string",
            GgufValue::Array(_) => "array",
        }
    }
}

impl fmt::Display for GgufValue {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            GgufValue::U8(v) => write!(f, "{v}"),
            GgufValue::I8(v) => write!(f, "{v}"),
            GgufValue::U16(v) => write!(f, "{v}"),
            GgufValue::I16(v) => write!(f, "{v}"),
            GgufValue::U32(v) => write!(f, "{v}"),
            GgufValue::I32(v) => write!(f, "{v}"),
            GgufValue::U64(v) => write!(f, "{v}"),
            GgufValue::I64(v) => write!(f, "{v}"),
            GgufValue::F32(v) => write!(f, "{v}"),
            GgufValue::F64(v) => write!(f, "{v}"),
            GgufValue::Bool(v) => write!(f, "{v}"),
            GgufValue::String(v) => write!(f, "{v:?}"),
            GgufValue::Array(v) => {
                f.write_str("[")?;
                for (i, x) in v.iter().enumerate() {
                    if i > 0 {
                        f.write_str(", ")?;
                    }
                    write!(f, "{x}")?;
                }
                f.write_str("]")
            }
        }
    }
}

/// A ggml tensor element type, by its id in the file.
#[allow(non_camel_case_types)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum GgmlType {
    /// 32-bit float.
    F32,
    /// 16-bit float.
    F16,
    /// 4-bit, blocks of 32, scale.
    Q4_0,
    /// 4-bit, blocks of 32, scale and min.
    Q4_1,
    /// 5-bit, blocks of 32, scale.
    Q5_0,
    /// 5-bit, blocks of 32, scale and min.
    Q5_1,
    /// 8-bit, blocks of 32, scale.
    Q8_0,
    /// 8-bit, blocks of 32, scale and sum.
    Q8_1,
    /// 2-bit k-quant.
    Q2_K,
    /// 3-bit k-quant.
    Q3_K,
    /// 4-bit k-quant.
    Q4_K,
    /// 5-bit k-quant.
    Q5_K,
    /// 6-bit k-quant.
    Q6_K,
    /// 8-bit k-quant (intermediate).
    Q8_K,
    /// 2.06-bit i-quant.
    IQ2_XXS,
    /// 2.31-bit i-quant.
    IQ2_XS,
    /// 3.06-bit i-quant.
    IQ3_XXS,
    /// 1.56-bit i-quant.
    IQ1_S,
    /// 4.5-bit non-linear, blocks of 32.
    IQ4_NL,
    /// 3.44-bit i-quant.
    IQ3_S,
    /// 2.5-bit i-quant.
    IQ2_S,
    /// 4.25-bit non-linear i-quant.
    IQ4_XS,
    /// 8-bit integer.
    I8,
    /// 16-bit integer.
    I16,
    /// 32-bit integer.
    I32,
    /// 64-bit integer.
    I64,
    /// 64-bit float.
    F64,
    /// 1.75-bit i-quant.
    IQ1_M,
    /// bfloat16.
    BF16,
    /// Ternary, 1.69 bits.
    TQ1_0,
    /// Ternary, 2.06 bits.
    TQ2_0,
    /// Microscaling FP4, blocks of 32.
    MXFP4,
    /// An id this reader does not know.
    Unknown(u32),
}

impl GgmlType {
    /// The type for an id; unassigned ids map to [`GgmlType::Unknown`].
    pub fn from_id(id: u32) -> Self {
        use GgmlType::*;
        match id {
            0 => F32,
            1 => F16,
            2 => Q4_0,
            3 => Q4_1,
            6 => Q5_0,
            7 => Q5_1,
            8 => Q8_0,
            9 => Q8_1,
            10 => Q2_K,
            11 => Q3_K,
            12 => Q4_K,
            13 => Q5_K,
            14 => Q6_K,
            15 => Q8_K,
            16 => IQ2_XXS,
            17 => IQ2_XS,
            18 => IQ3_XXS,
            19 => IQ1_S,
            20 => IQ4_NL,
            21 => IQ3_S,
            22 => IQ2_S,
            23 => IQ4_XS,
            24 => I8,
            25 => I16,
            26 => I32,
            27 => I64,
            28 => F64,
            29 => IQ1_M,
            30 => BF16,
            34 => TQ1_0,
            35 => TQ2_0,
            39 => MXFP4,
            other => Unknown(other),
        }
    }

    /// The type's id in the file.
    pub fn id(self) -> u32 {
        use GgmlType::*;
        match self {
            F32 => 0,
            F16 => 1,
            Q4_0 => 2,
            Q4_1 => 3,
            Q5_0 => 6,
            Q5_1 => 7,
            Q8_0 => 8,
            Q8_1 => 9,
            Q2_K => 10,
            Q3_K => 11,
            Q4_K => 12,
            Q5_K => 13,
            Q6_K => 14,
            Q8_K => 15,
            IQ2_XXS => 16,
            IQ2_XS => 17,
            IQ3_XXS => 18,
            IQ1_S => 19,
            IQ4_NL => 20,
            IQ3_S => 21,
            IQ2_S => 22,
            IQ4_XS => 23,
            I8 => 24,
            I16 => 25,
            I32 => 26,
            I64 => 27,
            F64 => 28,
            IQ1_M => 29,
            BF16 => 30,
            TQ1_0 => 34,
            TQ2_0 => 35,
            MXFP4 => 39,
            Unknown(id) => id,
        }
    }

    /// Elements per block (1 for plain types; 0 when unknown).
    pub fn block_size(self) -> u64 {
        use GgmlType::*;
        match self {
            F32 | F16 | BF16 | F64 | I8 | I16 | I32 | I64 => 1,
            Q4_0 | Q4_1 | Q5_0 | Q5_1 | Q8_0 | Q8_1 | IQ4_NL | MXFP4 => 32,
            Q2_K | Q3_K | Q4_K | Q5_K | Q6_K | Q8_K | IQ2_XXS | IQ2_XS | IQ3_XXS | IQ1_S | IQ3_S | IQ2_S
            | IQ4_XS | IQ1_M | TQ1_0 | TQ2_0 => 256,
            Unknown(_) => 0,
        }
    }

    /// Bytes per block (0 when unknown).
    pub fn type_size(self) -> u64 {
        use GgmlType::*;
        match self {
            F32 | I32 => 4,
            F16 | BF16 | I16 => 2,
            F64 | I64 => 8,
            I8 => 1,
            Q4_0 | IQ4_NL => 18,
            Q4_1 => 20,
            Q5_0 => 22,
            Q5_1 => 24,
            Q8_0 => 34,
            Q8_1 => 36,
            Q2_K => 84,
            Q3_K => 110,
            Q4_K => 144,
            Q5_K => 176,
            Q6_K => 210,
            Q8_K => 292,
            IQ2_XXS => 66,
            IQ2_XS => 74,
            IQ3_XXS => 98,
            IQ1_S => 50,
            IQ3_S => 110,
            IQ2_S => 82,
            IQ4_XS => 136,
            IQ1_M => 56,
            TQ1_0 => 54,
            TQ2_0 => 66,
            MXFP4 => 17,
            Unknown(_) => 0,
        }
    }

    /// The conventional name (`"Q4_K"`, `"BF16"`, `"type42"` for unknown ids).
    pub fn name(self) -> String {
        match self {
            GgmlType::Unknown(id) => format!("type{id}"),
            known => format!("{known:?}"),
        }
    }

    /// Bytes for `n_elements` of this type, if known and a whole number of blocks.
    pub fn bytes_for(self, n_elements: u64) -> Option<u64> {
        let bs = self.block_size();
        if bs == 0 || !n_elements.is_multiple_of(bs) {
            return None;
        }
        (n_elements / bs).checked_mul(self.type_size())
    }
}

impl fmt::Display for GgmlType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.name())
    }
}

/// The llama.cpp name of a `general.file_type` value (its `LLAMA_FTYPE_MOSTLY_*` numbering).
pub fn file_type_name(file_type: u32) -> Option<&'static str> {
    // Bit 10 marks a file type guessed by the converter; the number underneath still applies.
    Some(match file_type & !1024 {
        0 => "F32",
        1 => "F16",
        2 => "Q4_0",
        3 => "Q4_1",
        7 => "Q8_0",
        8 => "Q5_0",
        9 => "Q5_1",
        10 => "Q2_K",
        11 => "Q3_K_S",
        12 => "Q3_K_M",
        13 => "Q3_K_L",
        14 => "Q4_K_S",
        15 => "Q4_K_M",
        16 => "Q5_K_S",
        17 => "Q5_K_M",
        18 => "Q6_K",
        19 => "IQ2_XXS",
        20 => "IQ2_XS",
        21 => "Q2_K_S",
        22 => "IQ3_XS",
        23 => "IQ3_XXS",
        24 => "IQ1_S",
        25 => "IQ4_NL",
        26 => "IQ3_S",
        27 => "IQ3_M",
        28 => "IQ2_S",
        29 => "IQ2_M",
        30 => "IQ4_XS",
        31 => "IQ1_M",
        32 => "BF16",
        36 => "TQ1_0",
        37 => "TQ2_0",
        38 => "MXFP4_MOE",
        _ => return None,
    })
}

/// One entry of the tensor table.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TensorInfo {
    /// Tensor name (`blk.0.attn_q.weight`).
    pub name: String,
    /// Dimensions, innermost first (ggml order).
    pub dims: Vec<u64>,
    /// Element type.
    pub ggml_type: GgmlType,
    /// Absolute byte offset of the data in the file.
    pub offset: u64,
    /// Bytes of data.
    pub n_bytes: u64,
}

impl TensorInfo {
    /// The number of elements (product of the dimensions).
    pub fn n_elements(&self) -> u64 {
        self.dims.iter().product()
    }
}

/// An open GGUF file: parsed header and tables plus the mapped file ([`GgufFile::open`]) or only
/// the header's bytes ([`GgufFile::read_header`]).
pub struct GgufFile {
    /// The path the file was opened from.
    pub path: PathBuf,
    /// GGUF format version (2 or 3).
    pub version: u32,
    /// Tensor data alignment (`general.alignment`, default 32).
    pub alignment: u64,
    /// Absolute offset of the tensor data section.
    pub data_offset: u64,
    metadata: Vec<(String, GgufValue)>,
    tensors: Vec<TensorInfo>,
    bytes: Held,
}

/// The bytes a [`GgufFile`] holds.
enum Held {
    /// The whole file, mapped ([`GgufFile::open`]).
    Mapped(Mmap),
    /// The header only, read ([`GgufFile::read_header`]).
    Header(Vec<u8>),
}

impl std::ops::Deref for Held {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        match self {
            Held::Mapped(m) => m,
            Held::Header(h) => h,
        }
    }
}

impl fmt::Debug for GgufFile {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("GgufFile")
            .field("path", &self.path)
            .field("version", &self.version)
            .field("metadata", &self.metadata.len())
            .field("tensors", &self.tensors.len())
            .finish()
    }
}

impl GgufFile {
    /// Map and parse a GGUF file, validating its structure against its size.
    pub fn open(path: impl AsRef<Path>) -> Result<GgufFile, GgufError> {
        let path = path.as_ref();
        let io = |source| GgufError::Io {
            path: path.to_path_buf(),
            source,
        };
        let file = File::open(path).map_err(io)?;
        let len = file.metadata().map_err(io)?.len();
        if len < 24 {
            // Too short for the fixed header; say so before mapping (empty maps are awkward).
            let mut head = [0u8; 4];
            let n = std::io::Read::read(&mut &file, &mut head).unwrap_or(0);
            if n == 4 && head != GGUF_MAGIC {
                return Err(GgufError::BadMagic {
                    path: path.to_path_buf(),
                    found: head.to_vec(),
                });
            }
            return Err(GgufError::Truncated {
                path: path.to_path_buf(),
                what: "header".into(),
                offset: 0,
                file_len: len,
            });
        }
        // SAFETY: the map is read-only and private to this value. Another process truncating or
        // rewriting the file while it is mapped is outside what Rust can guard against; the store
        // never modifies a weights file in place (imports build new files and rename them).
        let mmap = unsafe { Mmap::map(&file) }.map_err(io)?;
        let parsed = Parser::new(&mmap, len, path, &Cell::new(false)).parse()?;
        Ok(GgufFile::new(path, parsed, Held::Mapped(mmap)))
    }

    /// Reads and parses the header (metadata and tensor index) of a GGUF file with plain reads,
    /// mapping nothing, and checks the tensors' extents against the file's length as
    /// [`GgufFile::open`] does. A file cut or rewritten meanwhile is an error or a file parsed as
    /// it was, never a signal; and nothing of the file is held afterwards but the header's bytes:
    /// [`GgufFile::bytes`] is the header and [`GgufFile::tensor_data`] empty (read tensors
    /// from the file at their [`TensorInfo::offset`]).
    pub fn read_header(path: impl AsRef<Path>) -> Result<GgufFile, GgufError> {
        use std::os::unix::fs::FileExt;
        let path = path.as_ref();
        let io = |source| GgufError::Io {
            path: path.to_path_buf(),
            source,
        };
        let file = File::open(path).map_err(io)?;
        let len = file.metadata().map_err(io)?.len();
        if len < 24 {
            // The short-file errors, as `open` words them (it maps nothing that short).
            return GgufFile::open(path);
        }
        // Headers are mostly vocabularies (a few MB; 262k tokens take about 10): read 16 MiB,
        // more while too short.
        let mut prefix = len.min(FIRST_HEADER_READ);
        loop {
            let mut buf = vec![0u8; prefix as usize];
            file.read_exact_at(&mut buf, 0).map_err(|e| match e.kind() {
                std::io::ErrorKind::UnexpectedEof => GgufError::Truncated {
                    path: path.to_path_buf(),
                    what: "header (the file shrank while it was read)".into(),
                    offset: 0,
                    file_len: file.metadata().map_or(0, |m| m.len()),
                },
                _ => io(e),
            })?;
            let short = Cell::new(false);
            match Parser::new(&buf, len, path, &short).parse() {
                Err(_) if short.get() && prefix < len => prefix = (prefix * 4).min(len),
                parsed => {
                    let parsed = parsed?;
                    buf.truncate(parsed.data_offset.min(prefix) as usize);
                    return Ok(GgufFile::new(path, parsed, Held::Header(buf)));
                }
            }
        }
    }

    fn new(path: &Path, parsed: Parsed, bytes: Held) -> GgufFile {
        GgufFile {
            path: path.to_path_buf(),
            version: parsed.version,
            alignment: parsed.alignment,
            data_offset: parsed.data_offset,
            metadata: parsed.metadata,
            tensors: parsed.tensors,
            bytes,
        }
    }

    /// All metadata key/value pairs, in file order.
    pub fn metadata(&self) -> &[(String, GgufValue)] {
        &self.metadata
    }

    /// The value of a metadata key.
    pub fn get(&self, key: &str) -> Option<&GgufValue> {
        self.metadata.iter().find(|(k, _)| k == key).map(|(_, v)| v)
    }

    /// A string metadata value.
    pub fn get_str(&self, key: &str) -> Option<&str> {
        self.get(key).and_then(GgufValue::as_str)
    }

    /// An integer metadata value of any integer type, if non-negative.
    pub fn get_u64(&self, key: &str) -> Option<u64> {
        self.get(key).and_then(GgufValue::as_u64)
    }

    /// A float metadata value (`f32` or `f64`).
    pub fn get_f32(&self, key: &str) -> Option<f32> {
        self.get(key).and_then(GgufValue::as_f32)
    }

    /// A boolean metadata value.
    pub fn get_bool(&self, key: &str) -> Option<bool> {
        self.get(key).and_then(GgufValue::as_bool)
    }

    /// A string-array metadata value (`None` if any element is not a string).
    pub fn get_str_array(&self, key: &str) -> Option<Vec<&str>> {
        self.get(key)?.as_array()?.iter().map(GgufValue::as_str).collect()
    }

    /// An integer-array metadata value (`None` if any element is not a non-negative integer).
    pub fn get_u64_array(&self, key: &str) -> Option<Vec<u64>> {
        self.get(key)?.as_array()?.iter().map(GgufValue::as_u64).collect()
    }

    /// `general.architecture`.
    pub fn architecture(&self) -> Option<&str> {
        self.get_str("general.architecture")
    }

    /// The tensor table, in file order.
    pub fn tensors(&self) -> &[TensorInfo] {
        &self.tensors
    }

    /// The tensor with the given name.
    pub fn tensor(&self, name: &str) -> Option<&TensorInfo> {
        self.tensors.iter().find(|t| t.name == name)
    }

    /// The bytes of a tensor (empty if the info does not describe a range of this file, or the
    /// file was opened with [`GgufFile::read_header`]).
    pub fn tensor_data(&self, info: &TensorInfo) -> &[u8] {
        let range = usize::try_from(info.offset)
            .ok()
            .zip(usize::try_from(info.n_bytes).ok())
            .and_then(|(start, n)| Some(start..start.checked_add(n)?));
        range.and_then(|r| self.bytes.get(r)).unwrap_or(&[])
    }

    /// The whole mapped file ([`GgufFile::open`]), or its header ([`GgufFile::read_header`]).
    pub fn bytes(&self) -> &[u8] {
        &self.bytes
    }

    /// Total elements over all tensors (the parameter count).
    pub fn parameter_count(&self) -> u64 {
        self.tensors.iter().map(TensorInfo::n_elements).sum()
    }
}

/// Tensor count and bytes per element type, sorted by bytes (largest first).
pub fn quant_mix(file: &GgufFile) -> Vec<(String, usize, u64)> {
    let mut mix: Vec<(GgmlType, usize, u64)> = Vec::new();
    for t in file.tensors() {
        match mix.iter_mut().find(|(ty, _, _)| *ty == t.ggml_type) {
            Some(entry) => {
                entry.1 += 1;
                entry.2 += t.n_bytes;
            }
            None => mix.push((t.ggml_type, 1, t.n_bytes)),
        }
    }
    mix.sort_by(|a, b| b.2.cmp(&a.2).then(a.0.cmp(&b.0)));
    mix.into_iter()
        .map(|(ty, n, bytes)| (ty.name(), n, bytes))
        .collect()
}

struct Parsed {
    version: u32,
    alignment: u64,
    data_offset: u64,
    metadata: Vec<(String, GgufValue)>,
    tensors: Vec<TensorInfo>,
}

struct Parser<'a> {
    /// The file, or its first bytes (see [`GgufFile::read_header`]).
    buf: &'a [u8],
    pos: usize,
    path: &'a Path,
    /// Length of the whole file.
    file_len: u64,
    /// Set when a read ran past `buf` but not past the file: `buf` was too short a prefix.
    short: &'a Cell<bool>,
}

impl<'a> Parser<'a> {
    fn new(buf: &'a [u8], file_len: u64, path: &'a Path, short: &'a Cell<bool>) -> Self {
        Parser {
            buf,
            pos: 0,
            path,
            file_len,
            short,
        }
    }

    /// Bytes of the file after the read position.
    fn remaining(&self) -> u64 {
        self.file_len.saturating_sub(self.pos as u64)
    }

    fn truncated(&self, what: impl Into<String>, offset: usize) -> GgufError {
        GgufError::Truncated {
            path: self.path.to_path_buf(),
            what: what.into(),
            offset: offset as u64,
            file_len: self.file_len,
        }
    }

    fn invalid(&self, msg: impl Into<String>) -> GgufError {
        GgufError::Invalid {
            path: self.path.to_path_buf(),
            msg: msg.into(),
        }
    }

    fn take(&mut self, n: u64, what: &str) -> Result<&'a [u8], GgufError> {
        if n > self.remaining() {
            return Err(self.truncated(what, self.pos));
        }
        if n > (self.buf.len() - self.pos) as u64 {
            self.short.set(true);
            return Err(self.truncated(what, self.pos));
        }
        let start = self.pos;
        self.pos += n as usize;
        Ok(&self.buf[start..self.pos])
    }

    fn array<const N: usize>(&mut self, what: &str) -> Result<[u8; N], GgufError> {
        let bytes = self.take(N as u64, what)?;
        let mut out = [0u8; N];
        out.copy_from_slice(bytes);
        Ok(out)
    }

    fn u32(&mut self, what: &str) -> Result<u32, GgufError> {
        self.array(what).map(u32::from_le_bytes)
    }

    fn u64(&mut self, what: &str) -> Result<u64, GgufError> {
        self.array(what).map(u64::from_le_bytes)
    }

    fn string(&mut self, what: &str) -> Result<String, GgufError> {
        let start = self.pos;
        let len = self.u64(what)?;
        if len > self.remaining() {
            return Err(self.truncated(format!("{what} ({len} bytes)"), start));
        }
        let bytes = self.take(len, what)?;
        Ok(String::from_utf8_lossy(bytes).into_owned())
    }

    /// Check that `count` items of at least `min_size` bytes each can fit in what is left.
    fn check_count(&self, count: u64, min_size: u64, what: &str) -> Result<(), GgufError> {
        match count.checked_mul(min_size) {
            Some(n) if n <= self.remaining() => Ok(()),
            _ => Err(self.truncated(format!("{count} {what}"), self.pos)),
        }
    }

    fn value(&mut self, ty: GgufValueType, key: &str, depth: usize) -> Result<GgufValue, GgufError> {
        use GgufValueType as T;
        Ok(match ty {
            T::U8 => GgufValue::U8(self.array::<1>(key)?[0]),
            T::I8 => GgufValue::I8(i8::from_le_bytes(self.array(key)?)),
            T::U16 => GgufValue::U16(u16::from_le_bytes(self.array(key)?)),
            T::I16 => GgufValue::I16(i16::from_le_bytes(self.array(key)?)),
            T::U32 => GgufValue::U32(u32::from_le_bytes(self.array(key)?)),
            T::I32 => GgufValue::I32(i32::from_le_bytes(self.array(key)?)),
            T::U64 => GgufValue::U64(u64::from_le_bytes(self.array(key)?)),
            T::I64 => GgufValue::I64(i64::from_le_bytes(self.array(key)?)),
            T::F32 => GgufValue::F32(f32::from_le_bytes(self.array(key)?)),
            T::F64 => GgufValue::F64(f64::from_le_bytes(self.array(key)?)),
            T::Bool => GgufValue::Bool(self.array::<1>(key)?[0] != 0),
            T::String => GgufValue::String(self.string(key)?),
            T::Array => {
                if depth >= MAX_ARRAY_DEPTH {
                    return Err(self.invalid(format!("{key}: arrays nested deeper than {MAX_ARRAY_DEPTH}")));
                }
                let elem_id = self.u32(key)?;
                let elem = GgufValueType::from_id(elem_id)
                    .ok_or_else(|| self.invalid(format!("{key}: unknown array element type {elem_id}")))?;
                let count = self.u64(key)?;
                self.check_count(count, elem.min_size(), &format!("array elements of {key}"))?;
                let mut values = Vec::with_capacity(count as usize);
                for _ in 0..count {
                    values.push(self.value(elem, key, depth + 1)?);
                }
                GgufValue::Array(values)
            }
        })
    }

    fn parse(mut self) -> Result<Parsed, GgufError> {
        let magic = self.array::<4>("magic")?;
        if magic != GGUF_MAGIC {
            return Err(GgufError::BadMagic {
                path: self.path.to_path_buf(),
                found: magic.to_vec(),
            });
        }
        let version = self.u32("version")?;
        if version != 2 && version != 3 {
            return Err(GgufError::UnsupportedVersion {
                path: self.path.to_path_buf(),
                version,
            });
        }
        let n_tensors = self.u64("tensor count")?;
        let n_kv = self.u64("metadata count")?;
        // Smallest metadata entry: empty key (8) + type (4) + one byte value.
        self.check_count(n_kv, 13, "metadata entries")?;

        let mut metadata = Vec::with_capacity(n_kv as usize);
        for i in 0..n_kv {
            let key = self.string(&format!("metadata key #{i}"))?;
            let type_id = self.u32(&key)?;
            let ty = GgufValueType::from_id(type_id)
                .ok_or_else(|| self.invalid(format!("{key}: unknown value type {type_id}")))?;
            let value = self.value(ty, &key, 0)?;
            metadata.push((key, value));
        }

        let alignment = match metadata.iter().find(|(k, _)| k == "general.alignment") {
            None => DEFAULT_ALIGNMENT,
            Some((_, v)) => match v.as_u64() {
                Some(a) if a.is_power_of_two() => a,
                _ => return Err(self.invalid(format!("general.alignment {v} is not a power of two"))),
            },
        };

        // Smallest tensor entry: empty name (8) + n_dims (4) + type (4) + offset (8).
        self.check_count(n_tensors, 24, "tensor infos")?;
        let mut raw = Vec::with_capacity(n_tensors as usize);
        for i in 0..n_tensors {
            let name = self.string(&format!("tensor name #{i}"))?;
            let n_dims = self.u32(&name)?;
            if n_dims > MAX_DIMS {
                return Err(self.invalid(format!("tensor {name}: {n_dims} dimensions")));
            }
            let mut dims = Vec::with_capacity(n_dims as usize);
            for _ in 0..n_dims {
                dims.push(self.u64(&name)?);
            }
            let ggml_type = GgmlType::from_id(self.u32(&name)?);
            let rel_offset = self.u64(&name)?;
            raw.push((name, dims, ggml_type, rel_offset));
        }

        let file_len = self.file_len;
        let data_offset = (self.pos as u64).div_ceil(alignment) * alignment;
        if data_offset > file_len && n_tensors > 0 {
            return Err(self.truncated("tensor data section", self.pos));
        }

        // Unknown types have no size formula: take the gap to the next tensor (or the file end).
        let mut starts: Vec<u64> = raw.iter().map(|r| r.3).collect();
        starts.sort_unstable();
        let mut tensors = Vec::with_capacity(raw.len());
        for (name, dims, ggml_type, rel) in raw {
            let n_elements = dims
                .iter()
                .try_fold(1u64, |acc, &d| acc.checked_mul(d))
                .ok_or_else(|| self.invalid(format!("tensor {name}: element count overflows")))?;
            let offset = data_offset
                .checked_add(rel)
                .ok_or_else(|| self.invalid(format!("tensor {name}: offset overflows")))?;
            let n_bytes = match ggml_type {
                GgmlType::Unknown(_) => {
                    let next = starts.iter().find(|&&s| s > rel).copied();
                    match next {
                        Some(s) => s - rel,
                        None => file_len.saturating_sub(offset),
                    }
                }
                known => known.bytes_for(n_elements).ok_or_else(|| {
                    self.invalid(format!(
                        "tensor {name}: {n_elements} elements is not a whole number of {known} blocks"
                    ))
                })?,
            };
            match offset.checked_add(n_bytes) {
                Some(end) if end <= file_len => {}
                _ => {
                    return Err(GgufError::Truncated {
                        path: self.path.to_path_buf(),
                        what: format!("data of tensor {name} ({n_bytes} bytes)"),
                        offset,
                        file_len,
                    })
                }
            }
            tensors.push(TensorInfo {
                name,
                dims,
                ggml_type,
                offset,
                n_bytes,
            });
        }

        Ok(Parsed {
            version,
            alignment,
            data_offset,
            metadata,
            tensors,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testutil::{sample_gguf, GgufWriter};

    fn write(dir: &tempfile::TempDir, name: &str, bytes: &[u8]) -> PathBuf {
        let p = dir.path().join(name);
        std::fs::write(&p, bytes).unwrap();
        p
    }

    #[test]
    fn reads_metadata_and_tensor_table() {
        let dir = tempfile::tempdir().unwrap();
        let p = write(&dir, "m.gguf", &sample_gguf(Some("{{ messages }}")));
        let f = GgufFile::open(&p).unwrap();
        assert_eq!(f.version, 3);
        assert_eq!(f.alignment, 32);
        assert_eq!(f.architecture(), Some("qwen2"));
        assert_eq!(f.get_u64("qwen2.context_length"), Some(4096));
        assert_eq!(f.get_u64("qwen2.block_count"), Some(2));
        assert_eq!(f.get_f32("qwen2.rope.freq_base"), Some(1_000_000.0));
        assert_eq!(f.get_str_array("tokenizer.ggml.tokens"), Some(vec!["a", "b"]));
        assert_eq!(f.get_str("tokenizer.chat_template"), Some("{{ messages }}"));
        assert_eq!(f.metadata()[0].0, "general.architecture");
        let t = f.tensors();
        assert_eq!(t.len(), 4);
        assert_eq!(t[0].name, "token_embd.weight");
        assert_eq!(t[0].dims, vec![64, 4]);
        assert_eq!(t[0].ggml_type, GgmlType::Q8_0);
        assert_eq!(t[0].n_bytes, 8 * 34);
        assert_eq!(t[1].n_bytes, 2 * 144);
        assert_eq!(t[0].offset, f.data_offset);
        assert_eq!(f.data_offset % 32, 0);
        for (i, info) in t.iter().enumerate() {
            let data = f.tensor_data(info);
            assert_eq!(data.len() as u64, info.n_bytes);
            assert_eq!(data[1], 31u8.wrapping_add(i as u8));
        }
        assert_eq!(f.parameter_count(), 256 + 512 + 64 + 64);
        assert_eq!(f.bytes().len() as u64, std::fs::metadata(&p).unwrap().len());
    }

    #[test]
    fn every_value_type_round_trips() {
        let values = vec![
            GgufValue::U8(7),
            GgufValue::I8(-7),
            GgufValue::U16(700),
            GgufValue::I16(-700),
            GgufValue::U32(70_000),
            GgufValue::I32(-70_000),
            GgufValue::U64(7 << 40),
            GgufValue::I64(-(7 << 40)),
            GgufValue::F32(0.5),
            GgufValue::F64(-0.25),
            GgufValue::Bool(true),
            GgufValue::String("héllo".into()),
            GgufValue::Array(vec![GgufValue::I32(1), GgufValue::I32(-2)]),
            GgufValue::Array(vec![
                GgufValue::Array(vec![GgufValue::String("x".into())]),
                GgufValue::Array(vec![GgufValue::String("y".into()), GgufValue::String("z".into())]),
            ]),
        ];
        let mut w = GgufWriter::new();
        w.version = 2;
        for (i, v) in values.iter().enumerate() {
            w = w.kv(&format!("k{i}"), v.clone());
        }
        let dir = tempfile::tempdir().unwrap();
        let f = GgufFile::open(write(&dir, "v.gguf", &w.build())).unwrap();
        assert_eq!(f.version, 2);
        let got: Vec<GgufValue> = f.metadata().iter().map(|(_, v)| v.clone()).collect();
        assert_eq!(got, values);
        assert_eq!(f.get_u64("k1"), None, "negative integers are not u64");
        assert_eq!(f.get_u64("k2"), Some(700));
        assert_eq!(f.get("k5").and_then(GgufValue::as_i64), Some(-70_000));
        assert!(f.tensors().is_empty());
    }

    #[test]
    fn invalid_utf8_strings_are_replaced_not_rejected() {
        let mut bytes = GgufWriter::new().str("general.name", "abc").build();
        let pos = bytes.windows(3).position(|w| w == b"abc").unwrap();
        bytes[pos + 1] = 0xff;
        let dir = tempfile::tempdir().unwrap();
        let f = GgufFile::open(write(&dir, "u.gguf", &bytes)).unwrap();
        assert_eq!(f.get_str("general.name"), Some("a\u{fffd}c"));
    }

    #[test]
    fn every_truncation_is_an_error_not_a_panic() {
        let full = sample_gguf(Some("{% for m in messages %}{% endfor %}"));
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("t.gguf");
        for len in 0..full.len() {
            std::fs::write(&p, &full[..len]).unwrap();
            match GgufFile::open(&p) {
                Err(GgufError::Truncated { .. }) => {}
                other => panic!("prefix of {len} bytes: expected Truncated, got {other:?}"),
            }
        }
        std::fs::write(&p, &full).unwrap();
        assert!(GgufFile::open(&p).is_ok());
    }

    #[test]
    fn reading_the_header_parses_as_mapping_does_whatever_the_file_holds() {
        let dir = tempfile::tempdir().unwrap();
        // A header past the first read (1 MiB under test) makes the reader grow its prefix.
        let big = crate::testutil::GgufWriter::new()
            .str("general.architecture", "test")
            .str("test.big", &"x".repeat(3 << 20))
            .tensor("a.weight", &[32, 4], GgmlType::F32)
            .build();
        for (name, full) in [("s.gguf", sample_gguf(Some("tmpl"))), ("big.gguf", big)] {
            let p = write(&dir, name, &full);
            let (mapped, read) = (GgufFile::open(&p).unwrap(), GgufFile::read_header(&p).unwrap());
            assert_eq!(read.metadata(), mapped.metadata());
            assert_eq!(read.tensors(), mapped.tensors());
            assert_eq!(read.data_offset, mapped.data_offset);
            assert_eq!(read.bytes(), &mapped.bytes()[..mapped.data_offset as usize]);
            // Cut anywhere (every length of the small file, steps through the big one): the
            // same answer, word for word.
            let step = if full.len() > 1 << 20 { 65537 } else { 1 };
            for len in (0..full.len()).step_by(step) {
                std::fs::write(&p, &full[..len]).unwrap();
                let (a, b) = (GgufFile::open(&p), GgufFile::read_header(&p));
                match (a, b) {
                    (Ok(a), Ok(b)) => assert_eq!(a.tensors(), b.tensors(), "{name} cut at {len}"),
                    (Err(a), Err(b)) => assert_eq!(a.to_string(), b.to_string(), "{name} cut at {len}"),
                    (a, b) => panic!("{name} cut at {len}: {:?} vs {:?}", a.err(), b.err()),
                }
            }
        }
    }

    #[test]
    fn corrupt_bytes_never_panic() {
        let full = sample_gguf(Some("tmpl"));
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("c.gguf");
        // Flip each header/table byte to a few hostile values; any result is fine but a panic.
        let table_end = full.len() - 32 * 20;
        for i in 4..table_end.min(full.len()) {
            for v in [0x00u8, 0x7f, 0xff] {
                let mut b = full.clone();
                b[i] = v;
                std::fs::write(&p, &b).unwrap();
                let _ = GgufFile::open(&p);
            }
        }
    }

    #[test]
    fn rejects_bad_magic_version_and_counts() {
        let dir = tempfile::tempdir().unwrap();
        let mut b = sample_gguf(None);
        b[0] = b'X';
        let e = GgufFile::open(write(&dir, "a", &b)).unwrap_err();
        assert!(matches!(e, GgufError::BadMagic { .. }), "{e}");

        let mut b = sample_gguf(None);
        b[4..8].copy_from_slice(&1u32.to_le_bytes());
        let e = GgufFile::open(write(&dir, "b", &b)).unwrap_err();
        assert!(
            matches!(e, GgufError::UnsupportedVersion { version: 1, .. }),
            "{e}"
        );

        let mut b = sample_gguf(None);
        b[16..24].copy_from_slice(&u64::MAX.to_le_bytes());
        let e = GgufFile::open(write(&dir, "c", &b)).unwrap_err();
        assert!(e.to_string().contains("metadata entries"), "{e}");

        let mut b = sample_gguf(None);
        b[8..16].copy_from_slice(&(1u64 << 40).to_le_bytes());
        let e = GgufFile::open(write(&dir, "d", &b)).unwrap_err();
        assert!(e.to_string().contains("tensor infos"), "{e}");
        assert!(!e.to_string().contains('\n'));
        assert!(e.to_string().contains(dir.path().join("d").to_str().unwrap()));
    }

    #[test]
    fn custom_alignment_is_honoured_and_validated() {
        let mut w = GgufWriter::new()
            .kv("general.alignment", GgufValue::U32(64))
            .tensor("a", &[3], GgmlType::F32)
            .tensor("b", &[5], GgmlType::F16);
        w.alignment = 64;
        let dir = tempfile::tempdir().unwrap();
        let f = GgufFile::open(write(&dir, "a.gguf", &w.build())).unwrap();
        assert_eq!(f.alignment, 64);
        assert_eq!(f.data_offset % 64, 0);
        assert_eq!(f.tensors()[1].offset, f.data_offset + 64);

        let w = GgufWriter::new().kv("general.alignment", GgufValue::U32(48));
        let e = GgufFile::open(write(&dir, "b.gguf", &w.build())).unwrap_err();
        assert!(e.to_string().contains("power of two"), "{e}");
    }

    #[test]
    fn ggml_type_table() {
        for id in 0..64 {
            let t = GgmlType::from_id(id);
            assert_eq!(t.id(), id);
            if let GgmlType::Unknown(_) = t {
                assert_eq!(t.block_size(), 0);
            } else {
                assert!(t.block_size() > 0 && t.type_size() > 0, "{t}");
            }
        }
        assert_eq!(GgmlType::Q4_K.name(), "Q4_K");
        assert_eq!(GgmlType::Unknown(99).name(), "type99");
        assert_eq!(GgmlType::from_id(39), GgmlType::MXFP4);
        assert_eq!(GgmlType::Q6_K.bytes_for(512), Some(420));
        assert_eq!(GgmlType::Q4_0.bytes_for(33), None);
        assert_eq!(file_type_name(15), Some("Q4_K_M"));
        assert_eq!(file_type_name(1024 + 7), Some("Q8_0"));
        assert_eq!(file_type_name(32), Some("BF16"));
        assert_eq!(file_type_name(4), None);
    }

    #[test]
    fn quant_mix_sorts_by_bytes() {
        let dir = tempfile::tempdir().unwrap();
        let f = GgufFile::open(write(&dir, "m.gguf", &sample_gguf(None))).unwrap();
        let mix = quant_mix(&f);
        assert_eq!(
            mix,
            vec![
                ("F32".to_string(), 2, 512),
                ("Q4_K".to_string(), 1, 288),
                ("Q8_0".to_string(), 1, 272),
            ]
        );
    }

    /// A real GGUF from `scripts/fetch-models`' cache (`$BERTH_CACHE`, else `~/.cache/berth`);
    /// `None` (a recorded skip, a failure under CI) when it has not been fetched.
    fn real(name: &str) -> Option<GgufFile> {
        let p = crate::test_skip::fetched_model(name)?;
        Some(GgufFile::open(&p).unwrap())
    }

    #[test]
    fn real_qwen2_coder() {
        let Some(f) = real("qwen2.5-coder-0.5b-instruct.gguf") else {
            return;
        };
        assert_eq!(f.architecture(), Some("qwen2"));
        assert_eq!(f.get_str_array("tokenizer.ggml.tokens").unwrap().len(), 151936);
        assert_eq!(f.get_u64("qwen2.context_length"), Some(32768));
        assert!(f.get_str("tokenizer.chat_template").is_some());
        let last = f.tensors().iter().map(|t| t.offset + t.n_bytes).max().unwrap();
        assert!(last <= f.bytes().len() as u64);
        assert!(f.parameter_count() > 400_000_000);
        let read = GgufFile::read_header(&f.path).unwrap();
        assert_eq!((read.metadata(), read.tensors()), (f.metadata(), f.tensors()));
    }

    #[test]
    fn real_gemma3() {
        let Some(f) = real("gemma-3-270m-q4_k_m.gguf") else {
            return;
        };
        assert_eq!(f.architecture(), Some("gemma3"));
        assert_eq!(f.get_u64("gemma3.block_count"), Some(18));
        assert!(!quant_mix(&f).is_empty());
    }
}
