//! Sentence-transformers embedding heads: what runs after the transformer of an embedding model
//! (pooling, dense projections, normalisation), read as data from the pack's `modules.json` and
//! its module folders, so a mean-pooled EmbeddingGemma and a last-token Qwen3-Embedding are the
//! same code with different files.

use std::collections::BTreeMap;
use std::path::Path;

use berth_kernels::ops::mean_rows;
use berth_plugin_api::{EmbeddingSpec, PluginError, Pooling};
use serde_json::Value;

use crate::linear::{matmul, MatmulScratch};
use crate::weights::{Matrix, Weights};

/// What a dense module applies after its projection.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum DenseActivation {
    /// `torch.nn.Identity` (EmbeddingGemma's two projections).
    Identity,
    /// `torch.nn.Tanh` (sentence-transformers' default for Dense).
    Tanh,
}

/// A sentence-transformers `Dense` module: `activation(W·x + b)`.
#[derive(Debug)]
struct Dense {
    weight: Matrix,
    bias: Option<Vec<f32>>,
    activation: DenseActivation,
}

/// The modules after the transformer of a sentence-transformers model.
#[derive(Debug)]
pub struct SentenceHead {
    pooling: Pooling,
    dense: Vec<Dense>,
    normalize: bool,
    dimensions: usize,
    max_tokens: u32,
    prompts: BTreeMap<String, String>,
    default_prompt: Option<String>,
}

fn bad(message: impl Into<String>) -> PluginError {
    PluginError::invalid_argument(message.into())
}

fn read_json(path: &Path) -> Result<Value, PluginError> {
    let text = std::fs::read_to_string(path).map_err(|e| bad(format!("{}: {e}", path.display())))?;
    serde_json::from_str(&text).map_err(|e| bad(format!("{}: {e}", path.display())))
}

/// The module kind of a sentence-transformers class path (`sentence_transformers.models.Dense`
/// → `Dense`).
fn module_kind(class: &str) -> &str {
    class.rsplit('.').next().unwrap_or(class)
}

fn pooling_of(config: &Value, folder: &str) -> Result<Pooling, PluginError> {
    let on = |k: &str| config.get(k).and_then(Value::as_bool) == Some(true);
    let modes: Vec<(&str, Option<Pooling>)> = [
        ("pooling_mode_mean_tokens", Some(Pooling::Mean)),
        ("pooling_mode_lasttoken", Some(Pooling::LastToken)),
        ("pooling_mode_cls_token", Some(Pooling::Cls)),
        ("pooling_mode_max_tokens", None),
        ("pooling_mode_mean_sqrt_len_tokens", None),
        ("pooling_mode_weightedmean_tokens", None),
    ]
    .into_iter()
    .filter(|(k, _)| on(k))
    .collect();
    match modes.as_slice() {
        [(_, Some(p))] => {
            if config.get("include_prompt").and_then(Value::as_bool) == Some(false) {
                return Err(bad(format!(
                    "{folder}/config.json: pooling without the prompt (include_prompt false) is not supported"
                )));
            }
            Ok(*p)
        }
        [(k, None)] => Err(bad(format!("{folder}/config.json: {k} is not supported"))),
        [] => Err(bad(format!("{folder}/config.json: no pooling mode is on"))),
        _ => Err(bad(format!(
            "{folder}/config.json: several pooling modes at once are not supported"
        ))),
    }
}

fn load_dense(dir: &Path, folder: &str, in_features: usize) -> Result<Dense, PluginError> {
    let config = read_json(&dir.join(folder).join("config.json"))?;
    let num = |k: &str| config.get(k).and_then(Value::as_u64).map(|v| v as usize);
    let (inputs, outputs) = (num("in_features"), num("out_features"));
    if inputs != Some(in_features) || outputs.is_none_or(|o| o == 0) {
        return Err(bad(format!(
            "{folder}/config.json: in_features {inputs:?} / out_features {outputs:?}; {in_features} inputs expected"
        )));
    }
    let activation = match config
        .get("activation_function")
        .and_then(Value::as_str)
        .unwrap_or("torch.nn.modules.activation.Tanh")
    {
        a if a.ends_with(".Identity") => DenseActivation::Identity,
        a if a.ends_with(".Tanh") => DenseActivation::Tanh,
        a => return Err(bad(format!("{folder}: activation {a:?} is not supported"))),
    };
    let file = dir.join(folder).join("model.safetensors");
    if !file.is_file() {
        return Err(bad(format!("{folder}: no model.safetensors")));
    }
    let w = Weights::open_safetensors(&[file])?;
    let weight = w.matrix_named("linear.weight")?.to_f32();
    if weight.rows != outputs.unwrap_or(0) || weight.cols != in_features {
        return Err(bad(format!(
            "{folder}: linear.weight is {}x{}, config says {}x{in_features}",
            weight.rows,
            weight.cols,
            outputs.unwrap_or(0)
        )));
    }
    let bias = if config.get("bias").and_then(Value::as_bool) != Some(false) && w.has_named("linear.bias") {
        Some(w.vector_named("linear.bias")?)
    } else {
        None
    };
    Ok(Dense {
        weight,
        bias,
        activation,
    })
}

