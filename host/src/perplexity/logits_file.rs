//! llama.cpp's KL-divergence base file (`llama-perplexity --kl-divergence-base`), read and written
//! byte for byte as `tools/perplexity/perplexity.cpp` does, so one base file serves both engines.
//!
//! Layout (little-endian): the magic `_logits_`; `n_ctx`, `n_vocab`, `n_chunk` as 32-bit
//! integers; the `n_chunk · n_ctx` evaluated tokens as 32-bit integers (as tokenized, before the
//! first token of a chunk is replaced by BOS); then, for every chunk, `n_ctx - 1 - n_ctx/2` rows
//! (the scored second half of the window) of `nv = 2·⌈n_vocab/2⌉ + 4` 16-bit words: an f32 scale
//! and an f32 minimum log-probability in the first four words, then each token's log-probability
//! as `min + scale · q`, `q` rounded to the nearest of 65536 steps over the 16 nats below the
//! largest logit (anything lower is 0).

use anyhow::{bail, Context, Result};
use std::fs::File;
use std::io::{BufReader, BufWriter, Read, Write};
use std::path::Path;

/// The file's first eight bytes.
const MAGIC: &[u8; 8] = b"_logits_";

/// Log-probabilities more than this many nats below the top are stored as the floor.
const RANGE_NATS: f32 = 16.0;

/// 16-bit words per stored row for a vocabulary of `n_vocab`.
pub fn row_words(n_vocab: usize) -> usize {
    2 * n_vocab.div_ceil(2) + 4
}

/// Rows scored (and stored) per chunk of `n_ctx` tokens: predictions of tokens
/// `n_ctx/2 + 1 .. n_ctx - 1`.
pub fn scored_rows(n_ctx: usize) -> usize {
    n_ctx - 1 - n_ctx / 2
}

/// What a base file holds before its rows.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Header {
    /// Tokens per chunk.
    pub n_ctx: usize,
    /// Logits per row.
    pub n_vocab: usize,
    /// Chunks.
    pub n_chunk: usize,
    /// The `n_chunk · n_ctx` tokens evaluated.
    pub tokens: Vec<i32>,
}

/// llama.cpp's `nearest_int`: round to nearest, ties to even, by the 1.5·2^23 trick.
fn nearest_int(x: f32) -> i32 {
    ((x + 12_582_912.0f32).to_bits() & 0x007f_ffff) as i32 - 0x0040_0000
}

/// Stores one row of logits as llama.cpp does, into `out` (`row_words(logits.len())` words),
/// and returns the negative log-likelihood of `next` (as llama.cpp computes it for the PPL).
pub fn quantize_row(logits: &[f32], next: usize, out: &mut [u16]) -> f64 {
    let max = logits.iter().copied().fold(logits[0], f32::max);
    let min = logits
        .iter()
        .copied()
        .fold(logits[0], f32::min)
        .max(max - RANGE_NATS);
    let sum_exp: f64 = logits.iter().map(|&l| f64::from((l - max).exp())).sum();
    let log_sum_exp = sum_exp.ln() as f32;
    let min_log_prob = min - max - log_sum_exp;
    let scale = (max - min) / 65535.0;
    out[..2].copy_from_slice(&split(scale));
    out[2..4].copy_from_slice(&split(min_log_prob));
    let q = &mut out[4..4 + logits.len()];
    if scale != 0.0 {
        let inv = 1.0 / scale;
        for (w, &l) in q.iter_mut().zip(logits) {
            *w = if l > min {
                nearest_int(inv * (l - min)) as u16
            } else {
                0
            };
        }
    } else {
        q.fill(0);
    }
    out[4 + logits.len()..].fill(0);
    f64::from(max + log_sum_exp - logits[next])
}

/// An f32 as the two 16-bit words it occupies in memory (little-endian).
fn split(v: f32) -> [u16; 2] {
    let b = v.to_le_bytes();
    [u16::from_le_bytes([b[0], b[1]]), u16::from_le_bytes([b[2], b[3]])]
}

/// The f32 in two 16-bit words.
fn join(w: &[u16]) -> f32 {
    let (a, b) = (w[0].to_le_bytes(), w[1].to_le_bytes());
    f32::from_le_bytes([a[0], a[1], b[0], b[1]])
}

/// One stored row read back: `(scale, min_log_prob, quantised log-probabilities)`.
pub fn row_parts(row: &[u16], n_vocab: usize) -> (f32, f32, &[u16]) {
    (join(&row[0..2]), join(&row[2..4]), &row[4..4 + n_vocab])
}

/// Writes a base file: the header at creation, then each chunk's rows in order.
pub struct BaseWriter {
    out: BufWriter<File>,
    words: usize,
    bytes: Vec<u8>,
}

impl BaseWriter {
    /// Creates `path` and writes the header.
    pub fn create(path: &Path, header: &Header) -> Result<BaseWriter> {
        let file = File::create(path).with_context(|| format!("creating {}", path.display()))?;
        let mut out = BufWriter::with_capacity(1 << 20, file);
        out.write_all(MAGIC)?;
        for v in [header.n_ctx, header.n_vocab, header.n_chunk] {
            out.write_all(&(v as i32).to_le_bytes())?;
        }
        for t in &header.tokens {
            out.write_all(&t.to_le_bytes())?;
        }
        Ok(BaseWriter {
            out,
            words: row_words(header.n_vocab),
            bytes: Vec::new(),
        })
    }

    /// Appends stored rows (`row_words` words each).
    pub fn write_rows(&mut self, rows: &[u16]) -> Result<()> {
        debug_assert_eq!(rows.len() % self.words, 0);
        self.bytes.clear();
        self.bytes.extend(rows.iter().flat_map(|w| w.to_le_bytes()));
        self.out.write_all(&self.bytes)?;
        Ok(())
    }

