//! The gpt-oss plugin: OpenAI's gpt-oss (alternating sliding-window and full attention with
//! q/k/v/o biases and per-head attention sinks, YaRN RoPE, a biased top-k router over experts
//! with biases and a clamped SwiGLU), from HF safetensors (bf16/f32 or MXFP4 experts) or
//! llama.cpp GGUF files. This crate is the config and the weight map; the runtime is
//! `berth-plugin-common`.

#![warn(missing_docs)]

use berth_plugin_api::{LoadConfig, PluginError};
use berth_plugin_common::family::{
    bad, chat_template, hf_config, template_has_tools, GgufKeys, HfConfig, Loaded, Specials,
};
use berth_plugin_common::mxfp4;
use berth_plugin_common::weights::ByteSource;
use berth_plugin_common::{
    Activation, AttnWeights, DecoderConfig, DecoderModel, DecoderWeights, Ffn, FfnBias, GatedFfn, KvSource,
    LayerWeights, Matrix, Mixer, MoeBiases, MoeConfig, RouterScoring, Weights,
};
use std::sync::Arc;

/// Architectures served: GGUF `general.architecture` and HF `model_type`.
pub const ARCHITECTURES: [&str; 2] = ["gpt-oss", "gpt_oss"];

/// The harmony special tokens (o200k_harmony), looked up by text and reported in the model info.
const SPECIAL_TOKENS: [&str; 9] = [
    "<|startoftext|>",
    "<|endoftext|>",
    "<|return|>",
    "<|constrain|>",
    "<|channel|>",
    "<|start|>",
    "<|end|>",
    "<|message|>",
    "<|call|>",
];

/// Harmony's stops for an assistant turn: the final answer (`<|return|>`) and a tool call
/// (`<|call|>`).
const STOP_TEXTS: [&str; 2] = ["<|return|>", "<|call|>"];

/// Ends every harmony message, including the analysis ones the model continues after: never a
/// stop, whatever the checkpoint's eos/eot ids say.
const NEVER_STOP: &str = "<|end|>";

/// `swiglu_alpha` and `swiglu_limit` of every gpt-oss (llama.cpp's graph hard-codes them; GGUF
/// has no keys for them).
const SWIGLU_ALPHA: f32 = 1.702;
/// See [`SWIGLU_ALPHA`].
const SWIGLU_LIMIT: f32 = 7.0;

/// A loaded gpt-oss model.
pub type GptOssModel = DecoderModel;

berth_plugin_common::decoder_family!(
    GptOssFamily,
    name: "gpt-oss",
    description: "OpenAI gpt-oss text models (GGUF, safetensors; MXFP4 experts)",
    architectures: ARCHITECTURES,
    knows: |a| {
        let a = a.to_ascii_lowercase();
        ARCHITECTURES.contains(&a.as_str()) || a == "gptossforcausallm"
    },
    gguf: load_gguf,
    safetensors: load_safetensors,
);

/// Where a layer's experts come from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum ExpertLayout {
    /// llama.cpp's stacked `ffn_{gate,up,down}_exps` (already `out × in` per expert) with their
    /// biases.
    Gguf,
    /// HF's fused `gate_up_proj` (`[E, hidden, 2·ffn]`, gate and up interleaved on the last
    /// axis) and `down_proj` (`[E, ffn, hidden]`), both `x @ W` (transposed against a Linear),
    /// or their MXFP4 `_blocks` / `_scales` (already `out × in`, gate and up interleaved by
    /// rows).
    Hf,
}

/// The tensor names of one checkpoint format.
struct Names {
    embed: &'static str,
    final_norm: &'static str,
    output: &'static str,
    layer: fn(usize, &str) -> String,
    experts: ExpertLayout,
}

