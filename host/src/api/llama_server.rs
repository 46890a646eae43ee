//! llama-server's own routes, in its shapes: `/infill` (fill-in-the-middle for editor plugins such
//! as llama.vim), `/tokenize` and `/detokenize`. llama-server serves one model; here `model` is an
//! optional field, defaulting to the only model loaded, else the only pack in the store.

use super::body::{self, int_in, Int, RequestBody};
use super::pipeline::{body, model_for, sse};
use super::sampling::openai_decode;
use super::ApiError;
use crate::chat::Delta;
use crate::decoding::{DecodeOptions, FinishReason};
use crate::engine::Finish;
use crate::state::models::Model;
use crate::state::{RequestId, Shared};
use crate::turn::fim::{self, File, Fill};
use crate::turn::reply::{self, Encoder, End, ReplyEvent};
use crate::turn::{ChatRequest, Prompt, Turn};
use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::State;
use axum::response::{IntoResponse, Response};
use axum::Extension;
use serde::Deserialize;
use serde_json::{json, Value};
use std::convert::Infallible;
use std::sync::Arc;

/// The model a llama-server request means: the one it names, else the only one loaded, else the
/// only pack in the store; a 400 asking for `model` when that leaves a choice.
async fn model_of(st: &Shared, name: Option<&str>) -> Result<Arc<Model>, ApiError> {
    if let Some(name) = name {
        return model_for(st, name, None).await;
    }
    let loaded = st.models.loaded();
    if let [only] = loaded.as_slice() {
        return Ok(only.clone());
    }
    let catalog = st.models.catalog();
    match catalog.as_slice() {
        [only] if loaded.is_empty() => model_for(st, &only.reference, None).await,
        [] => Err(ApiError::param(
            "model",
            "'model' is required: the store has no packs",
        )),
        _ => Err(ApiError::param(
            "model",
            format!(
                "'model' is required: {} packs are in the store and {} loaded",
                catalog.len(),
                loaded.len()
            ),
        )),
    }
}

/// One other file of `/infill`'s `input_extra`.
#[derive(Debug, Deserialize)]
pub struct ExtraChunk {
    /// Its path (`tmp` when absent, as llama-server names it).
    pub filename: Option<String>,
    /// Its text.
    pub text: Option<String>,
}

/// The body of `POST /infill`. Other llama-server fields (`samplers`, `cache_prompt`,
/// `t_max_prompt_ms`, ...) are ignored, as editor plugins send many; the sampling fields are
/// read as on `/v1/completions`.
#[derive(Debug, Deserialize)]
#[serde(remote = "Self")]
pub struct InfillRequest {
    /// The pack (optional: see [`model_of`]).
    pub model: Option<String>,
    /// The text before the gap.
    pub input_prefix: Option<String>,
    /// The text after the gap.
    pub input_suffix: Option<String>,
    /// Other files of the project, as context.
    pub input_extra: Option<Vec<ExtraChunk>>,
    /// Text the middle starts with (after `input_prefix`).
    pub prompt: Option<String>,
    /// Most tokens to generate (-1: until an end token or the context is full).
    pub n_predict: Option<Int>,
    /// Stream server-sent events or answer once.
    pub stream: Option<bool>,
}

/// The body of `POST /tokenize`.
#[derive(Debug, Deserialize)]
#[serde(remote = "Self")]
pub struct TokenizeRequest {
    /// The pack (optional: see [`model_of`]).
    pub model: Option<String>,
    /// The text (required).
    pub content: Option<String>,
    /// Add BOS (and EOS) when the model asks for them (default false).
    pub add_special: Option<bool>,
    /// Read special-token text (`<|im_start|>`) as that token (default true).
    pub parse_special: Option<bool>,
    /// Answer `{"id", "piece"}` objects instead of ids.
    pub with_pieces: Option<bool>,
}

/// The body of `POST /detokenize`.
#[derive(Debug, Deserialize)]
#[serde(remote = "Self")]
pub struct DetokenizeRequest {
    /// The pack (optional: see [`model_of`]).
    pub model: Option<String>,
    /// The ids (required).
    pub tokens: Option<Vec<u32>>,
}

crate::object_only!(InfillRequest, TokenizeRequest, DetokenizeRequest);

impl RequestBody for InfillRequest {
    fn validate(&self) -> Result<(), ApiError> {
        int_in("n_predict", self.n_predict, -1, u32::MAX as i64)?;
        Ok(())
    }
}

impl RequestBody for TokenizeRequest {
    fn validate(&self) -> Result<(), ApiError> {
        match self.content {
            Some(_) => Ok(()),
            None => Err(ApiError::param("content", "'content' is required")),
        }
    }
}

