//! A generic pre-norm transformer decoder (Llama/Qwen layout, with the switches and per-layer
//! options Gemma 3 and 4, LFM2 and Qwen3.5 need), running a batch of rows from several sequences:
//! linear layers over all rows at once, attention per row against its own sequence's KV cache,
//! and the LM head only for rows that want logits.
//!
//! The forward pass reads as its blocks (`forward`):
//!
//! ```text
//! x = embed(tokens)                      (given embeddings replace image rows)
//! per-layer inputs (Gemma 4)
//! for each layer:
//!     x += post_norm(mixer(norm(x)))     attention | short conv | gated delta-net
//!     x += post_norm(ffn(norm(x)))       dense | MoE | dense + MoE
//!     x += per-layer input (Gemma 4);  x *= layer scalar (Gemma 4)
//! logits = head(final_norm(x))           for the rows that want them, soft-capped
//! ```
//!
//! - [`config`]: [`DecoderConfig`], the shape and switches.
//! - [`weights`]: [`DecoderWeights`], loading and checks.
//! - `forward`: the pass and its per-layer blocks; `attention`, `ffn`, `head`: the blocks.

mod attention;
mod checks;
pub mod config;
mod ffn;
mod forward;
mod geometry;
mod head;
#[cfg(test)]
mod tests;
pub mod weights;

use crate::kv::KvCache;
use crate::ops::Rope;
use crate::state::{LayerStateDims, SeqStates};
use attention::layer_rope;
use berth_plugin_api::{BatchView, LogitsOut, PluginError, Rewind};
use forward::Scratch;
use geometry::AttnGeometry;

pub use crate::layers::{
    Activation, AttnShape, AttnWeights, DenseMoe, Ffn, FfnBias, GatedDeltaNet, GatedFfn, KvSource,
    LayerWeights, Mixer, MoeBiases, MoeConfig, Ple, PleLayer, RouterScoring, SharedExpert, ShortConv,
};
pub use config::DecoderConfig;
pub use weights::DecoderWeights;

/// A decoder with its KV cache and scratch space: the whole per-instance state of a model.
pub struct Decoder {
    /// Configuration.
    pub cfg: DecoderConfig,
    /// Weights.
    pub weights: DecoderWeights,
    /// KV cache of every sequence (attention layers).
    pub kv: KvCache,
    /// Convolution and recurrent state of every sequence (the other layers).
    pub states: SeqStates,
    /// Compute threads.
    pub threads: usize,
    ropes: Vec<Rope>,
    geometry: Vec<Option<AttnGeometry>>,
    s: Scratch,
}

impl Decoder {
    /// A decoder for `max_seqs` sequences of at most `max_len` positions.
    pub fn new(
        cfg: DecoderConfig,
        weights: DecoderWeights,
        max_seqs: usize,
        max_len: usize,
        threads: usize,
    ) -> Decoder {
        let ropes = (0..cfg.rope_base.len())
            .map(|l| layer_rope(&cfg, &weights, l))
            .collect();
        let geometry: Vec<Option<AttnGeometry>> = (weights.layers.iter().enumerate())
            .map(|(l, lw)| AttnGeometry::of(&cfg, &lw.mixer, l))
            .collect();
        let kv_dims = (geometry.iter().enumerate())
            .map(|(l, g)| g.map_or(0, |g| g.cached(l)))
            .collect();
        let kv = KvCache::new(kv_dims, max_seqs, max_len);
        let state_dims: Vec<LayerStateDims> = weights.layers.iter().map(state_dims).collect();
        let max_snapshots = budgeted_snapshots(&state_dims, max_seqs, cfg.max_snapshots, cfg.snapshot_budget);
        let states = SeqStates::new(state_dims, max_seqs, cfg.snapshot_every, max_snapshots);
        Decoder {
            cfg,
            weights,
            kv,
            states,
            threads: threads.max(1),
            ropes,
            geometry,
            s: Scratch::default(),
        }
    }

    /// Logits per row: the LM head's rows.
    pub fn vocab_size(&self) -> usize {
        self.weights.output.rows
    }

    /// Positions held by sequence `seq`.
    pub fn seq_len(&self, seq: i32) -> Result<usize, PluginError> {
        Ok(self.kv.seq_len(self.kv.check_seq(seq)?))
    }

    /// How far back a sequence can be cut: anywhere without recurrent layers, else to the
    /// snapshots [`SeqStates`] keeps (or only to 0 when it keeps none).
    pub fn rewind(&self) -> Rewind {
        if !self.states.is_recurrent() {
            Rewind::Anywhere
        } else if self.states.max_snapshots() == 0 {
            Rewind::OnlyToStart
        } else {
            Rewind::Snapshots {
                every: self.states.every() as u32,
            }
        }
    }

