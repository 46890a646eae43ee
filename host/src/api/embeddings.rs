//! Embeddings: OpenAI's `/v1/embeddings`, Ollama's `/api/embed` and its legacy `/api/embeddings`,
//! thin wire mappings over [`crate::embedding::embed`].

use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::State;
use axum::response::{IntoResponse, Response};
use base64::Engine as _;
use serde::Deserialize;
use serde_json::{json, Value};

use super::body::{self, field_names, Int, KeepAlive, RequestBody};
use super::pipeline::{body as request_body, model_for};
use super::{ApiError, OllamaError};
use crate::embedding::{embed, embedding_model, EmbedOptions, Inputs};
use crate::options::OllamaOptions;
use crate::state::models::Model;
use crate::state::Shared;

/// Reads an `input` given as a string, an array of strings, an array of token ids or an array of
/// token-id arrays (OpenAI's four forms); `field` names it in errors.
fn inputs_of(v: &Value, field: &str, tokens_allowed: bool) -> Result<(Inputs, bool), ApiError> {
    let bad = |at: String, what: &str| ApiError::param(&at, format!("{at} must be {what}"));
    let ids = |v: &Value, at: String| -> Result<Vec<u32>, ApiError> {
        let arr = v
            .as_array()
            .ok_or_else(|| bad(at.clone(), "a list of token ids"))?;
        arr.iter()
            .enumerate()
            .map(|(j, t)| {
                t.as_u64()
                    .and_then(|t| u32::try_from(t).ok())
                    .ok_or_else(|| bad(format!("{at}[{j}]"), "a token id (a non-negative integer)"))
            })
            .collect()
    };
    let what = if tokens_allowed {
        "a string, a list of strings, a list of token ids or a list of lists of token ids"
    } else {
        "a string or a list of strings"
    };
    let listed = matches!(v, Value::Array(a) if !a.first().is_some_and(Value::is_number));
    let inputs = match v {
        Value::String(s) => Ok(Inputs::Texts(vec![s.clone()])),
        Value::Array(a) if a.is_empty() => Err(ApiError::param(field, format!("{field} is an empty list"))),
        Value::Array(a) => match &a[0] {
            Value::String(_) => a
                .iter()
                .enumerate()
                .map(|(i, s)| {
                    s.as_str()
                        .map(str::to_string)
                        .ok_or_else(|| bad(format!("{field}[{i}]"), "a string"))
                })
                .collect::<Result<_, _>>()
                .map(Inputs::Texts),
            Value::Number(_) if tokens_allowed => Ok(Inputs::Tokens(vec![ids(v, field.to_string())?])),
            Value::Array(_) if tokens_allowed => a
                .iter()
                .enumerate()
                .map(|(i, s)| ids(s, format!("{field}[{i}]")))
                .collect::<Result<_, _>>()
                .map(Inputs::Tokens),
            _ => Err(bad(format!("{field}[0]"), what)),
        },
        _ => Err(bad(field.to_string(), what)),
    }?;
    Ok((inputs, listed))
}

/// A `dimensions` field: a positive integer.
fn dimensions_of(d: Option<Int>) -> Result<Option<usize>, ApiError> {
    match d {
        None => Ok(None),
        Some(Int(n)) if n >= 1 => Ok(Some(n as usize)),
        Some(Int(n)) => Err(ApiError::param(
            "dimensions",
            format!("dimensions must be at least 1; got {n}"),
        )),
    }
}

/// The body of `POST /v1/embeddings`.
#[derive(Debug, Deserialize)]
#[serde(remote = "Self")]
pub struct EmbeddingsRequest {
    /// The model (required).
    pub model: Option<String>,
    /// A string, a list of strings, a list of token ids, or a list of token-id lists (required).
    pub input: Option<Value>,
    /// `float` (the default) or `base64` (little-endian f32 bytes).
    pub encoding_format: Option<String>,
    /// Keep the first this many dimensions, renormalised.
    pub dimensions: Option<Int>,
    /// The end user (accepted, unused).
    pub user: Option<String>,
    /// Berth extension: a prompt of the model's, by name (`query`, `document`, …), put before
    /// every input text (sentence-transformers' `prompt_name`).
    pub prompt_name: Option<String>,
    /// Berth extension: cut inputs longer than the model embeds instead of refusing them.
    pub truncate: Option<bool>,
}

