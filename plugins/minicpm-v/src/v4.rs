//! MiniCPM-V 4.0 and 4.5 (`model_type` `minicpmv`, `version` 4.0 / 4.5): the Idefics2 vision
//! tower (`vpm.*`), one resampler pass per slice (`resampler.*`, `query_num` rows each) and the
//! language model under `llm.*` with its fields at the top of `config.json`: Llama for 4.0,
//! Qwen3 (per-head q/k norms) for 4.5. The image rows take the places of the `<unk>` tokens.

use berth_plugin_api::{LoadConfig, PluginError};
use berth_plugin_common::family::{
    bad, chat_template, read_json, template_has_tools, HfConfig, Loaded, Specials,
};
use berth_plugin_common::vision::idefics2::Idefics2Vision;
use berth_plugin_common::vision::resampler::Resampler;
use berth_plugin_common::{DecoderWeights, Weights};
use serde_json::{json, Map, Value};
use std::path::Path;

/// Which 4.x release a pack is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Version {
    /// 4.0: Llama language model.
    V4_0,
    /// 4.5: Qwen3 language model.
    V4_5,
}

impl Version {
    /// The release `config.json`'s `version` names (a number or a string), if it is 4.0 or 4.5.
    pub fn from_config(c: &Value) -> Result<Version, PluginError> {
        let v = c.get("version");
        let n = v
            .and_then(Value::as_f64)
            .or_else(|| v.and_then(Value::as_str).and_then(|s| s.trim().parse().ok()));
        match n {
            Some(x) if (x - 4.0).abs() < 1e-9 => Ok(Version::V4_0),
            Some(x) if (x - 4.5).abs() < 1e-9 => Ok(Version::V4_5),
            _ => Err(bad(format!(
                "config.json: MiniCPM-V version {} is not supported (4.0, 4.5 and 4.6 are)",
                v.map_or("(none)".to_string(), Value::to_string)
            ))),
        }
    }

    /// The architecture name reported to the host.
    pub fn architecture(self) -> &'static str {
        match self {
            Version::V4_0 => "minicpmv4_0",
            Version::V4_5 => "minicpmv4_5",
        }
    }
}

/// The vision side of a 4.x model: the tower and the resampler.
#[derive(Clone, Debug)]
pub struct V4Vision {
    /// The Idefics2 tower (`vpm`).
    pub tower: Idefics2Vision,
    /// The resampler into the language model's width.
    pub resampler: Resampler,
}

impl V4Vision {
    /// Loads `vpm.*` and `resampler.*` with the sizes of the whole config; the resampler's width
    /// is the language model's `hidden_size`.
    pub fn load(w: &Weights, c: &Value) -> Result<V4Vision, PluginError> {
        let vc = c
            .get("vision_config")
            .ok_or_else(|| bad("config.json: minicpmv without vision_config"))?;
        let drop = c
            .get("drop_vision_last_layer")
            .and_then(Value::as_bool)
            .unwrap_or(false);
        let tower = Idefics2Vision::load(w, "vpm.", vc, drop)?;
        let hc = HfConfig(c);
        let query_num = hc.num("query_num").unwrap_or(64);
        if query_num == 0 {
            return Err(bad("config.json: query_num is 0"));
        }
        let resampler = Resampler::load(
            w,
            "resampler",
            query_num,
            hc.req("hidden_size")?,
            tower.config.hidden_size,
        )?;
        Ok(V4Vision { tower, resampler })
    }

    /// One slice's tower output, `h·w × vision hidden`.
    pub fn hidden(
        &self,
        strip: &[f32],
        grid: (usize, usize),
        threads: usize,
    ) -> Result<Vec<f32>, PluginError> {
        self.tower.forward(strip, grid, threads)
    }

    /// One slice's image features, `query_num × hidden`.
    pub fn features(
        &self,
        strip: &[f32],
        grid: (usize, usize),
        threads: usize,
    ) -> Result<Vec<f32>, PluginError> {
        let hidden = self.hidden(strip, grid, threads)?;
        self.resampler.forward(&hidden, grid, threads)
    }
}

/// Special tokens looked up by text in the vocabulary and reported in the model info.
const SPECIAL_TOKENS: [&str; 14] = [
    "<unk>",
    "<s>",
    "</s>",
    "<|im_start|>",
    "<|im_end|>",
    "<|endoftext|>",
    "<think>",
    "</think>",
    "<image>",
    "</image>",
    "<slice>",
    "</slice>",
    "<image_id>",
    "</image_id>",
];

/// Special tokens that end generation when present.
const STOP_TEXTS: [&str; 2] = ["<|im_end|>", "<|endoftext|>"];

/// Refuses language-model settings the common decoder would silently get wrong here.
fn check_text_config(hc: &HfConfig<'_>) -> Result<(), PluginError> {
    if hc.flag("mlp_bias") == Some(true) {
        return Err(bad("config.json: mlp_bias is not supported"));
    }
    for k in ["scale_emb", "scale_depth"] {
        if hc.float(k).is_some_and(|v| v != 1.0) {
            return Err(bad(format!(
                "config.json: {k} (MiniCPM muP scaling) is not supported"
            )));
        }
    }
    for k in ["rope_scaling", "rope_parameters"] {
        let Some(r) = hc.0.get(k).filter(|r| r.is_object()) else {
            continue;
        };
        let kind = r
            .get("rope_type")
            .or_else(|| r.get("type"))
            .and_then(Value::as_str)
            .unwrap_or("default");
        if kind != "default" {
            return Err(bad(format!("config.json: {k} type {kind:?} is not supported")));
        }
    }
    Ok(())
}