    /// Drops every position at or after `len` from a sequence; recurrent layers refuse a
    /// position they hold no snapshot of (the sequence is then unchanged).
    pub fn seq_truncate(&mut self, seq: i32, len: u32) -> Result<(), PluginError> {
        let s = self.kv.check_seq(seq)?;
        let current = self.kv.seq_len(s);
        self.states.truncate(s, len as usize, current)?;
        self.kv.truncate(s, len as usize);
        Ok(())
    }

    /// Copies sequence `src` into `dst`.
    pub fn seq_fork(&mut self, src: i32, dst: i32) -> Result<(), PluginError> {
        let (s, d) = (self.kv.check_seq(src)?, self.kv.check_seq(dst)?);
        self.kv.fork(s, d);
        self.states.fork(s, d);
        Ok(())
    }

    /// Feeds one token to a sequence at its next position without computing logits.
    pub fn force_token(&mut self, seq: i32, token: i32) -> Result<(), PluginError> {
        let pos = self.seq_len(seq)? as i32;
        let batch = BatchView {
            tokens: &[token],
            positions: &[pos],
            seq_ids: &[seq],
            want_logits: &[0],
        };
        self.decode(&batch, &mut LogitsOut::new(&mut [], self.vocab_size()))
    }

    /// Runs a batch (the plugin `decode` contract): each row's position must be its sequence's
    /// next one; one logits row is written per row that wants logits, in batch order.
    pub fn decode(&mut self, batch: &BatchView<'_>, logits: &mut LogitsOut<'_>) -> Result<(), PluginError> {
        self.decode_with_embeddings(batch, &[], logits)
    }

    /// [`Decoder::decode`] with some rows' input embeddings given by the caller: each
    /// `(row, embedding)` of `embeds` (a batch row index and `hidden` floats) replaces that row's
    /// token embedding (after any embedding scale) as the first layer's input, as transformers
    /// places `inputs_embeds` (image features at image-token positions). The row's token must
    /// still be a valid id; per-layer embeddings (Gemma 4) still come from it.
    ///
    /// Rows run in batch order, whatever the mix of prompt chunks and decode steps: matmuls round
    /// every row as a single row would (packed or single-order kernels), attention computes each
    /// row alone or bit for bit as alone, and the recurrent mixers group rows by sequence, so each
    /// row's logits are those of running its sequence alone.
    pub fn decode_with_embeddings(
        &mut self,
        batch: &BatchView<'_>,
        embeds: &[(usize, &[f32])],
        logits: &mut LogitsOut<'_>,
    ) -> Result<(), PluginError> {
        batch.validate()?;
        if self.cfg.bidirectional {
            return Err(PluginError::unsupported(
                "this is an embedding model (bidirectional attention): it embeds text and does not generate",
            ));
        }
        self.check_embeddings(batch.len(), embeds)?;
        self.check_logits(batch, logits)?;
        self.place_rows(batch)?;
        if self.states.is_recurrent() {
            self.s.groups.build(&self.s.rows);
        }
        self.forward(batch.tokens, embeds, batch.want_logits, logits, None);
        for (seq, next) in self.s.seq_next.iter().enumerate() {
            if let Some(len) = *next {
                self.kv.set_len(seq, len);
            }
        }
        Ok(())
    }

    /// Refuses given embeddings of the wrong width, outside the batch or two for one row.
    fn check_embeddings(&self, n: usize, embeds: &[(usize, &[f32])]) -> Result<(), PluginError> {
        for (k, &(row, e)) in embeds.iter().enumerate() {
            if row >= n || e.len() != self.cfg.hidden {
                return Err(PluginError::invalid_argument(format!(
                    "embedding for row {row} of {n}: {} floats, hidden size {}",
                    e.len(),
                    self.cfg.hidden
                )));
            }
            if embeds[..k].iter().any(|&(r, _)| r == row) {
                return Err(PluginError::invalid_argument(format!(
                    "row {row} is given two embeddings"
                )));
            }
        }
        Ok(())
    }

    /// Refuses a logits buffer with too few rows or too short ones for the rows that want logits.
    fn check_logits(&self, batch: &BatchView<'_>, logits: &LogitsOut<'_>) -> Result<(), PluginError> {
        let vocab = self.vocab_size();
        let want = batch.logit_rows();
        if want > 0 && logits.row_len() < vocab {
            return Err(PluginError::invalid_argument(format!(
                "logits rows hold {} floats; the vocabulary has {vocab}",
                logits.row_len()
            )));
        }
        if logits.capacity_rows() < want {
            return Err(PluginError::invalid_argument(format!(
                "logits buffer holds {} rows; {want} wanted",
                logits.capacity_rows()
            )));
        }
        Ok(())
    }

