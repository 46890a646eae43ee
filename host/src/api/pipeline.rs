//! The generation pipeline every API shares: the request body and model lookup, rendering a
//! conversation to a prompt, the constraint for tools and formats, submitting to the engine,
//! collecting or streaming what comes back, and the checks on chat messages.

use super::body::{self, Parsed, RequestBody};
use super::ApiError;
use crate::chat::{ChatFormat, ParseStart};
use crate::constraint::{ParamError, RequestConstraints, SequenceConstraint};
use crate::decoding::{DecodeOptions, FinishReason};
use crate::engine::{Event, Finish, Job, JobImage, Sibling, SubmitError};
use crate::harmony::{HarmonyInput, ReasoningEffort};
use crate::sampling::TokenLogprobs;
use crate::state::models::{Model, ModelError};
use crate::state::Shared;
use crate::template::RenderInput;
use axum::body::{Body, Bytes};
use axum::extract::rejection::BytesRejection;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde_json::{json, Map, Value};
use std::convert::Infallible;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};
use tokio::sync::mpsc::{unbounded_channel, UnboundedReceiver};

/// Seconds since the Unix epoch (`created` fields).
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

    /// The decode options it asks for, before the model is known (`json`: the whole body, for
    /// the fields typed as parts of it).
    fn decode_options(&self, json: &Map<String, Value>) -> Result<DecodeOptions, ApiError>;

    /// Its tools and response format, checked (none by default).
    fn constraints(&self) -> Result<RequestConstraints, ApiError> {
        RequestConstraints::from_ollama(None, None).map_err(param_error)
    }

    /// The chat template variables it sets (`think`, `reasoning_effort`, ...).
    fn template_extra(&self, _json: &Map<String, Value>) -> Result<Map<String, Value>, ApiError> {
        Ok(Map::new())
    }

    /// Settles the decode options against the model (OpenAI's `logit_bias` and its vocabulary).
    fn with_model(&self, _decode: &mut DecodeOptions, _model: &Model) -> Result<(), ApiError> {
        Ok(())
    }
}

/// A generating request after the preamble every handler shares.
pub(crate) struct Prepared<T> {
    /// The typed, validated body.
    pub request: T,
    /// The body as sent (messages, tools and formats are handed on as JSON).
    pub json: Map<String, Value>,
    /// Its decode options (no constraint yet).
    pub decode: DecodeOptions,
    /// Its tools and response format.
    pub constraints: RequestConstraints,
    /// Its chat template variables.
    pub extra: Map<String, Value>,
    /// The model, loaded.
    pub model: Arc<Model>,
    /// The keep-alive it asked for.
    pub keep_alive: Option<Option<Duration>>,
}

/// The preamble of every generating handler: the body (axum's rejections in the API's shape),
/// parsed into its typed request and validated; its model named (400 when not); its decode
/// options, constraints and template variables; then the model looked up and loaded with its
/// keep-alive (404 `model_not_found`; a model another request is loading is waited for). Every 400 comes before the lookup.
pub(crate) async fn prepare<T: GenerationBody>(
    st: &Shared,
    b: Result<Bytes, BytesRejection>,
) -> Result<Prepared<T>, ApiError> {
    let checked = check_body::<T>(&body(b)?)?;
    let name = checked.request.model_name().unwrap_or_default();
    let keep_alive = checked.request.keep_alive();
    let model = model_for(st, name, keep_alive).await?;
    let mut decode = checked.decode;
    checked.request.with_model(&mut decode, &model)?;
    Ok(Prepared {
        request: checked.request,
        json: checked.json,
        decode,
        constraints: checked.constraints,
        extra: checked.extra,
        model,
        keep_alive,
    })
}

/// A generating request's body, checked as far as it can be without the model.
pub(crate) struct CheckedBody<T> {
    /// The typed, validated body.
    pub request: T,
    /// The body as sent.
    pub json: Map<String, Value>,
    /// Its decode options (no constraint, no `logit_bias` yet).
    pub decode: DecodeOptions,
    /// Its tools and response format.
    pub constraints: RequestConstraints,
    /// Its chat template variables.
    pub extra: Map<String, Value>,
}

/// The part of [`prepare`] before the model: parse, validate, a model named, decode options,
/// constraints and template variables. Every 400 about the body's own fields comes from here.
pub(crate) fn check_body<T: GenerationBody>(bytes: &[u8]) -> Result<CheckedBody<T>, ApiError> {
    let Parsed { request, json } = body::parse::<T>(bytes)?;
    if request.model_name().is_none() {
        return Err(ApiError::param("model", "'model' is required"));
    }
    let decode = request.decode_options(&json)?;
    let constraints = request.constraints()?;
    let extra = request.template_extra(&json)?;
    Ok(CheckedBody {
        request,
        json,
        decode,
        constraints,
        extra,
    })
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

/// Checks the messages' shape; `openai`: a tool message must name its `tool_call_id` (Ollama's
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

/// OpenAI's `usage` object of one finished generation.
pub(crate) fn usage(fin: &Finish) -> Value {
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
            Event::Error(e) => return Err(ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, e)),
        }
    }
    Err(ApiError::new(
        StatusCode::SERVICE_UNAVAILABLE,
        "the model was unloaded during the request",
    ))
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

/// One server-sent event carrying a JSON payload.
pub(crate) fn data(v: &Value) -> Bytes {
    Bytes::from(format!("data: {v}\n\n"))
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
