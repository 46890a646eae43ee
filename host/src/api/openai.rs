//! The OpenAI API: `/v1/chat/completions`, `/v1/completions`, `/v1/models`.

use super::{parse_object, ApiError, Fields};
use crate::chat::{self, ChatFormat, ParseStart, StreamParser};
use crate::constraint::{ParamError, RequestConstraints, SequenceConstraint};
use crate::decoding::{DecodeOptions, FinishReason};
use crate::engine::{Event, Finish, Job, JobImage, Sibling, SubmitError};
use crate::harmony::{HarmonyInput, ReasoningEffort};
use crate::sampling::SamplingParams;
use crate::sampling::TokenLogprobs;
use crate::server::models::{Model, ModelError};
use crate::server::{RequestId, Shared};
use crate::template::RenderInput;
use axum::body::{Body, Bytes};
use axum::extract::rejection::BytesRejection;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Extension;
use serde_json::{json, Map, Value};
use std::convert::Infallible;
use std::sync::Arc;
use std::time::{Instant, SystemTime, UNIX_EPOCH};
use tokio::sync::mpsc::{unbounded_channel, UnboundedReceiver};

const CHAT_FIELDS: &[&str] = &[
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
    "modalities",
    "keep_alive",
    "verbosity",
    "prediction",
    "web_search_options",
    "functions",
    "function_call",
];

const COMPLETION_FIELDS: &[&str] = &[
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
    "logit_bias",
    "n",
    "user",
    "echo",
    "suffix",
    "best_of",
    "logprobs",
    "keep_alive",
];

pub(crate) fn now_secs() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
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

/// Sampling and stopping fields shared by chat and completions (OpenAI names), all but
/// `logit_bias`, which needs the model's vocabulary (see [`logit_bias`]).
pub(crate) fn decode_options(f: &Fields<'_>, max_key: &[&str]) -> Result<DecodeOptions, ApiError> {
    let mut s = SamplingParams::default();
    if let Some(t) = f.num("temperature", 0.0, 2.0)? {
        s.temperature = t as f32;
    }
    if let Some(p) = f.num("top_p", 0.0, 1.0)? {
        s.top_p = p as f32;
    }
    if let Some(k) = f.int("top_k", -1, 1 << 20)? {
        s.top_k = k.max(0) as usize;
    }
    if let Some(p) = f.num("min_p", 0.0, 1.0)? {
        s.min_p = p as f32;
    }
    if let Some(seed) = f.int("seed", i64::MIN, i64::MAX)? {
        s.seed = Some(seed as u64);
    }
    if let Some(p) = f.num("presence_penalty", -2.0, 2.0)? {
        s.presence_penalty = p as f32;
    }
    if let Some(p) = f.num("frequency_penalty", -2.0, 2.0)? {
        s.frequency_penalty = p as f32;
    }
    if let Some(p) = f.num("repetition_penalty", 0.0, 10.0)? {
        s.repeat_penalty = p as f32;
    }
    let mut max_tokens = None;
    for k in max_key {
        if let Some(m) = f.int(k, 1, u32::MAX as i64)? {
            max_tokens = Some(m as usize);
        }
    }
    Ok(DecodeOptions {
        sampling: s,
        max_tokens,
        stop: crate::decoding::parse_stop(f.raw("stop"), "stop", 4).map_err(param_error)?,
        constraint: None,
        logprobs: None,
    })
}

/// OpenAI's `logit_bias`, checked against the loaded model's vocabulary: a token id outside it is
/// a 400 on `logit_bias` naming the id.
pub(crate) fn logit_bias(f: &Fields<'_>, vocab: usize) -> Result<Vec<(u32, f32)>, ApiError> {
    crate::sampling::parse_logit_bias(f.raw("logit_bias"), vocab).map_err(param_error)
}

/// The legacy `functions` / `function_call` fields (superseded by `tools` / `tool_choice`) are
/// not served: a 400 naming the field rather than a reply that silently ignores them.
pub(crate) fn refuse_legacy_functions(f: &Fields<'_>) -> Result<(), ApiError> {
    for (legacy, current) in [("functions", "tools"), ("function_call", "tool_choice")] {
        if f.raw(legacy).is_some() {
            return Err(ApiError::param(
                legacy,
                format!("'{legacy}' (the legacy function-calling API) is not supported; use '{current}'"),
            ));
        }
    }
    Ok(())
}

/// A constraint error as a 400 naming the parameter.
pub(crate) fn param_error(e: ParamError) -> ApiError {
    ApiError::param(&e.param, e.message)
}

/// Whether the rendered prompt leaves the model thinking (the constraint allows reasoning first).
/// gpt-oss always reasons (on its analysis channel): thinking cannot be turned off.
pub(crate) fn thinking(model: &Model, start: ParseStart, extra: &Map<String, Value>) -> bool {
    if model.detected.format == ChatFormat::Harmony {
        return true;
    }
    match start {
        ParseStart::Reasoning => true,
        ParseStart::ReasoningClosed => false,
        _ => {
            model.detected.reasoning.is_some()
                && extra.get("enable_thinking").and_then(Value::as_bool) != Some(false)
        }
    }
}

