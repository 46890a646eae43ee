//! Pulling from an Ollama registry (the OCI distribution API): the manifest
//! `GET {registry}/v2/{namespace}/{name}/manifests/{tag}`, then each layer's blob
//! `GET {registry}/v2/{namespace}/{name}/blobs/sha256:<hex>`, checked against its digest.
//!
//! The model layer (a GGUF) is imported as the pack's weights. Berth renders Jinja chat templates,
//! so the GGUF's own `tokenizer.chat_template` stays the pack's template; Ollama's Go template is
//! kept beside it as `ollama.template` for reference. The params layer (JSON) becomes the
//! manifest's `defaults` and `params.json`; the system, messages and license layers become the
//! manifest's `system`, `messages` and `license` (and stay as files, with the projector layer and
//! the image config).

use std::fs;

use sha2::Digest as _;

use crate::download::{Blob, Digest};
use crate::hub::{fetch_all, link_or_copy, request_error, status_error, HubOptions, Scratch};
use crate::pack::{FileRole, PackFile, PackManifest, PackMessage, PackRef};
use crate::pull::{Phase, Progress, PullError};
use crate::store::{ImportOptions, PackEntry, Store};

/// The manifest media type asked for.
pub const MANIFEST_MEDIA_TYPE: &str = "application/vnd.docker.distribution.manifest.v2+json";
/// The prefix of Ollama's layer media types.
const LAYER_PREFIX: &str = "application/vnd.ollama.image.";

/// A model in a registry.
#[derive(Debug, Clone)]
pub(crate) struct Model {
    /// The reference as the user wrote it, for errors.
    pub reference: String,
    /// The registry's base URL.
    pub registry: String,
    /// `namespace/name`.
    pub repository: String,
    /// The tag.
    pub tag: String,
}

/// One layer (or the config) of a manifest.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Layer {
    /// The kind after `application/vnd.ollama.image.` (`model`, `template`, ...), or `config`.
    pub kind: String,
    /// The layer's digest.
    pub digest: Digest,
    /// Its size in bytes.
    pub size: u64,
}

impl Layer {
    /// The file the layer becomes in the pack, `None` for the weights (imported as `model.gguf`).
    fn pack_file(&self, nth: usize) -> Option<String> {
        let numbered = |base: &str, ext: &str| {
            if nth == 0 {
                format!("{base}{ext}")
            } else {
                format!("{base}-{}{ext}", nth + 1)
            }
        };
        Some(match self.kind.as_str() {
            "model" => return None,
            "template" => numbered("ollama", ".template"),
            "params" => numbered("params", ".json"),
            "system" => numbered("system", ".txt"),
            "license" => numbered("LICENSE", ""),
            "messages" => numbered("messages", ".json"),
            "projector" => numbered("projector", ".gguf"),
            "config" => numbered("ollama-config", ".json"),
            other => numbered(&format!("layer-{other}"), ""),
        })
    }
}

/// The layers of a manifest, the config first; refuses what Berth cannot serve.
pub(crate) fn parse_manifest(json: &serde_json::Value) -> Result<Vec<Layer>, String> {
    let layer = |v: &serde_json::Value, kind: Option<&str>| -> Result<Layer, String> {
        let media = v.get("mediaType").and_then(|m| m.as_str()).unwrap_or("");
        let digest_text = v.get("digest").and_then(|d| d.as_str()).unwrap_or("");
        let digest = digest_text
            .strip_prefix("sha256:")
            .and_then(Digest::sha256)
            .ok_or_else(|| format!("layer {media}: digest {digest_text:?} is not sha256:<64 hex>"))?;
        let size = v
            .get("size")
            .and_then(|s| s.as_u64())
            .ok_or_else(|| format!("layer {media}: no size"))?;
        let kind = match kind {
            Some(k) => k.to_string(),
            None => media
                .strip_prefix(LAYER_PREFIX)
                .ok_or_else(|| format!("layer {digest_text} has media type {media:?}, not an Ollama layer"))?
                .to_string(),
        };
        Ok(Layer { kind, digest, size })
    };
    let mut out = Vec::new();
    if let Some(c) = json.get("config").filter(|c| c.is_object()) {
        out.push(layer(c, Some("config"))?);
    }
    let layers = json
        .get("layers")
        .and_then(|l| l.as_array())
        .ok_or("the manifest has no layers")?;
    for l in layers {
        out.push(layer(l, None)?);
    }
    let models = out.iter().filter(|l| l.kind == "model").count();
    if models != 1 {
        return Err(format!(
            "the manifest has {models} model layers; Berth needs exactly one"
        ));
    }
    if let Some(a) = out.iter().find(|l| l.kind == "adapter") {
        return Err(format!(
            "layer {} is a LoRA adapter; Berth cannot apply adapters",
            a.digest.hex()
        ));
    }
    Ok(out)
}

