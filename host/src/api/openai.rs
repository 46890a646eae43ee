//! The OpenAI API: `/v1/chat/completions`, `/v1/completions`, `/v1/models`.

use super::body::{self, field_names, int_in, Int, RequestBody, StreamOptions, Think};
use super::messages::{self, ChatMessage};
use super::pipeline::{capabilities, now_secs, prepare, sse, usage_n, GenerationBody, Prepared, MAX_CHOICES};
use super::sampling::{openai_decode, OpenAiSampling, SamplingExtensions};
use super::ApiError;
use crate::chat::{openai_delta, Delta};
use crate::constraint::RequestConstraints;
use crate::decoding::DecodeOptions;
use crate::engine::Finish;
use crate::sampling::TokenLogprobs;
use crate::state::models::Model;
use crate::state::{RequestId, Shared};
use crate::turn::reply::{self, Encoder, ReplyEvent};
use crate::turn::{ChatRequest, Prompt as TurnPrompt, Turn};
use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Extension;
use serde::de::{self, Deserializer, IgnoredAny, SeqAccess, Unexpected, Visitor};
use serde::Deserialize;
use serde_json::{json, Map, Value};
use std::convert::Infallible;
use std::fmt;
use std::time::UNIX_EPOCH;

/// The body of `POST /v1/chat/completions`; the sampling fields are [`OpenAiSampling`] and the
/// template variables [`ChatTemplateVars`], read from the same object.
#[derive(Debug, Deserialize)]
#[serde(remote = "Self")]
pub struct ChatCompletionRequest {
    /// The model (required).
    pub model: Option<String>,
    /// The conversation (required, not empty).
    pub messages: Option<Vec<ChatMessage>>,
    /// Answer as server-sent events.
    pub stream: Option<bool>,
    /// Streaming options.
    pub stream_options: Option<StreamOptions>,
    /// Most tokens to generate (the older name).
    pub max_tokens: Option<Int>,
    /// Most tokens to generate (wins over `max_tokens`).
    pub max_completion_tokens: Option<Int>,
    /// Token id -> bias (checked against the model's vocabulary).
    pub logit_bias: Option<Value>,
    /// Tools the model may call (checked by the constraint builder).
    pub tools: Option<Value>,
    /// Which tool, if any, the model must call.
    pub tool_choice: Option<Value>,
    /// Whether several calls may come in one reply.
    pub parallel_tool_calls: Option<Value>,
    /// A JSON object or schema the reply must follow.
    pub response_format: Option<Value>,
    /// Choices to generate.
    pub n: Option<Int>,
    /// Report the tokens' log-probabilities.
    pub logprobs: Option<bool>,
    /// Alternatives per token to report (needs `logprobs`).
    pub top_logprobs: Option<Int>,
    /// Accepted and ignored: they do not change the reply.
    pub user: Option<IgnoredAny>,
    /// Accepted and ignored.
    pub store: Option<IgnoredAny>,
    /// Accepted and ignored.
    pub metadata: Option<IgnoredAny>,
    /// Accepted and ignored.
    pub service_tier: Option<IgnoredAny>,
    /// A prompt-cache routing key: accepted and ignored (prefix reuse is automatic here).
    pub prompt_cache_key: Option<String>,
    /// How long a cached prompt is kept (`in_memory`, `24h`): accepted and ignored.
    pub prompt_cache_retention: Option<String>,
    /// A stable id of the end user for abuse monitoring: accepted and ignored.
    pub safety_identifier: Option<String>,
    /// Output modalities: only `["text"]` is served.
    pub modalities: Option<Vec<String>>,
    /// Accepted and ignored (the server's keep-alive applies).
    pub keep_alive: Option<IgnoredAny>,
    /// Not implemented: a 400 when given.
    pub verbosity: Option<IgnoredAny>,
    /// Predicted outputs: not implemented, a 400 when given.
    pub prediction: Option<IgnoredAny>,
    /// Web search: not implemented, a 400 when given.
    pub web_search_options: Option<IgnoredAny>,
    /// The legacy function-calling API: refused when given.
    pub functions: Option<IgnoredAny>,
    /// The legacy function-calling API: refused when given.
    pub function_call: Option<IgnoredAny>,
}

impl RequestBody for ChatCompletionRequest {
    fn known_keys() -> Option<Vec<&'static str>> {
        Some(
            [
                field_names::<Self>(),
                field_names::<OpenAiSampling>(),
                field_names::<SamplingExtensions>(),
                field_names::<ChatTemplateVars>(),
            ]
            .concat(),
        )
    }

    fn validate(&self) -> Result<(), ApiError> {
        refuse_legacy_functions(self.functions.is_some(), self.function_call.is_some())?;
        if let Some(m) = self.modalities.as_ref().filter(|m| m.iter().any(|x| x != "text")) {
            return Err(ApiError::param(
                "modalities",
                format!("'modalities' {m:?} is not supported: Berth answers with text only"),
            ));
        }
        for (field, given) in [
            ("verbosity", self.verbosity.is_some()),
            ("prediction", self.prediction.is_some()),
            ("web_search_options", self.web_search_options.is_some()),
        ] {
            if given {
                return Err(ApiError::param(
                    field,
                    format!("'{field}' is not supported by Berth"),
                ));
            }
        }
        let messages = self
            .messages
            .as_ref()
            .ok_or_else(|| ApiError::param("messages", "'messages' is required"))?;
        messages::check(messages, true)?;
        max_tokens(&[
            ("max_tokens", self.max_tokens),
            ("max_completion_tokens", self.max_completion_tokens),
        ])?;
        int_in("n", self.n, 1, MAX_CHOICES as i64)?;
        super::logprobs::request(self.logprobs, self.top_logprobs)?;
        Ok(())
    }
}

impl GenerationBody for ChatCompletionRequest {
    fn model_name(&self) -> Option<&str> {
        self.model.as_deref()
    }

