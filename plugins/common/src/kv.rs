//! Per-sequence KV cache: for each sequence and layer, keys and values as `[pos][kv_dim]` f32,
//! grown in chunks and kept when truncated, so warm decode steps do not allocate.

use berth_plugin_api::PluginError;

/// Positions added at a time when a sequence's buffers grow.
pub const KV_CHUNK: usize = 256;

#[derive(Clone, Debug, Default)]
struct SeqKv {
    len: usize,
    cap: usize,
    k: Vec<Vec<f32>>,
    v: Vec<Vec<f32>>,
}

/// Keys and values of every sequence, per layer.
#[derive(Clone, Debug)]
pub struct KvCache {
    dims: Vec<usize>,
    max_len: usize,
    seqs: Vec<SeqKv>,
}

impl KvCache {
    /// A cache for layers whose K and V rows hold `layer_dims[l]` floats (`n_kv_heads * head_dim`),
    /// for `max_seqs` sequences of at most `max_len` positions.
    pub fn new(layer_dims: Vec<usize>, max_seqs: usize, max_len: usize) -> KvCache {
        let empty = SeqKv {
            len: 0,
            cap: 0,
            k: vec![Vec::new(); layer_dims.len()],
            v: vec![Vec::new(); layer_dims.len()],
        };
        KvCache {
            dims: layer_dims,
            max_len,
            seqs: vec![empty; max_seqs],
        }
    }

    /// Number of sequence slots.
    pub fn max_sequences(&self) -> usize {
        self.seqs.len()
    }

    /// Longest sequence held.
    pub fn max_len(&self) -> usize {
        self.max_len
    }

    /// Floats per K (or V) row in layer `layer`.
    pub fn dim(&self, layer: usize) -> usize {
        self.dims[layer]
    }

    /// Checks a sequence id and returns it as an index.
    pub fn check_seq(&self, seq: i32) -> Result<usize, PluginError> {
        if seq < 0 || seq as usize >= self.seqs.len() {
            return Err(PluginError::invalid_argument(format!(
                "sequence id {seq} outside 0..{}",
                self.seqs.len()
            )));
        }
        Ok(seq as usize)
    }

    /// Positions held by sequence `seq` (an index from [`KvCache::check_seq`]).
    pub fn seq_len(&self, seq: usize) -> usize {
        self.seqs[seq].len
    }

    /// Makes room for `len` positions in sequence `seq` (grows in [`KV_CHUNK`] steps).
    pub fn reserve(&mut self, seq: usize, len: usize) {
        let s = &mut self.seqs[seq];
        if len <= s.cap {
            return;
        }
        let cap = len.div_ceil(KV_CHUNK) * KV_CHUNK;
        for (l, &d) in self.dims.iter().enumerate() {
            s.k[l].resize(cap * d, 0.0);
            s.v[l].resize(cap * d, 0.0);
        }
        s.cap = cap;
    }

    /// Sets the length of sequence `seq` (positions below it must have been written).
    pub fn set_len(&mut self, seq: usize, len: usize) {
        assert!(len <= self.seqs[seq].cap, "set_len beyond reserved capacity");
        self.seqs[seq].len = len;
    }

    /// Empties sequence `seq` and gives its memory back (an embedding call's sequences: the next
    /// call's may be of any length, and idle slots should not hold their longest input's keys).
    pub fn release(&mut self, seq: usize) {
        let s = &mut self.seqs[seq];
        s.len = 0;
        s.cap = 0;
        for buf in s.k.iter_mut().chain(s.v.iter_mut()) {
            *buf = Vec::new();
        }
    }

    /// Drops every position at or after `len` (keeps the memory).
    pub fn truncate(&mut self, seq: usize, len: usize) {
        let s = &mut self.seqs[seq];
        s.len = s.len.min(len);
    }

    /// Copies sequence `src` into `dst`.
    pub fn fork(&mut self, src: usize, dst: usize) {
        if src == dst {
            return;
        }
        let len = self.seqs[src].len;
        self.reserve(dst, len);
        for l in 0..self.dims.len() {
            let n = len * self.dims[l];
            let (s, d) = two_mut(&mut self.seqs, src, dst);
            d.k[l][..n].copy_from_slice(&s.k[l][..n]);
            d.v[l][..n].copy_from_slice(&s.v[l][..n]);
        }
        self.seqs[dst].len = len;
    }

    /// Writes the key and value rows of position `pos` in layer `layer` (room must be reserved).
    pub fn write(&mut self, seq: usize, layer: usize, pos: usize, k: &[f32], v: &[f32]) {
        let d = self.dims[layer];
        let s = &mut self.seqs[seq];
        s.k[layer][pos * d..(pos + 1) * d].copy_from_slice(&k[..d]);
        s.v[layer][pos * d..(pos + 1) * d].copy_from_slice(&v[..d]);
    }

    /// Keys and values of layer `layer` for positions `0..upto` of sequence `seq`.
    pub fn layer(&self, seq: usize, layer: usize, upto: usize) -> (&[f32], &[f32]) {
        let d = self.dims[layer];
        let s = &self.seqs[seq];
        (&s.k[layer][..upto * d], &s.v[layer][..upto * d])
    }
}

fn two_mut<T>(v: &mut [T], a: usize, b: usize) -> (&T, &mut T) {
    if a < b {
        let (lo, hi) = v.split_at_mut(b);
        (&lo[a], &mut hi[0])
    } else {
        let (lo, hi) = v.split_at_mut(a);
        (&hi[0], &mut lo[b])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn write_truncate_fork() {
        let mut kv = KvCache::new(vec![2, 3], 4, 1000);
        assert!(kv.check_seq(4).is_err());
        kv.reserve(1, 3);
        for p in 0..3 {
            let x = [p as f32; 3];
            kv.write(1, 0, p, &x, &x);
            kv.write(1, 1, p, &x, &x);
        }
        kv.set_len(1, 3);
        kv.fork(1, 0);
        assert_eq!(kv.seq_len(0), 3);
        assert_eq!(kv.layer(0, 1, 3).0, &[0., 0., 0., 1., 1., 1., 2., 2., 2.]);
        kv.truncate(1, 1);
        assert_eq!(kv.seq_len(1), 1);
        assert_eq!(kv.seq_len(0), 3);
    }
}
