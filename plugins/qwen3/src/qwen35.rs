//! Qwen3.5 (dense and MoE): config and weight map. Layers alternate gated delta-net (linear
//! attention) and gated full attention as `layer_types` says; every norm of the main path is the
//! zero-centred `(1 + w)` RMSNorm in HF checkpoints (llama.cpp's converter folds the 1 in),
//! except the delta-net's gated output norm (plain `w`).

use berth_plugin_api::PluginError;
use berth_plugin_common::family::{bad, HfConfig};
use berth_plugin_common::weights::GgufFile;
use berth_plugin_common::{
    AttnWeights, DecoderConfig, DecoderWeights, Ffn, GatedDeltaNet, GatedFfn, LayerWeights, Mixer, SharedExpert,
    Weights,
};

/// Which mixer each layer has.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum LayerKind {
    Linear,
    Full,
}

/// Qwen3.5's geometry beyond the common decoder config.
#[derive(Clone, Copy, Debug)]
struct LinearDims {
    k_heads: usize,
    v_heads: usize,
    dk: usize,
    dv: usize,
    kernel: usize,
}

/// Applies Qwen3.5's config: partial rotary (HF pairing), zero-centred norms, layer kinds.
pub fn hf_config(cfg: &mut DecoderConfig, c: &HfConfig<'_>) -> Result<(), PluginError> {
    let partial = c.float("partial_rotary_factor").unwrap_or(1.0);
    cfg.rope_dim = ((cfg.head_dim as f64 * partial) as usize) & !1;
    cfg.rope_partial_pairs = true;
    cfg.norm_add_one = true;
    cfg.qk_norm = true;
    Ok(())
}

fn layer_kinds_hf(c: &HfConfig<'_>, n_layers: usize) -> Vec<LayerKind> {
    match c.strings("layer_types") {
        Some(t) => t
            .iter()
            .map(|t| if t == "full_attention" { LayerKind::Full } else { LayerKind::Linear })
            .collect(),
        None => {
            let every = c.num("full_attention_interval").unwrap_or(4);
            (0..n_layers)
                .map(|i| if (i + 1) % every == 0 { LayerKind::Full } else { LayerKind::Linear })
                .collect()
        }
    }
}