    fn turn(&mut self, json: &Map<String, Value>, base: &DecodeOptions) -> Result<ChatRequest, ApiError> {
        let max = max_tokens(&[
            ("max_tokens", self.max_tokens),
            ("max_completion_tokens", self.max_completion_tokens),
        ])?;
        let messages = messages::to_turn(self.messages.as_ref());
        let mut req = ChatRequest::new(TurnPrompt::Chat(messages));
        req.decode = openai_decode(json, max, base)?;
        req.decode.logprobs = super::logprobs::request(self.logprobs, self.top_logprobs)?;
        req.constraints = RequestConstraints::from_openai(
            self.tools.as_ref(),
            self.tool_choice.as_ref(),
            self.parallel_tool_calls.as_ref(),
            self.response_format.as_ref(),
        )?;
        req.logit_bias = self.logit_bias.take();
        req.n = self.n.map_or(1, |Int(n)| n as usize);
        body::part::<ChatTemplateVars>(json)?.apply(&mut req);
        Ok(req)
    }
}

/// The body of `POST /v1/completions` (with [`OpenAiSampling`] from the same object).
#[derive(Debug, Deserialize)]
#[serde(remote = "Self")]
pub struct CompletionRequest {
    /// The model (required).
    pub model: Option<String>,
    /// The prompt (required): a string, or a list of one string.
    pub prompt: Option<Prompt>,
    /// Answer as server-sent events.
    pub stream: Option<bool>,
    /// Streaming options.
    pub stream_options: Option<StreamOptions>,
    /// Most tokens to generate (16 when absent).
    pub max_tokens: Option<Int>,
    /// Token id -> bias (checked against the model's vocabulary).
    pub logit_bias: Option<Value>,
    /// Choices to generate.
    pub n: Option<Int>,
    /// Accepted and ignored.
    pub user: Option<IgnoredAny>,
    /// Echo the prompt: only `false` is served.
    pub echo: Option<bool>,
    /// Text after the completion: fill-in-the-middle, with `prompt` the text before the gap.
    pub suffix: Option<String>,
    /// Candidates to pick the best of: only `n` is served.
    pub best_of: Option<Int>,
    /// Alternatives per token to report (0-5; the chosen token always included).
    pub logprobs: Option<Int>,
    /// Accepted and ignored (the server's keep-alive applies).
    pub keep_alive: Option<IgnoredAny>,
}

impl RequestBody for CompletionRequest {
    fn known_keys() -> Option<Vec<&'static str>> {
        Some(
            [
                field_names::<Self>(),
                field_names::<OpenAiSampling>(),
                field_names::<SamplingExtensions>(),
            ]
            .concat(),
        )
    }

    fn validate(&self) -> Result<(), ApiError> {
        if self.prompt.is_none() {
            return Err(ApiError::param("prompt", "'prompt' is required"));
        }
        max_tokens(&[("max_tokens", self.max_tokens)])?;
        int_in("logprobs", self.logprobs, 0, 5)?;
        let n = int_in("n", self.n, 1, MAX_CHOICES as i64)?.unwrap_or(1);
        if self.echo == Some(true) {
            return Err(ApiError::param("echo", "'echo' is not supported"));
        }
        if let Some(best_of) = int_in("best_of", self.best_of, 1, MAX_CHOICES as i64)? {
            if best_of != n {
                return Err(ApiError::param(
                    "best_of",
                    "'best_of' other than 'n' is not supported",
                ));
            }
        }
        Ok(())
    }
}

impl GenerationBody for CompletionRequest {
    fn model_name(&self) -> Option<&str> {
        self.model.as_deref()
    }

    fn turn(&mut self, json: &Map<String, Value>, base: &DecodeOptions) -> Result<ChatRequest, ApiError> {
        let max = max_tokens(&[("max_tokens", self.max_tokens)])?.or(Some(16));
        let text = self.prompt.take().map(|Prompt(p)| p).unwrap_or_default();
        let mut req = ChatRequest::new(TurnPrompt::Raw {
            text,
            images: Vec::new(),
        });
        req.decode = openai_decode(json, max, base)?;
        req.decode.logprobs = self.logprobs.map(|Int(n)| n as usize);
        req.logit_bias = self.logit_bias.take();
        req.n = self.n.map_or(1, |Int(n)| n as usize);
        // The text is completed and streamed exactly as generated.
        req.parse_reply = false;
        Ok(req)
    }
}

/// A legacy completions prompt: a string, or a list holding one string.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Prompt(pub String);

impl<'de> Deserialize<'de> for Prompt {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Prompt, D::Error> {
        struct PromptVisitor;
        impl<'de> Visitor<'de> for PromptVisitor {
            type Value = Prompt;

            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a string")
            }

            fn visit_str<E: de::Error>(self, v: &str) -> Result<Prompt, E> {
                Ok(Prompt(v.to_string()))
            }

            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Prompt, A::Error> {
                let first = seq.next_element::<Value>()?;
                let more = seq.next_element::<IgnoredAny>()?.is_some();
                match first {
                    Some(Value::String(s)) if !more => Ok(Prompt(s)),
                    _ => Err(de::Error::invalid_type(Unexpected::Seq, &self)),
                }
            }
        }
        d.deserialize_any(PromptVisitor)
    }
}

/// A token cap from the first given of several names, checked (1 to 2^32-1): the last given wins.
fn max_tokens(fields: &[(&str, Option<Int>)]) -> Result<Option<usize>, ApiError> {
    let mut max = None;
    for (name, v) in fields {
        if let Some(m) = int_in(name, *v, 1, u32::MAX as i64)? {
            max = Some(m as usize);
        }
    }
    Ok(max)
}