/// Fetches and parses the manifest, checking `Docker-Content-Digest` when the registry sends it.
fn fetch_manifest(client: &reqwest::blocking::Client, model: &Model) -> Result<Vec<Layer>, PullError> {
    let url = format!(
        "{}/v2/{}/manifests/{}",
        model.registry, model.repository, model.tag
    );
    let resp = client
        .get(&url)
        .header(reqwest::header::ACCEPT, MANIFEST_MEDIA_TYPE)
        .send()
        .map_err(|e| request_error(&url, &e))?;
    let status = resp.status();
    if !status.is_success() {
        let hint = if status.as_u16() == 404 {
            "no such model or tag in the registry"
        } else {
            ""
        };
        return Err(status_error(&url, status, hint));
    }
    let published = resp
        .headers()
        .get("docker-content-digest")
        .and_then(|v| v.to_str().ok())
        .map(str::to_string);
    let body = resp.bytes().map_err(|e| request_error(&url, &e))?;
    if let Some(expected) = published.as_deref().and_then(|d| d.strip_prefix("sha256:")) {
        let got: String = sha2::Sha256::digest(&body)
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect();
        if !got.eq_ignore_ascii_case(expected) {
            return Err(PullError::FileDigest {
                file: format!("manifest {}:{}", model.repository, model.tag),
                algorithm: "sha256",
                expected: expected.to_ascii_lowercase(),
                got,
            });
        }
    }
    let json: serde_json::Value = serde_json::from_slice(&body).map_err(|e| PullError::Http {
        url: url.clone(),
        message: format!("not a JSON manifest: {e}"),
    })?;
    parse_manifest(&json).map_err(|message| PullError::Hub {
        reference: model.reference.clone(),
        message,
    })
}

/// Converts a JSON value to TOML (`None` for null, which TOML cannot hold).
fn json_to_toml(v: &serde_json::Value) -> Option<toml::Value> {
    Some(match v {
        serde_json::Value::Null => return None,
        serde_json::Value::Bool(b) => toml::Value::Boolean(*b),
        serde_json::Value::Number(n) => match n.as_i64() {
            Some(i) => toml::Value::Integer(i),
            None => toml::Value::Float(n.as_f64()?),
        },
        serde_json::Value::String(s) => toml::Value::String(s.clone()),
        serde_json::Value::Array(a) => toml::Value::Array(a.iter().filter_map(json_to_toml).collect()),
        serde_json::Value::Object(o) => toml::Value::Table(
            o.iter()
                .filter_map(|(k, v)| Some((k.clone(), json_to_toml(v)?)))
                .collect(),
        ),
    })
}

/// Writes a text layer into the manifest: `params` (JSON) become the defaults, `system` the
/// system prompt, `messages` (a JSON list of `{role, content}`) the pack's messages, and each
/// `license` layer is added to the license text.
fn apply_layer(manifest: &mut PackManifest, kind: &str, text: &str) -> Result<(), String> {
    match kind {
        "params" => {
            let params: serde_json::Value =
                serde_json::from_str(text).map_err(|e| format!("the params layer is not JSON: {e}"))?;
            if let Some(toml::Value::Table(t)) = json_to_toml(&params) {
                manifest.defaults.extend(t);
            }
        }
        "system" => manifest.system = Some(text.to_string()),
        "messages" => {
            let messages: Vec<PackMessage> = serde_json::from_str(text)
                .map_err(|e| format!("the messages layer is not a list of {{role, content}}: {e}"))?;
            manifest.messages = messages;
        }
        "license" => {
            manifest.license = Some(match manifest.license.take() {
                Some(before) => format!("{before}\n\n{text}"),
                None => text.to_string(),
            })
        }
        _ => {}
    }
    Ok(())
}