/// HF names, by the role names used below.
const HF: Names = Names {
    embed: "model.embed_tokens.weight",
    final_norm: "model.norm.weight",
    output: "lm_head.weight",
    layer: |i, role| {
        let stem = match role {
            "attn_norm" => "input_layernorm.weight",
            "ffn_norm" => "post_attention_layernorm.weight",
            "q" => "self_attn.q_proj.weight",
            "k" => "self_attn.k_proj.weight",
            "v" => "self_attn.v_proj.weight",
            "o" => "self_attn.o_proj.weight",
            "q_bias" => "self_attn.q_proj.bias",
            "k_bias" => "self_attn.k_proj.bias",
            "v_bias" => "self_attn.v_proj.bias",
            "o_bias" => "self_attn.o_proj.bias",
            "sinks" => "self_attn.sinks",
            "router" => "mlp.router.weight",
            "router_bias" => "mlp.router.bias",
            "gate_up" => "mlp.experts.gate_up_proj",
            "gate_up_bias" => "mlp.experts.gate_up_proj_bias",
            "down" => "mlp.experts.down_proj",
            "down_bias" => "mlp.experts.down_proj_bias",
            other => other,
        };
        format!("model.layers.{i}.{stem}")
    },
    experts: ExpertLayout::Hf,
};

/// llama.cpp's names (`convert_hf_to_gguf.py`'s GptOssModel; the `gpt-oss` architecture).
const GGUF: Names = Names {
    embed: "token_embd.weight",
    final_norm: "output_norm.weight",
    output: "output.weight",
    layer: |i, role| {
        let stem = match role {
            "attn_norm" => "attn_norm.weight",
            "ffn_norm" => "post_attention_norm.weight",
            "q" => "attn_q.weight",
            "k" => "attn_k.weight",
            "v" => "attn_v.weight",
            "o" => "attn_output.weight",
            "q_bias" => "attn_q.bias",
            "k_bias" => "attn_k.bias",
            "v_bias" => "attn_v.bias",
            "o_bias" => "attn_output.bias",
            "sinks" => "attn_sinks.weight",
            "router" => "ffn_gate_inp.weight",
            "router_bias" => "ffn_gate_inp.bias",
            "gate" => "ffn_gate_exps.weight",
            "up" => "ffn_up_exps.weight",
            "down" => "ffn_down_exps.weight",
            "gate_bias" => "ffn_gate_exps.bias",
            "up_bias" => "ffn_up_exps.bias",
            "down_bias" => "ffn_down_exps.bias",
            other => other,
        };
        format!("blk.{i}.{stem}")
    },
    experts: ExpertLayout::Gguf,
};

/// The routing every gpt-oss uses: top-k of the biased router logits, softmax over the k.
fn moe_config(n_experts: usize, top_k: usize) -> MoeConfig {
    MoeConfig {
        n_experts,
        top_k,
        norm_topk_prob: false,
        scoring: RouterScoring::TopKSoftmax,
        routed_scale: 1.0,
        norm_eps: 0.0,
    }
}

fn load_safetensors(w: Weights, config: &LoadConfig) -> Result<Loaded, PluginError> {
    let dir = &config.pack_dir;
    let c = hf_config(dir)?;
    let hc = HfConfig(&c);
    let mut cfg = hc.decoder_config()?;
    let n = cfg.n_layers;
    // transformers' default: even layers slide, odd layers attend to everything.
    let sliding: Vec<bool> = match hc.strings("layer_types") {
        Some(t) => t.iter().map(|t| t == "sliding_attention").collect(),
        None => (0..n).map(|i| i % 2 == 0).collect(),
    };
    let window = hc.num("sliding_window").unwrap_or(128);
    set_windows(&mut cfg, &sliding, window)?;
    cfg.rope_yarn = hc.yarn()?;
    cfg.activation = Activation::ClampedSwiglu {
        alpha: hc.float("swiglu_alpha").map_or(SWIGLU_ALPHA, |v| v as f32),
        limit: hc.float("swiglu_limit").map_or(SWIGLU_LIMIT, |v| v as f32),
    };
    cfg.moe = Some(moe_config(
        hc.req("num_local_experts")?,
        hc.req("num_experts_per_tok")?,
    ));
    let weights = load_layers(&w, &cfg, &HF)?;
    let template = chat_template(&w, dir);
    Ok(Loaded {
        architecture: "gpt-oss".into(),
        cfg,
        weights,
        context_length: hc.num("max_position_embeddings").unwrap_or(131072) as u32,
        specials: harmony_stops(Specials::from_hf(dir, &c, &SPECIAL_TOKENS, &STOP_TEXTS)?),
        tools: template_has_tools(template.as_deref()),
    })
}

