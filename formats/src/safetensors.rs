//! A safetensors header reader over a memory map.
//!
//! The file is an 8-byte little-endian header length, a JSON header naming each tensor's dtype,
//! shape and byte range, then the data. Every range is checked against the file at open time.

use std::fmt;
use std::fs::File;
use std::path::{Path, PathBuf};

use memmap2::Mmap;

/// Headers larger than this are refused (the format's reference implementation uses 100 MB).
pub const MAX_HEADER_LEN: u64 = 100_000_000;

/// Why a safetensors file could not be read.
#[derive(Debug, thiserror::Error)]
pub enum SafetensorsError {
    /// The file could not be opened or mapped.
    #[error("{path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The underlying error.
        source: std::io::Error,
    },
    /// The file is shorter than its header says.
    #[error("{path}: truncated: {what} (file is {file_len} bytes)")]
    Truncated {
        /// The file.
        path: PathBuf,
        /// What runs past the end.
        what: String,
        /// The file's length.
        file_len: u64,
    },
    /// The header is not valid.
    #[error("{path}: invalid safetensors header: {msg}")]
    Invalid {
        /// The file.
        path: PathBuf,
        /// What is wrong.
        msg: String,
    },
}

/// A tensor element type; unknown names are kept verbatim.
#[allow(non_camel_case_types)]
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Dtype {
    /// Boolean (one byte).
    BOOL,
    /// Unsigned 8-bit.
    U8,
    /// Signed 8-bit.
    I8,
    /// Unsigned 16-bit.
    U16,
    /// Signed 16-bit.
    I16,
    /// Unsigned 32-bit.
    U32,
    /// Signed 32-bit.
    I32,
    /// Unsigned 64-bit.
    U64,
    /// Signed 64-bit.
    I64,
    /// Half precision.
    F16,
    /// bfloat16.
    BF16,
    /// Single precision.
    F32,
    /// Double precision.
    F64,
    /// FP8 e4m3.
    F8_E4M3,
    /// FP8 e5m2.
    F8_E5M2,
    /// FP8 e8m0 (scales).
    F8_E8M0,
    /// Any other dtype string.
    Other(String),
}

impl Dtype {
    /// The dtype for its header spelling.
    pub fn parse(s: &str) -> Dtype {
        match s {
            "BOOL" => Dtype::BOOL,
            "U8" => Dtype::U8,
            "I8" => Dtype::I8,
            "U16" => Dtype::U16,
            "I16" => Dtype::I16,
            "U32" => Dtype::U32,
            "I32" => Dtype::I32,
            "U64" => Dtype::U64,
            "I64" => Dtype::I64,
            "F16" => Dtype::F16,
            "BF16" => Dtype::BF16,
            "F32" => Dtype::F32,
            "F64" => Dtype::F64,
            "F8_E4M3" => Dtype::F8_E4M3,
            "F8_E5M2" => Dtype::F8_E5M2,
            "F8_E8M0" => Dtype::F8_E8M0,
            other => Dtype::Other(other.to_string()),
        }
    }

    /// The header spelling (`"BF16"`).
    pub fn name(&self) -> &str {
        match self {
            Dtype::BOOL => "BOOL",
            Dtype::U8 => "U8",
            Dtype::I8 => "I8",
            Dtype::U16 => "U16",
            Dtype::I16 => "I16",
            Dtype::U32 => "U32",
            Dtype::I32 => "I32",
            Dtype::U64 => "U64",
            Dtype::I64 => "I64",
            Dtype::F16 => "F16",
            Dtype::BF16 => "BF16",
            Dtype::F32 => "F32",
            Dtype::F64 => "F64",
            Dtype::F8_E4M3 => "F8_E4M3",
            Dtype::F8_E5M2 => "F8_E5M2",
            Dtype::F8_E8M0 => "F8_E8M0",
            Dtype::Other(s) => s,
        }
    }

    /// Bytes per element, when known.
    pub fn size(&self) -> Option<u64> {
        Some(match self {
            Dtype::BOOL | Dtype::U8 | Dtype::I8 => 1,
            Dtype::F8_E4M3 | Dtype::F8_E5M2 | Dtype::F8_E8M0 => 1,
            Dtype::U16 | Dtype::I16 | Dtype::F16 | Dtype::BF16 => 2,
            Dtype::U32 | Dtype::I32 | Dtype::F32 => 4,
            Dtype::U64 | Dtype::I64 | Dtype::F64 => 8,
            Dtype::Other(_) => return None,
        })
    }
}

