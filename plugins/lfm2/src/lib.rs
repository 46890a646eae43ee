//! The LFM2 plugin: Liquid's LFM2 (gated short convolutions between grouped-query attention
//! layers) and LFM2-MoE (sigmoid-routed experts with a selection bias after the first dense
//! layers), from HF safetensors or llama.cpp GGUF files. This crate is the config and the weight
//! map; the runtime is `berth-plugin-common`. [`vl`] adds LFM2-VL's vision encoder and places its
//! image features in the language model; an `lfm2_vl` safetensors pack loads as
//! [`Lfm2Model::Vision`] and takes images through the plugin ABI.

#![warn(missing_docs)]

use berth_plugin_api::{
    BatchView, Family, ImageInput, LoadConfig, LogitsOut, Model, ModelDescription, PluginError,
    PluginManifest, PreparedImage, RgbView, VisionSpec,
};
use berth_plugin_common::family::{
    bad, chat_template, family_manifest, hf_config, load_experts, load_pack, probe_family,
    template_has_tools, GgufKeys, HfConfig, Loaded, Specials,
};
use berth_plugin_common::{
    AttnWeights, DecoderConfig, DecoderModel, DecoderWeights, Ffn, GatedFfn, LayerWeights, Mixer, MoeConfig,
    RouterScoring, ShortConv, Weights,
};
use serde_json::Value;
use vl::Lfm2VlModel;

pub mod vl;

/// Architectures served: GGUF `general.architecture` values (llama.cpp spells LFM2-MoE `lfm2moe`)
/// and HF `model_type`s.
pub const ARCHITECTURES: [&str; 4] = ["lfm2", "lfm2moe", "lfm2_moe", "lfm2_vl"];

/// Special tokens looked up by text in the vocabulary and reported in the model info.
const SPECIAL_TOKENS: [&str; 9] = [
    "<|startoftext|>",
    "<|im_start|>",
    "<|im_end|>",
    "<|endoftext|>",
    "<|tool_call_start|>",
    "<|tool_call_end|>",
    "<|tool_response_start|>",
    "<think>",
    "</think>",
];

/// Special tokens that end generation when present.
const STOP_TEXTS: [&str; 2] = ["<|im_end|>", "<|endoftext|>"];

/// A loaded LFM2 pack: a text model, or LFM2-VL's language model with its vision encoder.
pub enum Lfm2Model {
    /// LFM2 or LFM2-MoE (GGUF or safetensors), or the language model of a GGUF LFM2-VL pack.
    Text(Box<DecoderModel>),
    /// LFM2-VL from a safetensors `lfm2_vl` pack: takes images.
    Vision(Box<Lfm2VlModel>),
}

impl Lfm2Model {
    /// The model the plugin calls.
    fn inner(&self) -> &dyn Model {
        match self {
            Lfm2Model::Text(m) => m.as_ref(),
            Lfm2Model::Vision(m) => m.as_ref(),
        }
    }

    /// The model the plugin calls, mutably.
    fn inner_mut(&mut self) -> &mut dyn Model {
        match self {
            Lfm2Model::Text(m) => m.as_mut(),
            Lfm2Model::Vision(m) => m.as_mut(),
        }
    }

    /// The language model.
    pub fn text(&self) -> &DecoderModel {
        match self {
            Lfm2Model::Text(m) => m,
            Lfm2Model::Vision(m) => &m.text,
        }
    }
}

impl Model for Lfm2Model {
    fn describe(&self) -> ModelDescription {
        self.inner().describe()
    }

    fn decode(&mut self, batch: &BatchView<'_>, logits: &mut LogitsOut<'_>) -> Result<(), PluginError> {
        self.inner_mut().decode(batch, logits)
    }

    fn force_token(&mut self, seq: i32, token: i32) -> Result<(), PluginError> {
        self.inner_mut().force_token(seq, token)
    }

    fn thinking_enabled(&self, requested: Option<bool>) -> bool {
        self.inner().thinking_enabled(requested)
    }

    fn tools_enabled(&self) -> bool {
        self.inner().tools_enabled()
    }

    fn seq_truncate(&mut self, seq: i32, len: u32) -> Result<(), PluginError> {
        self.inner_mut().seq_truncate(seq, len)
    }

    fn seq_fork(&mut self, src: i32, dst: i32) -> Result<(), PluginError> {
        self.inner_mut().seq_fork(src, dst)
    }

    fn vision(&self) -> Option<VisionSpec> {
        self.inner().vision()
    }