fn load_gguf(w: Weights, config: &LoadConfig) -> Result<Loaded, PluginError> {
    let k = GgufKeys::new(&w).expect("opened as GGUF");
    if k.arch != "gpt-oss" {
        return Err(bad(format!("unsupported architecture {:?}", k.arch)));
    }
    let mut cfg = k.decoder_config()?;
    let n = cfg.n_layers;
    // llama.cpp: a per-layer pattern array if present, else every `n`-th layer (default 2) is
    // full and the others slide (`set_swa_pattern`).
    let sliding: Vec<bool> = match k.bools("attention.sliding_window_pattern") {
        Some(p) => p,
        None => {
            let every = k.num("attention.sliding_window_pattern").unwrap_or(2);
            (0..n).map(|i| every == 0 || i % every < every - 1).collect()
        }
    };
    set_windows(&mut cfg, &sliding, k.req("attention.sliding_window")?)?;
    // gpt-oss's configs say `truncate: false`; the converter does not carry the flag over.
    cfg.rope_yarn = k.yarn(false)?;
    cfg.activation = Activation::ClampedSwiglu {
        alpha: SWIGLU_ALPHA,
        limit: SWIGLU_LIMIT,
    };
    cfg.moe = Some(moe_config(k.req("expert_count")?, k.req("expert_used_count")?));
    let weights = load_layers(&w, &cfg, &GGUF)?;
    let template = chat_template(&w, &config.pack_dir);
    Ok(Loaded {
        architecture: k.arch.clone(),
        cfg,
        weights,
        context_length: k.context_length(),
        specials: harmony_stops(Specials::from_gguf(&w, &SPECIAL_TOKENS, &STOP_TEXTS)),
        tools: template_has_tools(template.as_deref()),
    })
}

/// Sets each layer's sliding window from the per-layer flags.
fn set_windows(cfg: &mut DecoderConfig, sliding: &[bool], window: usize) -> Result<(), PluginError> {
    if sliding.len() != cfg.n_layers {
        return Err(bad(format!(
            "{} layer types for {} layers",
            sliding.len(),
            cfg.n_layers
        )));
    }
    if window == 0 {
        return Err(bad("sliding window of 0 positions"));
    }
    cfg.sliding_window = sliding.iter().map(|&s| s.then_some(window)).collect();
    Ok(())
}

/// Drops `<|end|>` from the stop tokens (a checkpoint may declare it as eos or eot): harmony
/// generation goes on after an analysis message's `<|end|>`.
fn harmony_stops(mut s: Specials) -> Specials {
    if let Some(end) = s.special.get(NEVER_STOP).and_then(|v| v.as_i64()) {
        s.stop_tokens.retain(|&t| t as i64 != end);
    }
    s
}

/// The weight map: every layer's attention and experts by the names of `names`.
fn load_layers(w: &Weights, cfg: &DecoderConfig, names: &Names) -> Result<DecoderWeights, PluginError> {
    let t = |i: usize, role: &str| (names.layer)(i, role);
    let mat = |n: String| w.matrix_named(&n);
    let vec = |n: String| w.vector_named(&n);
    let opt = |n: String| -> Result<Option<Vec<f32>>, PluginError> {
        if w.has_named(&n) {
            vec(n).map(Some)
        } else {
            Ok(None)
        }
    };
    let n_experts = cfg.moe.map_or(0, |m| m.n_experts);
    let mut layers = Vec::with_capacity(cfg.n_layers);
    for i in 0..cfg.n_layers {
        let mut a = AttnWeights::new(mat(t(i, "q"))?, mat(t(i, "k"))?, mat(t(i, "v"))?, mat(t(i, "o"))?);
        a.bq = opt(t(i, "q_bias"))?;
        a.bo = opt(t(i, "o_bias"))?;
        a.sinks = opt(t(i, "sinks"))?;
        if let KvSource::Own { bk, bv, .. } = &mut a.kv {
            *bk = opt(t(i, "k_bias"))?;
            *bv = opt(t(i, "v_bias"))?;
        }
        let (experts, biases) = match names.experts {
            ExpertLayout::Gguf => gguf_experts(w, |r| t(i, r), n_experts)?,
            ExpertLayout::Hf => hf_experts(w, |r| t(i, r), n_experts)?,
        };
        layers.push(LayerWeights {
            attn_norm: vec(t(i, "attn_norm"))?,
            mixer: Mixer::Attention(Box::new(a)),
            post_attn_norm: None,
            ffn_norm: vec(t(i, "ffn_norm"))?,
            post_ffw_norm: None,
            ffn: Ffn::Moe {
                router: mat(t(i, "router"))?,
                experts,
                selection_bias: None,
                shared: None,
                biases: Some(Box::new(MoeBiases {
                    router: vec(t(i, "router_bias"))?,
                    experts: biases,
                })),
            },
        });
    }
    let embed = mat(names.embed.into())?;
    // gpt-oss does not tie its LM head; a checkpoint without one falls back to the embeddings.
    let output = if w.has_named(names.output) {
        mat(names.output.into())?
    } else {
        embed.clone()
    };
    DecoderWeights::new(cfg, embed, layers, vec(names.final_norm.into())?, output)
}