impl fmt::Display for Dtype {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// One tensor of the header.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SafetensorsTensor {
    /// Tensor name.
    pub name: String,
    /// Element type.
    pub dtype: Dtype,
    /// Shape, outermost first.
    pub shape: Vec<u64>,
    /// Absolute byte range `[start, end)` in the file.
    pub data_offsets: (u64, u64),
}

impl SafetensorsTensor {
    /// The number of elements (product of the shape).
    pub fn n_elements(&self) -> u64 {
        self.shape.iter().product()
    }

    /// Bytes of data.
    pub fn n_bytes(&self) -> u64 {
        self.data_offsets.1 - self.data_offsets.0
    }
}

/// An open safetensors file.
pub struct SafetensorsFile {
    /// The path the file was opened from.
    pub path: PathBuf,
    /// Absolute offset of the data section (8 + header length).
    pub data_offset: u64,
    tensors: Vec<SafetensorsTensor>,
    metadata: Vec<(String, String)>,
    bytes: Held,
}

/// The bytes a [`SafetensorsFile`] holds.
enum Held {
    /// The whole file, mapped ([`SafetensorsFile::open`]).
    Mapped(Mmap),
    /// The header only, read ([`SafetensorsFile::read_header`]).
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

impl fmt::Debug for SafetensorsFile {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SafetensorsFile")
            .field("path", &self.path)
            .field("tensors", &self.tensors.len())
            .finish()
    }
}

impl SafetensorsFile {
    /// Map a file and parse and validate its header.
    pub fn open(path: impl AsRef<Path>) -> Result<SafetensorsFile, SafetensorsError> {
        let path = path.as_ref();
        let p = || path.to_path_buf();
        let io = |source| SafetensorsError::Io { path: p(), source };
        let file = File::open(path).map_err(io)?;
        let file_len = file.metadata().map_err(io)?.len();
        let truncated = |what: String| SafetensorsError::Truncated {
            path: p(),
            what,
            file_len,
        };
        if file_len < 8 {
            return Err(truncated("header length".into()));
        }
        // SAFETY: read-only private map; files in the store are replaced by rename, never
        // rewritten in place, so the mapping's contents stay stable while it is open.
        let mmap = unsafe { Mmap::map(&file) }.map_err(io)?;
        let header_len = Self::header_len(path, &mmap[..8], file_len)?;
        Self::parse(path, file_len, header_len, Held::Mapped(mmap))
    }

    /// Reads and parses the header of a safetensors file with plain reads, mapping nothing, and
    /// checks the tensors' extents against the file's length as [`SafetensorsFile::open`] does:
    /// a file cut or rewritten meanwhile is an error or a file parsed as it was, never a signal.
    /// [`SafetensorsFile::bytes`] is then the header and [`SafetensorsFile::tensor_data`] None
    /// (read tensors from the file at their [`SafetensorsTensor::data_offsets`]).
    pub fn read_header(path: impl AsRef<Path>) -> Result<SafetensorsFile, SafetensorsError> {
        use std::os::unix::fs::FileExt;
        let path = path.as_ref();
        let io = |source| SafetensorsError::Io {
            path: path.to_path_buf(),
            source,
        };
        let file = File::open(path).map_err(io)?;
        let file_len = file.metadata().map_err(io)?.len();
        if file_len < 8 {
            return Self::open(path);
        }
        let shrank = |e: std::io::Error| match e.kind() {
            std::io::ErrorKind::UnexpectedEof => SafetensorsError::Truncated {
                path: path.to_path_buf(),
                what: "header (the file shrank while it was read)".into(),
                file_len: file.metadata().map_or(0, |m| m.len()),
            },
            _ => io(e),
        };
        let mut len_bytes = [0u8; 8];
        file.read_exact_at(&mut len_bytes, 0).map_err(shrank)?;
        let header_len = Self::header_len(path, &len_bytes, file_len)?;
        let mut head = vec![0u8; 8 + header_len as usize];
        file.read_exact_at(&mut head, 0).map_err(shrank)?;
        Self::parse(path, file_len, header_len, Held::Header(head))
    }

    /// The header length the first eight bytes give, checked against the limit and the file.
    fn header_len(path: &Path, first: &[u8], file_len: u64) -> Result<u64, SafetensorsError> {
        let mut len_bytes = [0u8; 8];
        len_bytes.copy_from_slice(&first[..8]);
        let header_len = u64::from_le_bytes(len_bytes);
        if header_len > MAX_HEADER_LEN {
            return Err(SafetensorsError::Invalid {
                path: path.to_path_buf(),
                msg: format!("header length {header_len} is too large"),
            });
        }
        if 8 + header_len > file_len {
            return Err(SafetensorsError::Truncated {
                path: path.to_path_buf(),
                what: format!("header of {header_len} bytes"),
                file_len,
            });
        }
        Ok(header_len)
    }

