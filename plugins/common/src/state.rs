//! Per-sequence recurrent state of the layers that are not attention: a convolution window
//! (LFM2's short convolution, the delta-net's input convolution) and a matrix state (the gated
//! delta rule), with snapshots so that a sequence can go back to a position it passed.
//!
//! Attention layers keep their keys and values in [`crate::kv::KvCache`], which can rewind
//! anywhere; these states only hold "now", so a rewind needs a snapshot taken at that position:
//! 0 (the empty state), the current length, and every multiple of [`SeqStates::every`] that the
//! sequence passed (the most recent [`SeqStates::max_snapshots`] of them).

use berth_plugin_api::PluginError;

/// Floats of one layer's state per sequence.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct LayerStateDims {
    /// Convolution window (`(kernel-1) × channels`).
    pub conv: usize,
    /// Recurrent matrix state.
    pub recurrent: usize,
}

/// One layer's state of one sequence.
#[derive(Clone, Debug, Default)]
pub struct LayerState {
    /// Convolution window, oldest input first.
    pub conv: Vec<f32>,
    /// Recurrent matrix state.
    pub recurrent: Vec<f32>,
}

#[derive(Clone, Debug, Default)]
struct Snapshot {
    len: usize,
    layers: Vec<LayerState>,
}

#[derive(Clone, Debug, Default)]
struct SeqState {
    layers: Vec<LayerState>,
    snapshots: Vec<Snapshot>,
}

/// The recurrent state of every sequence, per layer, with snapshots.
#[derive(Clone, Debug)]
pub struct SeqStates {
    dims: Vec<LayerStateDims>,
    seqs: Vec<SeqState>,
    every: usize,
    max_snapshots: usize,
}

impl SeqStates {
    /// States for `max_seqs` sequences with layers of the given sizes; a snapshot is kept every
    /// `every` positions, at most `max_snapshots` per sequence.
    pub fn new(dims: Vec<LayerStateDims>, max_seqs: usize, every: usize, max_snapshots: usize) -> SeqStates {
        let fresh = SeqState {
            layers: dims
                .iter()
                .map(|d| LayerState {
                    conv: vec![0.0; d.conv],
                    recurrent: vec![0.0; d.recurrent],
                })
                .collect(),
            snapshots: Vec::new(),
        };
        SeqStates {
            dims,
            seqs: vec![fresh; max_seqs],
            every: every.max(1),
            max_snapshots,
        }
    }

    /// Whether any layer holds state (otherwise rewinds are free).
    pub fn is_recurrent(&self) -> bool {
        self.dims.iter().any(|d| d.conv + d.recurrent > 0)
    }

    /// Positions between snapshots.
    pub fn every(&self) -> usize {
        self.every
    }

    /// Most snapshots kept per sequence.
    pub fn max_snapshots(&self) -> usize {
        self.max_snapshots
    }

    /// Whether a snapshot is due once a sequence reaches `len` positions.
    pub fn snapshot_due(&self, len: usize) -> bool {
        self.max_snapshots > 0 && len > 0 && len.is_multiple_of(self.every)
    }

    /// One layer's state of a sequence.
    pub fn layer_mut(&mut self, seq: usize, layer: usize) -> &mut LayerState {
        &mut self.seqs[seq].layers[layer]
    }

    /// Records layer `layer`'s current state as the snapshot at `len` positions.
    pub fn snapshot_layer(&mut self, seq: usize, layer: usize, len: usize) {
        let n_layers = self.dims.len();
        let s = &mut self.seqs[seq];
        let at = match s.snapshots.iter().position(|x| x.len == len) {
            Some(i) => i,
            None => {
                if s.snapshots.len() >= self.max_snapshots {
                    // Thin out the middle: keep the oldest (a shared system prompt) and the
                    // newest (the previous turn of a conversation).
                    s.snapshots.remove(s.snapshots.len() / 2);
                }
                s.snapshots.push(Snapshot {
                    len,
                    layers: vec![LayerState::default(); n_layers],
                });
                s.snapshots.sort_by_key(|x| x.len);
                s.snapshots
                    .iter()
                    .position(|x| x.len == len)
                    .expect("just inserted")
            }
        };
        let (src, dst) = (&s.layers[layer], &mut s.snapshots[at].layers[layer]);
        dst.conv.clone_from(&src.conv);
        dst.recurrent.clone_from(&src.recurrent);
    }