    /// Checks each row (a known sequence, a token of the vocabulary, its sequence's next
    /// position, room left) and records it in `s.rows` (sequence, position) and `s.seq_next`
    /// (each sequence's length after the batch); reserves the cache for those lengths.
    fn place_rows(&mut self, batch: &BatchView<'_>) -> Result<(), PluginError> {
        let s = &mut self.s;
        s.seq_next.clear();
        s.seq_next.resize(self.kv.max_sequences(), None);
        s.rows.clear();
        for i in 0..batch.len() {
            let seq = self.kv.check_seq(batch.seq_ids[i])?;
            let tok = batch.tokens[i];
            if tok < 0 || tok as usize >= self.weights.vocab_in() {
                return Err(PluginError::invalid_argument(format!(
                    "token {tok} outside the vocabulary (size {})",
                    self.weights.vocab_in()
                )));
            }
            let next = s.seq_next[seq].unwrap_or_else(|| self.kv.seq_len(seq));
            let pos = batch.positions[i];
            if pos < 0 || pos as usize != next {
                return Err(PluginError::invalid_argument(format!(
                    "sequence {seq}: position {pos} is not its next position {next}"
                )));
            }
            if next >= self.kv.max_len() {
                return Err(PluginError::invalid_argument(format!(
                    "sequence {seq} is full ({} positions)",
                    self.kv.max_len()
                )));
            }
            s.seq_next[seq] = Some(next + 1);
            s.rows.push((seq, next));
        }
        for (seq, next) in s.seq_next.iter().enumerate() {
            if let Some(len) = *next {
                self.kv.reserve(seq, len);
            }
        }
        Ok(())
    }

    /// The final-normed hidden states of whole sequences (an embedding model's token states),
    /// all in one forward pass: sequence `k` of `seqs` runs from position 0 in slot `k`, emptied
    /// before and released after (its keys and values are not needed once the states are out).
    /// Returns `[row][hidden]`, the sequences' rows back to back.
    pub fn embed_states(&mut self, seqs: &[&[i32]]) -> Result<Vec<f32>, PluginError> {
        self.check_embedding_input(seqs)?;
        let s = &mut self.s;
        s.seq_next.clear();
        s.seq_next.resize(self.kv.max_sequences(), None);
        s.rows.clear();
        let mut tokens = Vec::with_capacity(seqs.iter().map(|q| q.len()).sum());
        for (k, seq) in seqs.iter().enumerate() {
            self.kv.set_len(k, 0);
            self.kv.reserve(k, seq.len());
            s.seq_next[k] = Some(seq.len());
            s.rows.extend((0..seq.len()).map(|pos| (k, pos)));
            tokens.extend_from_slice(seq);
        }
        let want = vec![0u8; tokens.len()];
        let mut hidden = Vec::new();
        let vocab = self.vocab_size();
        let mut no_logits = LogitsOut::new(&mut [], vocab);
        self.forward(&tokens, &[], &want, &mut no_logits, Some(&mut hidden));
        for k in 0..seqs.len() {
            self.kv.release(k);
        }
        Ok(hidden)
    }

    /// Refuses to embed with recurrent layers, more sequences than slots, an empty or too long
    /// sequence, or a token outside the vocabulary.
    fn check_embedding_input(&self, seqs: &[&[i32]]) -> Result<(), PluginError> {
        if self.states.is_recurrent() {
            return Err(PluginError::unsupported(
                "embedding with convolution or recurrent layers",
            ));
        }
        if seqs.len() > self.kv.max_sequences() {
            return Err(PluginError::invalid_argument(format!(
                "{} sequences to embed; the model holds {} at once",
                seqs.len(),
                self.kv.max_sequences()
            )));
        }
        for (k, seq) in seqs.iter().enumerate() {
            if seq.is_empty() || seq.len() > self.kv.max_len() {
                return Err(PluginError::invalid_argument(format!(
                    "sequence {k} has {} tokens; 1 to {} can be embedded",
                    seq.len(),
                    self.kv.max_len()
                )));
            }
            let vocab = self.weights.vocab_in();
            if let Some(&t) = seq.iter().find(|&&t| t < 0 || t as usize >= vocab) {
                return Err(PluginError::invalid_argument(format!(
                    "token {t} outside the vocabulary (size {vocab})"
                )));
            }
        }
        Ok(())
    }
}

/// The convolution and recurrent state a layer keeps per sequence (none for attention).
fn state_dims(layer: &LayerWeights) -> LayerStateDims {
    match &layer.mixer {
        Mixer::Attention(_) => LayerStateDims::default(),
        Mixer::ShortConv(c) => LayerStateDims {
            conv: (c.kernel - 1) * c.out_proj.rows,
            recurrent: 0,
        },
        Mixer::GatedDeltaNet(d) => LayerStateDims {
            conv: (d.kernel - 1) * d.conv_channels(),
            recurrent: d.state_len(),
        },
    }
}

/// Snapshots per sequence that fit `budget` bytes for `max_seqs` sequences, at most `wanted`.
fn budgeted_snapshots(dims: &[LayerStateDims], max_seqs: usize, wanted: usize, budget: usize) -> usize {
    let per_snapshot: usize = dims.iter().map(|d| (d.conv + d.recurrent) * 4).sum();
    if per_snapshot == 0 {
        return wanted;
    }
    wanted.min(budget / (per_snapshot * max_seqs.max(1)))
}
