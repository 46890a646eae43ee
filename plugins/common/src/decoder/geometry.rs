//! The shape of each attention layer's heads and cache, computed once when the decoder is
//! built; read by the forward pass (cache sizes) and the attention block.

use super::DecoderConfig;
use crate::layers::{KvSource, Mixer};

/// The shape of one attention layer's heads and the cache it reads.
#[derive(Clone, Copy, Debug)]
pub(super) struct AttnGeometry {
    pub(super) head_dim: usize,
    pub(super) n_kv_heads: usize,
    /// The layer whose cache holds the keys and values.
    pub(super) kv_layer: usize,
    pub(super) window: Option<usize>,
}

impl AttnGeometry {
    /// The geometry of layer `layer` if it is an attention layer.
    pub(super) fn of(cfg: &DecoderConfig, mixer: &Mixer, layer: usize) -> Option<AttnGeometry> {
        let window = cfg.sliding_window.get(layer).copied().flatten();
        let Mixer::Attention(a) = mixer else {
            return None;
        };
        let (head_dim, n_kv_heads) = a.geometry(cfg);
        let kv_layer = match a.kv {
            KvSource::Own { .. } => layer,
            KvSource::Shared(src) => src,
        };
        Some(AttnGeometry {
            head_dim,
            n_kv_heads,
            kv_layer,
            window,
        })
    }

    pub(super) fn kv_dim(&self) -> usize {
        self.n_kv_heads * self.head_dim
    }

    /// Floats this layer keeps per position in its own cache.
    pub(super) fn cached(&self, layer: usize) -> usize {
        if self.kv_layer == layer {
            self.kv_dim()
        } else {
            0
        }
    }
}