/// The template variables of a chat request: `chat_template_kwargs`, `reasoning_effort`, `think`.
#[derive(Debug, Default, Deserialize)]
#[serde(remote = "Self")]
pub struct ChatTemplateVars {
    /// Variables passed to the chat template as they are.
    pub chat_template_kwargs: Option<Map<String, Value>>,
    /// none, minimal, low, medium or high.
    pub reasoning_effort: Option<String>,
    /// Thinking on or off, or a reasoning level.
    pub think: Option<Think>,
}

crate::object_only!(ChatCompletionRequest, CompletionRequest, ChatTemplateVars);

impl RequestBody for ChatTemplateVars {
    fn validate(&self) -> Result<(), ApiError> {
        match self.reasoning_effort.as_deref() {
            Some(e) if !["none", "minimal", "low", "medium", "high"].contains(&e) => Err(ApiError::param(
                "reasoning_effort",
                "'reasoning_effort' is one of none, minimal, low, medium, high",
            )),
            _ => Ok(()),
        }
    }
}

impl ChatTemplateVars {
    /// Puts the template variables on a turn: the kwargs, `reasoning_effort`, then `think`
    /// (which wins: a level sets the effort too).
    pub fn apply(&self, req: &mut ChatRequest) {
        req.template_vars = self.chat_template_kwargs.clone().unwrap_or_default();
        req.thinking.effort = self.reasoning_effort.clone();
        match &self.think {
            Some(Think::Enabled(b)) => req.thinking.enabled = Some(*b),
            Some(Think::Level(l)) => {
                req.thinking.effort = Some(l.clone());
                req.thinking.enabled = Some(true);
            }
            None => {}
        }
    }
}

/// The legacy `functions` / `function_call` fields (superseded by `tools` / `tool_choice`) are
/// not served: a 400 naming the field rather than a reply that silently ignores them.
fn refuse_legacy_functions(functions: bool, function_call: bool) -> Result<(), ApiError> {
    for (given, legacy, current) in [
        (functions, "functions", "tools"),
        (function_call, "function_call", "tool_choice"),
    ] {
        if given {
            return Err(ApiError::param(
                legacy,
                format!("'{legacy}' (the legacy function-calling API) is not supported; use '{current}'"),
            ));
        }
    }
    Ok(())
}

/// `POST /v1/chat/completions`.
pub async fn chat_completions(
    State(st): State<Shared>,
    Extension(RequestId(id)): Extension<RequestId>,
    b: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    let Prepared {
        request: req,
        turn: chat,
        model,
        ..
    } = prepare::<ChatCompletionRequest>(&st, b).await?;
    let mut turn = Turn::prepare(&model, chat, st.image_urls).await?;
    let rxs = turn.submit(&model, &id)?;
    let parsers = turn.parsers();
    let include_usage = req.stream_options.and_then(|o| o.include_usage).unwrap_or(false);
    let chunks = Chunks::new(
        format!("chatcmpl-{}", id.trim_start_matches("req-")),
        "chat.completion.chunk",
        &model,
        &turn,
        include_usage,
    );
    if !req.stream.unwrap_or(false) {
        let replies = reply::collect_all(rxs, parsers).await?;
        let choices: Vec<Value> = replies
            .iter()
            .enumerate()
            .map(|(index, r)| {
                json!({"index": index, "message": r.message.to_openai(),
                       "logprobs": chunks.chat_logprobs(&r.logprobs, true),
                       "finish_reason": r.end.reason().as_str()})
            })
            .collect();
        let finishes: Vec<Finish> = replies.into_iter().map(|r| r.end.finish).collect();
        return Ok(axum::Json(chunks.whole("chat.completion", choices, &finishes)).into_response());
    }
    Ok(sse_of(reply::encode(
        reply::merged(rxs, parsers),
        ChatChunks(chunks),
    )))
}

/// What the chunks of one streamed request share, and how its choices ended.
struct Chunks {
    id: String,
    object: &'static str,
    created: u64,
    model: String,
    include_usage: bool,
    /// The tokenizer, when the request asked for log-probabilities.
    logprobs: Option<crate::tokenizer::Tokenizer>,
    n: usize,
    finishes: Vec<Finish>,
    failed: bool,
    /// Text streamed so far per choice (the legacy log-probabilities' offsets).
    offsets: Vec<usize>,
}

impl Chunks {
    /// The chunks of a turn of `n` choices.
    fn new(id: String, object: &'static str, model: &Model, turn: &Turn, include_usage: bool) -> Chunks {
        let n = turn.choices;
        Chunks {
            id,
            object,
            created: now_secs(),
            model: model.reference.clone(),
            include_usage,
            logprobs: turn.logprobs.then(|| model.tokenizer.clone()),
            n,
            finishes: Vec::new(),
            failed: false,
            offsets: vec![0; n],
        }
    }

    /// One chunk with one choice.
    fn chunk(&self, choice: Value) -> Value {
        let mut c = json!({"id": self.id, "object": self.object, "created": self.created,
                           "model": self.model, "choices": [choice]});
        if self.include_usage {
            c["usage"] = Value::Null;
        }
        c
    }

    /// The non-streamed body: the choices and the usage.
    fn whole(&self, object: &str, choices: Vec<Value>, finishes: &[Finish]) -> Value {
        json!({"id": self.id, "object": object, "created": self.created, "model": self.model,
               "choices": choices, "usage": usage_n(finishes)})
    }

    /// A chat choice's `logprobs` (`null` when not asked for, or `when` is false).
    fn chat_logprobs(&self, lps: &[TokenLogprobs], when: bool) -> Value {
        match &self.logprobs {
            Some(tok) if when => super::logprobs::chat_choice(tok, lps),
            _ => Value::Null,
        }
    }

    /// A choice ended: counted for the usage and `[DONE]`.
    fn ended(&mut self, fin: Finish) {
        self.finishes.push(fin);
    }