/// The grammar for a request's tools / format, if it needs one.
pub(crate) fn constraint_for(
    model: &Model,
    rc: &RequestConstraints,
    thinking: bool,
    start: ParseStart,
) -> Result<Option<SequenceConstraint>, ApiError> {
    if rc.is_unconstrained() {
        return Ok(None);
    }
    match &model.constraints {
        Ok(f) => f.build(rc, thinking, start).map_err(param_error),
        Err(e) => Err(ApiError::param(
            "response_format",
            format!(
                "constrained decoding is not available for {}: {e}",
                model.reference
            ),
        )),
    }
}

/// The loaded model named by the request (404 unknown, 503 loading).
pub(crate) async fn model_for(
    st: &Shared,
    name: &str,
    keep_alive: Option<Option<std::time::Duration>>,
) -> Result<Arc<Model>, ApiError> {
    match st.models.get(name, keep_alive).await {
        Ok(m) => Ok(m),
        Err(ModelError::NotFound) => Err(ApiError::model_not_found(name)),
        Err(ModelError::Loading) => Err(ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            format!("the model '{name}' is loading; retry shortly"),
        )),
        Err(ModelError::Failed(m)) => Err(ApiError::new(StatusCode::SERVICE_UNAVAILABLE, m)),
    }
}

/// Queues a prompt on a model's engine; the receiver gets its events.
pub(crate) fn submit(
    model: &Model,
    id: &str,
    prompt: Vec<u32>,
    images: Vec<JobImage>,
    decode: DecodeOptions,
) -> Result<UnboundedReceiver<Event>, ApiError> {
    let mut rxs = submit_n(model, id, prompt, images, vec![decode])?;
    Ok(rxs.remove(0))
}

/// Queues a prompt for several choices (`n`), one [`DecodeOptions`] each: the first choice
/// computes the prompt and the others fork its sequence. One receiver per choice, in order.
pub(crate) fn submit_n(
    model: &Model,
    id: &str,
    prompt: Vec<u32>,
    images: Vec<JobImage>,
    mut decodes: Vec<DecodeOptions>,
) -> Result<Vec<UnboundedReceiver<Event>>, ApiError> {
    if prompt.is_empty() {
        return Err(ApiError::param("messages", "the prompt is empty"));
    }
    if prompt.len() >= model.context_length {
        let mut e = ApiError::param(
            "messages",
            format!(
                "This model's maximum context length is {} tokens; the prompt has {}.",
                model.context_length,
                prompt.len()
            ),
        );
        e.code = Some("context_length_exceeded");
        return Err(e);
    }
    let mut rxs = Vec::new();
    let mut siblings = Vec::new();
    let first = decodes.remove(0);
    let (tx, rx) = unbounded_channel();
    rxs.push(rx);
    for decode in decodes {
        let (events, rx) = unbounded_channel();
        rxs.push(rx);
        siblings.push(Sibling { decode, events });
    }
    let job = Job {
        id: id.to_string(),
        prompt,
        decode: first,
        events: tx,
        received: Instant::now(),
        images,
        siblings,
    };
    match model.engine.submit(job) {
        Ok(()) => Ok(rxs),
        Err(SubmitError::QueueFull) => Err(ApiError::new(
            StatusCode::TOO_MANY_REQUESTS,
            "the server is busy: the request queue is full; retry shortly",
        )),
        Err(SubmitError::Closed) => Err(ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "the model is being unloaded; retry shortly",
        )),
    }
}

/// `n` of a request (1 when absent), at most [`MAX_CHOICES`].
pub(crate) fn choices(f: &Fields<'_>) -> Result<usize, ApiError> {
    Ok(f.int("n", 1, MAX_CHOICES as i64)?.unwrap_or(1) as usize)
}

/// The decode options of `n` choices: the first as given, each other with its own seed
/// ([`choice_seed`]) and a fresh constraint from `constraint`.
pub(crate) fn choice_decodes(
    first: DecodeOptions,
    n: usize,
    constraint: impl Fn() -> Result<Option<SequenceConstraint>, ApiError>,
) -> Result<Vec<DecodeOptions>, ApiError> {
    let mut rest = Vec::new();
    for k in 1..n {
        let mut sampling = first.sampling.clone();
        sampling.seed = choice_seed(first.sampling.seed, k);
        rest.push(DecodeOptions {
            sampling,
            max_tokens: first.max_tokens,
            stop: first.stop.clone(),
            constraint: constraint()?,
            logprobs: first.logprobs,
        });
    }
    rest.insert(0, first);
    Ok(rest)
}

/// Most choices one request may ask for.
pub const MAX_CHOICES: usize = 16;

/// The seed of choice `k`: the request's seed for the first, a different fixed stream for each
/// other, so a seeded request with `n` > 1 is reproducible and its choices differ.
pub(crate) fn choice_seed(seed: Option<u64>, k: usize) -> Option<u64> {
    match (seed, k) {
        (s, 0) => s,
        (Some(s), k) => Some(s.wrapping_add((k as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15))),
        (None, _) => None,
    }
}

