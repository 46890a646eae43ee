//! A tiny reader for little-endian `.npy` files (version 1–3, C order; float32, and int64 / int32
//! read as f32) and uncompressed `.npz` archives of them, for tests that compare against reference
//! outputs.

use std::collections::BTreeMap;
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
    // Integer arrays (masks, shapes) are read as f32 too: exact for the small values they hold.
    let (width, convert): (usize, fn(&[u8]) -> f32) = if header.contains("'descr': '<f4'") {
        (4, |c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
    } else if header.contains("'descr': '<i8'") {
        (8, |c| {
            i64::from_le_bytes([c[0], c[1], c[2], c[3], c[4], c[5], c[6], c[7]]) as f32
        })
    } else if header.contains("'descr': '<i4'") {
        (4, |c| i32::from_le_bytes([c[0], c[1], c[2], c[3]]) as f32)
    } else {
        return Err(format!(
            "only little-endian float32, int64 and int32 are supported: {header}"
        ));
    };
    let fortran = header.contains("'fortran_order': True");
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
    if body.len() < n * width {
        return Err(format!(
            "npy body holds {} bytes, {} needed",
            body.len(),
            n * width
        ));
    }
    let data: Vec<f32> = body[..n * width].chunks_exact(width).map(convert).collect();
    if !fortran || shape.len() < 2 {
        return Ok(NpyF32 { shape, data });
    }
    // Column-major: the first index varies fastest. Reorder to row-major.
    let mut c_order = vec![0.0f32; n];
    let mut idx = vec![0usize; shape.len()];
    for (i, slot) in c_order.iter_mut().enumerate() {
        let mut rem = i;
        for (k, &dim) in shape.iter().enumerate().rev() {
            idx[k] = rem % dim;
            rem /= dim;
        }
        let f = idx
            .iter()
            .zip(&shape)
            .rev()
            .fold(0, |acc, (&ix, &dim)| acc * dim + ix);
        *slot = data[f];
    }
    Ok(NpyF32 { shape, data: c_order })
}

/// Reads the arrays of an uncompressed `.npz` file (`numpy.savez`), keyed by name without the
/// `.npy` suffix, each through [`parse_npy_f32`].
pub fn read_npz_f32(path: impl AsRef<Path>) -> Result<BTreeMap<String, NpyF32>, String> {
    let path = path.as_ref();
    let bytes = std::fs::read(path).map_err(|e| format!("{}: {e}", path.display()))?;
    parse_npz_f32(&bytes).map_err(|e| format!("{}: {e}", path.display()))
}

/// Parses the bytes of an uncompressed `.npz` (zip) file through its central directory (numpy
/// writes zip64 local headers without sizes; the directory has them, or a zip64 extra field does).
pub fn parse_npz_f32(bytes: &[u8]) -> Result<BTreeMap<String, NpyF32>, String> {
    let get = |o: usize, n: usize| {
        bytes
            .get(o..o + n)
            .ok_or_else(|| "truncated npz file".to_string())
    };
    let u16_at = |o: usize| get(o, 2).map(|b| u16::from_le_bytes([b[0], b[1]]) as usize);
    let u32_at = |o: usize| get(o, 4).map(|b| u32::from_le_bytes([b[0], b[1], b[2], b[3]]) as usize);
    let u64_at = |o: usize| get(o, 8).map(|b| u64::from_le_bytes(b.try_into().expect("8 bytes")) as usize);
    // The end-of-central-directory record: the last "PK\x05\x06".
    let eocd = (0..bytes.len().saturating_sub(21))
        .rev()
        .find(|&o| bytes[o..o + 4] == [0x50, 0x4b, 0x05, 0x06])
        .ok_or("no zip end record: not an npz file")?;
    let (count, mut at) = (u16_at(eocd + 10)?, u32_at(eocd + 16)?);
    let mut out = BTreeMap::new();
    for _ in 0..count {
        if u32_at(at)? != 0x0201_4b50 {
            return Err("bad npz central directory entry".into());
        }
        let method = u16_at(at + 10)?;
        let (mut size, mut local) = (u32_at(at + 20)?, u32_at(at + 42)?);
        let (name_len, extra_len, comment_len) = (u16_at(at + 28)?, u16_at(at + 30)?, u16_at(at + 32)?);
        let name = std::str::from_utf8(get(at + 46, name_len)?).map_err(|_| "npz entry name is not text")?;
        if method != 0 {
            return Err(format!(
                "{name}: compressed npz entries are not supported (use numpy.savez)"
            ));
        }
        // Zip64 extra field (id 1): the 64-bit uncompressed size, compressed size and local
        // header offset, each present only when its 32-bit field is saturated.
        let uncompressed = u32_at(at + 24)?;
        let mut e = at + 46 + name_len;
        while e + 4 <= at + 46 + name_len + extra_len {
            let (id, len) = (u16_at(e)?, u16_at(e + 2)?);
            if id == 1 {
                let mut f = e + 4;
                for (field, saturated) in [
                    (None, uncompressed == 0xFFFF_FFFF),
                    (Some(0), size == 0xFFFF_FFFF),
                ] {
                    if saturated {
                        if field == Some(0) {
                            size = u64_at(f)?;
                        }
                        f += 8;
                    }
                }
                if local == 0xFFFF_FFFF {
                    local = u64_at(f)?;
                }
            }
            e += 4 + len;
        }
        if u32_at(local)? != 0x0403_4b50 {
            return Err(format!("{name}: bad npz local header"));
        }
        let data_at = local + 30 + u16_at(local + 26)? + u16_at(local + 28)?;
        let array = parse_npy_f32(get(data_at, size)?).map_err(|e| format!("{name}: {e}"))?;
        out.insert(name.trim_end_matches(".npy").to_string(), array);
        at += 46 + name_len + extra_len + comment_len;
    }
    if out.is_empty() {
        return Err("no arrays in npz file".into());
    }
    Ok(out)
}