    /// The usage chunk (when asked for) and `[DONE]`, once every choice ended well.
    fn tail(&self) -> String {
        if self.failed || self.finishes.len() < self.n {
            return String::new();
        }
        let mut out = String::new();
        if self.include_usage {
            let mut u = self.chunk(Value::Null);
            u["choices"] = json!([]);
            u["usage"] = usage_n(&self.finishes);
            out.push_str(&frame(&u));
        }
        out + "data: [DONE]\n\n"
    }

    /// A failed choice's error event.
    fn failure(&mut self, e: &str) -> String {
        self.failed = true;
        frame(&json!({"error": {"message": e, "type": "server_error", "param": null, "code": null}}))
    }
}

/// One server-sent event frame.
fn frame(v: &Value) -> String {
    format!("data: {v}\n\n")
}

/// The encoder of streamed chat completions: one chunk per flush, the role first, the finish
/// reason in a chunk of its own, then the usage and `[DONE]`.
struct ChatChunks(Chunks);

impl Encoder for ChatChunks {
    fn start(&mut self) -> String {
        (0..self.0.n)
            .map(|i| {
                frame(
                    &self
                        .0
                        .chunk(json!({"index": i, "delta": {"role": "assistant", "content": ""},
                                                 "logprobs": null, "finish_reason": null})),
                )
            })
            .collect()
    }

    fn event(&mut self, index: usize, event: ReplyEvent) -> String {
        let c = &mut self.0;
        match event {
            ReplyEvent::Grew { deltas, logprobs } => {
                let delta = openai_delta(&deltas).unwrap_or_else(|| json!({}));
                let lps = c.chat_logprobs(&logprobs, !logprobs.is_empty());
                frame(
                    &c.chunk(json!({"index": index, "delta": delta, "logprobs": lps, "finish_reason": null})),
                )
            }
            ReplyEvent::Ended {
                deltas,
                logprobs,
                end,
            } => {
                let mut out = String::new();
                let delta = openai_delta(&deltas);
                if delta.is_some() || (!logprobs.is_empty() && c.logprobs.is_some()) {
                    let lps = c.chat_logprobs(&logprobs, !logprobs.is_empty());
                    let delta = delta.unwrap_or_else(|| json!({}));
                    out += &frame(&c.chunk(
                        json!({"index": index, "delta": delta, "logprobs": lps, "finish_reason": null}),
                    ));
                }
                let reason = end.reason().as_str();
                out += &frame(
                    &c.chunk(json!({"index": index, "delta": {}, "logprobs": null, "finish_reason": reason})),
                );
                c.ended(end.finish);
                out
            }
            ReplyEvent::Failed(e) => c.failure(&e),
        }
    }

    fn end(&mut self) -> String {
        self.0.tail()
    }
}

/// The encoder of streamed legacy completions: one chunk per piece of text, then the finish
/// reason, the usage and `[DONE]`.
struct CompletionChunks(Chunks);

impl CompletionChunks {
    fn legacy(&self, lps: &[TokenLogprobs], offset: usize) -> Value {
        match &self.0.logprobs {
            Some(tok) => super::logprobs::legacy(tok, lps, offset),
            None => Value::Null,
        }
    }
}

impl Encoder for CompletionChunks {
    fn event(&mut self, index: usize, event: ReplyEvent) -> String {
        match event {
            ReplyEvent::Grew { deltas, logprobs } => {
                let text: String = deltas
                    .iter()
                    .filter_map(|d| match d {
                        Delta::Content(t) => Some(t.as_str()),
                        _ => None,
                    })
                    .collect();
                let lps = self.legacy(&logprobs, self.0.offsets[index]);
                self.0.offsets[index] += text.len();
                frame(
                    &self
                        .0
                        .chunk(json!({"index": index, "text": text, "logprobs": lps, "finish_reason": null})),
                )
            }
            ReplyEvent::Ended { logprobs, end, .. } => {
                let lps = if logprobs.is_empty() {
                    Value::Null
                } else {
                    self.legacy(&logprobs, self.0.offsets[index])
                };
                let reason = end.reason().as_str();
                let out =
                    frame(&self.0.chunk(
                        json!({"index": index, "text": "", "logprobs": lps, "finish_reason": reason}),
                    ));
                self.0.ended(end.finish);
                out
            }
            ReplyEvent::Failed(e) => self.0.failure(&e),
        }
    }

    fn end(&mut self) -> String {
        self.0.tail()
    }
}

/// An SSE response over an encoder's text.
fn sse_of(text: impl futures_util::Stream<Item = String> + Send + 'static) -> Response {
    sse(futures_util::StreamExt::map(text, |t| {
        Ok::<_, Infallible>(Bytes::from(t))
    }))
}

/// `POST /v1/completions`.
pub async fn completions(
    State(st): State<Shared>,
    Extension(RequestId(id)): Extension<RequestId>,
    b: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    let Prepared {
        request: req,
        turn: mut chat,
        model,
        ..
    } = prepare::<CompletionRequest>(&st, b).await?;
    let mut fim_prompt = None;
    if let Some(suffix) = req.suffix.as_deref().filter(|s| !s.is_empty()) {
        let prefix = match &chat.prompt {
            TurnPrompt::Raw { text, .. } => text.clone(),
            TurnPrompt::Chat(_) => String::new(),
        };
        let fill = crate::turn::fim::Fill {
            prefix,
            suffix: suffix.to_string(),
            files: Vec::new(),
        };
        fim_prompt = Some(crate::turn::fim::apply(&model, &mut chat, &fill, "suffix")?);
    }
    let mut turn = Turn::prepare(&model, chat, st.image_urls).await?;
    if let Some(prompt) = fim_prompt {
        crate::turn::fim::place(&mut turn, prompt);
    }
    let rxs = turn.submit(&model, &id)?;
    let stream = req.stream.unwrap_or(false);
    let include_usage = stream && req.stream_options.and_then(|o| o.include_usage).unwrap_or(false);
    let chunks = Chunks::new(
        format!("cmpl-{}", id.trim_start_matches("req-")),
        "text_completion",
        &model,
        &turn,
        include_usage,
    );
    let enc = CompletionChunks(chunks);
    if !stream {
        let replies = reply::collect_all(rxs, turn.parsers()).await?;
        let choices: Vec<Value> = replies
            .iter()
            .enumerate()
            .map(|(index, r)| {
                let text = r.message.content.clone().unwrap_or_default();
                json!({"index": index, "text": text, "logprobs": enc.legacy(&r.logprobs, 0),
                       "finish_reason": r.end.reason().as_str()})
            })
            .collect();
        let finishes: Vec<Finish> = replies.into_iter().map(|r| r.end.finish).collect();
        return Ok(axum::Json(enc.0.whole("text_completion", choices, &finishes)).into_response());
    }
    Ok(sse_of(reply::encode(reply::merged(rxs, turn.parsers()), enc)))
}