/// The template variables of a chat request: `chat_template_kwargs`, `think`, `reasoning_effort`.
pub(crate) fn template_extra(f: &Fields<'_>) -> Result<Map<String, Value>, ApiError> {
    let mut extra = f.object("chat_template_kwargs")?.cloned().unwrap_or_default();
    if let Some(effort) = f.str("reasoning_effort")? {
        if !["none", "minimal", "low", "medium", "high"].contains(&effort) {
            return Err(ApiError::param(
                "reasoning_effort",
                "'reasoning_effort' is one of none, minimal, low, medium, high",
            ));
        }
        extra.insert("reasoning_effort".into(), effort.into());
        extra
            .entry("enable_thinking")
            .or_insert((effort != "none").into());
    }
    match f.raw("think") {
        None => {}
        Some(Value::Bool(b)) => {
            extra.insert("enable_thinking".into(), (*b).into());
        }
        Some(Value::String(s)) if ["low", "medium", "high"].contains(&s.as_str()) => {
            extra.insert("reasoning_effort".into(), s.clone().into());
            extra.insert("enable_thinking".into(), true.into());
        }
        Some(_) => {
            return Err(ApiError::param(
                "think",
                "'think' is a boolean (or low, medium, high)",
            ))
        }
    }
    Ok(extra)
}

/// Checks the messages' shape (400 for anything malformed).
pub(crate) fn check_messages(messages: &[Value]) -> Result<(), ApiError> {
    check_messages_as(messages, true)
}

/// Checks the messages' shape; `openai`: a tool message must name its `tool_call_id` (Ollama's
/// name the tool with `tool_name` instead).
pub(crate) fn check_messages_as(messages: &[Value], openai: bool) -> Result<(), ApiError> {
    if messages.is_empty() {
        return Err(ApiError::param("messages", "'messages' must not be empty"));
    }
    for (i, m) in messages.iter().enumerate() {
        let p = format!("messages[{i}]");
        let Some(o) = m.as_object() else {
            return Err(ApiError::param(&p, format!("'{p}' must be an object")));
        };
        match o.get("role").and_then(Value::as_str) {
            Some("system" | "developer" | "user" | "assistant" | "tool" | "function") => {}
            Some(r) => {
                return Err(ApiError::param(
                    &format!("{p}.role"),
                    format!("unknown role '{r}'"),
                ))
            }
            None => {
                return Err(ApiError::param(
                    &format!("{p}.role"),
                    format!("'{p}.role' is required"),
                ))
            }
        }
        let role = o.get("role").and_then(Value::as_str).unwrap_or("");
        if openai && role == "tool" && !o.get("tool_call_id").is_some_and(Value::is_string) {
            return Err(ApiError::param(
                &format!("{p}.tool_call_id"),
                format!("'{p}.tool_call_id' is required (a string) on a tool message"),
            ));
        }
        match o.get("tool_calls") {
            None | Some(Value::Null) => {}
            Some(Value::Array(calls)) if role == "assistant" => {
                for (k, c) in calls.iter().enumerate() {
                    let q = format!("{p}.tool_calls[{k}]");
                    let f = c.get("function");
                    let named = f.and_then(|f| f.get("name")).is_some_and(Value::is_string);
                    let args_ok = f
                        .and_then(|f| f.get("arguments"))
                        .is_none_or(|a| a.is_string() || a.is_object());
                    if !named || !args_ok {
                        return Err(ApiError::param(
                            &q,
                            format!("'{q}' must be an object with 'function': {{'name', 'arguments'}}"),
                        ));
                    }
                }
            }
            Some(_) => {
                return Err(ApiError::param(
                    &format!("{p}.tool_calls"),
                    format!("'{p}.tool_calls' must be an array, on an assistant message"),
                ))
            }
        }
        match o.get("content") {
            None | Some(Value::Null | Value::String(_)) => {}
            Some(Value::Array(parts)) => {
                for (j, part) in parts.iter().enumerate() {
                    let kind = part.get("type").and_then(Value::as_str);
                    let ok = kind.is_some_and(|t| {
                        matches!(
                            t,
                            "text" | "image_url" | "input_audio" | "file" | "refusal" | "image"
                        )
                    });
                    if !ok {
                        return Err(ApiError::param(
                            &format!("{p}.content"),
                            "content parts are objects with a 'type' (text, image_url, ...)",
                        ));
                    }
                    if kind == Some("text") && !part.get("text").is_some_and(Value::is_string) {
                        let q = format!("{p}.content[{j}].text");
                        return Err(ApiError::param(&q, format!("'{q}' is required (a string)")));
                    }
                }
            }
            Some(_) => {
                return Err(ApiError::param(
                    &format!("{p}.content"),
                    format!("'{p}.content' must be a string or an array of parts"),
                ))
            }
        }
    }
    Ok(())
}