impl SentenceHead {
    /// The head described by `dir/modules.json`, for a transformer of `hidden` outputs that holds
    /// `context` positions; `None` when the pack has no `modules.json` (not an embedding model).
    pub fn load(dir: &Path, hidden: usize, context: u32) -> Result<Option<SentenceHead>, PluginError> {
        let modules_path = dir.join("modules.json");
        if !modules_path.is_file() {
            return Ok(None);
        }
        let modules = read_json(&modules_path)?;
        let list = modules
            .as_array()
            .ok_or_else(|| bad("modules.json: not a list"))?;
        let mut pooling = None;
        let mut dense = Vec::new();
        let mut normalize = false;
        let mut width = hidden;
        for m in list {
            let class = m.get("type").and_then(Value::as_str).unwrap_or("");
            let folder = m.get("path").and_then(Value::as_str).unwrap_or("");
            if folder.contains("..") || folder.starts_with('/') {
                return Err(bad(format!(
                    "modules.json: module path {folder:?} is not inside the pack"
                )));
            }
            match module_kind(class) {
                "Transformer" if pooling.is_none() && dense.is_empty() => {}
                "Pooling" if pooling.is_none() => {
                    let config = read_json(&dir.join(folder).join("config.json"))?;
                    pooling = Some(pooling_of(&config, folder)?);
                }
                "Dense" if pooling.is_some() && !normalize => {
                    let d = load_dense(dir, folder, width)?;
                    width = d.weight.rows;
                    dense.push(d);
                }
                "Normalize" if pooling.is_some() => normalize = true,
                _ => {
                    return Err(bad(format!(
                        "modules.json: module {class:?} at this place is not supported (Transformer, Pooling, Dense, Normalize in that order are)"
                    )))
                }
            }
        }
        let pooling = pooling.ok_or_else(|| bad("modules.json: no Pooling module"))?;
        let st = read_json(&dir.join("config_sentence_transformers.json")).ok();
        let prompts = st
            .as_ref()
            .and_then(|c| c.get("prompts"))
            .and_then(Value::as_object)
            .map(|o| {
                o.iter()
                    .filter_map(|(k, v)| Some((k.clone(), v.as_str()?.to_string())))
                    .collect()
            })
            .unwrap_or_default();
        let default_prompt = st
            .as_ref()
            .and_then(|c| c.get("default_prompt_name"))
            .and_then(Value::as_str)
            .map(str::to_string);
        let trained = read_json(&dir.join("sentence_bert_config.json"))
            .ok()
            .and_then(|c| c.get("max_seq_length").and_then(Value::as_u64))
            .map_or(context, |m| m.min(u64::from(context)) as u32);
        Ok(Some(SentenceHead {
            pooling,
            dense,
            normalize,
            dimensions: width,
            max_tokens: trained.min(context),
            prompts,
            default_prompt,
        }))
    }

    /// The spec the plugin reports through the ABI.
    pub fn spec(&self) -> EmbeddingSpec {
        EmbeddingSpec {
            dimensions: self.dimensions as u32,
            pooling: self.pooling,
            normalized: self.normalize,
            max_tokens: self.max_tokens,
            prompts: self.prompts.clone(),
            default_prompt: self.default_prompt.clone(),
        }
    }