/// One `/v1/models` entry.
fn model_object(st: &Shared, e: &berth_registry::store::PackEntry) -> Value {
    let created = e.modified.duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs());
    let caps = capabilities(st, e);
    // OpenAI's fields, plus Anthropic's (`type`, `display_name`, `created_at`): both clients'
    // `models.list()` read the same route.
    json!({
        "id": e.reference,
        "object": "model",
        "created": created,
        "owned_by": "berth",
        "capabilities": caps,
        "type": "model",
        "display_name": e.reference,
        "created_at": super::pipeline::rfc3339(e.modified),
    })
}

/// `GET /v1/models`.
pub async fn list_models(State(st): State<Shared>) -> Response {
    let data: Vec<Value> = st
        .models
        .catalog()
        .iter()
        .filter(|e| e.manifest.is_some() && e.problems.is_empty())
        .map(|e| model_object(&st, e))
        .collect();
    // Anthropic's list also says where it starts and ends, and that there is no next page.
    let first = data.first().map(|m| m["id"].clone()).unwrap_or(Value::Null);
    let last = data.last().map(|m| m["id"].clone()).unwrap_or(Value::Null);
    axum::Json(json!({"object": "list", "data": data, "has_more": false,
        "first_id": first, "last_id": last}))
    .into_response()
}

/// `GET /v1/models/{id}`.
pub async fn get_model(
    State(st): State<Shared>,
    id: Result<Path<String>, axum::extract::rejection::PathRejection>,
) -> Result<Response, ApiError> {
    // An id that does not decode (percent-encoded bytes that are not UTF-8) names no model.
    let Path(id) = id.map_err(|e| ApiError {
        code: Some("model_not_found"),
        param: Some("model".into()),
        ..ApiError::new(StatusCode::NOT_FOUND, e.body_text())
    })?;
    let id = id.trim_start_matches('/');
    match st.models.store().get(id) {
        Ok(e) if e.manifest.is_some() => Ok(axum::Json(model_object(&st, &e)).into_response()),
        _ => Err(ApiError::model_not_found(id)),
    }
}

#[cfg(test)]
mod tests {
    use super::{ChatCompletionRequest, CompletionRequest};
    use crate::api::body::{parse, RequestBody};
    use crate::api::pipeline::check_body;
    use crate::api::pipeline::check_messages;
    use crate::api::ApiError;
    use crate::harmony::ReasoningEffort;
    use crate::turn::ChatRequest;
    use crate::turn::{choice_seed, harmony_effort};
    use axum::http::StatusCode;
    use serde_json::{Map, Value};

    /// The typed turn of a chat body's fields (with a model and a message added), or the error.
    fn turn(body: &str) -> Result<ChatRequest, ApiError> {
        let mut v: Value = serde_json::from_str(body).unwrap();
        v["model"] = "m".into();
        v["messages"] = serde_json::json!([{"role": "user", "content": "hi"}]);
        check_body::<ChatCompletionRequest>(v.to_string().as_bytes()).map(|(_, t)| t)
    }

    fn extra(body: &str) -> Result<Map<String, Value>, ApiError> {
        turn(body).map(|t| t.template_extra())
    }

    /// The reasoning effort a gpt-oss model renders for a chat body, or the error's (status, param).
    fn effort(body: &str) -> Result<ReasoningEffort, (StatusCode, Option<String>)> {
        extra(body)
            .and_then(|e| harmony_effort(&e))
            .map_err(|e| (e.status, e.param))
    }