    fn encode_images(&mut self, seq: i32, images: &[ImageInput<'_>]) -> Result<(), PluginError> {
        self.inner_mut().encode_images(seq, images)
    }

    fn prepare_image(&self, image: &RgbView<'_>, index: u32) -> Result<PreparedImage, PluginError> {
        self.inner().prepare_image(image, index)
    }
}

/// Whether an architecture name is one of ours (HF class names included).
fn knows(a: &str) -> bool {
    let a = a.to_ascii_lowercase();
    ARCHITECTURES.contains(&a.as_str())
        || matches!(
            a.as_str(),
            "lfm2-vl" | "lfm2forcausallm" | "lfm2moeforcausallm" | "lfm2vlforconditionalgeneration"
        )
}

/// Which mixer a layer has.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    Conv,
    Attention,
}

/// The tensor names of one checkpoint format.
struct Names {
    embed: &'static str,
    final_norm: &'static str,
    layer: fn(usize, &str) -> String,
}

/// The HF name of a layer tensor under the language model's prefix (`layers.{i}.…`).
fn hf_layer(i: usize, role: &str) -> String {
    let stem = match role {
        "mixer_norm" => "operator_norm.weight",
        "ffn_norm" => "ffn_norm.weight",
        "conv_in" => "conv.in_proj.weight",
        "conv" => "conv.conv.weight",
        "conv_out" => "conv.out_proj.weight",
        "q" => "self_attn.q_proj.weight",
        "k" => "self_attn.k_proj.weight",
        "v" => "self_attn.v_proj.weight",
        "o" => "self_attn.out_proj.weight",
        "q_norm" => "self_attn.q_layernorm.weight",
        "k_norm" => "self_attn.k_layernorm.weight",
        "gate" => "feed_forward.w1.weight",
        "up" => "feed_forward.w3.weight",
        "down" => "feed_forward.w2.weight",
        "router" => "feed_forward.gate.weight",
        "expert_bias" => "feed_forward.expert_bias",
        other => return format!("layers.{i}.feed_forward.experts.{other}"),
    };
    format!("layers.{i}.{stem}")
}

/// HF names, by the role names used below.
const HF: Names = Names {
    embed: "model.embed_tokens.weight",
    final_norm: "model.embedding_norm.weight",
    layer: |i, role| format!("model.{}", hf_layer(i, role)),
};

/// HF names of LFM2-VL's language model (`model.language_model.*`).
const HF_VL: Names = Names {
    embed: "model.language_model.embed_tokens.weight",
    final_norm: "model.language_model.embedding_norm.weight",
    layer: |i, role| format!("model.language_model.{}", hf_layer(i, role)),
};

/// llama.cpp's names (`convert_hf_to_gguf.py`, LFM2 and LFM2-MoE).
const GGUF: Names = Names {
    embed: "token_embd.weight",
    final_norm: "token_embd_norm.weight",
    layer: |i, role| {
        let stem = match role {
            "mixer_norm" => "attn_norm.weight",
            "ffn_norm" => "ffn_norm.weight",
            "conv_in" => "shortconv.in_proj.weight",
            "conv" => "shortconv.conv.weight",
            "conv_out" => "shortconv.out_proj.weight",
            "q" => "attn_q.weight",
            "k" => "attn_k.weight",
            "v" => "attn_v.weight",
            "o" => "attn_output.weight",
            "q_norm" => "attn_q_norm.weight",
            "k_norm" => "attn_k_norm.weight",
            "gate" => "ffn_gate.weight",
            "up" => "ffn_up.weight",
            "down" => "ffn_down.weight",
            "router" => "ffn_gate_inp.weight",
            "expert_bias" => "exp_probs_b.bias",
            "gate_exps" => "ffn_gate_exps.weight",
            "up_exps" => "ffn_up_exps.weight",
            "down_exps" => "ffn_down_exps.weight",
            other => other,
        };
        format!("blk.{i}.{stem}")
    },
};

/// LFM2-MoE settings beyond [`MoeConfig`].
struct MoeLayout {
    config: MoeConfig,
    dense_layers: usize,
    expert_bias: bool,
}

/// The LFM2 family: text packs on the common decoder, `lfm2_vl` safetensors packs as
/// [`Lfm2VlModel`].
pub struct Lfm2Family;

impl Family for Lfm2Family {
    type Model = Lfm2Model;

    fn manifest() -> PluginManifest {
        family_manifest(
            "lfm2",
            env!("CARGO_PKG_VERSION"),
            "LFM2 and LFM2-MoE text models (GGUF, safetensors) and LFM2-VL with images (safetensors)",
            &ARCHITECTURES,
        )
    }