/// Maps HF tensor names onto the decoder's layers.
pub fn load_hf(w: &Weights, cfg: &DecoderConfig, c: &HfConfig<'_>) -> Result<DecoderWeights, PluginError> {
    let dims = LinearDims {
        k_heads: c.req("linear_num_key_heads")?,
        v_heads: c.req("linear_num_value_heads")?,
        dk: c.req("linear_key_head_dim")?,
        dv: c.req("linear_value_head_dim")?,
        kernel: c.num("linear_conv_kernel_dim").unwrap_or(4),
    };
    let kinds = layer_kinds_hf(c, cfg.n_layers);
    if kinds.len() != cfg.n_layers {
        return Err(bad(format!("layer_types has {} entries for {} layers", kinds.len(), cfg.n_layers)));
    }
    let mat = |n: String| w.matrix_named(&n);
    let vec = |n: String| w.vector_named(&n);
    let mut layers = Vec::with_capacity(cfg.n_layers);
    for (i, kind) in kinds.iter().enumerate() {
        let p = format!("model.layers.{i}");
        let mixer = match kind {
            LayerKind::Full => Mixer::Attention(AttnWeights {
                wq: mat(format!("{p}.self_attn.q_proj.weight"))?,
                wk: mat(format!("{p}.self_attn.k_proj.weight"))?,
                wv: mat(format!("{p}.self_attn.v_proj.weight"))?,
                wo: mat(format!("{p}.self_attn.o_proj.weight"))?,
                bq: None,
                bk: None,
                bv: None,
                q_norm: Some(vec(format!("{p}.self_attn.q_norm.weight"))?),
                k_norm: Some(vec(format!("{p}.self_attn.k_norm.weight"))?),
                gated: true,
            }),
            LayerKind::Linear => {
                let a = format!("{p}.linear_attn");
                let neg_a = vec(format!("{a}.A_log"))?.iter().map(|v| -v.exp()).collect();
                Mixer::GatedDeltaNet(GatedDeltaNet {
                    in_qkv: mat(format!("{a}.in_proj_qkv.weight"))?,
                    in_z: mat(format!("{a}.in_proj_z.weight"))?,
                    in_b: mat(format!("{a}.in_proj_b.weight"))?,
                    in_a: mat(format!("{a}.in_proj_a.weight"))?,
                    conv: vec(format!("{a}.conv1d.weight"))?,
                    kernel: dims.kernel,
                    neg_a,
                    dt_bias: vec(format!("{a}.dt_bias"))?,
                    norm: vec(format!("{a}.norm.weight"))?,
                    out_proj: mat(format!("{a}.out_proj.weight"))?,
                    k_heads: dims.k_heads,
                    v_heads: dims.v_heads,
                    dk: dims.dk,
                    dv: dims.dv,
                    tiled: false,
                })
            }
        };
        let ffn_hf = |m: &str| -> Result<GatedFfn, PluginError> {
            Ok(GatedFfn {
                gate: mat(format!("{m}.gate_proj.weight"))?,
                up: mat(format!("{m}.up_proj.weight"))?,
                down: mat(format!("{m}.down_proj.weight"))?,
            })
        };
        let ffn = match cfg.moe {
            None => Ffn::Dense(ffn_hf(&format!("{p}.mlp"))?),
            Some(m) => Ffn::Moe {
                router: mat(format!("{p}.mlp.gate.weight"))?,
                experts: (0..m.n_experts)
                    .map(|e| ffn_hf(&format!("{p}.mlp.experts.{e}")))
                    .collect::<Result<_, _>>()?,
                selection_bias: None,
                shared: if w.has_named(&format!("{p}.mlp.shared_expert.gate_proj.weight")) {
                    Some(SharedExpert {
                        ffn: ffn_hf(&format!("{p}.mlp.shared_expert"))?,
                        gate: Some(mat(format!("{p}.mlp.shared_expert_gate.weight"))?),
                    })
                } else {
                    None
                },
            },
        };
        layers.push(LayerWeights {
            attn_norm: vec(format!("{p}.input_layernorm.weight"))?,
            mixer,
            post_attn_norm: None,
            ffn_norm: vec(format!("{p}.post_attention_layernorm.weight"))?,
            post_ffw_norm: None,
            ffn,
        });
    }
    let embed = mat("model.embed_tokens.weight".into())?;
    let output = if !cfg.tie_embeddings && w.has_named("lm_head.weight") {
        mat("lm_head.weight".into())?
    } else {
        embed.clone()
    };
    DecoderWeights::new(cfg, embed, layers, vec("model.norm.weight".into())?, output)
}

/// Applies Qwen3.5's GGUF metadata.
pub fn gguf_config(cfg: &mut DecoderConfig, g: &GgufFile, arch: &str) -> Result<(), PluginError> {
    let rot = g
        .get_u64(&format!("{arch}.rope.dimension_count"))
        .map_or(cfg.head_dim, |v| v as usize);
    cfg.rope_dim = rot;
    cfg.rope_partial_pairs = true;
    // llama.cpp's converter folds the `1 +` of the zero-centred norms into the weights.
    cfg.norm_add_one = false;
    cfg.qk_norm = true;
    Ok(())
}