crate::object_only!(EmbeddingsRequest, EmbedRequest, LegacyEmbeddingsRequest);

impl RequestBody for EmbeddingsRequest {
    fn known_keys() -> Option<Vec<&'static str>> {
        Some(field_names::<Self>().to_vec())
    }

    fn validate(&self) -> Result<(), ApiError> {
        match self.encoding_format.as_deref() {
            None | Some("float") | Some("base64") => {}
            Some(f) => {
                return Err(ApiError::param(
                    "encoding_format",
                    format!("encoding_format must be 'float' or 'base64'; got '{f}'"),
                ))
            }
        }
        dimensions_of(self.dimensions)?;
        if self.input.is_none() {
            return Err(ApiError::param("input", "'input' is required"));
        }
        Ok(())
    }
}

/// `POST /v1/embeddings` (and `/embeddings`).
pub async fn openai(
    State(st): State<Shared>,
    b: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    let req = body::parse::<EmbeddingsRequest>(&request_body(b)?)?.request;
    let name = req
        .model
        .as_deref()
        .ok_or_else(|| ApiError::param("model", "'model' is required"))?;
    let (inputs, listed) = inputs_of(req.input.as_ref().expect("validated"), "input", true)?;
    let model = model_for(&st, name, None).await?;
    let opts = EmbedOptions {
        listed,
        prompt_name: req.prompt_name.clone(),
        truncate: req.truncate.unwrap_or(false),
        dimensions: dimensions_of(req.dimensions)?,
        field: "input",
        ..EmbedOptions::default()
    };
    let out = embed(&model, inputs, &opts).await?;
    let base64 = req.encoding_format.as_deref() == Some("base64");
    let data: Vec<Value> = out
        .vectors
        .iter()
        .enumerate()
        .map(|(i, v)| {
            let embedding = if base64 {
                let bytes: Vec<u8> = v.iter().flat_map(|x| x.to_le_bytes()).collect();
                Value::String(base64::engine::general_purpose::STANDARD.encode(bytes))
            } else {
                json!(v)
            };
            json!({"object": "embedding", "index": i, "embedding": embedding})
        })
        .collect();
    Ok(axum::Json(json!({
        "object": "list",
        "data": data,
        "model": model.reference,
        "usage": {"prompt_tokens": out.tokens, "total_tokens": out.tokens},
    }))
    .into_response())
}

/// The body of Ollama's `POST /api/embed`.
#[derive(Debug, Deserialize)]
#[serde(remote = "Self")]
pub struct EmbedRequest {
    /// The model (required).
    pub model: Option<String>,
    /// A string or a list of strings; none loads the model.
    pub input: Option<Value>,
    /// Cut inputs longer than the model embeds (the default) instead of refusing them.
    pub truncate: Option<bool>,
    /// Keep the first this many dimensions, renormalised.
    pub dimensions: Option<Int>,
    /// How long the model stays loaded.
    pub keep_alive: Option<KeepAlive>,
    /// Model options (accepted; the server's settings apply).
    pub options: Option<OllamaOptions>,
    /// Berth extension: a prompt of the model's, by name (`query`, `document`, …).
    pub prompt_name: Option<String>,
}

impl RequestBody for EmbedRequest {
    fn validate(&self) -> Result<(), ApiError> {
        dimensions_of(self.dimensions).map(|_| ())
    }
}

/// The body of Ollama's legacy `POST /api/embeddings`.
#[derive(Debug, Deserialize)]
#[serde(remote = "Self")]
pub struct LegacyEmbeddingsRequest {
    /// The model (required).
    pub model: Option<String>,
    /// The text; empty or absent answers an empty vector.
    pub prompt: Option<String>,
    /// How long the model stays loaded.
    pub keep_alive: Option<KeepAlive>,
    /// Model options (accepted; the server's settings apply).
    pub options: Option<OllamaOptions>,
}

impl RequestBody for LegacyEmbeddingsRequest {}

/// Nanoseconds, as Ollama reports durations.
fn nanos(d: Duration) -> u64 {
    d.as_nanos().min(u128::from(u64::MAX)) as u64
}

