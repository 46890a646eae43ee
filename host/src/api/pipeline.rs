//! The generation pipeline every API shares: the request body and model lookup, rendering a
//! conversation to a prompt, the constraint for tools and formats, submitting to the engine,
//! collecting or streaming what comes back, and the checks on chat messages.

use super::body::{self, Parsed, RequestBody};
use super::ApiError;
use crate::decoding::DecodeOptions;
use crate::engine::Finish;
use crate::state::models::{Model, ModelError};
use crate::state::Shared;
use axum::body::{Body, Bytes};
use axum::extract::rejection::BytesRejection;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde_json::{json, Map, Value};
use std::convert::Infallible;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// Seconds since the Unix epoch (`created` fields).
pub(crate) fn now_secs() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

use crate::turn::ChatRequest;
pub(crate) use crate::turn::MAX_CHOICES;

/// RFC 3339 UTC time with nanoseconds, as Ollama writes it (`2024-03-01T00:00:00.005000000Z`).
pub(crate) fn rfc3339(t: SystemTime) -> String {
    let whole = berth_registry::pack::rfc3339(t);
    let nanos = t.duration_since(UNIX_EPOCH).unwrap_or_default().subsec_nanos();
    format!("{}.{nanos:09}Z", whole.trim_end_matches('Z'))
}

/// The request body, with axum's own rejections (413, ...) in OpenAI's shape.
pub(crate) fn body(b: Result<Bytes, BytesRejection>) -> Result<Bytes, ApiError> {
    b.map_err(|e| {
        let status = e.status();
        let msg = if status == StatusCode::PAYLOAD_TOO_LARGE {
            "the request body is too large".to_string()
        } else {
            e.body_text()
        };
        ApiError::new(status, msg)
    })
}

/// The loaded model named by the request (404 unknown; a model another request is loading is
/// waited for).
pub(crate) async fn model_for(
    st: &Shared,
    name: &str,
    keep_alive: Option<Option<std::time::Duration>>,
) -> Result<Arc<Model>, ApiError> {
    match st.models.get(name, keep_alive).await {
        Ok(m) => Ok(m),
        Err(ModelError::NotFound) => Err(ApiError::model_not_found(name)),
        // A pack that cannot load (no plugin, broken weights) stays broken on retry: a server
        // fault, not "busy" (Anthropic's clients read 503 as overloaded).
        Err(ModelError::Failed(m)) => Err(ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, m)),
    }
}

/// Checks chat messages given as JSON (the shape every API converts its conversation to): a 400
/// naming the first malformed field.
#[cfg(test)]
pub(crate) fn check_messages(messages: &[Value]) -> Result<(), ApiError> {
    super::messages::check_json(messages, true)
}

/// A generating request's typed body: what the shared preamble ([`prepare`]) needs of it.
pub(crate) trait GenerationBody: RequestBody {
    /// The model it names (required).
    fn model_name(&self) -> Option<&str>;

    /// The keep-alive it asks for: outer `None` unset, inner `None` forever.
    fn keep_alive(&self) -> Option<Option<Duration>> {
        None
    }

    /// The typed turn it asks for (`json`: the whole body, for the fields typed as parts of it),
    /// its sampling and stopping over `base` (the model's pack defaults). Every 400 about the
    /// body's own fields comes from here or from validation.
    fn turn(&mut self, json: &Map<String, Value>, base: &DecodeOptions) -> Result<ChatRequest, ApiError>;
}

/// A generating request after the preamble every handler shares.
pub(crate) struct Prepared<T> {
    /// The typed, validated body (what its surface still needs: stream flags, ids).
    pub request: T,
    /// The typed turn.
    pub turn: ChatRequest,
    /// The model, loaded.
    pub model: Arc<Model>,
    /// The keep-alive it asked for.
    pub keep_alive: Option<Option<Duration>>,
}

/// The preamble of every generating handler: the body (axum's rejections in the API's shape),
/// parsed into its typed request and validated; its model named (400 when not); then the model
/// looked up and loaded with its keep-alive (404 `model_not_found`; a model another request is
/// loading is waited for); then its typed turn over the pack's defaults. The body's fields are
/// checked before the lookup (validation covers their ranges).
pub(crate) async fn prepare<T: GenerationBody>(
    st: &Shared,
    b: Result<Bytes, BytesRejection>,
) -> Result<Prepared<T>, ApiError> {
    let (mut request, json) = check_fields::<T>(&body(b)?)?;
    let name = request.model_name().unwrap_or_default();
    let keep_alive = request.keep_alive();
    let model = model_for(st, name, keep_alive).await?;
    if model.embedding.is_some() {
        return Err(ApiError::param(
            "model",
            format!(
                "model '{}' is an embedding model: it embeds text and does not generate (use /v1/embeddings or /api/embed)",
                model.reference
            ),
        ));
    }
    let turn = request.turn(&json, &model.defaults.decode)?;
    Ok(Prepared {
        request,
        turn,
        model,
        keep_alive,
    })
}

/// The part of [`prepare`] before the model: parse, validate, a model named.
pub(crate) fn check_fields<T: GenerationBody>(bytes: &[u8]) -> Result<(T, Map<String, Value>), ApiError> {
    let Parsed { request, json } = body::parse::<T>(bytes)?;
    if request.model_name().is_none() {
        return Err(ApiError::param("model", "'model' is required"));
    }
    Ok((request, json))
}

#[cfg(test)]
/// A body checked as [`prepare`] checks it, with its typed turn over Berth's own defaults (no
/// pack's).
pub(crate) fn check_body<T: GenerationBody>(bytes: &[u8]) -> Result<(T, ChatRequest), ApiError> {
    let (mut request, json) = check_fields::<T>(bytes)?;
    let turn = request.turn(&json, &DecodeOptions::default())?;
    Ok((request, turn))
}

/// OpenAI's `usage` object of one finished generation.
pub(crate) fn usage(fin: &Finish) -> Value {
    json!({
        "prompt_tokens": fin.prompt_tokens,
        "completion_tokens": fin.completion_tokens,
        "total_tokens": fin.prompt_tokens + fin.completion_tokens,
        "prompt_tokens_details": {"cached_tokens": fin.cached_tokens},
    })
}

/// `usage` of several choices of one prompt: the prompt counted once.
pub(crate) fn usage_n(fins: &[Finish]) -> Value {
    let mut u = usage(&fins[0]);
    let completion: usize = fins.iter().map(|f| f.completion_tokens).sum();
    u["completion_tokens"] = completion.into();
    u["total_tokens"] = (fins[0].prompt_tokens + completion).into();
    u
}

/// A server-sent-events response over a stream of `data:` payloads.
pub(crate) fn sse(
    stream: impl futures_util::Stream<Item = Result<Bytes, Infallible>> + Send + 'static,
) -> Response {
    Response::builder()
        .header("content-type", "text/event-stream")
        .header("cache-control", "no-cache")
        .body(Body::from_stream(stream))
        .unwrap_or_else(|_| StatusCode::INTERNAL_SERVER_ERROR.into_response())
}

/// A pack's capabilities: its manifest's, plus `vision` when it is loaded and its plugin
/// reports a vision spec.
pub(crate) fn capabilities(st: &Shared, e: &berth_registry::store::PackEntry) -> Vec<String> {
    let mut caps = e
        .manifest
        .as_ref()
        .map(|m| m.capabilities.clone())
        .unwrap_or_default();
    let vision = st
        .models
        .loaded()
        .iter()
        .any(|m| m.reference == e.reference && m.vision.is_some());
    if vision && !caps.iter().any(|c| c == "vision") {
        caps.push("vision".into());
    }
    caps
}