    fn probe(model_config: &Value) -> u32 {
        probe_family(model_config, "lfm2", knows)
    }

    fn create(config: &LoadConfig) -> Result<Lfm2Model, PluginError> {
        if vl::is_vl_pack(config) {
            return Ok(Lfm2Model::Vision(Box::new(vl::load(config)?)));
        }
        let loaded = load_pack(config, load_gguf, load_safetensors)?;
        Ok(Lfm2Model::Text(Box::new(DecoderModel::new(loaded, config)?)))
    }
}

berth_plugin_api::export_plugin!(Lfm2Family);

/// The LFM2 language model of an HF pack: `lfm2`, `lfm2_moe`, or the `text_config` and
/// `model.language_model.*` tensors of an `lfm2_vl` pack.
fn load_safetensors(w: Weights, config: &LoadConfig) -> Result<Loaded, PluginError> {
    let dir = &config.pack_dir;
    let c = hf_config(dir)?;
    let hc = HfConfig(&c);
    let mut cfg = hc.decoder_config()?;
    cfg.qk_norm = true;
    let n_layers = cfg.n_layers;
    if hc.float("rope_theta").is_none() {
        cfg.rope_base = vec![1e6; n_layers]; // LFM2's default
    }
    let kinds: Vec<Kind> = match hc.full_attention_layers() {
        Some(full) => full
            .iter()
            .map(|&f| if f { Kind::Attention } else { Kind::Conv })
            .collect(),
        None => {
            let idxs: Vec<usize> = c
                .get("full_attn_idxs")
                .and_then(Value::as_array)
                .map(|a| a.iter().filter_map(Value::as_u64).map(|v| v as usize).collect())
                .ok_or_else(|| bad("config.json: neither layer_types nor full_attn_idxs"))?;
            (0..n_layers)
                .map(|i| {
                    if idxs.contains(&i) {
                        Kind::Attention
                    } else {
                        Kind::Conv
                    }
                })
                .collect()
        }
    };
    let moe = match hc.num("num_experts") {
        Some(n_experts) => Some(MoeLayout {
            config: MoeConfig {
                n_experts,
                top_k: hc.req("num_experts_per_tok")?,
                norm_topk_prob: hc.flag("norm_topk_prob").unwrap_or(true),
                scoring: RouterScoring::Sigmoid,
                routed_scale: hc.float("routed_scaling_factor").unwrap_or(1.0) as f32,
                norm_eps: 1e-6,
            },
            dense_layers: hc.num("num_dense_layers").unwrap_or(0),
            expert_bias: hc.flag("use_expert_bias").unwrap_or(true),
        }),
        None => None,
    };
    let kernel = hc.num("conv_L_cache").unwrap_or(3);
    // LFM2-VL keeps the language model under `model.language_model`.
    let names = if w.has_named(HF_VL.embed) { &HF_VL } else { &HF };
    let weights = load_layers(&w, &mut cfg, names, &kinds, kernel, moe.as_ref())?;
    let template = chat_template(&w, dir);
    Ok(Loaded {
        architecture: if moe.is_some() { "lfm2moe" } else { "lfm2" }.into(),
        cfg,
        weights,
        context_length: hc.num("max_position_embeddings").unwrap_or(32768) as u32,
        specials: Specials::from_hf(dir, &c, &SPECIAL_TOKENS, &STOP_TEXTS)?,
        tools: template_has_tools(template.as_deref()),
    })
}

fn load_gguf(w: Weights, config: &LoadConfig) -> Result<Loaded, PluginError> {
    let k = GgufKeys::new(&w).expect("opened as GGUF");
    if k.arch != "lfm2" && k.arch != "lfm2moe" {
        return Err(bad(format!("unsupported architecture {:?}", k.arch)));
    }
    let mut cfg = k.decoder_config()?;
    cfg.qk_norm = true;
    // llama.cpp marks the conv layers with a KV head count of 0 (an array per layer).
    let kinds: Vec<Kind> = match k.nums("attention.head_count_kv") {
        Some(a) => a
            .iter()
            .map(|&n| if n == 0 { Kind::Conv } else { Kind::Attention })
            .collect(),
        None => vec![Kind::Attention; cfg.n_layers],
    };
    let moe = match k.num("expert_count") {
        Some(n_experts) => Some(MoeLayout {
            config: MoeConfig {
                n_experts,
                top_k: k.req("expert_used_count")?,
                norm_topk_prob: k.flag("expert_weights_norm").unwrap_or(true),
                scoring: RouterScoring::Sigmoid,
                routed_scale: k.float("expert_weights_scale").unwrap_or(1.0),
                norm_eps: 1e-6,
            },
            dense_layers: k.num("leading_dense_block_count").unwrap_or(0),
            expert_bias: true,
        }),
        None => None,
    };
    let kernel = k.num("shortconv.l_cache").unwrap_or(3);
    let weights = load_layers(&w, &mut cfg, &GGUF, &kinds, kernel, moe.as_ref())?;
    let template = chat_template(&w, &config.pack_dir);
    Ok(Loaded {
        architecture: k.arch.clone(),
        cfg,
        weights,
        context_length: k.context_length(),
        specials: Specials::from_gguf(&w, &SPECIAL_TOKENS, &STOP_TEXTS),
        tools: template_has_tools(template.as_deref()),
    })
}