/// The language model of a 4.x pack: the top-level fields of `config.json`, tensors
/// `llm.model.*` and `llm.lm_head.weight` (absent when tied).
pub fn load_text(
    w: Weights,
    config: &LoadConfig,
    c: &Value,
    version: Version,
) -> Result<Loaded, PluginError> {
    let w = w.with_hf_prefix("llm.");
    let hc = HfConfig(c);
    check_text_config(&hc)?;
    let mut cfg = hc.decoder_config()?;
    // HF checkpoints keep q/k in rotate_half order.
    cfg.rope_neox = true;
    cfg.qkv_bias = hc.flag("attention_bias").unwrap_or(false);
    cfg.qk_norm = version == Version::V4_5;
    let weights = DecoderWeights::load(&w, &cfg)?;
    let dir = &config.pack_dir;
    let template = chat_template(&w, dir);
    Ok(Loaded {
        architecture: version.architecture().into(),
        cfg,
        weights,
        context_length: hc.num("max_position_embeddings").unwrap_or(32768) as u32,
        specials: Specials::from_hf(dir, c, &SPECIAL_TOKENS, &STOP_TEXTS)?,
        tools: template_has_tools(template.as_deref()),
    })
}

/// The id of token `text` in the pack's `tokenizer.json`: an added token, else a vocabulary
/// entry of the model.
pub fn token_id(dir: &Path, text: &str) -> Result<i32, PluginError> {
    let path = dir.join("tokenizer.json");
    if !path.is_file() {
        return Err(bad(format!(
            "{}: needed to find the image token {text:?}",
            path.display()
        )));
    }
    let t = read_json(&path)?;
    let added = t.get("added_tokens").and_then(Value::as_array).and_then(|a| {
        a.iter()
            .find(|x| x.get("content").and_then(Value::as_str) == Some(text))
            .and_then(|x| x.get("id")?.as_i64())
    });
    let vocab = || t.get("model")?.get("vocab")?.get(text)?.as_i64();
    added
        .or_else(vocab)
        .map(|id| id as i32)
        .ok_or_else(|| bad(format!("tokenizer.json has no {text:?} token")))
}

/// The image processor's settings for the host's `minicpmv` scheme: `preprocessor_config.json`
/// where the pack has one, else `config.json` (`slice_config`, `slice_mode`, `use_image_id`,
/// `query_num`), else MiniCPM-V's defaults. Each slice and the overview take `query_num` image
/// tokens.
pub fn preprocess_params(
    config: &LoadConfig,
    c: &Value,
    patch: usize,
    query_num: usize,
) -> Result<Map<String, Value>, PluginError> {
    let path = config.pack_dir.join("preprocessor_config.json");
    let pre = if path.is_file() {
        read_json(&path)?
    } else {
        json!({})
    };
    let slice = c.get("slice_config").cloned().unwrap_or(json!({}));
    let get = |keys: &[&str], default: Value| {
        keys.iter()
            .find_map(|k| pre.get(*k).or_else(|| slice.get(*k)).or_else(|| c.get(*k)))
            .cloned()
            .unwrap_or(default)
    };
    let mut m = Map::new();
    m.insert("max_slice_nums".into(), get(&["max_slice_nums"], json!(9)));
    m.insert("scale_resolution".into(), get(&["scale_resolution"], json!(448)));
    m.insert("patch_size".into(), json!(patch));
    m.insert("slice_mode".into(), get(&["slice_mode"], json!(true)));
    m.insert("query_num".into(), json!(query_num));
    m.insert("use_image_id".into(), get(&["use_image_id"], json!(true)));
    m.insert(
        "image_mean".into(),
        get(&["image_mean", "norm_mean"], json!([0.5, 0.5, 0.5])),
    );
    m.insert(
        "image_std".into(),
        get(&["image_std", "norm_std"], json!([0.5, 0.5, 0.5])),
    );
    Ok(m)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn version_comes_from_the_config() {
        assert_eq!(
            Version::from_config(&json!({"version": 4.0})).unwrap(),
            Version::V4_0
        );
        assert_eq!(
            Version::from_config(&json!({"version": 4.5})).unwrap(),
            Version::V4_5
        );
        assert_eq!(
            Version::from_config(&json!({"version": "4.5"})).unwrap(),
            Version::V4_5
        );
        assert!(Version::from_config(&json!({"version": 2.6})).is_err());
        assert!(Version::from_config(&json!({})).is_err());
    }

    #[test]
    fn unsupported_language_model_settings_are_refused() {
        let ok = json!({"rope_scaling": null, "scale_emb": 1.0});
        assert!(check_text_config(&HfConfig(&ok)).is_ok());
        for bad_cfg in [
            json!({"scale_emb": 12.0}),
            json!({"mlp_bias": true}),
            json!({"rope_scaling": {"rope_type": "longrope"}}),
        ] {
            assert!(check_text_config(&HfConfig(&bad_cfg)).is_err(), "{bad_cfg}");
        }
    }
}
