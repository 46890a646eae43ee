//! Qwen3.5 (dense and MoE): config and weight map, shared by the qwen3 plugin and MiniCPM-V 4.6's
//! Qwen3.5 backbone. Layers alternate gated delta-net (linear
//! attention) and gated full attention; every norm of the main path is the zero-centred
//! `(1 + w)` RMSNorm in HF checkpoints (llama.cpp's converter folds the 1 in), except the
//! delta-net's gated output norm (plain `w`). llama.cpp's GGUF also stores `-exp(A_log)` and
//! the delta-net's value heads tiled over the key heads (tests/fixtures/gguf-tiny/TENSORS.md).

use berth_plugin_api::PluginError;
use berth_plugin_common::family::{bad, load_experts, GgufKeys, HfConfig};
use berth_plugin_common::{
    AttnWeights, DecoderConfig, DecoderWeights, Ffn, GatedDeltaNet, GatedFfn, LayerWeights, Mixer,
    SharedExpert, Weights,
};

/// Which mixer a layer has.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    Linear,
    Full,
}

/// Geometry of the delta-net layers and which layers they are.
struct Layout {
    kinds: Vec<Kind>,
    k_heads: usize,
    v_heads: usize,
    dk: usize,
    dv: usize,
    kernel: usize,
}

/// How one checkpoint format names and stores the tensors.
struct Format {
    /// The name of a layer tensor by role.
    name: fn(usize, &str) -> String,
    /// Top-level names: embeddings, final norm, LM head.
    globals: [&'static str; 3],
    /// `A_log` is stored as is (HF) rather than as `-exp(A_log)` (GGUF).
    a_log: bool,
    /// Value heads tiled over key heads (GGUF) rather than grouped (HF).
    tiled: bool,
}

const HF: Format = Format {
    name: |i, role| {
        let stem = match role {
            "attn_norm" => "input_layernorm.weight",
            "ffn_norm" => "post_attention_layernorm.weight",
            "q" => "self_attn.q_proj.weight",
            "k" => "self_attn.k_proj.weight",
            "v" => "self_attn.v_proj.weight",
            "o" => "self_attn.o_proj.weight",
            "q_norm" => "self_attn.q_norm.weight",
            "k_norm" => "self_attn.k_norm.weight",
            "qkv" => "linear_attn.in_proj_qkv.weight",
            "z" => "linear_attn.in_proj_z.weight",
            "b" => "linear_attn.in_proj_b.weight",
            "a" => "linear_attn.in_proj_a.weight",
            "conv" => "linear_attn.conv1d.weight",
            "a_log" => "linear_attn.A_log",
            "dt_bias" => "linear_attn.dt_bias",
            "ssm_norm" => "linear_attn.norm.weight",
            "ssm_out" => "linear_attn.out_proj.weight",
            "router" => "mlp.gate.weight",
            "shared_gate" => "mlp.shared_expert_gate.weight",
            // FFN projections: `gate` / `up` / `down`, with an expert or shared-expert prefix.
            ffn => {
                let (prefix, proj) = ffn.rsplit_once('.').unwrap_or(("", ffn));
                let prefix = match prefix {
                    "" => "mlp".to_string(),
                    "shexp" => "mlp.shared_expert".to_string(),
                    e => format!("mlp.experts.{e}"),
                };
                return format!("model.layers.{i}.{prefix}.{proj}_proj.weight");
            }
        };
        format!("model.layers.{i}.{stem}")
    },
    globals: ["model.embed_tokens.weight", "model.norm.weight", "lm_head.weight"],
    a_log: true,
    tiled: false,
};

const GGUF: Format = Format {
    name: |i, role| {
        let stem = match role {
            "attn_norm" => "attn_norm.weight",
            "ffn_norm" => "post_attention_norm.weight",
            "q" => "attn_q.weight",
            "k" => "attn_k.weight",
            "v" => "attn_v.weight",
            "o" => "attn_output.weight",
            "q_norm" => "attn_q_norm.weight",
            "k_norm" => "attn_k_norm.weight",
            "qkv" => "attn_qkv.weight",
            "z" => "attn_gate.weight",
            "b" => "ssm_beta.weight",
            "a" => "ssm_alpha.weight",
            "conv" => "ssm_conv1d.weight",
            "a_log" => "ssm_a",
            "dt_bias" => "ssm_dt.bias",
            "ssm_norm" => "ssm_norm.weight",
            "ssm_out" => "ssm_out.weight",
            "router" => "ffn_gate_inp.weight",
            "shared_gate" => "ffn_gate_inp_shexp.weight",
            ffn => {
                return match ffn.rsplit_once('.') {
                    None => format!("blk.{i}.ffn_{ffn}.weight"),
                    Some(("shexp", proj)) => format!("blk.{i}.ffn_{proj}_shexp.weight"),
                    Some((_, proj)) => format!("blk.{i}.ffn_{proj}_exps.weight"),
                }
            }
        };
        format!("blk.{i}.{stem}")
    },
    globals: ["token_embd.weight", "output_norm.weight", "output.weight"],
    a_log: false,
    tiled: true,
};

/// Applies Qwen3.5's HF config (partial rotary with HF pairing, zero-centred norms) and maps
/// the weights.
pub fn load_hf(
    w: &Weights,
    cfg: &mut DecoderConfig,
    c: &HfConfig<'_>,
) -> Result<DecoderWeights, PluginError> {
    let partial = c.float("partial_rotary_factor").unwrap_or(1.0);
    cfg.rope_dim = ((cfg.head_dim as f64 * partial) as usize) & !1;
    cfg.norm_add_one = true;
    let kinds = match c.full_attention_layers() {
        Some(full) => full
            .iter()
            .map(|&f| if f { Kind::Full } else { Kind::Linear })
            .collect(),
        None => every_nth_full(cfg.n_layers, c.num("full_attention_interval")),
    };
    let layout = Layout {
        kinds,
        k_heads: c.req("linear_num_key_heads")?,
        v_heads: c.req("linear_num_value_heads")?,
        dk: c.req("linear_key_head_dim")?,
        dv: c.req("linear_value_head_dim")?,
        kernel: c.num("linear_conv_kernel_dim").unwrap_or(4),
    };
    load(w, cfg, &layout, &HF)
}

/// Applies Qwen3.5's GGUF metadata and maps the weights.
pub fn load_gguf(
    w: &Weights,
    cfg: &mut DecoderConfig,
    k: &GgufKeys<'_>,
) -> Result<DecoderWeights, PluginError> {
    cfg.rope_dim = k.num("rope.dimension_count").unwrap_or(cfg.head_dim);
    // The converter folded the `1 +` of the zero-centred norms into the weights.
    cfg.norm_add_one = false;
    let kinds = match k.bools("attention.recurrent_layers") {
        Some(r) => r
            .iter()
            .map(|&lin| if lin { Kind::Linear } else { Kind::Full })
            .collect(),
        None => every_nth_full(cfg.n_layers, k.num("full_attention_interval")),
    };
    let v_heads = k.req("ssm.time_step_rank")?;
    let layout = Layout {
        kinds,
        k_heads: k.req("ssm.group_count")?,
        v_heads,
        dk: k.req("ssm.state_size")?,
        dv: k.req("ssm.inner_size")? / v_heads.max(1),
        kernel: k.req("ssm.conv_kernel")?,
    };
    load(w, cfg, &layout, &GGUF)
}

/// Layers `interval-1`, `2·interval-1`, ... are full attention (config default 4).
fn every_nth_full(n_layers: usize, interval: Option<usize>) -> Vec<Kind> {
    let every = interval.unwrap_or(4).max(1);
    (0..n_layers)
        .map(|i| {
            if (i + 1) % every == 0 {
                Kind::Full
            } else {
                Kind::Linear
            }
        })
        .collect()
}

/// The weight map, for either format.
fn load(w: &Weights, cfg: &mut DecoderConfig, l: &Layout, f: &Format) -> Result<DecoderWeights, PluginError> {
    if l.kinds.len() != cfg.n_layers || l.v_heads == 0 {
        return Err(bad(format!(
            "{} layer kinds for {} layers",
            l.kinds.len(),
            cfg.n_layers
        )));
    }
    cfg.rope_partial_pairs = true;
    cfg.qk_norm = true;
    // A multimodal checkpoint (Qwen3.5's own, MiniCPM-V 4.6) keeps the language model under
    // `model.language_model.*`.
    let nested = w.has_named("model.language_model.embed_tokens.weight");
    let rebase = |n: String| match n.strip_prefix("model.") {
        Some(rest) if nested => format!("model.language_model.{rest}"),
        _ => n,
    };
    let mat = |n: String| w.matrix_named(&n);
    let vec = |n: String| w.vector_named(&n);
    let mut layers = Vec::with_capacity(cfg.n_layers);
    for (i, kind) in l.kinds.iter().enumerate() {
        let t = |role: &str| rebase((f.name)(i, role));
        let mixer = match kind {
            Kind::Full => Mixer::Attention(Box::new(AttnWeights {
                gated: true,
                ..AttnWeights::new(mat(t("q"))?, mat(t("k"))?, mat(t("v"))?, mat(t("o"))?)
                    .with_qk_norms(vec(t("q_norm"))?, vec(t("k_norm"))?)
            })),
            Kind::Linear => {
                let mut neg_a = vec(t("a_log"))?;
                if f.a_log {
                    neg_a.iter_mut().for_each(|v| *v = -v.exp());
                }
                Mixer::GatedDeltaNet(Box::new(GatedDeltaNet {
                    in_qkv: mat(t("qkv"))?,
                    in_z: mat(t("z"))?,
                    in_b: mat(t("b"))?,
                    in_a: mat(t("a"))?,
                    conv: vec(t("conv"))?,
                    kernel: l.kernel,
                    neg_a,
                    dt_bias: vec(t("dt_bias"))?,
                    norm: vec(t("ssm_norm"))?,
                    out_proj: mat(t("ssm_out"))?,
                    k_heads: l.k_heads,
                    v_heads: l.v_heads,
                    dk: l.dk,
                    dv: l.dv,
                    tiled: f.tiled,
                }))
            }
        };
        let ffn3 = |prefix: &str| -> Result<GatedFfn, PluginError> {
            Ok(GatedFfn {
                gate: mat(t(&format!("{prefix}gate")))?,
                up: mat(t(&format!("{prefix}up")))?,
                down: mat(t(&format!("{prefix}down")))?,
            })
        };
        let ffn = match cfg.moe {
            None => Ffn::Dense(ffn3("")?),
            Some(m) => Ffn::Moe {
                router: mat(t("router"))?,
                experts: load_experts(
                    w,
                    |e, p| match e {
                        None => t(&format!("exps.{p}")),
                        Some(e) => t(&format!("{e}.{p}")),
                    },
                    m.n_experts,
                )?,
                selection_bias: None,
                shared: if w.has_named(&t("shexp.gate")) {
                    Some(SharedExpert {
                        ffn: ffn3("shexp.")?,
                        gate: Some(mat(t("shared_gate"))?),
                    })
                } else {
                    None
                },
                biases: None,
            },
        };
        layers.push(LayerWeights {
            attn_norm: vec(t("attn_norm"))?,
            mixer,
            post_attn_norm: None,
            ffn_norm: vec(t("ffn_norm"))?,
            post_ffw_norm: None,
            ffn,
        });
    }
    let [embed_name, norm_name, head_name] = f.globals;
    let embed = mat(rebase(embed_name.into()))?;
    let output = if !cfg.tie_embeddings && w.has_named(head_name) {
        mat(head_name.into())?
    } else {
        embed.clone()
    };
    DecoderWeights::new(cfg, embed, layers, vec(rebase(norm_name.into()))?, output)
}