    /// Pools each sequence's token states (`states`: `[row][hidden]`, the sequences of `lens`
    /// back to back) and projects them: one vector of the spec's dimensions per sequence. A final
    /// Normalize module is left to the host (the spec's `normalized`), which normalises after
    /// any truncation to fewer dimensions and can also hand out the raw vector.
    pub fn apply(&self, states: &[f32], lens: &[usize], hidden: usize, threads: usize) -> Vec<f32> {
        let n = lens.len();
        let mut pooled = vec![0f32; n * hidden];
        let mut start = 0;
        for (k, &len) in lens.iter().enumerate() {
            let rows = &states[start * hidden..(start + len) * hidden];
            let out = &mut pooled[k * hidden..(k + 1) * hidden];
            match self.pooling {
                Pooling::Mean => mean_rows(rows, len, out),
                Pooling::LastToken => out.copy_from_slice(&rows[(len - 1) * hidden..]),
                Pooling::Cls => out.copy_from_slice(&rows[..hidden]),
            }
            start += len;
        }
        let mut scratch = MatmulScratch::new();
        let mut x = pooled;
        for d in &self.dense {
            let mut y = vec![0f32; n * d.weight.rows];
            matmul(&d.weight, &x, n, &mut y, &mut scratch, threads);
            for row in y.chunks_exact_mut(d.weight.rows) {
                if let Some(b) = &d.bias {
                    berth_kernels::ops::add_in_place(row, b);
                }
                if d.activation == DenseActivation::Tanh {
                    row.iter_mut().for_each(|v| *v = v.tanh());
                }
            }
            x = y;
        }
        x
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn pooling_modes_read_from_the_config_and_unsupported_ones_are_named() {
        let p = |v: Value| pooling_of(&v, "1_Pooling");
        assert_eq!(
            p(json!({"pooling_mode_mean_tokens": true})).unwrap(),
            Pooling::Mean
        );
        assert_eq!(
            p(json!({"pooling_mode_lasttoken": true, "pooling_mode_mean_tokens": false})).unwrap(),
            Pooling::LastToken
        );
        assert_eq!(p(json!({"pooling_mode_cls_token": true})).unwrap(), Pooling::Cls);
        let e = p(json!({"pooling_mode_max_tokens": true})).unwrap_err().message;
        assert!(e.contains("pooling_mode_max_tokens"), "{e}");
        assert!(p(json!({})).unwrap_err().message.contains("no pooling mode"));
        assert!(
            p(json!({"pooling_mode_mean_tokens": true, "include_prompt": false}))
                .unwrap_err()
                .message
                .contains("include_prompt")
        );
    }

    #[test]
    fn a_pack_without_modules_json_has_no_head_and_an_unknown_module_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        assert!(SentenceHead::load(dir.path(), 8, 64).unwrap().is_none());
        std::fs::write(
            dir.path().join("modules.json"),
            r#"[{"idx":0,"name":"0","path":"","type":"sentence_transformers.models.Transformer"},
                {"idx":1,"name":"1","path":"1_X","type":"sentence_transformers.models.LayerNorm"}]"#,
        )
        .unwrap();
        let e = SentenceHead::load(dir.path(), 8, 64).unwrap_err().message;
        assert!(e.contains("LayerNorm"), "{e}");
    }

    #[test]
    fn mean_and_last_token_heads_pool_and_leave_normalising_to_the_host() {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        std::fs::create_dir(d.join("1_Pooling")).unwrap();
        std::fs::write(
            d.join("modules.json"),
            r#"[{"idx":0,"name":"0","path":"","type":"sentence_transformers.models.Transformer"},
                {"idx":1,"name":"1","path":"1_Pooling","type":"sentence_transformers.models.Pooling"},
                {"idx":2,"name":"2","path":"2_Normalize","type":"sentence_transformers.models.Normalize"}]"#,
        )
        .unwrap();
        std::fs::write(
            d.join("config_sentence_transformers.json"),
            r#"{"prompts": {"query": "q: "}, "default_prompt_name": null}"#,
        )
        .unwrap();
        std::fs::write(
            d.join("1_Pooling/config.json"),
            r#"{"pooling_mode_mean_tokens": true}"#,
        )
        .unwrap();
        let head = SentenceHead::load(d, 2, 64).unwrap().unwrap();
        let spec = head.spec();
        assert_eq!(
            (spec.dimensions, spec.pooling, spec.normalized),
            (2, Pooling::Mean, true)
        );
        assert_eq!(spec.prompts["query"], "q: ");
        assert_eq!(spec.max_tokens, 64);
        // Two sequences: [[1,0],[5,4]] (mean [3,2]) and [[0,-2]].
        let states = [1.0, 0.0, 5.0, 4.0, 0.0, -2.0];
        assert_eq!(head.apply(&states, &[2, 1], 2, 1), vec![3.0, 2.0, 0.0, -2.0]);
        std::fs::write(
            d.join("1_Pooling/config.json"),
            r#"{"pooling_mode_lasttoken": true}"#,
        )
        .unwrap();
        let head = SentenceHead::load(d, 2, 64).unwrap().unwrap();
        assert_eq!(head.apply(&states, &[2, 1], 2, 1), vec![5.0, 4.0, 0.0, -2.0]);
    }
}