/// A stacked per-expert bias (`[E, len]` flat) cut into `E` vectors, checked against `n`.
fn split_bias(v: Vec<f32>, n: usize, name: &str) -> Result<Vec<Vec<f32>>, PluginError> {
    if n == 0 || !v.len().is_multiple_of(n) {
        return Err(bad(format!("{name}: {} values for {n} experts", v.len())));
    }
    Ok(v.chunks_exact(v.len() / n).map(<[f32]>::to_vec).collect())
}

/// Checks that a stacked expert tensor has `n` experts.
fn check_count(v: Vec<Matrix>, n: usize, name: &str) -> Result<Vec<Matrix>, PluginError> {
    if v.len() != n {
        return Err(bad(format!("{name}: {} experts, expected {n}", v.len())));
    }
    Ok(v)
}

/// A layer's experts and their biases from llama.cpp's stacked tensors (any weight type,
/// MXFP4 included).
fn gguf_experts(
    w: &Weights,
    t: impl Fn(&str) -> String,
    n: usize,
) -> Result<(Vec<GatedFfn>, Vec<FfnBias>), PluginError> {
    let stack = |r: &str| check_count(w.stacked_named(&t(r))?, n, &t(r));
    let bias = |r: &str| split_bias(w.vector_named(&t(r))?, n, &t(r));
    let experts = (stack("gate")?.into_iter().zip(stack("up")?).zip(stack("down")?))
        .map(|((gate, up), down)| GatedFfn { gate, up, down })
        .collect();
    let biases = (bias("gate_bias")?
        .into_iter()
        .zip(bias("up_bias")?)
        .zip(bias("down_bias")?))
    .map(|((gate, up), down)| FfnBias { gate, up, down })
    .collect();
    Ok((experts, biases))
}

/// A layer's experts and their biases from HF's fused tensors: MXFP4 `_blocks` / `_scales`
/// (repacked by [`mxfp4`]), else the float `gate_up_proj` / `down_proj` transposed into
/// `out × in` matrices (one new buffer per tensor; the mapped file stays the only other copy).
fn hf_experts(
    w: &Weights,
    t: impl Fn(&str) -> String,
    n: usize,
) -> Result<(Vec<GatedFfn>, Vec<FfnBias>), PluginError> {
    let (gate_up, down) = (t("gate_up"), t("down"));
    let (gates, ups, downs) = if mxfp4::has_hf_mxfp4(w, &gate_up) {
        let (gates, ups) = mxfp4::hf_gate_up_experts(w, &gate_up)?;
        let downs = mxfp4::hf_experts(w, &down)?;
        (gates, ups, downs)
    } else {
        let fused = transpose_experts(
            &check_count(w.stacked_named(&gate_up)?, n, &gate_up)?,
            true,
            &gate_up,
        )?;
        let half = fused.first().map_or(0, |m| m.rows / 2);
        let (gates, ups) = fused
            .iter()
            .map(|m| (m.slice_rows(0, half), m.slice_rows(half, half)))
            .unzip();
        let downs = transpose_experts(&check_count(w.stacked_named(&down)?, n, &down)?, false, &down)?;
        (gates, ups, downs)
    };
    let (gates, ups, downs) = (
        check_count(gates, n, &gate_up)?,
        check_count(ups, n, &gate_up)?,
        check_count(downs, n, &down)?,
    );
    let gu_bias = split_bias(w.vector_named(&t("gate_up_bias"))?, n, &t("gate_up_bias"))?;
    let down_bias = split_bias(w.vector_named(&t("down_bias"))?, n, &t("down_bias"))?;
    let biases = gu_bias
        .into_iter()
        .zip(down_bias)
        .map(|(gu, down)| FfnBias {
            gate: gu.iter().step_by(2).copied().collect(),
            up: gu.iter().skip(1).step_by(2).copied().collect(),
            down,
        })
        .collect();
    let experts = (gates.into_iter().zip(ups).zip(downs))
        .map(|((gate, up), down)| GatedFfn { gate, up, down })
        .collect();
    Ok((experts, biases))
}