/// Pulls `model` into the store as `local`.
pub(crate) fn pull(
    store: &Store,
    model: &Model,
    local: &PackRef,
    opts: &HubOptions,
    progress: &mut dyn FnMut(&Progress),
) -> Result<PackEntry, PullError> {
    let client = opts.client()?;
    let layers = fetch_manifest(&client, model)?;
    let blobs: Vec<Blob> = layers
        .iter()
        .map(|l| Blob {
            url: format!(
                "{}/v2/{}/blobs/sha256:{}",
                model.registry,
                model.repository,
                l.digest.hex()
            ),
            name: format!("{} layer sha256:{}", l.kind, &l.digest.hex()[..12]),
            size: l.size,
            digest: l.digest.clone(),
        })
        .collect();
    let paths = fetch_all(&opts.downloader(None)?, &blobs, progress)?;
    crate::hub::emit(progress, Phase::Writing);

    // Import the GGUF into a scratch store first (for its metadata), add the other layers as
    // files, then import that pack into the real store, which installs it in one rename.
    let scratch = Scratch::new(store)?;
    let scratch_store = Store::new(scratch.dir.join("home"));
    let model_index = layers.iter().position(|l| l.kind == "model").unwrap_or(0);
    let import = ImportOptions {
        name: Some(local.to_string()),
        template: None,
        family: None,
        quantize: None,
    };
    let built = scratch_store.import(&paths[model_index], &import)?;
    let mut manifest = PackManifest::load(&built.dir).map_err(crate::store::StoreError::from)?;
    let mut seen: Vec<&str> = Vec::new();
    for (layer, path) in layers.iter().zip(&paths) {
        let nth = seen.iter().filter(|k| **k == layer.kind).count();
        seen.push(&layer.kind);
        let Some(name) = layer.pack_file(nth) else {
            continue;
        };
        link_or_copy(path, &built.dir.join(&name))?;
        manifest.files.push(PackFile {
            path: name,
            role: FileRole::Other,
            size: Some(layer.size),
            sha256: Some(layer.digest.hex().to_string()),
        });
        if matches!(layer.kind.as_str(), "params" | "system" | "messages" | "license") {
            let text = fs::read_to_string(path).map_err(|source| PullError::Io {
                path: path.clone(),
                source,
            })?;
            apply_layer(&mut manifest, &layer.kind, &text).map_err(|message| PullError::Hub {
                reference: model.reference.clone(),
                message,
            })?;
        }
    }
    manifest
        .save(&built.dir)
        .map_err(crate::store::StoreError::from)?;
    Ok(store.import(&built.dir, &import)?)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn manifest(layers: serde_json::Value) -> serde_json::Value {
        serde_json::json!({
            "schemaVersion": 2,
            "mediaType": MANIFEST_MEDIA_TYPE,
            "config": {"mediaType": "application/vnd.docker.container.image.v1+json",
                       "digest": format!("sha256:{}", "c".repeat(64)), "size": 10},
            "layers": layers,
        })
    }

    fn layer(kind: &str, fill: &str) -> serde_json::Value {
        serde_json::json!({"mediaType": format!("{LAYER_PREFIX}{kind}"),
                           "digest": format!("sha256:{}", fill.repeat(64)), "size": 5})
    }

    #[test]
    fn manifests_give_the_config_and_layers_and_refuse_what_cannot_be_served() {
        let m = manifest(serde_json::json!([
            layer("model", "a"),
            layer("template", "b"),
            layer("params", "d")
        ]));
        let layers = parse_manifest(&m).unwrap();
        let kinds: Vec<&str> = layers.iter().map(|l| l.kind.as_str()).collect();
        assert_eq!(kinds, ["config", "model", "template", "params"]);
        assert_eq!(layers[1].digest, Digest::Sha256("a".repeat(64)));
        assert_eq!(layers[2].pack_file(0).as_deref(), Some("ollama.template"));
        assert_eq!(layers[1].pack_file(0), None);
        let none = manifest(serde_json::json!([layer("template", "b")]));
        assert!(parse_manifest(&none).unwrap_err().contains("0 model layers"));
        let adapter = manifest(serde_json::json!([layer("model", "a"), layer("adapter", "e")]));
        assert!(parse_manifest(&adapter).unwrap_err().contains("adapter"));
        let bad = manifest(
            serde_json::json!([{"mediaType": "application/vnd.ollama.image.model",
                                               "digest": "sha256:../../etc", "size": 1}]),
        );
        assert!(parse_manifest(&bad).unwrap_err().contains("not sha256"));
    }

    #[test]
    fn params_json_becomes_toml_defaults() {
        let v = serde_json::json!({"temperature": 0.6, "num_ctx": 4096, "stop": ["<|im_end|>"], "x": null});
        let Some(toml::Value::Table(t)) = json_to_toml(&v) else {
            panic!()
        };
        assert_eq!(t["temperature"].as_float(), Some(0.6));
        assert_eq!(t["num_ctx"].as_integer(), Some(4096));
        assert_eq!(t["stop"].as_array().unwrap()[0].as_str(), Some("<|im_end|>"));
        assert!(!t.contains_key("x"));
    }

    #[test]
    fn text_layers_fill_the_manifest() {
        let mut m = PackManifest::new(&PackRef::parse("a:b").unwrap(), "qwen3");
        apply_layer(
            &mut m,
            "params",
            r#"{"stop": ["<|im_end|>", "<|endoftext|>"], "temperature": 0.2}"#,
        )
        .unwrap();
        apply_layer(&mut m, "system", "You are Ollama's.\n").unwrap();
        apply_layer(
            &mut m,
            "messages",
            r#"[{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]"#,
        )
        .unwrap();
        apply_layer(&mut m, "license", "MIT").unwrap();
        apply_layer(&mut m, "license", "Apache-2.0").unwrap();
        assert_eq!(
            m.defaults["stop"].as_array().map(Vec::len),
            Some(2),
            "stop stays an array"
        );
        assert_eq!(m.system.as_deref(), Some("You are Ollama's.\n"));
        assert_eq!(m.messages[1].content, "hello");
        assert_eq!(m.license.as_deref(), Some("MIT\n\nApache-2.0"));
        assert!(apply_layer(&mut m, "messages", "{}")
            .unwrap_err()
            .contains("messages layer"));
        assert!(apply_layer(&mut m, "params", "nope").is_err());
    }
}