/// Maps llama.cpp's tensor names (`convert_hf_to_gguf.py`, Qwen3.5 text models) onto the
/// decoder's layers. The converter stores the delta-net's value heads tiled over the key heads
/// and `ssm_a` as `-exp(A_log)` already (tests/fixtures/gguf-tiny/TENSORS.md).
pub fn load_gguf(w: &Weights, cfg: &DecoderConfig) -> Result<DecoderWeights, PluginError> {
    let g = w.gguf().expect("opened as GGUF");
    let arch = g.architecture().unwrap_or("");
    let key = |k: &str| format!("{arch}.{k}");
    let get = |k: &str| g.get_u64(&key(k)).map(|v| v as usize);
    let req = |k: &str| get(k).ok_or_else(|| bad(format!("GGUF: missing {}", key(k))));
    let (kernel, dk, k_heads, v_heads, inner) = (
        req("ssm.conv_kernel")?,
        req("ssm.state_size")?,
        req("ssm.group_count")?,
        req("ssm.time_step_rank")?,
        req("ssm.inner_size")?,
    );
    let kinds: Vec<LayerKind> = match g.get(&key("attention.recurrent_layers")).and_then(|v| v.as_array()) {
        Some(a) => a
            .iter()
            .map(|v| if v.as_bool() == Some(true) { LayerKind::Linear } else { LayerKind::Full })
            .collect(),
        None => {
            let every = get("full_attention_interval").unwrap_or(4);
            (0..cfg.n_layers)
                .map(|i| if (i + 1) % every == 0 { LayerKind::Full } else { LayerKind::Linear })
                .collect()
        }
    };
    if kinds.len() != cfg.n_layers || v_heads == 0 {
        return Err(bad(format!("GGUF: {} recurrent-layer flags for {} layers", kinds.len(), cfg.n_layers)));
    }
    let mat = |n: String| w.matrix_named(&n);
    let vec = |n: String| w.vector_named(&n);
    let mut layers = Vec::with_capacity(cfg.n_layers);
    for (i, kind) in kinds.iter().enumerate() {
        let p = format!("blk.{i}");
        let mixer = match kind {
            LayerKind::Full => Mixer::Attention(AttnWeights {
                wq: mat(format!("{p}.attn_q.weight"))?,
                wk: mat(format!("{p}.attn_k.weight"))?,
                wv: mat(format!("{p}.attn_v.weight"))?,
                wo: mat(format!("{p}.attn_output.weight"))?,
                bq: None,
                bk: None,
                bv: None,
                q_norm: Some(vec(format!("{p}.attn_q_norm.weight"))?),
                k_norm: Some(vec(format!("{p}.attn_k_norm.weight"))?),
                gated: true,
            }),
            LayerKind::Linear => Mixer::GatedDeltaNet(GatedDeltaNet {
                in_qkv: mat(format!("{p}.attn_qkv.weight"))?,
                in_z: mat(format!("{p}.attn_gate.weight"))?,
                in_b: mat(format!("{p}.ssm_beta.weight"))?,
                in_a: mat(format!("{p}.ssm_alpha.weight"))?,
                conv: vec(format!("{p}.ssm_conv1d.weight"))?,
                kernel,
                neg_a: vec(format!("{p}.ssm_a"))?,
                dt_bias: vec(format!("{p}.ssm_dt.bias"))?,
                norm: vec(format!("{p}.ssm_norm.weight"))?,
                out_proj: mat(format!("{p}.ssm_out.weight"))?,
                k_heads,
                v_heads,
                dk,
                dv: inner / v_heads,
                tiled: true,
            }),
        };
        let ffn3 = |stem: &str, suffix: &str| -> Result<GatedFfn, PluginError> {
            Ok(GatedFfn {
                gate: mat(format!("{stem}.ffn_gate{suffix}.weight"))?,
                up: mat(format!("{stem}.ffn_up{suffix}.weight"))?,
                down: mat(format!("{stem}.ffn_down{suffix}.weight"))?,
            })
        };
        let ffn = match cfg.moe {
            None => Ffn::Dense(ffn3(&p, "")?),
            Some(m) => {
                let stack = |role: &str| -> Result<Vec<_>, PluginError> {
                    let v = w.stacked_named(&format!("{p}.ffn_{role}_exps.weight"))?;
                    if v.len() != m.n_experts {
                        return Err(bad(format!("{p}: {} {role} experts, expected {}", v.len(), m.n_experts)));
                    }
                    Ok(v)
                };
                let (gs, us, ds) = (stack("gate")?, stack("up")?, stack("down")?);
                Ffn::Moe {
                    router: mat(format!("{p}.ffn_gate_inp.weight"))?,
                    experts: gs
                        .into_iter()
                        .zip(us)
                        .zip(ds)
                        .map(|((gate, up), down)| GatedFfn { gate, up, down })
                        .collect(),
                    selection_bias: None,
                    shared: if w.has_named(&format!("{p}.ffn_gate_shexp.weight")) {
                        Some(SharedExpert {
                            ffn: ffn3(&p, "_shexp")?,
                            gate: Some(mat(format!("{p}.ffn_gate_inp_shexp.weight"))?),
                        })
                    } else {
                        None
                    },
                }
            }
        };
        layers.push(LayerWeights {
            attn_norm: vec(format!("{p}.attn_norm.weight"))?,
            mixer,
            post_attn_norm: None,
            ffn_norm: vec(format!("{p}.post_attention_norm.weight"))?,
            post_ffw_norm: None,
            ffn,
        });
    }
    let embed = mat("token_embd.weight".into())?;
    let output = if w.has_named("output.weight") {
        mat("output.weight".into())?
    } else {
        embed.clone()
    };
    DecoderWeights::new(cfg, embed, layers, vec("output_norm.weight".into())?, output)
}
