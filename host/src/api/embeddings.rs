//! Embeddings: OpenAI's `/v1/embeddings`, Ollama's `/api/embed` and its legacy `/api/embeddings`,
//! thin wire mappings over one core ([`embed`]) that adds the model's named prompt, tokenizes,
//! checks or truncates each input's length, queues the inputs on the engine (which packs them
//! with other requests' into shared forward passes), then truncates to the asked dimensions and
//! normalises the vectors.

use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use base64::Engine as _;
use serde::Deserialize;
use serde_json::{json, Value};

use super::body::{self, field_names, Int, KeepAlive, RequestBody};
use super::ollama::OllamaOptions;
use super::pipeline::{body as request_body, model_for};
use super::{ApiError, OllamaError};
use crate::engine::SubmitError;
use crate::state::models::Model;
use crate::state::Shared;

/// What is embedded: texts (the prompt is added, then they are tokenized) or token ids as given.
#[derive(Clone, Debug, PartialEq)]
pub(crate) enum Inputs {
    /// Texts.
    Texts(Vec<String>),
    /// Token-id sequences.
    Tokens(Vec<Vec<u32>>),
}

impl Inputs {
    fn len(&self) -> usize {
        match self {
            Inputs::Texts(t) => t.len(),
            Inputs::Tokens(t) => t.len(),
        }
    }
}

/// How an API wants its vectors.
#[derive(Clone, Debug, Default)]
pub(crate) struct EmbedOptions {
    /// A prompt of the model's (`query`, `document`, …); `None`: the model's default, if any.
    pub prompt_name: Option<String>,
    /// Cut an input longer than the model embeds (else a 400 naming it).
    pub truncate: bool,
    /// Keep the first this many dimensions (Matryoshka), renormalised.
    pub dimensions: Option<usize>,
    /// Hand out the vectors as the model's last projection leaves them, never normalised
    /// (Ollama's legacy endpoint); otherwise they are normalised when the model's modules end
    /// with a Normalize, and always for `always_normalize`.
    pub raw: bool,
    /// Normalise even when the model does not (Ollama's `/api/embed` always does).
    pub always_normalize: bool,
    /// The field the inputs came in, for error messages (`input`, `prompt`).
    pub field: &'static str,
    /// The inputs came as a list: errors name `input[i]` even when it holds one.
    pub listed: bool,
}

/// The vectors of one request.
#[derive(Debug)]
pub(crate) struct EmbedOutcome {
    /// One per input, in order.
    pub vectors: Vec<Vec<f32>>,
    /// Tokens embedded, over all inputs (prompt and special tokens included).
    pub tokens: usize,
}

/// The model must embed: a 400 saying what it is otherwise.
fn embedding_model(model: &Model) -> Result<&berth_plugin_api::EmbeddingSpec, ApiError> {
    model.embedding.as_ref().ok_or_else(|| {
        ApiError::param(
            "model",
            format!(
                "model '{}' is a generating model: it does not embed text (use an embedding model such as embeddinggemma:300m)",
                model.reference
            ),
        )
    })
}

/// `text`'s tokens as the model embeds them (its special tokens around the text), cut to `max`
/// keeping those special tokens when `truncate`, as sentence-transformers' tokenizer truncates.
fn tokenize(model: &Model, text: &str, max: usize, truncate: bool) -> (Vec<u32>, usize) {
    let full = model.tokenizer.encode(text, true);
    let n = full.len();
    if n <= max || !truncate {
        return (full, n);
    }
    let plain_len = model.tokenizer.encode(text, false).len();
    let head = if model.tokenizer.add_bos()
        && model.tokenizer.bos_id().is_some()
        && full.first() == model.tokenizer.bos_id().as_ref()
    {
        1
    } else {
        0
    };
    let tail = n.saturating_sub(plain_len + head);
    let keep = max.saturating_sub(head + tail);
    let mut cut = full[..head + keep].to_vec();
    cut.extend_from_slice(&full[n - tail..]);
    (cut, n)
}