    #[test]
    fn reasoning_effort_reaches_gpt_oss() {
        assert_eq!(effort(r#"{"reasoning_effort": "low"}"#), Ok(ReasoningEffort::Low));
        assert_eq!(
            effort(r#"{"reasoning_effort": "medium"}"#),
            Ok(ReasoningEffort::Medium)
        );
        assert_eq!(
            effort(r#"{"reasoning_effort": "high"}"#),
            Ok(ReasoningEffort::High)
        );
        assert_eq!(effort(r#"{"think": "high"}"#), Ok(ReasoningEffort::High));
        assert_eq!(effort("{}"), Ok(ReasoningEffort::Medium));
        assert_eq!(
            effort(r#"{"reasoning_effort": null}"#),
            Ok(ReasoningEffort::Medium)
        );
        // A boolean `think` cannot turn gpt-oss's reasoning off: the default effort stays.
        assert_eq!(effort(r#"{"think": false}"#), Ok(ReasoningEffort::Medium));
        // The template kwargs may carry it too (as for the Hugging Face template).
        assert_eq!(
            effort(r#"{"chat_template_kwargs": {"reasoning_effort": "low"}}"#),
            Ok(ReasoningEffort::Low)
        );
    }

    #[test]
    fn efforts_gpt_oss_does_not_know_are_400s_naming_reasoning_effort() {
        let bad = Err((StatusCode::BAD_REQUEST, Some("reasoning_effort".to_string())));
        // Valid OpenAI values that gpt-oss cannot honour.
        assert_eq!(effort(r#"{"reasoning_effort": "none"}"#), bad);
        assert_eq!(effort(r#"{"reasoning_effort": "minimal"}"#), bad);
        assert_eq!(
            effort(r#"{"chat_template_kwargs": {"reasoning_effort": 3}}"#),
            bad
        );
        // Not an OpenAI value at all: refused for every model.
        let e = extra(r#"{"reasoning_effort": "extreme"}"#).unwrap_err();
        assert_eq!(
            (e.status, e.param.as_deref()),
            (StatusCode::BAD_REQUEST, Some("reasoning_effort"))
        );
        let e = extra(r#"{"think": "extreme"}"#).unwrap_err();
        assert_eq!(e.param.as_deref(), Some("think"));
        // The error body is OpenAI's shape.
        let e = harmony_effort(&extra(r#"{"reasoning_effort": "none"}"#).unwrap()).unwrap_err();
        assert!(
            e.message.contains("'none'") && e.message.contains("low, medium and high"),
            "{}",
            e.message
        );
    }

    #[test]
    fn other_templates_still_see_effort_and_thinking() {
        let e = extra(r#"{"reasoning_effort": "none"}"#).unwrap();
        assert_eq!(
            (&e["reasoning_effort"], &e["enable_thinking"]),
            (&"none".into(), &false.into())
        );
        let e = extra(r#"{"reasoning_effort": "high", "think": false}"#).unwrap();
        assert_eq!(
            (&e["reasoning_effort"], &e["enable_thinking"]),
            (&"high".into(), &false.into())
        );
    }

    /// The (status, param, message) of a chat body's error.
    fn refusal(body: &str) -> (StatusCode, Option<String>, String) {
        let e = turn(body).unwrap_err();
        (e.status, e.param, e.message)
    }

    #[test]
    fn repeat_last_n_reaches_chat_and_completions_as_every_flat_surface_takes_it() {
        let d = turn(r#"{"repetition_penalty": 1.3, "repeat_last_n": 7}"#)
            .unwrap()
            .decode;
        assert_eq!((d.sampling.repeat_penalty, d.sampling.repeat_last_n), (1.3, 7));
        assert_eq!(
            turn(r#"{"repeat_last_n": -1}"#)
                .unwrap()
                .decode
                .sampling
                .repeat_last_n,
            usize::MAX
        );
        assert_eq!(
            refusal(r#"{"repeat_last_n": 1.5}"#).1.as_deref(),
            Some("repeat_last_n")
        );
        let body = br#"{"model": "m", "prompt": "x", "repeat_last_n": 7}"#;
        let (_, t) = check_body::<CompletionRequest>(body).unwrap();
        assert_eq!(t.decode.sampling.repeat_last_n, 7);
    }

    #[test]
    fn stop_goes_through_parse_stop() {
        let d = turn(r#"{"stop": ["</s>", ""]}"#).unwrap().decode;
        assert_eq!(
            d.stop,
            vec!["</s>"],
            "empty stop strings are dropped, as parse_stop does"
        );
        assert_eq!(turn(r#"{"stop": "x"}"#).unwrap().decode.stop, vec!["x"]);
        for bad in [
            r#"{"stop": 7}"#,
            r#"{"stop": ["a", 1]}"#,
            r#"{"stop": ["a","b","c","d","e"]}"#,
        ] {
            let (status, param, _) = refusal(bad);
            assert_eq!(
                (status, param.as_deref()),
                (StatusCode::BAD_REQUEST, Some("stop")),
                "{bad}"
            );
        }
    }

    fn logit_bias(v: Option<&Value>, vocab: usize) -> Result<Vec<(u32, f32)>, ApiError> {
        crate::sampling::parse_logit_bias(v, vocab).map_err(ApiError::from)
    }

    #[test]
    fn logit_bias_is_checked_against_the_vocabulary() {
        let field = |body: &str| serde_json::from_str::<Value>(body).unwrap()["logit_bias"].clone();
        let bias = |body: &str| logit_bias(Some(&field(body)).filter(|v| !v.is_null()), 100);
        assert_eq!(
            bias(r#"{"logit_bias": {"0": -100, "99": 5}}"#).unwrap(),
            vec![(0, -100.0), (99, 5.0)]
        );
        let e = bias(r#"{"logit_bias": {"100": 1}}"#).unwrap_err();
        let (status, param, message) = (e.status, e.param, e.message);
        assert_eq!(
            (status, param.as_deref()),
            (StatusCode::BAD_REQUEST, Some("logit_bias"))
        );
        assert!(
            message.contains("'100'") && message.contains("100 tokens"),
            "{message}"
        );
        for bad in [
            r#"{"logit_bias": {"1": 101}}"#,
            r#"{"logit_bias": {"a": 1}}"#,
            r#"{"logit_bias": [1]}"#,
        ] {
            let e = bias(bad).unwrap_err();
            let (status, param) = (e.status, e.param);
            assert_eq!(
                (status, param.as_deref()),
                (StatusCode::BAD_REQUEST, Some("logit_bias")),
                "{bad}"
            );
        }
        assert!(bias(r#"{"logit_bias": null}"#).unwrap().is_empty());
        // The turn keeps logit_bias as sent: Turn::prepare checks it against the model's vocabulary.
        let t = turn(r#"{"logit_bias": {"100000000": 1}}"#).unwrap();
        assert!(t.decode.sampling.logit_bias.is_empty() && t.logit_bias.is_some());
    }

    #[test]
    fn legacy_functions_are_refused_naming_the_field() {
        let chat = |body: &str| parse::<ChatCompletionRequest>(body.as_bytes()).map(|_| ());
        let e = chat(r#"{"functions": [{"name": "f", "parameters": {}}]}"#).unwrap_err();
        assert_eq!(
            (e.status, e.param.as_deref()),
            (StatusCode::BAD_REQUEST, Some("functions"))
        );
        assert!(e.message.contains("'tools'"), "{}", e.message);
        let e = chat(r#"{"function_call": "auto"}"#).unwrap_err();
        assert_eq!(
            (e.status, e.param.as_deref()),
            (StatusCode::BAD_REQUEST, Some("function_call"))
        );
        assert!(e.message.contains("'tool_choice'"), "{}", e.message);
        let user = r#""messages": [{"role": "user", "content": "hi"}]"#;
        for ok in [
            format!(r#"{{{user}, "functions": null, "function_call": null}}"#),
            format!(r#"{{{user}, "tools": []}}"#),
        ] {
            assert!(chat(&ok).is_ok(), "{ok}");
        }
    }

    #[test]
    fn malformed_messages_are_400s_naming_the_field() {
        let check =
            |v: Value| check_messages(v.as_array().unwrap()).map_err(|e| (e.status.as_u16(), e.param));
        let user = serde_json::json!({"role": "user", "content": "hi"});
        for (bad, param) in [
            (
                serde_json::json!([user, {"role": "tool", "content": "x"}]),
                "messages[1].tool_call_id",
            ),
            (
                serde_json::json!([{"role": "assistant", "content": null, "tool_calls": "f()"}]),
                "messages[0].tool_calls",
            ),
            (
                serde_json::json!([{"role": "assistant", "tool_calls": [{"function": {"arguments": "{}"}}]}]),
                "messages[0].tool_calls[0].function.name",
            ),
            (
                serde_json::json!([{"role": "user", "content": [{"type": "text"}]}]),
                "messages[0].content[0].text",
            ),
        ] {
            assert_eq!(check(bad.clone()), Err((400, Some(param.to_string()))), "{bad}");
        }
        let good = serde_json::json!([user,
            {"role": "assistant", "tool_calls": [{"id": "c", "type": "function",
                "function": {"name": "f", "arguments": "{}"}}]},
            {"role": "tool", "tool_call_id": "c", "content": "1"}]);
        assert_eq!(check(good), Ok(()));
        // Ollama's tool messages name the tool, not a call id.
        let ollama = serde_json::json!([user, {"role": "tool", "tool_name": "f", "content": "1"}]);
        assert!(crate::api::messages::check_json(ollama.as_array().unwrap(), false).is_ok());
    }

    #[test]
    fn chat_bodies_parse_typed_and_name_the_path_of_a_wrong_field() {
        // Everything the handler checks before it looks the model up (a model named, unless the
        // body names one).
        let error = |body: &str| {
            let mut v: Value = serde_json::from_str(body).unwrap();
            v.as_object_mut().unwrap().entry("model").or_insert("m".into());
            match check_body::<ChatCompletionRequest>(v.to_string().as_bytes()) {
                Ok(_) => panic!("accepted: {body}"),
                Err(e) => (e.status.as_u16(), e.param.unwrap_or_default()),
            }
        };
        let user = r#"{"role": "user", "content": "hi"}"#;
        for (body, param) in [
            (
                r#"{"messages":[{"role":"tool"}]}"#.to_string(),
                "messages[0].tool_call_id",
            ),
            (
                format!(r#"{{"messages":[{user}, {{"role":"tool","tool_call_id":3}}]}}"#),
                "messages[1].tool_call_id",
            ),
            (format!(r#"{{"messages":[{user}], "stream": "yes"}}"#), "stream"),
            (
                format!(r#"{{"model": "m", "messages":[{user}], "seed": 1.5}}"#),
                "seed",
            ),
            (
                format!(r#"{{"messages":[{user}], "stream_options": {{"include_usage": 1}}}}"#),
                "stream_options.include_usage",
            ),
            (
                format!(r#"{{"messages":[{user}], "temperature": "hot"}}"#),
                "temperature",
            ),
            (
                format!(r#"{{"messages":[{user}], "temperature": 3}}"#),
                "temperature",
            ),
            (
                format!(r#"{{"messages":[{user}], "max_completion_tokens": 0}}"#),
                "max_completion_tokens",
            ),
            (format!(r#"{{"messages":[{user}], "n": 17}}"#), "n"),
            (
                format!(r#"{{"messages":[{user}], "top_logprobs": 3}}"#),
                "top_logprobs",
            ),
            (
                format!(r#"{{"messages":[{user}], "reasoning_effort": "extreme"}}"#),
                "reasoning_effort",
            ),
            (
                format!(r#"{{"messages":[{user}], "chat_template_kwargs": []}}"#),
                "chat_template_kwargs",
            ),
            (format!(r#"{{"messages":[{user}], "bogus": 1}}"#), "bogus"),
            (r#"{"model": "m"}"#.to_string(), "messages"),
            (
                format!(r#"{{"messages":[{user}], "stream_options": [true]}}"#),
                "stream_options",
            ),
            (r#"{"messages":[["user", "hi"]]}"#.to_string(), "messages[0]"),
            (format!(r#"{{"messages":[{user}], "tools": 5}}"#), "tools"),
            (format!(r#"{{"messages":[{user}], "think": "extreme"}}"#), "think"),
        ] {
            assert_eq!(error(&body), (400, param.to_string()), "{body}");
        }
        let no_model = format!(r#"{{"messages":[{user}]}}"#);
        let e = check_body::<ChatCompletionRequest>(no_model.as_bytes())
            .err()
            .unwrap();
        assert_eq!(e.param.as_deref(), Some("model"));
        let ok = parse::<ChatCompletionRequest>(
            format!(r#"{{"model": "m", "messages": [{user}], "max_tokens": 10.0, "user": 5, "n": null}}"#)
                .as_bytes(),
        )
        .unwrap();
        assert_eq!(ok.request.model.as_deref(), Some("m"));
        assert_eq!(ok.request.max_tokens, Some(crate::api::body::Int(10)));
        // What the openai SDKs pass through for prompt caching and abuse monitoring: accepted
        // like `store` and `metadata`, since none of them changes the answer.
        let cache = format!(
            r#"{{"model": "m", "messages": [{user}], "prompt_cache_key": "k", "safety_identifier": "u1",
                "prompt_cache_retention": "24h", "store": false, "metadata": {{"a": "b"}}}}"#
        );
        assert!(check_body::<ChatCompletionRequest>(cache.as_bytes()).is_ok());
        let bad = format!(r#"{{"model": "m", "messages": [{user}], "prompt_cache_key": 7}}"#);
        assert_eq!(error(&bad), (400, "prompt_cache_key".to_string()));
    }

    #[test]
    fn the_strict_field_lists_are_the_ones_openai_served_before() {
        let mut chat = ChatCompletionRequest::known_keys().unwrap();
        chat.sort_unstable();
        let mut expected = vec![
            "model",
            "messages",
            "stream",
            "stream_options",
            "temperature",
            "top_p",
            "top_k",
            "min_p",
            "seed",
            "stop",
            "max_tokens",
            "max_completion_tokens",
            "presence_penalty",
            "frequency_penalty",
            "repetition_penalty",
            "repeat_last_n",
            "logit_bias",
            "tools",
            "tool_choice",
            "parallel_tool_calls",
            "response_format",
            "chat_template_kwargs",
            "reasoning_effort",
            "think",
            "n",
            "user",
            "logprobs",
            "top_logprobs",
            "store",
            "metadata",
            "service_tier",
            "prompt_cache_key",
            "prompt_cache_retention",
            "safety_identifier",
            "modalities",
            "keep_alive",
            "verbosity",
            "prediction",
            "web_search_options",
            "functions",
            "function_call",
        ];
        expected.sort_unstable();
        assert_eq!(chat, expected);
        let mut completion = CompletionRequest::known_keys().unwrap();
        completion.sort_unstable();
        let mut expected = vec![
            "model",
            "prompt",
            "stream",
            "stream_options",
            "temperature",
            "top_p",
            "top_k",
            "min_p",
            "seed",
            "stop",
            "max_tokens",
            "presence_penalty",
            "frequency_penalty",
            "repetition_penalty",
            "repeat_last_n",
            "logit_bias",
            "n",
            "user",
            "echo",
            "suffix",
            "best_of",
            "logprobs",
            "keep_alive",
        ];
        expected.sort_unstable();
        assert_eq!(completion, expected);
    }

    #[test]
    fn completion_prompts_and_refusals() {
        let prompt = |body: &str| parse::<CompletionRequest>(body.as_bytes()).map(|p| p.request.prompt);
        assert_eq!(
            prompt(r#"{"prompt": ["once"]}"#).unwrap(),
            Some(super::Prompt("once".into()))
        );
        for (body, param) in [
            (r#"{"prompt": ["a", "b"]}"#, "prompt"),
            (r#"{"prompt": 5}"#, "prompt"),
            (r#"{}"#, "prompt"),
            (r#"{"prompt": "x", "echo": true}"#, "echo"),
            (r#"{"prompt": "x", "best_of": 2}"#, "best_of"),
            (r#"{"prompt": "x", "best_of": -1}"#, "best_of"),
            (r#"{"prompt": "x", "logprobs": -1}"#, "logprobs"),
            (
                r#"{"prompt": "x", "max_completion_tokens": 5}"#,
                "max_completion_tokens",
            ),
        ] {
            let e = prompt(body).unwrap_err();
            assert_eq!(
                (e.status.as_u16(), e.param.as_deref()),
                (400, Some(param)),
                "{body}"
            );
        }
    }

    #[test]
    fn fields_berth_does_not_implement_are_400s_saying_so() {
        let check = |body: &str| check_body::<ChatCompletionRequest>(body.as_bytes());
        let base = r#""model": "m", "messages": [{"role": "user", "content": "hi"}]"#;
        for (extra, param) in [
            (r#""modalities": ["text", "audio"]"#, "modalities"),
            (r#""verbosity": "low""#, "verbosity"),
            (
                r#""prediction": {"type": "content", "content": "x"}"#,
                "prediction",
            ),
            (r#""web_search_options": {}"#, "web_search_options"),
        ] {
            let e = check(&format!("{{{base}, {extra}}}")).expect_err(extra);
            assert_eq!(
                (e.status.as_u16(), e.param.as_deref()),
                (400, Some(param)),
                "{extra}"
            );
            assert!(e.message.contains("not supported"), "{}", e.message);
        }
        for extra in [
            r#""modalities": ["text"]"#,
            r#""verbosity": null"#,
            r#""user": "u""#,
        ] {
            assert!(check(&format!("{{{base}, {extra}}}")).is_ok(), "{extra}");
        }
        let completion = |body: &str| parse::<CompletionRequest>(body.as_bytes());
        assert!(completion(r#"{"prompt": "x", "suffix": ""}"#).is_ok());
        assert!(completion(r#"{"prompt": "x", "suffix": "}"}"#).is_ok());
        assert!(completion(r#"{"prompt": "x", "suffix": null}"#).is_ok());
    }

    #[test]
    fn max_tokens_zero_is_refused_and_n_gives_each_choice_its_seed() {
        let (status, param, _) = refusal(r#"{"max_tokens": 0}"#);
        assert_eq!((status.as_u16(), param.as_deref()), (400, Some("max_tokens")));
        assert_eq!(choice_seed(Some(5), 0), Some(5));
        assert_ne!(choice_seed(Some(5), 1), choice_seed(Some(5), 2));
        assert_eq!(choice_seed(None, 3), None);
    }
}