/// A 400 naming the first `image_url` part, for a model that takes no images (before any is
/// fetched).
pub(crate) fn refuse_images(model: &Model, messages: &[Value]) -> Result<(), ApiError> {
    for (i, m) in messages.iter().enumerate() {
        let Some(Value::Array(parts)) = m.get("content") else {
            continue;
        };
        if let Some(j) = parts
            .iter()
            .position(|p| p.get("type").and_then(Value::as_str) == Some("image_url"))
        {
            let place = format!("messages[{i}].content[{j}]");
            return Err(ApiError::param(
                &place,
                format!("{place}: model {} does not take images", model.reference),
            ));
        }
    }
    Ok(())
}

/// The reasoning effort of a request to a harmony (gpt-oss) model: `low`, `medium` (the default)
/// or `high`, from `reasoning_effort` or `think`. gpt-oss cannot reason less than `low`, so
/// `none` and `minimal` are refused; a boolean `think` leaves the default, as Ollama does.
pub(crate) fn harmony_effort(extra: &Map<String, Value>) -> Result<ReasoningEffort, ApiError> {
    let known = "gpt-oss knows the reasoning efforts low, medium and high";
    match extra.get("reasoning_effort") {
        None | Some(Value::Null) => Ok(ReasoningEffort::Medium),
        Some(Value::String(s)) => crate::harmony::parse_effort(s)
            .ok_or_else(|| ApiError::param("reasoning_effort", format!("'{s}' is not supported: {known}"))),
        Some(_) => Err(ApiError::param(
            "reasoning_effort",
            format!("'reasoning_effort' must be a string: {known}"),
        )),
    }
}

/// Renders a conversation with openai-harmony (a harmony pack with the o200k vocabulary) or the
/// model's template; returns (rendered text, tokens).
pub(crate) fn render(
    model: &Model,
    messages: Vec<Value>,
    tools: Option<Vec<Value>>,
    extra: Map<String, Value>,
) -> Result<(String, Vec<u32>), ApiError> {
    if model.detected.format == ChatFormat::Harmony {
        let effort = harmony_effort(&extra)?;
        if let Some(harmony) = &model.harmony {
            let tokens = harmony
                .render(&HarmonyInput {
                    messages: &messages,
                    tools: tools.as_deref(),
                    effort,
                    date: None,
                    add_generation_prompt: true,
                })
                .map_err(|e| ApiError::param(&e.param, e.message))?;
            return Ok((model.tokenizer.decode(&tokens, false), tokens));
        }
    }
    let template = model.template.as_ref().ok_or_else(|| {
        ApiError::param(
            "model",
            format!("{} has no chat template; use /v1/completions", model.reference),
        )
    })?;
    let (bos, eos) = model.special_texts();
    let text = template
        .render(&RenderInput {
            messages,
            tools,
            add_generation_prompt: true,
            extra,
            bos_token: bos,
            eos_token: eos,
        })
        .map_err(|e| {
            ApiError::param(
                "messages",
                format!("the chat template rejected the conversation: {e}"),
            )
        })?;
    let tokens = model.tokenizer.encode(&text, false);
    Ok((text, tokens))
}

/// A chat choice's `finish_reason`: `length` whenever `max_tokens` or the context cut the reply
/// (also inside a call, or after calls the model went on repeating), else `tool_calls` when the
/// reply holds calls, else how the engine ended (`stop`).
pub(crate) fn chat_finish_reason(fin: &Finish, calls: bool) -> &'static str {
    if fin.reason == FinishReason::Length {
        "length"
    } else if calls {
        "tool_calls"
    } else {
        fin.reason.as_str()
    }
}

fn usage(fin: &Finish) -> Value {
    json!({
        "prompt_tokens": fin.prompt_tokens,
        "completion_tokens": fin.completion_tokens,
        "total_tokens": fin.prompt_tokens + fin.completion_tokens,
        "prompt_tokens_details": {"cached_tokens": fin.cached_tokens},
    })
}

/// Collects a whole generation: text and how it ended.
pub(crate) async fn collect(rx: UnboundedReceiver<Event>) -> Result<(String, Finish), ApiError> {
    let c = collect_all(rx).await?;
    Ok((c.text, c.finish))
}

/// A whole generation: its text, the tokens' log-probabilities (when asked for) and its end.
pub(crate) struct Collected {
    /// The generated text.
    pub text: String,
    /// One entry per generated token, when the request asked for log-probabilities.
    pub logprobs: Vec<TokenLogprobs>,
    /// How it ended.
    pub finish: Finish,
}

/// Collects a whole generation with its log-probabilities.
pub(crate) async fn collect_all(mut rx: UnboundedReceiver<Event>) -> Result<Collected, ApiError> {
    let mut text = String::new();
    let mut logprobs = Vec::new();
    while let Some(ev) = rx.recv().await {
        match ev {
            Event::Text(t) => text.push_str(&t),
            Event::Logprobs(lp) => logprobs.push(lp),
            Event::Done(finish) => {
                return Ok(Collected {
                    text,
                    logprobs,
                    finish,
                })
            }
            Event::Error(e) => return Err(ApiError::new(StatusCode::SERVICE_UNAVAILABLE, e)),
        }
    }
    Err(ApiError::new(
        StatusCode::SERVICE_UNAVAILABLE,
        "the model was unloaded during the request",
    ))
}