/// The model an Ollama embedding request names, loaded, and how long loading took.
async fn ollama_model(
    st: &Shared,
    name: Option<&str>,
    keep_alive: Option<KeepAlive>,
) -> Result<(Arc<Model>, Duration), ApiError> {
    let name = name.ok_or_else(|| ApiError::param("model", "'model' is required"))?;
    let start = Instant::now();
    let model = model_for(st, name, keep_alive.map(|KeepAlive(k)| k)).await?;
    Ok((model, start.elapsed()))
}

/// `POST /api/embed`.
pub async fn ollama_embed(
    State(st): State<Shared>,
    b: Result<Bytes, BytesRejection>,
) -> Result<Response, OllamaError> {
    let start = Instant::now();
    let req = body::parse::<EmbedRequest>(&request_body(b)?)?.request;
    let inputs = match &req.input {
        None => None,
        Some(Value::Array(a)) if a.is_empty() => None,
        Some(v) => Some(inputs_of(v, "input", false)?),
    };
    let (inputs, listed) = match inputs {
        Some((i, l)) => (Some(i), l),
        None => (None, false),
    };
    let (model, load) = ollama_model(&st, req.model.as_deref(), req.keep_alive).await?;
    embedding_model(&model)?;
    let Some(inputs) = inputs else {
        return Ok(axum::Json(json!({"model": model.reference, "embeddings": []})).into_response());
    };
    let opts = EmbedOptions {
        listed,
        prompt_name: req.prompt_name.clone(),
        truncate: req.truncate.unwrap_or(true),
        dimensions: dimensions_of(req.dimensions)?,
        always_normalize: true,
        field: "input",
        ..EmbedOptions::default()
    };
    let out = embed(&model, inputs, &opts).await?;
    Ok(axum::Json(json!({
        "model": model.reference,
        "embeddings": out.vectors,
        "total_duration": nanos(start.elapsed()),
        "load_duration": nanos(load),
        "prompt_eval_count": out.tokens,
    }))
    .into_response())
}

/// `POST /api/embeddings` (Ollama's legacy endpoint: one vector, not normalised).
pub async fn ollama_embeddings(
    State(st): State<Shared>,
    b: Result<Bytes, BytesRejection>,
) -> Result<Response, OllamaError> {
    let req = body::parse::<LegacyEmbeddingsRequest>(&request_body(b)?)?.request;
    let (model, _) = ollama_model(&st, req.model.as_deref(), req.keep_alive).await?;
    embedding_model(&model)?;
    let text = req.prompt.unwrap_or_default();
    if text.is_empty() {
        return Ok(axum::Json(json!({"embedding": []})).into_response());
    }
    let opts = EmbedOptions {
        truncate: true,
        raw: true,
        field: "prompt",
        ..EmbedOptions::default()
    };
    let out = embed(&model, Inputs::Texts(vec![text]), &opts).await?;
    let vector = out.vectors.into_iter().next().unwrap_or_default();
    Ok(axum::Json(json!({"embedding": vector})).into_response())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn inputs_take_openais_four_forms_and_name_the_bad_element() {
        let t = |v: Value| inputs_of(&v, "input", true).map(|(i, _)| i);
        assert_eq!(t(json!("hi")).unwrap(), Inputs::Texts(vec!["hi".into()]));
        assert_eq!(
            t(json!(["a", "b"])).unwrap(),
            Inputs::Texts(vec!["a".into(), "b".into()])
        );
        assert_eq!(t(json!([1, 2])).unwrap(), Inputs::Tokens(vec![vec![1, 2]]));
        assert_eq!(
            t(json!([[1], [2, 3]])).unwrap(),
            Inputs::Tokens(vec![vec![1], vec![2, 3]])
        );
        assert_eq!(t(json!(["a", 3])).unwrap_err().param.as_deref(), Some("input[1]"));
        assert_eq!(
            t(json!([[1], [-2]])).unwrap_err().param.as_deref(),
            Some("input[1][0]")
        );
        assert_eq!(t(json!([])).unwrap_err().param.as_deref(), Some("input"));
        assert_eq!(t(json!({"a": 1})).unwrap_err().param.as_deref(), Some("input"));
        assert!(inputs_of(&json!([1, 2]), "input", false).is_err());
    }

    #[test]
    fn dimensions_must_be_positive() {
        assert_eq!(dimensions_of(Some(Int(3))).unwrap(), Some(3));
        assert!(dimensions_of(Some(Int(0))).is_err());
        assert!(dimensions_of(Some(Int(-1))).is_err());
    }
}
