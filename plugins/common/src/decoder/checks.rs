//! The shape checks of a decoder's layers against its config: every mixer's and feed-forward's
//! matrices and vectors fit the hidden size and heads (done once, when the weights are assembled).

use super::config::DecoderConfig;
use crate::layers::{AttnWeights, Ffn, KvSource, LayerWeights, Mixer};
use berth_plugin_api::PluginError;

impl AttnWeights {
    /// Head size and KV heads: the layer's own, else the config's.
    pub fn geometry(&self, cfg: &DecoderConfig) -> (usize, usize) {
        self.shape
            .as_ref()
            .map_or((cfg.head_dim, cfg.n_kv_heads), |s| (s.head_dim, s.n_kv_heads))
    }
}

/// Checks layer `i`'s shapes against `cfg`.
pub(super) fn check_layer(l: &LayerWeights, cfg: &DecoderConfig, i: usize) -> Result<(), PluginError> {
    let h = cfg.hidden;
    if l.attn_norm.len() != h || l.ffn_norm.len() != h {
        return Err(PluginError::failed(format!(
            "layer {i}: norm widths differ from hidden {h}"
        )));
    }
    check_ffn(&l.ffn, cfg, i)?;
    let mixer_ok = match &l.mixer {
        Mixer::Attention(a) => return check_attention(a, cfg, i),
        Mixer::ShortConv(c) => {
            c.in_proj.rows == 3 * h
                && c.in_proj.cols == h
                && c.out_proj.rows == h
                && c.out_proj.cols == h
                && c.conv.len() == h * c.kernel
                && c.kernel >= 1
        }
        Mixer::GatedDeltaNet(d) => {
            let (kd, vd) = (d.k_heads * d.dk, d.v_heads * d.dv);
            d.k_heads > 0
                && d.v_heads % d.k_heads == 0
                && d.in_qkv.rows == 2 * kd + vd
                && d.in_qkv.cols == h
                && d.in_z.rows == vd
                && d.in_b.rows == d.v_heads
                && d.in_a.rows == d.v_heads
                && d.conv.len() == d.conv_channels() * d.kernel
                && d.kernel >= 1
                && d.neg_a.len() == d.v_heads
                && d.dt_bias.len() == d.v_heads
                && d.norm.len() == d.dv
                && d.out_proj.rows == h
                && d.out_proj.cols == vd
        }
    };
    if !mixer_ok {
        return Err(PluginError::failed(format!(
            "layer {i}: mixer shapes do not fit hidden {h}"
        )));
    }
    Ok(())
}

fn check_attention(a: &AttnWeights, cfg: &DecoderConfig, i: usize) -> Result<(), PluginError> {
    let h = cfg.hidden;
    let (hd, nkv) = a.geometry(cfg);
    let (q, kv) = (cfg.n_heads * hd, nkv * hd);
    let q_rows = if a.gated { 2 * q } else { q };
    let norm_ok = |n: &Option<Vec<f32>>| n.as_ref().is_none_or(|n| n.len() == hd);
    let bias_ok = |b: &Option<Vec<f32>>, n: usize| b.as_ref().is_none_or(|b| b.len() == n);
    let kv_ok = match &a.kv {
        KvSource::Own {
            wk,
            wv,
            bk,
            bv,
            k_norm,
        } => {
            (wk.rows, wk.cols) == (kv, h)
                && wv.as_ref().is_none_or(|v| (v.rows, v.cols) == (kv, h))
                && bias_ok(bk, kv)
                && bias_ok(bv, kv)
                && norm_ok(k_norm)
        }
        KvSource::Shared(src) => *src < i,
    };
    let ok = hd > 0
        && nkv > 0
        && cfg.n_heads.is_multiple_of(nkv)
        && (a.wq.rows, a.wq.cols) == (q_rows, h)
        && (a.wo.rows, a.wo.cols) == (h, q)
        && bias_ok(&a.bo, h)
        && bias_ok(&a.sinks, cfg.n_heads)
        && bias_ok(&a.bq, q)
        && norm_ok(&a.q_norm)
        && a.shape.as_ref().is_none_or(|s| s.rope.head_dim == hd)
        && kv_ok;
    if !ok {
        return Err(PluginError::failed(format!(
            "layer {i}: attention q {:?} o {:?} and keys/values {:?} do not fit hidden {h}, {} heads, {nkv} kv heads of {hd}",
            a.wq, a.wo, a.kv, cfg.n_heads
        )));
    }
    Ok(())
}

fn check_ffn(f: &Ffn, cfg: &DecoderConfig, i: usize) -> Result<(), PluginError> {
    let h = cfg.hidden;
    if let Ffn::Moe {
        router,
        experts,
        biases,
        ..
    } = f
    {
        let ne = experts.len();
        let shapes_ok = experts.iter().all(|e| {
            (e.gate.cols, e.up.cols, e.down.rows) == (h, h, h)
                && e.up.rows == e.gate.rows
                && e.down.cols == e.gate.rows
        });
        let biases_ok = biases.as_ref().is_none_or(|b| {
            b.router.len() == ne
                && b.experts.len() == ne
                && b.experts
                    .iter()
                    .zip(experts)
                    .all(|(b, e)| (b.gate.len(), b.up.len(), b.down.len()) == (e.gate.rows, e.up.rows, h))
        });
        if cfg.moe.is_none() || (router.rows, router.cols) != (ne, h) || !shapes_ok || !biases_ok {
            return Err(PluginError::failed(format!(
                "layer {i}: MoE block with router {router:?} and {ne} experts does not fit hidden {h} \
                 (or its biases do not fit the experts, or there is no MoE config)"
            )));
        }
        return Ok(());
    }
    let Ffn::DenseMoe(m) = f else { return Ok(()) };
    let ne = m.experts.len();
    let ok = cfg.moe.is_some()
        && (m.router.rows, m.router.cols) == (ne, h)
        && m.expert_scale.len() == ne
        && [
            &m.router_scale,
            &m.post_dense_norm,
            &m.pre_experts_norm,
            &m.post_experts_norm,
        ]
        .iter()
        .all(|v| v.len() == h);
    if !ok {
        return Err(PluginError::failed(format!(
            "layer {i}: MoE block with router {:?} and {ne} experts does not fit hidden {h} (or no MoE config)",
            m.router
        )));
    }
    Ok(())
}
