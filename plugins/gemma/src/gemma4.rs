//! Gemma 4's config and weight map onto the common decoder, as transformers defines the model:
//! per-layer head sizes and KV-head counts, q/k norms with weights and a weightless v norm,
//! attention scale 1, proportional RoPE on global layers, KV sharing between layers (values equal
//! to the keys on layers without a value projection), per-layer embeddings, a MoE block next to
//! the dense MLP, per-layer output scalars and a final logit soft-cap. All norms are plain `x · w`.

use crate::{rope_params, round_to_dtype, sliding_layers};
use berth_plugin_api::PluginError;
use berth_plugin_common::family::{bad, HfConfig};
use berth_plugin_common::ops::Rope;
use berth_plugin_common::{
    Activation, AttnShape, AttnWeights, DecoderConfig, DecoderWeights, DenseMoe, Ffn, GatedFfn, KvSource,
    LayerWeights, Mixer, MoeConfig, Ple, PleLayer, Weights,
};

/// The decoder config and weights of a Gemma 4 text model from its HF config and safetensors.
pub fn load(hc: &HfConfig, w: &Weights) -> Result<(DecoderConfig, DecoderWeights), PluginError> {
    let c = hc.0;
    let mut cfg = hc.decoder_config()?;
    let (n_layers, hidden) = (cfg.n_layers, cfg.hidden);
    cfg.qk_norm = true;
    cfg.post_norms = true;
    cfg.activation = Activation::GeluTanh;
    cfg.attn_scale = 1.0;
    cfg.final_softcap = hc.float("final_logit_softcapping").map(|v| v as f32);
    cfg.attn_softcap = hc.float("attn_logit_softcapping").map(|v| v as f32);
    let window = hc.num("sliding_window");
    let sliding = sliding_layers(c, n_layers, 6);
    let global = rope_params(c, "full_attention", 1_000_000.0);
    let local = rope_params(c, "sliding_attention", 10_000.0);
    let first_shared = n_layers - hc.num("num_kv_shared_layers").unwrap_or(0).min(n_layers);
    if hc.flag("enable_moe_block").unwrap_or(false) {
        let top_k = hc
            .num("top_k_experts")
            .or(hc.num("num_experts_per_tok"))
            .ok_or_else(|| bad("config.json: missing top_k_experts"))?;
        cfg.moe = Some(MoeConfig::softmax(hc.req("num_experts")?, top_k, true));
    }
    let ple_dim = hc.num("hidden_size_per_layer_input").unwrap_or(0);

    let layer = |i: usize, stem: &str| format!("model.layers.{i}.{stem}");
    let vec = |name: String| w.vector_named(&name);
    let mat = |name: String| w.matrix_named(&name);
    let mut layers: Vec<LayerWeights> = Vec::with_capacity(n_layers);
    // Each layer's head size and KV heads, for the layers that share its cache.
    let mut geometry: Vec<(usize, usize)> = Vec::with_capacity(n_layers);
    let mut scalars = Vec::with_capacity(n_layers);
    for i in 0..n_layers {
        let q_norm = vec(layer(i, "self_attn.q_norm.weight"))?;
        let hd = q_norm.len();
        if hd == 0 {
            return Err(bad(format!("layer {i}: empty q_norm")));
        }
        let (kv, n_kv) = if i < first_shared {
            let wk = mat(layer(i, "self_attn.k_proj.weight"))?;
            let v_name = layer(i, "self_attn.v_proj.weight");
            // No value projection: the values are the keys (`attention_k_eq_v`).
            let wv = if w.has_named(&v_name) {
                Some(mat(v_name)?)
            } else {
                None
            };
            let n_kv = wk.rows / hd;
            let k_norm = Some(vec(layer(i, "self_attn.k_norm.weight"))?);
            (
                KvSource::Own {
                    wk,
                    wv,
                    bk: None,
                    bv: None,
                    k_norm,
                },
                n_kv,
            )
        } else {
            // The last earlier layer of the same type that keeps its own cache.
            let src = (0..first_shared)
                .rev()
                .find(|&j| sliding[j] == sliding[i])
                .ok_or_else(|| {
                    bad(format!(
                        "layer {i}: no earlier layer of its type to share KV with"
                    ))
                })?;
            (KvSource::Shared(src), geometry[src].1)
        };
        geometry.push((hd, n_kv));
        let rope = if sliding[i] {
            Rope::new(local.theta, hd, hd, true)
        } else {
            match global.kind.as_str() {
                "proportional" => proportional_rope(global.theta, hd, global.partial, global.factor),
                "default" => Rope::new(global.theta, hd, hd, true),
                k => return Err(bad(format!("config.json: unsupported RoPE type {k:?}"))),
            }
        };
        if sliding[i] {
            cfg.sliding_window[i] = window;
        }
        cfg.rope_base[i] = if sliding[i] { local.theta } else { global.theta };
        let dense = GatedFfn {
            gate: mat(layer(i, "mlp.gate_proj.weight"))?,
            up: mat(layer(i, "mlp.up_proj.weight"))?,
            down: mat(layer(i, "mlp.down_proj.weight"))?,
        };
        let ffn = match cfg.moe {
            None => Ffn::Dense(dense),
            Some(moe) => {
                let gate_up = w.stacked_named(&layer(i, "experts.gate_up_proj"))?;
                let down = w.stacked_named(&layer(i, "experts.down_proj"))?;
                let n = moe.n_experts;
                if gate_up.len() != n || down.len() != n || gate_up[0].rows % 2 != 0 {
                    return Err(bad(format!("layer {i}: expert tensors do not fit {n} experts")));
                }
                let inter = gate_up[0].rows / 2;
                let experts = gate_up
                    .iter()
                    .zip(down)
                    .map(|(gu, down)| GatedFfn {
                        gate: gu.slice_rows(0, inter),
                        up: gu.slice_rows(inter, inter),
                        down,
                    })
                    .collect();
                Ffn::DenseMoe(Box::new(DenseMoe {
                    dense,
                    post_dense_norm: vec(layer(i, "post_feedforward_layernorm_1.weight"))?,
                    router: mat(layer(i, "router.proj.weight"))?,
                    router_scale: vec(layer(i, "router.scale"))?,
                    expert_scale: vec(layer(i, "router.per_expert_scale"))?,
                    experts,
                    pre_experts_norm: vec(layer(i, "pre_feedforward_layernorm_2.weight"))?,
                    post_experts_norm: vec(layer(i, "post_feedforward_layernorm_2.weight"))?,
                }))
            }
        };
        let scalar = layer(i, "layer_scalar");
        scalars.push(if w.has_named(&scalar) {
            vec(scalar)?[0]
        } else {
            1.0
        });
        layers.push(LayerWeights {
            attn_norm: vec(layer(i, "input_layernorm.weight"))?,
            mixer: Mixer::Attention(Box::new(AttnWeights {
                wq: mat(layer(i, "self_attn.q_proj.weight"))?,
                wo: mat(layer(i, "self_attn.o_proj.weight"))?,
                bo: None,
                sinks: None,
                bq: None,
                q_norm: Some(q_norm),
                kv,
                gated: false,
                v_norm: true,
                shape: Some(AttnShape {
                    head_dim: hd,
                    n_kv_heads: n_kv,
                    rope,
                }),
            })),
            post_attn_norm: Some(vec(layer(i, "post_attention_layernorm.weight"))?),
            ffn_norm: vec(layer(i, "pre_feedforward_layernorm.weight"))?,
            post_ffw_norm: Some(vec(layer(i, "post_feedforward_layernorm.weight"))?),
            ffn,
        });
    }
    let embed = mat("model.embed_tokens.weight".into())?;
    cfg.embed_scale = Some(round_to_dtype((hidden as f32).sqrt(), embed.wtype));
    cfg.tie_embeddings = !(w.has_named("lm_head.weight") && hc.flag("tie_word_embeddings") == Some(false));
    let output = if cfg.tie_embeddings {
        embed.clone()
    } else {
        mat("lm_head.weight".into())?
    };
    let mut dw = DecoderWeights::new(&cfg, embed, layers, vec("model.norm.weight".into())?, output)?
        .with_layer_scalars(scalars)?;
    if ple_dim > 0 {
        let pe = mat("model.embed_tokens_per_layer.weight".into())?;
        let ple_layers = (0..n_layers)
            .map(|i| {
                Ok(PleLayer {
                    gate: mat(layer(i, "per_layer_input_gate.weight"))?,
                    proj: mat(layer(i, "per_layer_projection.weight"))?,
                    post_norm: vec(layer(i, "post_per_layer_input_norm.weight"))?,
                })
            })
            .collect::<Result<Vec<_>, PluginError>>()?;
        dw = dw.with_ple(Ple {
            dim: ple_dim,
            embed_scale: round_to_dtype((ple_dim as f32).sqrt(), pe.wtype),
            embed: pe,
            projection: mat("model.per_layer_model_projection.weight".into())?,
            norm: vec("model.per_layer_projection_norm.weight".into())?,
            layers: ple_layers,
        })?;
    }
    Ok((cfg, dw))
}

/// Proportional RoPE (Gemma 4 global layers): `inv_freq[j] = base^(-2j / head_dim) / factor` for
/// the first `partial · head_dim / 2` pairs, identity (frequency 0) for the rest.
pub fn proportional_rope(base: f32, head_dim: usize, partial: f32, factor: f32) -> Rope {
    let angles = ((partial as f64 * head_dim as f64) / 2.0).floor() as usize;
    let inv_freq = (0..angles.min(head_dim / 2))
        .map(|j| (1.0 / (base as f64).powf(2.0 * j as f64 / head_dim as f64) / factor as f64) as f32)
        .collect();
    Rope {
        inv_freq,
        head_dim,
        neox: true,
        half: head_dim / 2,
        ggml: None,
        mscale: 1.0,
    }
}
