//! A tiny reader for little-endian float32 `.npy` files (version 1–3, C order), for tests that
//! compare against reference logits.

use std::path::Path;

/// A float32 array read from a `.npy` file.
#[derive(Clone, Debug, PartialEq)]
pub struct NpyF32 {
    /// Shape, outermost first.
    pub shape: Vec<usize>,
    /// Values in C (row-major) order.
    pub data: Vec<f32>,
}

impl NpyF32 {
    /// Row `i` of a 2-D array.
    pub fn row(&self, i: usize) -> &[f32] {
        let cols = self.shape.last().copied().unwrap_or(0);
        &self.data[i * cols..(i + 1) * cols]
    }
}

/// Reads a float32 `.npy` file.
pub fn read_npy_f32(path: impl AsRef<Path>) -> Result<NpyF32, String> {
    let path = path.as_ref();
    let bytes = std::fs::read(path).map_err(|e| format!("{}: {e}", path.display()))?;
    parse_npy_f32(&bytes).map_err(|e| format!("{}: {e}", path.display()))
}

/// Parses the bytes of a float32 `.npy` file.
pub fn parse_npy_f32(bytes: &[u8]) -> Result<NpyF32, String> {
    if bytes.len() < 10 || &bytes[..6] != b"\x93NUMPY" {
        return Err("not an npy file".into());
    }
    let major = bytes[6];
    let (header_len, start) = match major {
        1 => (u16::from_le_bytes([bytes[8], bytes[9]]) as usize, 10),
        2 | 3 => {
            if bytes.len() < 12 {
                return Err("truncated npy header".into());
            }
            (
                u32::from_le_bytes([bytes[8], bytes[9], bytes[10], bytes[11]]) as usize,
                12,
            )
        }
        v => return Err(format!("unsupported npy version {v}")),
    };
    let header = bytes
        .get(start..start + header_len)
        .ok_or("truncated npy header")?;
    let header = std::str::from_utf8(header).map_err(|_| "npy header is not text")?;
    if !header.contains("'descr': '<f4'") {
        return Err(format!("only little-endian float32 is supported: {header}"));
    }
    if header.contains("'fortran_order': True") {
        return Err("Fortran order is not supported".into());
    }
    let shape_start = header.find("'shape': (").ok_or("npy header has no shape")? + 10;
    let shape_end = shape_start + header[shape_start..].find(')').ok_or("bad npy shape")?;
    let shape = header[shape_start..shape_end]
        .split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(|s| s.parse::<usize>().map_err(|_| format!("bad npy dimension {s:?}")))
        .collect::<Result<Vec<_>, _>>()?;
    let n: usize = shape.iter().product();
    let body = &bytes[start + header_len..];
    if body.len() < n * 4 {
        return Err(format!("npy body holds {} bytes, {} needed", body.len(), n * 4));
    }
    let data = body[..n * 4]
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect();
    Ok(NpyF32 { shape, data })
}

/// The shared reference fixtures (`shared/fixtures`), which sessions and CI lay beside the
/// checkout; tests find them from here instead of from a machine-specific absolute path.
pub fn shared_fixtures() -> std::path::PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../../shared/fixtures")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_a_small_array() {
        let header = "{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }";
        let mut padded = header.to_string();
        while !(10 + padded.len() + 1).is_multiple_of(64) {
            padded.push(' ');
        }
        padded.push('\n');
        let mut bytes = b"\x93NUMPY\x01\x00".to_vec();
        bytes.extend_from_slice(&(padded.len() as u16).to_le_bytes());
        bytes.extend_from_slice(padded.as_bytes());
        for v in [1.0f32, 2.0, 3.0, 4.0, 5.0, 6.0] {
            bytes.extend_from_slice(&v.to_le_bytes());
        }
        let a = parse_npy_f32(&bytes).unwrap();
        assert_eq!(a.shape, vec![2, 3]);
        assert_eq!(a.row(1), &[4.0, 5.0, 6.0]);
    }
}