    /// Positions a sequence of length `current` can be cut back to, besides 0 and `current`.
    pub fn snapshot_lens(&self, seq: usize) -> Vec<usize> {
        self.seqs[seq].snapshots.iter().map(|x| x.len).collect()
    }

    /// Brings sequence `seq` (now `current` positions long) back to `len` positions: to 0 by
    /// clearing, to `current` by doing nothing, elsewhere only to a snapshot.
    pub fn truncate(&mut self, seq: usize, len: usize, current: usize) -> Result<(), PluginError> {
        if len >= current || !self.is_recurrent() {
            return Ok(());
        }
        let s = &mut self.seqs[seq];
        if len == 0 {
            for l in &mut s.layers {
                l.conv.fill(0.0);
                l.recurrent.fill(0.0);
            }
            s.snapshots.clear();
            return Ok(());
        }
        let Some(i) = s
            .snapshots
            .iter()
            .position(|x| x.len == len && x.layers.len() == s.layers.len())
        else {
            return Err(PluginError::invalid_argument(format!(
                "sequence {seq}: cannot rewind recurrent state from {current} to {len} positions \
                 (snapshots at 0, {current} and {:?})",
                s.snapshots.iter().map(|x| x.len).collect::<Vec<_>>()
            )));
        };
        for (dst, src) in s.layers.iter_mut().zip(&s.snapshots[i].layers) {
            dst.conv.copy_from_slice(&src.conv);
            dst.recurrent.copy_from_slice(&src.recurrent);
        }
        s.snapshots.truncate(i + 1);
        Ok(())
    }

    /// Copies sequence `src`'s state and snapshots into `dst`.
    pub fn fork(&mut self, src: usize, dst: usize) {
        if src != dst {
            let copy = self.seqs[src].clone();
            self.seqs[dst] = copy;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn states() -> SeqStates {
        let dims = vec![
            LayerStateDims {
                conv: 2,
                recurrent: 3,
            },
            LayerStateDims::default(),
        ];
        SeqStates::new(dims, 2, 4, 3)
    }

    #[test]
    fn rewinds_only_to_zero_now_and_snapshots() {
        let mut s = states();
        s.layer_mut(0, 0).recurrent.fill(1.0);
        assert!(s.snapshot_due(4) && !s.snapshot_due(5) && !s.snapshot_due(0));
        s.snapshot_layer(0, 0, 4);
        s.layer_mut(0, 0).recurrent.fill(2.0);
        assert!(s.truncate(0, 6, 6).is_ok());
        assert!(s.truncate(0, 5, 6).is_err());
        s.truncate(0, 4, 6).unwrap();
        assert_eq!(s.layer_mut(0, 0).recurrent, vec![1.0; 3]);
        s.truncate(0, 0, 4).unwrap();
        assert_eq!(s.layer_mut(0, 0).recurrent, vec![0.0; 3]);
        assert!(s.snapshot_lens(0).is_empty());
    }

    #[test]
    fn keeps_oldest_and_newest_snapshots_and_forks_them() {
        let mut s = states();
        for len in [4, 8, 12, 16] {
            s.snapshot_layer(0, 0, len);
        }
        assert_eq!(s.snapshot_lens(0), vec![4, 12, 16]);
        s.fork(0, 1);
        assert_eq!(s.snapshot_lens(1), vec![4, 12, 16]);
    }
}