    /// Parses the JSON header (`header_len` bytes after the first eight of `bytes`) of a file of
    /// `file_len` bytes.
    fn parse(
        path: &Path,
        file_len: u64,
        header_len: u64,
        bytes: Held,
    ) -> Result<SafetensorsFile, SafetensorsError> {
        let p = || path.to_path_buf();
        let invalid = |msg: String| SafetensorsError::Invalid { path: p(), msg };
        let truncated = |what: String| SafetensorsError::Truncated {
            path: p(),
            what,
            file_len,
        };
        let data_offset = 8 + header_len;
        let header: serde_json::Map<String, serde_json::Value> =
            serde_json::from_slice(&bytes[8..data_offset as usize])
                .map_err(|e| invalid(format!("JSON: {e}")))?;

        let mut tensors = Vec::with_capacity(header.len());
        let mut metadata = Vec::new();
        for (name, entry) in header {
            if name == "__metadata__" {
                let obj = entry
                    .as_object()
                    .ok_or_else(|| invalid("__metadata__ is not an object".into()))?;
                for (k, v) in obj {
                    let v = v.as_str().map_or_else(|| v.to_string(), str::to_string);
                    metadata.push((k.clone(), v));
                }
                continue;
            }
            let bad = |what: &str| invalid(format!("tensor {name}: {what}"));
            let obj = entry.as_object().ok_or_else(|| bad("entry is not an object"))?;
            let dtype = obj
                .get("dtype")
                .and_then(|v| v.as_str())
                .map(Dtype::parse)
                .ok_or_else(|| bad("missing dtype"))?;
            let shape = obj
                .get("shape")
                .and_then(|v| v.as_array())
                .ok_or_else(|| bad("missing shape"))?
                .iter()
                .map(|d| d.as_u64())
                .collect::<Option<Vec<u64>>>()
                .ok_or_else(|| bad("shape is not a list of non-negative integers"))?;
            let offsets = obj
                .get("data_offsets")
                .and_then(|v| v.as_array())
                .and_then(|a| match a.as_slice() {
                    [b, e] => Some((b.as_u64()?, e.as_u64()?)),
                    _ => None,
                })
                .ok_or_else(|| bad("data_offsets is not [begin, end]"))?;
            if offsets.1 < offsets.0 {
                return Err(bad("data_offsets end before they begin"));
            }
            let start = data_offset + offsets.0;
            let end = data_offset
                .checked_add(offsets.1)
                .filter(|&e| e <= file_len)
                .ok_or_else(|| truncated(format!("data of tensor {name} ends at {}", offsets.1)))?;
            if let Some(size) = dtype.size() {
                let expected = shape
                    .iter()
                    .try_fold(size, |acc, &d| acc.checked_mul(d))
                    .ok_or_else(|| bad("element count overflows"))?;
                if expected != end - start {
                    return Err(bad(&format!(
                        "{} bytes of data, but {dtype} {shape:?} needs {expected}",
                        end - start
                    )));
                }
            }
            tensors.push(SafetensorsTensor {
                name,
                dtype,
                shape,
                data_offsets: (start, end),
            });
        }
        Ok(SafetensorsFile {
            path: path.to_path_buf(),
            data_offset,
            tensors,
            metadata,
            bytes,
        })
    }

    /// The tensors, in header order.
    pub fn tensors(&self) -> &[SafetensorsTensor] {
        &self.tensors
    }

    /// The tensor with the given name.
    pub fn tensor(&self, name: &str) -> Option<&SafetensorsTensor> {
        self.tensors.iter().find(|t| t.name == name)
    }

    /// The `__metadata__` string map, in header order.
    pub fn metadata(&self) -> &[(String, String)] {
        &self.metadata
    }

    /// The bytes of the named tensor.
    pub fn tensor_data(&self, name: &str) -> Option<&[u8]> {
        let t = self.tensor(name)?;
        self.bytes
            .get(t.data_offsets.0 as usize..t.data_offsets.1 as usize)
    }

    /// The whole mapped file ([`SafetensorsFile::open`]), or its header
    /// ([`SafetensorsFile::read_header`]).
    pub fn bytes(&self) -> &[u8] {
        &self.bytes
    }