/// The shared reference fixtures (`shared/fixtures`), which sessions and CI lay beside the
/// checkout; tests find them from here instead of from a machine-specific absolute path.
pub fn shared_fixtures() -> std::path::PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../../shared/fixtures")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn npy_bytes(descr: &str, shape: &str, body: &[u8]) -> Vec<u8> {
        npy_bytes_order(descr, shape, false, body)
    }

    fn npy_bytes_order(descr: &str, shape: &str, fortran: bool, body: &[u8]) -> Vec<u8> {
        let order = if fortran { "True" } else { "False" };
        let header = format!("{{'descr': '{descr}', 'fortran_order': {order}, 'shape': {shape}, }}");
        let mut padded = header.to_string();
        while !(10 + padded.len() + 1).is_multiple_of(64) {
            padded.push(' ');
        }
        padded.push('\n');
        let mut bytes = b"\x93NUMPY\x01\x00".to_vec();
        bytes.extend_from_slice(&(padded.len() as u16).to_le_bytes());
        bytes.extend_from_slice(padded.as_bytes());
        bytes.extend_from_slice(body);
        bytes
    }

    #[test]
    fn parses_a_small_array() {
        let body: Vec<u8> = [1.0f32, 2.0, 3.0, 4.0, 5.0, 6.0]
            .iter()
            .flat_map(|v| v.to_le_bytes())
            .collect();
        let a = parse_npy_f32(&npy_bytes("<f4", "(2, 3)", &body)).unwrap();
        assert_eq!(a.shape, vec![2, 3]);
        assert_eq!(a.row(1), &[4.0, 5.0, 6.0]);
        // The same 2×3 array stored column-major.
        let body: Vec<u8> = [1.0f32, 4.0, 2.0, 5.0, 3.0, 6.0]
            .iter()
            .flat_map(|v| v.to_le_bytes())
            .collect();
        let f = parse_npy_f32(&npy_bytes_order("<f4", "(2, 3)", true, &body)).unwrap();
        assert_eq!(f, a);
    }

    #[test]
    fn parses_integer_arrays_and_npz_archives() {
        let ints: Vec<u8> = [2i64, -6].iter().flat_map(|v| v.to_le_bytes()).collect();
        let floats: Vec<u8> = [0.5f32].iter().flat_map(|v| v.to_le_bytes()).collect();
        let ints_len = npy_bytes("<i8", "(1, 2)", &ints).len();
        let floats_len = npy_bytes("<f4", "(1,)", &floats).len();
        let mut zip = Vec::new();
        for (name, data) in [
            ("shape.npy", npy_bytes("<i8", "(1, 2)", &ints)),
            ("x.npy", npy_bytes("<f4", "(1,)", &floats)),
        ] {
            zip.extend_from_slice(&0x0403_4b50u32.to_le_bytes());
            zip.extend_from_slice(&[20, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0]);
            zip.extend_from_slice(&(data.len() as u32).to_le_bytes());
            zip.extend_from_slice(&(data.len() as u32).to_le_bytes());
            zip.extend_from_slice(&(name.len() as u16).to_le_bytes());
            zip.extend_from_slice(&0u16.to_le_bytes());
            zip.extend_from_slice(name.as_bytes());
            zip.extend_from_slice(&data);
        }
        let cd = zip.len();
        let mut local = 0;
        for (name, len) in [("shape.npy", ints_len), ("x.npy", floats_len)] {
            let len = len as u32;
            zip.extend_from_slice(&0x0201_4b50u32.to_le_bytes());
            zip.extend_from_slice(&[20, 0, 20, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0]);
            zip.extend_from_slice(&len.to_le_bytes());
            zip.extend_from_slice(&len.to_le_bytes());
            zip.extend_from_slice(&(name.len() as u16).to_le_bytes());
            zip.extend_from_slice(&[0; 12]);
            zip.extend_from_slice(&(local as u32).to_le_bytes());
            zip.extend_from_slice(name.as_bytes());
            local += 30 + name.len() + len as usize;
        }
        let cd_len = zip.len() - cd;
        zip.extend_from_slice(&0x0605_4b50u32.to_le_bytes());
        zip.extend_from_slice(&[0, 0, 0, 0, 2, 0, 2, 0]);
        zip.extend_from_slice(&(cd_len as u32).to_le_bytes());
        zip.extend_from_slice(&(cd as u32).to_le_bytes());
        zip.extend_from_slice(&[0, 0]);
        let arrays = parse_npz_f32(&zip).unwrap();
        assert_eq!(arrays["shape"].data, vec![2.0, -6.0]);
        assert_eq!(arrays["shape"].shape, vec![1, 2]);
        assert_eq!(arrays["x"].data, vec![0.5]);
        assert!(parse_npy_f32(&npy_bytes("<f8", "(1,)", &[0; 8])).is_err());
        assert!(parse_npz_f32(b"PK\x05\x06").is_err());
    }
}