impl RequestBody for DetokenizeRequest {
    fn validate(&self) -> Result<(), ApiError> {
        match self.tokens {
            Some(_) => Ok(()),
            None => Err(ApiError::param("tokens", "'tokens' is required")),
        }
    }
}

/// One token with its text: a string, or its bytes when they are not valid UTF-8 alone (a piece
/// of a multi-byte character), as llama-server answers `with_pieces`.
fn piece(model: &Model, id: u32) -> Value {
    let bytes = model.tokenizer.token_bytes(id);
    match std::str::from_utf8(bytes) {
        Ok(s) => json!({"id": id, "piece": s}),
        Err(_) => json!({"id": id, "piece": bytes}),
    }
}

/// `POST /tokenize`: `{"tokens": [ids]}`, or `[{"id", "piece"}]` with `with_pieces`.
pub async fn tokenize(
    State(st): State<Shared>,
    b: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    let req = body::parse::<TokenizeRequest>(&body(b)?)?.request;
    let model = model_of(&st, req.model.as_deref()).await?;
    let content = req.content.unwrap_or_default();
    let add_special = req.add_special.unwrap_or(false);
    let ids = if req.parse_special.unwrap_or(true) {
        model.tokenizer.encode(&content, add_special)
    } else {
        model.tokenizer.encode_literal(&content, add_special)
    };
    let tokens: Vec<Value> = if req.with_pieces.unwrap_or(false) {
        ids.iter().map(|&id| piece(&model, id)).collect()
    } else {
        ids.iter().map(|&id| id.into()).collect()
    };
    Ok(axum::Json(json!({ "tokens": tokens })).into_response())
}

/// `POST /detokenize`: `{"content": text}`; an id outside the vocabulary is a 400 naming it.
pub async fn detokenize(
    State(st): State<Shared>,
    b: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    let req = body::parse::<DetokenizeRequest>(&body(b)?)?.request;
    let model = model_of(&st, req.model.as_deref()).await?;
    let tokens = req.tokens.unwrap_or_default();
    let vocab = model.tokenizer.vocab_size();
    if let Some(i) = tokens.iter().position(|&t| t as usize >= vocab) {
        let place = format!("tokens[{i}]");
        return Err(ApiError::param(
            &place,
            format!(
                "'{place}' is {}, outside the vocabulary (0 to {})",
                tokens[i],
                vocab - 1
            ),
        ));
    }
    let content = model.tokenizer.decode(&tokens, false);
    Ok(axum::Json(json!({ "content": content })).into_response())
}

/// `POST /infill`: the middle between `input_prefix` (+ `prompt`) and `input_suffix`, answered as
/// llama-server's `/completion` (whole, or as server-sent events with `stream`).
pub async fn infill(
    State(st): State<Shared>,
    Extension(RequestId(id)): Extension<RequestId>,
    b: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    let body::Parsed { request: req, json } = body::parse::<InfillRequest>(&body(b)?)?;
    let max = int_in("n_predict", req.n_predict, -1, u32::MAX as i64)?
        .filter(|&n| n >= 0)
        .map(|n| n as usize);
    let mut turn = ChatRequest::new(Prompt::Raw {
        text: String::new(),
        images: Vec::new(),
    });
    // The sampling fields checked before the model is looked up; applied over its pack's
    // defaults once it is.
    openai_decode(&json, max, &DecodeOptions::default())?;
    let fill = Fill {
        prefix: req.input_prefix.unwrap_or_default() + req.prompt.as_deref().unwrap_or(""),
        suffix: req.input_suffix.unwrap_or_default(),
        files: req
            .input_extra
            .unwrap_or_default()
            .into_iter()
            .map(|c| File {
                name: c.filename.unwrap_or_else(|| "tmp".into()),
                text: c.text.unwrap_or_default(),
            })
            .collect(),
    };
    let model = model_of(&st, req.model.as_deref()).await?;
    if model.embedding.is_some() {
        return Err(ApiError::param(
            "model",
            format!(
                "model '{}' is an embedding model: it does not generate",
                model.reference
            ),
        ));
    }
    turn.decode = openai_decode(&json, max, &model.defaults.decode)?;
    let user_stops = turn.decode.stop.clone();
    let prompt = fim::apply(&model, &mut turn, &fill, "input_suffix")?;
    let mut turn = Turn::prepare(&model, turn, st.image_urls).await?;
    fim::place(&mut turn, prompt);
    let rxs = turn.submit(&model, &id)?;
    let enc = Infill {
        model: model.reference.clone(),
        user_stops,
        text: String::new(),
    };
    if req.stream.unwrap_or(false) {
        let text = reply::encode(reply::merged(rxs, turn.parsers()), enc);
        return Ok(sse(futures_util::StreamExt::map(text, |t| {
            Ok::<_, Infallible>(Bytes::from(t))
        })));
    }
    let r = reply::collect_all(rxs, turn.parsers()).await?.remove(0);
    let content = r.message.content.unwrap_or_default();
    Ok(axum::Json(enc.last(&content, &r.end)).into_response())
}