/// Embeds `inputs` on `model` as `opts` asks: one vector per input, in order.
pub(crate) async fn embed(
    model: &Model,
    inputs: Inputs,
    opts: &EmbedOptions,
) -> Result<EmbedOutcome, ApiError> {
    let spec = embedding_model(model)?;
    let field = opts.field;
    let full = spec.dimensions as usize;
    if let Some(d) = opts.dimensions {
        if d == 0 || d > full {
            return Err(ApiError::param(
                "dimensions",
                format!(
                    "dimensions must be between 1 and {full} for model '{}'; got {d}",
                    model.reference
                ),
            ));
        }
    }
    let prompt = match opts.prompt_name.as_deref().or(spec.default_prompt.as_deref()) {
        None => "",
        Some(name) => spec.prompts.get(name).map(String::as_str).ok_or_else(|| {
            let known: Vec<&str> = spec.prompts.keys().map(String::as_str).collect();
            ApiError::param(
                "prompt_name",
                format!(
                    "model '{}' has no prompt named '{name}'; it has: {}",
                    model.reference,
                    if known.is_empty() {
                        "none".to_string()
                    } else {
                        known.join(", ")
                    }
                ),
            )
        })?,
    };
    let max = (spec.max_tokens as usize).min(model.context_length).max(1);
    let many = opts.listed || inputs.len() > 1;
    let at = |i: usize| {
        if many {
            format!("{field}[{i}]")
        } else {
            field.to_string()
        }
    };
    let mut sequences = Vec::with_capacity(inputs.len());
    match inputs {
        Inputs::Texts(texts) => {
            for (i, text) in texts.iter().enumerate() {
                let (ids, n) = tokenize(model, &format!("{prompt}{text}"), max, opts.truncate);
                if n > max && !opts.truncate {
                    return Err(too_long(&at(i), n, max));
                }
                sequences.push(ids);
            }
        }
        Inputs::Tokens(seqs) => {
            let vocab = model.vocab_size;
            for (i, ids) in seqs.into_iter().enumerate() {
                if ids.is_empty() {
                    return Err(ApiError::param(
                        &at(i),
                        format!("{} is an empty list of tokens", at(i)),
                    ));
                }
                if let Some(&t) = ids.iter().find(|&&t| t as usize >= vocab) {
                    return Err(ApiError::param(
                        &at(i),
                        format!("token {t} in {} is outside the vocabulary (size {vocab})", at(i)),
                    ));
                }
                let n = ids.len();
                if n > max && !opts.truncate {
                    return Err(too_long(&at(i), n, max));
                }
                sequences.push(ids.into_iter().take(max).collect());
            }
        }
    }
    let tokens = sequences.iter().map(Vec::len).sum();
    let done = match model.engine.embed(sequences) {
        Ok(rx) => rx,
        Err(SubmitError::QueueFull) => {
            return Err(ApiError::new(
                StatusCode::TOO_MANY_REQUESTS,
                "the model's queue is full; retry later",
            ))
        }
        Err(SubmitError::Closed) => {
            return Err(ApiError::new(
                StatusCode::SERVICE_UNAVAILABLE,
                "the model is unloading; retry",
            ))
        }
    };
    let embedded = match done.await {
        Ok(Ok(e)) => e,
        Ok(Err(message)) => return Err(ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, message)),
        Err(_) => {
            return Err(ApiError::new(
                StatusCode::SERVICE_UNAVAILABLE,
                "the model was unloaded before the inputs were embedded; retry",
            ))
        }
    };
    let normalize = !opts.raw && (spec.normalized || opts.always_normalize || opts.dimensions.is_some());
    let vectors = embedded
        .vectors
        .into_iter()
        .map(|mut v| {
            if let Some(d) = opts.dimensions {
                v.truncate(d);
            }
            if normalize {
                berth_kernels::ops::l2_normalize(&mut v);
            }
            v
        })
        .collect();
    Ok(EmbedOutcome { vectors, tokens })
}

fn too_long(at: &str, n: usize, max: usize) -> ApiError {
    let mut e = ApiError::param(
        at,
        format!("{at} has {n} tokens; this model embeds at most {max} (send it shorter, or ask for truncation)"),
    );
    e.code = Some("context_length_exceeded");
    e
}

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