/// `usage` of several choices of one prompt: the prompt counted once.
fn usage_n(fins: &[Finish]) -> Value {
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

fn data(v: &Value) -> Bytes {
    Bytes::from(format!("data: {v}\n\n"))
}

/// `POST /v1/chat/completions`.
pub async fn chat_completions(
    State(st): State<Shared>,
    Extension(RequestId(id)): Extension<RequestId>,
    b: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    let body = body(b)?;
    let obj = parse_object(&body)?;
    let f = Fields::new(&obj, "");
    f.only(CHAT_FIELDS)?;
    refuse_legacy_functions(&f)?;
    let name = f.required_str("model")?;
    let mut messages = f
        .array("messages")?
        .ok_or_else(|| ApiError::param("messages", "'messages' is required"))?
        .clone();
    check_messages(&messages)?;
    let stream = f.bool("stream")?.unwrap_or(false);
    let include_usage = match f.object("stream_options")? {
        Some(o) => Fields::new(o, "stream_options.")
            .bool("include_usage")?
            .unwrap_or(false),
        None => false,
    };
    let mut decode = decode_options(&f, &["max_tokens", "max_completion_tokens"])?;
    let rc = RequestConstraints::from_openai(
        f.raw("tools"),
        f.raw("tool_choice"),
        f.raw("parallel_tool_calls"),
        f.raw("response_format"),
    )
    .map_err(param_error)?;
    let logprobs = super::logprobs::chat_request(&f)?;
    decode.logprobs = logprobs;
    let n = choices(&f)?;
    let extra = template_extra(&f)?;
    let tool_choice_none = f.raw("tool_choice").and_then(Value::as_str) == Some("none");
    let render_tools = if tool_choice_none {
        None
    } else {
        rc.parser_tools().map(<[Value]>::to_vec)
    };
    let model = model_for(&st, name, None).await?;
    decode.sampling.logit_bias = logit_bias(&f, model.vocab_size)?;
    if model.vision.is_none() {
        refuse_images(&model, &messages)?;
    }
    let images = super::images::take_openai(&mut messages).await?;
    let (mut rendered, mut prompt) = render(&model, messages, render_tools.clone(), extra.clone())?;
    let mut slices = Vec::new();
    if !images.is_empty() {
        (rendered, prompt, slices) = super::images::expand(&model, &rendered, &images, false)?;
    }
    let start = chat::prefill(model.detected.format, &rendered);
    let thinks = thinking(&model, start, &extra);
    decode.constraint = constraint_for(&model, &rc, thinks, start)?;
    let decodes = choice_decodes(decode, n, || constraint_for(&model, &rc, thinks, start))?;
    let parser = || StreamParser::new(model.detected.format, start, render_tools.as_deref());
    let rxs = submit_n(&model, &id, prompt, slices, decodes)?;
    let cid = format!("chatcmpl-{}", id.trim_start_matches("req-"));
    let created = now_secs();
    let model_name = model.reference.clone();
    let tokenizer = model.tokenizer.clone();
    let lp_json = move |lps: &[TokenLogprobs]| -> Value {
        if logprobs.is_some() {
            super::logprobs::chat_choice(&tokenizer, lps)
        } else {
            Value::Null
        }
    };
    if !stream {
        let all = futures_util::future::try_join_all(rxs.into_iter().map(collect_all)).await?;
        let mut out = Vec::new();
        for (index, c) in all.iter().enumerate() {
            let mut parser = parser();
            parser.push(&c.text);
            // A cut reply is parsed as the prefix it is (see `StreamParser::finish_output`).
            let (_, msg) = parser.finish_output(c.finish.reason == FinishReason::Length);
            let reason = chat_finish_reason(&c.finish, !msg.tool_calls.is_empty());
            out.push(json!({"index": index, "message": msg.to_openai(), "logprobs": lp_json(&c.logprobs), "finish_reason": reason}));
        }
        let fins: Vec<Finish> = all.into_iter().map(|c| c.finish).collect();
        let body = json!({
            "id": cid,
            "object": "chat.completion",
            "created": created,
            "model": model_name,
            "choices": out,
            "usage": usage_n(&fins),
        });
        return Ok(axum::Json(body).into_response());
    }
    let chunk = Arc::new(
        move |index: usize, delta: Value, finish: Option<&str>, lps: Option<Value>| {
            let mut c = json!({
                "id": cid,
                "object": "chat.completion.chunk",
                "created": created,
                "model": model_name,
                "choices": [{"index": index, "delta": delta, "logprobs": lps, "finish_reason": finish}],
            });
            if include_usage {
                c["usage"] = Value::Null;
            }
            c
        },
    );
    /// One choice's stream state.
    struct S<C, L> {
        index: usize,
        rx: UnboundedReceiver<Event>,
        parser: StreamParser,
        chunk: Arc<C>,
        lp_json: L,
        /// Log-probabilities not yet sent (their text has not made a delta yet).
        lps: Vec<TokenLogprobs>,
        started: bool,
        done: bool,
        calls: bool,
        ends: Arc<std::sync::Mutex<Ends>>,
    }
    /// How the choices ended, for the usage chunk and `[DONE]`.
    #[derive(Default)]
    struct Ends {
        finishes: Vec<Finish>,
        failed: bool,
    }
    let ends = Arc::new(std::sync::Mutex::new(Ends::default()));
    let streams = rxs.into_iter().enumerate().map(|(index, rx)| {
        let state = S {
            index,
            rx,
            parser: parser(),
            chunk: chunk.clone(),
            lp_json: lp_json.clone(),
            lps: Vec::new(),
            started: false,
            done: false,
            calls: false,
            ends: ends.clone(),
        };
        Box::pin(futures_util::stream::unfold(state, |mut s| async move {
            if s.done {
                return None;
            }
            if !s.started {
                s.started = true;
                let first = (s.chunk)(s.index, json!({"role": "assistant", "content": ""}), None, None);
                return Some((Ok::<_, Infallible>(data(&first)), s));
            }
            loop {
                match s.rx.recv().await {
                    Some(Event::Logprobs(lp)) => s.lps.push(lp),
                    Some(Event::Text(t)) => {
                        if let Some(d) = s.parser.push(&t) {
                            s.calls |= d.get("tool_calls").is_some();
                            let l = (!s.lps.is_empty()).then(|| (s.lp_json)(&std::mem::take(&mut s.lps)));
                            return Some((Ok(data(&(s.chunk)(s.index, d, None, l))), s));
                        }
                    }
                    Some(Event::Done(fin)) => {
                        let (d, msg) = s.parser.finish_output(fin.reason == FinishReason::Length);
                        let mut out = String::new();
                        let l = (!s.lps.is_empty()).then(|| (s.lp_json)(&std::mem::take(&mut s.lps)));
                        match d {
                            Some(d) => out.push_str(&format!("data: {}\n\n", (s.chunk)(s.index, d, None, l))),
                            None if l.is_some() => {
                                out.push_str(&format!("data: {}\n\n", (s.chunk)(s.index, json!({}), None, l)))
                            }
                            None => {}
                        }
                        let reason = chat_finish_reason(&fin, s.calls || !msg.tool_calls.is_empty());
                        out.push_str(&format!("data: {}\n\n", (s.chunk)(s.index, json!({}), Some(reason), None)));
                        s.ends.lock().unwrap_or_else(|e| e.into_inner()).finishes.push(fin);
                        s.done = true;
                        return Some((Ok(Bytes::from(out)), s));
                    }
                    Some(Event::Error(e)) => {
                        s.done = true;
                        s.ends.lock().unwrap_or_else(|e| e.into_inner()).failed = true;
                        let err =
                            json!({"error": {"message": e, "type": "server_error", "param": null, "code": null}});
                        return Some((Ok(data(&err)), s));
                    }
                    None => return None,
                }
            }
        }))
    });
    let merged = futures_util::stream::select_all(streams);
    let chunk_tail = chunk.clone();
    let tail = futures_util::stream::once(async move {
        let ends = ends.lock().unwrap_or_else(|e| e.into_inner());
        let mut out = String::new();
        if ends.failed || ends.finishes.len() < n {
            return Ok(Bytes::new());
        }
        if include_usage {
            let mut u = (chunk_tail)(0, json!({}), None, None);
            u["choices"] = json!([]);
            u["usage"] = usage_n(&ends.finishes);
            out.push_str(&format!("data: {u}\n\n"));
        }
        out.push_str("data: [DONE]\n\n");
        Ok(Bytes::from(out))
    });
    Ok(sse(futures_util::StreamExt::chain(merged, tail)))
}

/// `POST /v1/completions`.
pub async fn completions(
    State(st): State<Shared>,
    Extension(RequestId(id)): Extension<RequestId>,
    b: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    let body = body(b)?;
    let obj = parse_object(&body)?;
    let f = Fields::new(&obj, "");
    f.only(COMPLETION_FIELDS)?;
    let name = f.required_str("model")?;
    let prompt = match f.raw("prompt") {
        Some(Value::String(s)) => s.clone(),
        Some(Value::Array(a)) if a.len() == 1 && a[0].is_string() => a[0].as_str().unwrap_or("").to_string(),
        Some(_) => return Err(ApiError::param("prompt", "'prompt' must be a string")),
        None => return Err(ApiError::param("prompt", "'prompt' is required")),
    };
    let stream = f.bool("stream")?.unwrap_or(false);
    let include_usage = match f.object("stream_options")? {
        Some(o) => Fields::new(o, "stream_options.")
            .bool("include_usage")?
            .unwrap_or(false),
        None => false,
    };
    let mut decode = decode_options(&f, &["max_tokens"])?;
    if decode.max_tokens.is_none() {
        decode.max_tokens = Some(16);
    }
    // The legacy `logprobs` is the number of alternatives (0-5), the chosen token always included.
    let logprobs = f.int("logprobs", 0, 5)?.map(|n| n as usize);
    decode.logprobs = logprobs;
    let n = choices(&f)?;
    if f.bool("echo")? == Some(true) {
        return Err(ApiError::param("echo", "'echo' is not supported"));
    }
    if let Some(best_of) = f.int("best_of", 1, MAX_CHOICES as i64)? {
        if best_of != n as i64 {
            return Err(ApiError::param(
                "best_of",
                "'best_of' other than 'n' is not supported",
            ));
        }
    }
    let model = model_for(&st, name, None).await?;
    decode.sampling.logit_bias = logit_bias(&f, model.vocab_size)?;
    let tokens = model.tokenizer.encode(&prompt, true);
    let decodes = choice_decodes(decode, n, || Ok(None))?;
    let rxs = submit_n(&model, &id, tokens, Vec::new(), decodes)?;
    let cid = format!("cmpl-{}", id.trim_start_matches("req-"));
    let created = now_secs();
    let model_name = model.reference.clone();
    let tokenizer = model.tokenizer.clone();
    let chunk = move |index: usize, text: &str, finish: Option<&str>, lps: Value| {
        let mut c = json!({
            "id": cid, "object": "text_completion", "created": created, "model": model_name,
            "choices": [{"index": index, "text": text, "logprobs": lps, "finish_reason": finish}],
        });
        if include_usage && stream {
            c["usage"] = Value::Null;
        }
        c
    };
    let legacy = move |lps: &[TokenLogprobs], offset: usize| {
        if logprobs.is_some() {
            super::logprobs::legacy(&tokenizer, lps, offset)
        } else {
            Value::Null
        }
    };
    if !stream {
        let all = futures_util::future::try_join_all(rxs.into_iter().map(collect_all)).await?;
        let mut out = Vec::new();
        for (index, c) in all.iter().enumerate() {
            let one = chunk(
                index,
                &c.text,
                Some(c.finish.reason.as_str()),
                legacy(&c.logprobs, 0),
            );
            out.push(one["choices"][0].clone());
        }
        let fins: Vec<Finish> = all.into_iter().map(|c| c.finish).collect();
        let mut c = chunk(0, "", None, Value::Null);
        c["choices"] = out.into();
        c["usage"] = usage_n(&fins);
        return Ok(axum::Json(c).into_response());
    }
    let ends = Arc::new(std::sync::Mutex::new((Vec::<Finish>::new(), false)));
    let (chunk, legacy) = (Arc::new(chunk), Arc::new(legacy));
    let streams = rxs.into_iter().enumerate().map(|(index, rx)| {
        let (chunk, legacy, ends) = (chunk.clone(), legacy.clone(), ends.clone());
        // (receiver, pending logprobs, text length so far, done)
        Box::pin(futures_util::stream::unfold(
            (rx, Vec::new(), 0usize, false),
            move |(mut rx, mut lps, mut offset, done)| {
                let (chunk, legacy, ends) = (chunk.clone(), legacy.clone(), ends.clone());
                async move {
                    if done {
                        return None;
                    }
                    loop {
                        match rx.recv().await {
                            Some(Event::Logprobs(lp)) => lps.push(lp),
                            Some(Event::Text(t)) => {
                                let l = legacy(&std::mem::take(&mut lps), offset);
                                offset += t.len();
                                let b = data(&chunk(index, &t, None, l));
                                return Some((Ok::<_, Infallible>(b), (rx, lps, offset, false)));
                            }
                            Some(Event::Done(fin)) => {
                                let l = if lps.is_empty() { Value::Null } else { legacy(&lps, offset) };
                                let out = format!("data: {}\n\n", chunk(index, "", Some(fin.reason.as_str()), l));
                                ends.lock().unwrap_or_else(|e| e.into_inner()).0.push(fin);
                                return Some((Ok(Bytes::from(out)), (rx, Vec::new(), offset, true)));
                            }
                            Some(Event::Error(e)) => {
                                ends.lock().unwrap_or_else(|e| e.into_inner()).1 = true;
                                let err = json!({"error": {"message": e, "type": "server_error", "param": null, "code": null}});
                                return Some((Ok(data(&err)), (rx, Vec::new(), offset, true)));
                            }
                            None => return None,
                        }
                    }
                }
            },
        ))
    });
    let merged = futures_util::stream::select_all(streams);
    let tail = futures_util::stream::once(async move {
        let ends = ends.lock().unwrap_or_else(|e| e.into_inner());
        if ends.1 || ends.0.len() < n {
            return Ok(Bytes::new());
        }
        let mut out = String::new();
        if include_usage {
            let mut u = chunk(0, "", None, Value::Null);
            u["choices"] = json!([]);
            u["usage"] = usage_n(&ends.0);
            out.push_str(&format!("data: {u}\n\n"));
        }
        out.push_str("data: [DONE]\n\n");
        Ok(Bytes::from(out))
    });
    Ok(sse(futures_util::StreamExt::chain(merged, tail)))
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
        "created_at": super::ollama::rfc3339(e.modified),
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
    use super::{
        check_messages, check_messages_as, choice_seed, decode_options, harmony_effort, logit_bias,
        refuse_legacy_functions, template_extra,
    };
    use crate::api::{parse_object, ApiError, Fields};
    use crate::harmony::ReasoningEffort;
    use axum::http::StatusCode;
    use serde_json::{Map, Value};

    fn extra(body: &str) -> Result<Map<String, Value>, ApiError> {
        let obj = parse_object(body.as_bytes()).unwrap();
        template_extra(&Fields::new(&obj, ""))
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
        assert!(!e.ollama);
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

    /// The (status, param, message) of a request body's error from `check`.
    fn refusal<T: std::fmt::Debug>(
        body: &str,
        check: impl Fn(&Fields<'_>) -> Result<T, ApiError>,
    ) -> (StatusCode, Option<String>, String) {
        let obj = parse_object(body.as_bytes()).unwrap();
        let e = check(&Fields::new(&obj, "")).unwrap_err();
        (e.status, e.param, e.message)
    }

    #[test]
    fn stop_goes_through_parse_stop() {
        let obj = parse_object(br#"{"stop": ["</s>", ""]}"#).unwrap();
        let d = decode_options(&Fields::new(&obj, ""), &["max_tokens"]).unwrap();
        assert_eq!(
            d.stop,
            vec!["</s>"],
            "empty stop strings are dropped, as parse_stop does"
        );
        let obj = parse_object(br#"{"stop": "x"}"#).unwrap();
        assert_eq!(
            decode_options(&Fields::new(&obj, ""), &[]).unwrap().stop,
            vec!["x"]
        );
        for bad in [
            r#"{"stop": 7}"#,
            r#"{"stop": ["a", 1]}"#,
            r#"{"stop": ["a","b","c","d","e"]}"#,
        ] {
            let (status, param, _) = refusal(bad, |f| decode_options(f, &[]));
            assert_eq!(
                (status, param.as_deref()),
                (StatusCode::BAD_REQUEST, Some("stop")),
                "{bad}"
            );
        }
    }

    #[test]
    fn logit_bias_is_checked_against_the_vocabulary() {
        let obj = parse_object(br#"{"logit_bias": {"0": -100, "99": 5}}"#).unwrap();
        assert_eq!(
            logit_bias(&Fields::new(&obj, ""), 100).unwrap(),
            vec![(0, -100.0), (99, 5.0)]
        );
        let (status, param, message) = refusal(r#"{"logit_bias": {"100": 1}}"#, |f| logit_bias(f, 100));
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
            let (status, param, _) = refusal(bad, |f| logit_bias(f, 100));
            assert_eq!(
                (status, param.as_deref()),
                (StatusCode::BAD_REQUEST, Some("logit_bias")),
                "{bad}"
            );
        }
        let obj = parse_object(br#"{"logit_bias": null}"#).unwrap();
        assert!(logit_bias(&Fields::new(&obj, ""), 100).unwrap().is_empty());
        // decode_options leaves logit_bias to the handler, which knows the model.
        let obj = parse_object(br#"{"logit_bias": {"100000000": 1}}"#).unwrap();
        assert!(decode_options(&Fields::new(&obj, ""), &[])
            .unwrap()
            .sampling
            .logit_bias
            .is_empty());
    }

    #[test]
    fn legacy_functions_are_refused_naming_the_field() {
        let (status, param, message) = refusal(
            r#"{"functions": [{"name": "f", "parameters": {}}]}"#,
            refuse_legacy_functions,
        );
        assert_eq!(
            (status, param.as_deref()),
            (StatusCode::BAD_REQUEST, Some("functions"))
        );
        assert!(message.contains("'tools'"), "{message}");
        let (status, param, message) = refusal(r#"{"function_call": "auto"}"#, refuse_legacy_functions);
        assert_eq!(
            (status, param.as_deref()),
            (StatusCode::BAD_REQUEST, Some("function_call"))
        );
        assert!(message.contains("'tool_choice'"), "{message}");
        for ok in [
            r#"{"functions": null, "function_call": null}"#,
            r#"{"tools": []}"#,
        ] {
            let obj = parse_object(ok.as_bytes()).unwrap();
            assert!(refuse_legacy_functions(&Fields::new(&obj, "")).is_ok(), "{ok}");
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
                "messages[0].tool_calls[0]",
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
        assert!(check_messages_as(ollama.as_array().unwrap(), false).is_ok());
    }

    #[test]
    fn max_tokens_zero_is_refused_and_n_gives_each_choice_its_seed() {
        let obj = parse_object(br#"{"max_tokens": 0}"#).unwrap();
        let e = decode_options(&Fields::new(&obj, ""), &["max_tokens"]).unwrap_err();
        assert_eq!((e.status.as_u16(), e.param.as_deref()), (400, Some("max_tokens")));
        assert_eq!(choice_seed(Some(5), 0), Some(5));
        assert_ne!(choice_seed(Some(5), 1), choice_seed(Some(5), 2));
        assert_eq!(choice_seed(None, 3), None);
    }
}