/// The encoder of `/infill`'s answer: llama-server's `/completion` objects.
struct Infill {
    model: String,
    /// The request's own stop strings (a FIM end token that stopped is an end of sequence).
    user_stops: Vec<String>,
    /// The text so far (for `has_new_line`).
    text: String,
}

impl Infill {
    /// The final object: the stop, the counts and the timings.
    fn last(&self, content: &str, end: &End) -> Value {
        let f: &Finish = &end.finish;
        let word = f.stop_sequence.clone().filter(|w| self.user_stops.contains(w));
        let stop_type = match (f.reason, &word) {
            (FinishReason::Length, _) => "limit",
            (_, Some(_)) => "word",
            _ => "eos",
        };
        let ms = |d: std::time::Duration| d.as_secs_f64() * 1000.0;
        let per_s = |n: usize, d: std::time::Duration| {
            if d.is_zero() {
                0.0
            } else {
                n as f64 / d.as_secs_f64()
            }
        };
        let prompt_n = f.prompt_tokens - f.cached_tokens;
        json!({
            "index": 0,
            "content": content,
            "tokens": [],
            "id_slot": 0,
            "stop": true,
            "model": self.model,
            "tokens_predicted": f.completion_tokens,
            "tokens_evaluated": f.prompt_tokens,
            "tokens_cached": f.cached_tokens,
            "has_new_line": self.text.contains('\n') || content.contains('\n'),
            "truncated": false,
            "stop_type": stop_type,
            "stopping_word": word.unwrap_or_default(),
            "timings": {
                "prompt_n": prompt_n,
                "prompt_ms": ms(f.prompt_duration),
                "prompt_per_second": per_s(prompt_n, f.prompt_duration),
                "predicted_n": f.completion_tokens,
                "predicted_ms": ms(f.generation_duration),
                "predicted_per_second": per_s(f.completion_tokens, f.generation_duration),
            },
        })
    }
}

/// The text of some deltas.
fn content(deltas: &[Delta]) -> String {
    deltas
        .iter()
        .filter_map(|d| match d {
            Delta::Content(t) => Some(t.as_str()),
            _ => None,
        })
        .collect()
}

impl Encoder for Infill {
    fn event(&mut self, _index: usize, event: ReplyEvent) -> String {
        match event {
            ReplyEvent::Grew { deltas, .. } => {
                let text = content(&deltas);
                self.text.push_str(&text);
                let v = json!({"index": 0, "content": text, "tokens": [], "stop": false, "id_slot": 0});
                format!("data: {v}\n\n")
            }
            ReplyEvent::Ended { deltas, end, .. } => {
                let text = content(&deltas);
                let last = self.last(&text, &end);
                self.text.push_str(&text);
                format!("data: {last}\n\n")
            }
            ReplyEvent::Failed(e) => {
                let v = json!({"error": {"code": 500, "message": e, "type": "server_error"}});
                format!("error: {v}\n\n")
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::body::parse;
    use axum::http::StatusCode;

    #[test]
    fn bodies_need_their_one_field_and_take_llama_server_extras() {
        for (e, param) in [
            (parse::<TokenizeRequest>(b"{}").unwrap_err(), "content"),
            (
                parse::<TokenizeRequest>(br#"{"content": 5}"#).unwrap_err(),
                "content",
            ),
            (parse::<DetokenizeRequest>(b"{}").unwrap_err(), "tokens"),
            (
                parse::<DetokenizeRequest>(br#"{"tokens": [1, -1]}"#).unwrap_err(),
                "tokens[1]",
            ),
            (
                parse::<InfillRequest>(br#"{"n_predict": -2}"#).unwrap_err(),
                "n_predict",
            ),
            (
                parse::<InfillRequest>(br#"{"input_extra": [{"text": 1}]}"#).unwrap_err(),
                "input_extra[0].text",
            ),
        ] {
            assert_eq!(
                (e.status, e.param.as_deref()),
                (StatusCode::BAD_REQUEST, Some(param))
            );
        }
        let ok = parse::<InfillRequest>(
            br#"{"input_prefix": "a", "input_suffix": "b", "samplers": ["top_k"], "cache_prompt": true,
                "input_extra": [{"filename": "x.py", "text": "y"}], "n_predict": -1}"#,
        )
        .unwrap();
        assert_eq!(
            ok.request.input_extra.unwrap()[0].filename.as_deref(),
            Some("x.py")
        );
    }
}