/// The weight map: every layer's mixer and feed-forward by the names of `names`.
fn load_layers(
    w: &Weights,
    cfg: &mut DecoderConfig,
    names: &Names,
    kinds: &[Kind],
    kernel: usize,
    moe: Option<&MoeLayout>,
) -> Result<DecoderWeights, PluginError> {
    if kinds.len() != cfg.n_layers {
        return Err(bad(format!(
            "{} layer types for {} layers",
            kinds.len(),
            cfg.n_layers
        )));
    }
    cfg.moe = moe.map(|m| m.config);
    let t = |i: usize, role: &str| (names.layer)(i, role);
    let mat = |n: String| w.matrix_named(&n);
    let vec = |n: String| w.vector_named(&n);
    let mut layers = Vec::with_capacity(cfg.n_layers);
    for (i, kind) in kinds.iter().enumerate() {
        let mixer = match kind {
            Kind::Conv => Mixer::ShortConv(ShortConv {
                in_proj: mat(t(i, "conv_in"))?,
                conv: vec(t(i, "conv"))?,
                kernel,
                out_proj: mat(t(i, "conv_out"))?,
            }),
            Kind::Attention => Mixer::Attention(Box::new(
                AttnWeights::new(mat(t(i, "q"))?, mat(t(i, "k"))?, mat(t(i, "v"))?, mat(t(i, "o"))?)
                    .with_qk_norms(vec(t(i, "q_norm"))?, vec(t(i, "k_norm"))?),
            )),
        };
        let dense = |i: usize| -> Result<GatedFfn, PluginError> {
            Ok(GatedFfn {
                gate: mat(t(i, "gate"))?,
                up: mat(t(i, "up"))?,
                down: mat(t(i, "down"))?,
            })
        };
        let ffn = match moe {
            Some(m) if i >= m.dense_layers => Ffn::Moe {
                router: mat(t(i, "router"))?,
                experts: load_experts(
                    w,
                    |e, p| match e {
                        None => t(i, &format!("{p}_exps")),
                        Some(e) => {
                            let w = match p {
                                "gate" => "w1",
                                "up" => "w3",
                                _ => "w2",
                            };
                            t(i, &format!("{e}.{w}.weight"))
                        }
                    },
                    m.config.n_experts,
                )?,
                selection_bias: if m.expert_bias {
                    Some(vec(t(i, "expert_bias"))?)
                } else {
                    None
                },
                shared: None,
                biases: None,
            },
            _ => Ffn::Dense(dense(i)?),
        };
        layers.push(LayerWeights {
            attn_norm: vec(t(i, "mixer_norm"))?,
            mixer,
            post_attn_norm: None,
            ffn_norm: vec(t(i, "ffn_norm"))?,
            post_ffw_norm: None,
            ffn,
        });
    }
    let embed = mat(names.embed.into())?;
    // LFM2 ties its LM head to the embeddings.
    let output = match ["lm_head.weight", "output.weight"]
        .iter()
        .find(|n| w.has_named(n))
    {
        Some(n) => mat(n.to_string())?,
        None => embed.clone(),
    };
    DecoderWeights::new(cfg, embed, layers, vec(names.final_norm.into())?, output)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn probe_accepts_lfm2_packs_only() {
        berth_plugin_common::testing::check_probe::<Lfm2Family>(
            "lfm2",
            &[
                "lfm2",
                // What llama.cpp's converter writes as general.architecture for LFM2-8B-A1B: a
                // GGUF pack of it was refused by every plugin before.
                "lfm2moe",
                "lfm2_moe",
                "lfm2_vl",
                "Lfm2ForCausalLM",
                "Lfm2VlForConditionalGeneration",
            ],
        );
    }
}