/// HF's `x @ W` experts (`stack[e]`: `in × out`, a float type) as `out × in` matrices over one
/// new buffer for all experts. With `deinterleave`, the output columns alternate gate and up
/// (`[..., ::2]` / `[..., 1::2]`) and each expert's rows come out as all gate rows, then all up
/// rows.
fn transpose_experts(stack: &[Matrix], deinterleave: bool, name: &str) -> Result<Vec<Matrix>, PluginError> {
    let Some(first) = stack.first() else {
        return Ok(Vec::new());
    };
    let (wtype, inp, out) = (first.wtype, first.rows, first.cols);
    if wtype.block_size() != 1 {
        return Err(bad(format!(
            "{name}: {} experts cannot be transposed",
            wtype.name()
        )));
    }
    if deinterleave && !out.is_multiple_of(2) {
        return Err(bad(format!(
            "{name}: {out} columns do not split into gate and up"
        )));
    }
    let eb = wtype.row_bytes(1);
    let per = out * inp * eb;
    let mut bytes = vec![0u8; stack.len() * per];
    for (m, dst) in stack.iter().zip(bytes.chunks_exact_mut(per)) {
        // Column `j` of the input becomes row `row(j)`.
        let row = |j: usize| {
            if deinterleave {
                (j % 2) * (out / 2) + j / 2
            } else {
                j
            }
        };
        for c in 0..inp {
            for (j, e) in m.row(c).chunks_exact(eb).enumerate() {
                let at = (row(j) * inp + c) * eb;
                dst[at..at + eb].copy_from_slice(e);
            }
        }
    }
    let source: Arc<dyn ByteSource> = Arc::new(bytes);
    (0..stack.len())
        .map(|e| Matrix::new(source.clone(), e * per, wtype, out, inp))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn probe_accepts_gpt_oss_packs_only() {
        berth_plugin_common::testing::check_probe::<GptOssFamily>(
            "gpt-oss",
            &["gpt-oss", "gpt_oss", "GptOssForCausalLM"],
        );
    }

    #[test]
    fn hf_experts_transpose_and_deinterleave() {
        // Two experts of `x @ W` with W: 3 inputs × 4 outputs (gate, up, gate, up).
        let w: Vec<f32> = (0..24).map(|v| v as f32).collect();
        let stack: Vec<Matrix> = w.chunks_exact(12).map(|c| Matrix::from_f32(3, 4, c)).collect();
        let fused = transpose_experts(&stack, true, "t").unwrap();
        let mut row = [0.0; 3];
        for (e, m) in fused.iter().enumerate() {
            assert_eq!((m.rows, m.cols), (4, 3));
            // Rows: gate columns 0 and 2, then up columns 1 and 3.
            for (r, col) in [0usize, 2, 1, 3].into_iter().enumerate() {
                m.dequantize_row(r, &mut row);
                let want: Vec<f32> = (0..3).map(|c| w[e * 12 + c * 4 + col]).collect();
                assert_eq!(row.to_vec(), want, "expert {e} row {r}");
            }
        }
        let plain = transpose_experts(&stack, false, "t").unwrap();
        plain[1].dequantize_row(3, &mut row);
        assert_eq!(row, [15.0, 19.0, 23.0]);
    }

    #[test]
    fn end_is_never_a_stop() {
        let mut s = Specials::default();
        s.special.insert("<|end|>".into(), 7.into());
        s.stop_tokens = vec![2, 7, 9];
        assert_eq!(harmony_stops(s).stop_tokens, vec![2, 9]);
    }
}