    /// Flushes everything to disk; a short write is an error here, not a silent truncation.
    pub fn finish(mut self) -> Result<()> {
        self.out.flush()?;
        self.out.get_ref().sync_all()?;
        Ok(())
    }
}

/// Reads a base file: the header at open, then rows in order.
pub struct BaseReader {
    input: BufReader<File>,
    /// The header.
    pub header: Header,
    bytes: Vec<u8>,
}

impl BaseReader {
    /// Opens `path`, checks its magic and size against its header, and reads the header.
    pub fn open(path: &Path) -> Result<BaseReader> {
        let file = File::open(path).with_context(|| format!("opening {}", path.display()))?;
        let size = file.metadata()?.len();
        let mut input = BufReader::with_capacity(1 << 20, file);
        let mut magic = [0u8; 8];
        input
            .read_exact(&mut magic)
            .ok()
            .filter(|_| &magic == MAGIC)
            .with_context(|| {
                format!(
                    "{} is not a KL-divergence base file (no _logits_ magic)",
                    path.display()
                )
            })?;
        let mut int = || -> Result<usize> {
            let mut b = [0u8; 4];
            input.read_exact(&mut b)?;
            let v = i32::from_le_bytes(b);
            if v <= 0 {
                bail!("{}: a header field is {v}", path.display());
            }
            Ok(v as usize)
        };
        let (n_ctx, n_vocab, n_chunk) = (int()?, int()?, int()?);
        if n_ctx < 4 {
            bail!("{}: n_ctx {n_ctx} is too small", path.display());
        }
        let expected = 20
            + 4 * (n_ctx * n_chunk) as u64
            + 2 * (n_chunk * scored_rows(n_ctx) * row_words(n_vocab)) as u64;
        if size != expected {
            bail!(
                "{}: {size} bytes where n_ctx {n_ctx}, n_vocab {n_vocab} and n_chunk {n_chunk} make {expected} \
                 (a truncated or foreign file)",
                path.display()
            );
        }
        let mut raw = vec![0u8; 4 * n_ctx * n_chunk];
        input.read_exact(&mut raw)?;
        let tokens = raw
            .chunks_exact(4)
            .map(|b| i32::from_le_bytes([b[0], b[1], b[2], b[3]]))
            .collect();
        Ok(BaseReader {
            input,
            header: Header {
                n_ctx,
                n_vocab,
                n_chunk,
                tokens,
            },
            bytes: Vec::new(),
        })
    }

    /// Reads the next `rows.len() / row_words` stored rows into `rows`.
    pub fn read_rows(&mut self, rows: &mut [u16]) -> Result<()> {
        self.bytes.resize(rows.len() * 2, 0);
        self.input.read_exact(&mut self.bytes)?;
        for (w, b) in rows.iter_mut().zip(self.bytes.chunks_exact(2)) {
            *w = u16::from_le_bytes([b[0], b[1]]);
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nearest_int_rounds_half_to_even_like_llama_cpp() {
        assert_eq!(nearest_int(0.5), 0);
        assert_eq!(nearest_int(1.5), 2);
        assert_eq!(nearest_int(2.4999), 2);
        assert_eq!(nearest_int(65535.0), 65535);
    }

    #[test]
    fn a_stored_row_gives_back_log_probabilities_within_one_step() {
        let logits: Vec<f32> = (0..101).map(|i| ((i * 37 % 101) as f32) * 0.19 - 9.0).collect();
        let mut row = vec![0u16; row_words(logits.len())];
        let nll = quantize_row(&logits, 7, &mut row);
        let max = logits.iter().copied().fold(f32::MIN, f32::max);
        let lse = max as f64 + logits.iter().map(|&l| ((l - max) as f64).exp()).sum::<f64>().ln();
        assert!((nll - (lse - logits[7] as f64)).abs() < 1e-5, "nll {nll}");
        let (scale, min_lp, q) = row_parts(&row, logits.len());
        for (i, &l) in logits.iter().enumerate() {
            let back = scale * f32::from(q[i]) + min_lp;
            let exact = (l as f64 - lse) as f32;
            if exact > min_lp {
                assert!((back - exact).abs() <= scale, "token {i}: {back} vs {exact}");
            }
        }
        // The odd vocabulary's padding word is zero.
        assert_eq!(row.len(), 4 + 102);
        assert_eq!(row[105], 0);
    }

    #[test]
    fn a_written_file_reads_back_and_a_truncated_one_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("base.bin");
        let header = Header {
            n_ctx: 8,
            n_vocab: 5,
            n_chunk: 2,
            tokens: (0..16).collect(),
        };
        let words = row_words(5);
        let rows: Vec<u16> = (0..(2 * scored_rows(8) * words) as u16).collect();
        let mut w = BaseWriter::create(&path, &header).unwrap();
        w.write_rows(&rows[..rows.len() / 2]).unwrap();
        w.write_rows(&rows[rows.len() / 2..]).unwrap();
        w.finish().unwrap();
        let mut r = BaseReader::open(&path).unwrap();
        assert_eq!(r.header, header);
        let mut back = vec![0u16; rows.len()];
        r.read_rows(&mut back).unwrap();
        assert_eq!(back, rows);

        let bytes = std::fs::read(&path).unwrap();
        std::fs::write(&path, &bytes[..bytes.len() - 2]).unwrap();
        let err = BaseReader::open(&path).err().unwrap().to_string();
        assert!(err.contains("truncated"), "{err}");
        std::fs::write(&path, b"not a base file at all").unwrap();
        assert!(BaseReader::open(&path).is_err());
    }
}