    /// Total elements over all tensors.
    pub fn parameter_count(&self) -> u64 {
        self.tensors.iter().map(SafetensorsTensor::n_elements).sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testutil::safetensors_bytes;

    fn sample() -> Vec<u8> {
        safetensors_bytes(
            &[
                ("a.weight", "F32", &[2, 3], (0..24).collect()),
                ("b.bias", "BF16", &[4], vec![1; 8]),
                ("c.q", "F4", &[4], vec![7; 2]),
            ],
            &[("format", "pt")],
        )
    }

    #[test]
    fn reads_header_and_data() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("m.safetensors");
        std::fs::write(&p, sample()).unwrap();
        let f = SafetensorsFile::open(&p).unwrap();
        let t = f.tensors();
        assert_eq!(t.len(), 3);
        assert_eq!(t[0].name, "a.weight");
        assert_eq!(t[0].dtype, Dtype::F32);
        assert_eq!(t[0].shape, vec![2, 3]);
        assert_eq!(t[1].dtype, Dtype::BF16);
        assert_eq!(t[2].dtype, Dtype::Other("F4".into()));
        assert_eq!(
            f.tensor_data("a.weight").unwrap(),
            &(0..24).collect::<Vec<u8>>()[..]
        );
        assert_eq!(f.tensor_data("c.q").unwrap(), &[7, 7]);
        assert_eq!(f.metadata(), &[("format".to_string(), "pt".to_string())]);
        assert_eq!(f.parameter_count(), 14);
    }

    #[test]
    fn reading_the_header_parses_as_mapping_does_whatever_the_file_holds() {
        let full = sample();
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("h.safetensors");
        std::fs::write(&p, &full).unwrap();
        let (mapped, read) = (
            SafetensorsFile::open(&p).unwrap(),
            SafetensorsFile::read_header(&p).unwrap(),
        );
        assert_eq!(read.tensors(), mapped.tensors());
        assert_eq!(read.metadata(), mapped.metadata());
        assert_eq!(read.bytes(), &full[..read.data_offset as usize]);
        assert_eq!(read.tensor_data("a.weight"), None);
        for len in 0..full.len() {
            std::fs::write(&p, &full[..len]).unwrap();
            let (a, b) = (SafetensorsFile::open(&p), SafetensorsFile::read_header(&p));
            assert_eq!(
                a.map(|f| f.tensors().to_vec()).map_err(|e| e.to_string()),
                b.map(|f| f.tensors().to_vec()).map_err(|e| e.to_string()),
                "cut at {len}"
            );
        }
    }

    #[test]
    fn every_truncation_is_an_error() {
        let full = sample();
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("t.safetensors");
        for len in 0..full.len() {
            std::fs::write(&p, &full[..len]).unwrap();
            assert!(SafetensorsFile::open(&p).is_err(), "prefix {len} accepted");
        }
    }

    #[test]
    fn malformed_headers_are_errors() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("x.safetensors");
        let cases: Vec<Vec<u8>> = vec![
            safetensors_bytes(&[("a", "F32", &[3], vec![0; 8])], &[]),
            {
                let mut b = 4u64.to_le_bytes().to_vec();
                b.extend_from_slice(b"nope");
                b
            },
            {
                let h = br#"{"a":{"dtype":"F32","shape":[1],"data_offsets":[4,0]}}"#;
                let mut b = (h.len() as u64).to_le_bytes().to_vec();
                b.extend_from_slice(h);
                b.extend_from_slice(&[0; 4]);
                b
            },
            u64::MAX.to_le_bytes().to_vec(),
        ];
        for (i, bytes) in cases.iter().enumerate() {
            std::fs::write(&p, bytes).unwrap();
            let e = SafetensorsFile::open(&p).unwrap_err();
            assert!(e.to_string().contains("x.safetensors"), "case {i}: {e}");
        }
    }

    #[test]
    fn real_reference_tiny_qwen3() {
        let p = Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../../shared/fixtures/reference-tiny/qwen3/model.safetensors");
        if !p.exists() {
            crate::test_skip::skip_unless_ci(&format!("{} not present (../shared)", p.display()));
            return;
        }
        let f = SafetensorsFile::open(&p).unwrap();
        assert!(f.tensor("model.embed_tokens.weight").is_some());
        assert_eq!(
            f.tensor("model.embed_tokens.weight").unwrap().shape,
            vec![512, 64]
        );
        for t in f.tensors() {
            assert_eq!(f.tensor_data(&t.name).unwrap().len() as u64, t.n_bytes());
        }
    }
}
