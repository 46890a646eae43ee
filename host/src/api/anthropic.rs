//! The Anthropic Messages API: `POST /v1/messages` and `POST /v1/messages/count_tokens`.
//!
//! A request is converted to the OpenAI chat shape (messages, tools, tool choice, template
//! variables) and served by the same template rendering, images, constraints, engine and chat
//! parser as `/v1/chat/completions`; the parsed reply is translated back into Anthropic content
//! blocks (`thinking`, `text`, `tool_use`), and a stream into Anthropic's server-sent events.

use super::pipeline::{self, body};
use super::{parse_object, AnthropicError, ApiError, Fields};
use crate::chat::{self, StreamParser};
use crate::constraint::{ParamError, RequestConstraints};
use crate::decoding::{DecodeOptions, FinishReason};
use crate::engine::{Event, Finish, JobImage};
use crate::sampling::SamplingParams;
use crate::state::models::Model;
use crate::state::{RequestId, Shared};
use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::State;
use axum::response::{IntoResponse, Response};
use axum::Extension;
use serde_json::{json, Map, Value};
use std::collections::HashMap;
use tokio::sync::mpsc::UnboundedReceiver;

/// The top-level fields of a Messages request.
const MESSAGE_FIELDS: &[&str] = &[
    "model",
    "max_tokens",
    "system",
    "messages",
    "tools",
    "tool_choice",
    "stop_sequences",
    "temperature",
    "top_p",
    "top_k",
    "thinking",
    "metadata",
    "stream",
    "service_tier",
    "cache_control",
    "output_config",
    "output_format",
];

/// The top-level fields of a token-counting request.
const COUNT_FIELDS: &[&str] = &[
    "model",
    "system",
    "messages",
    "tools",
    "tool_choice",
    "thinking",
    "cache_control",
    "output_config",
    "output_format",
];

/// The most stop sequences a request may carry.
const MAX_STOP_SEQUENCES: usize = 64;

/// Anthropic's smallest thinking budget.
const MIN_THINKING_BUDGET: i64 = 1024;

/// An Anthropic request in the OpenAI chat shape the rest of the server speaks.
#[derive(Debug)]
pub(crate) struct Converted {
    /// OpenAI-shaped messages (system first, `tool` messages where the results were).
    pub messages: Vec<Value>,
    /// Anthropic places (`messages[i].content[j]`) of the image blocks, in order.
    pub image_places: Vec<String>,
    /// OpenAI-shaped tools (`{"type": "function", "function": {...}}`), if any were declared.
    pub tools: Option<Value>,
    /// The OpenAI `tool_choice` the Anthropic one maps to.
    pub tool_choice: Option<Value>,
    /// The OpenAI `parallel_tool_calls` (false for `disable_parallel_tool_use`).
    pub parallel_tool_calls: Option<Value>,
    /// Template variables (`enable_thinking` from `thinking`).
    pub extra: Map<String, Value>,
    /// The OpenAI `response_format` that `output_config.format` (or the beta's top-level
    /// `output_format`) maps to.
    pub response_format: Option<Value>,
}

impl Converted {
    /// The request's constraints, with tool errors named as the Anthropic client sent them.
    fn constraints(&self) -> Result<RequestConstraints, ApiError> {
        RequestConstraints::from_openai(
            self.tools.as_ref(),
            self.tool_choice.as_ref(),
            self.parallel_tool_calls.as_ref(),
            self.response_format.as_ref(),
        )
        .map_err(anthropic_param)
    }
}

/// A constraint error named with Anthropic's field names (`input_schema`, `name`,
/// `output_config.format.schema`).
fn anthropic_param(e: ParamError) -> ApiError {
    let param = e
        .param
        .replace("response_format.json_schema", "output_config.format")
        .replace(".function.parameters", ".input_schema")
        .replace(".function.name", ".name")
        .replace(".function", "");
    ApiError::param(&param, e.message)
}

/// A 400 about one place in the request.
fn bad(place: &str, message: impl Into<String>) -> ApiError {
    ApiError::param(place, message)
}

/// The JSON type name of a value, for error messages.
fn type_name(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

/// A required string field of a block.
fn block_str<'a>(block: &'a Map<String, Value>, key: &str, place: &str) -> Result<&'a str, ApiError> {
    match block.get(key) {
        Some(Value::String(s)) => Ok(s),
        None | Some(Value::Null) => Err(bad(
            &format!("{place}.{key}"),
            format!("'{place}.{key}' is required"),
        )),
        Some(v) => Err(bad(
            &format!("{place}.{key}"),
            format!("'{place}.{key}' must be a string; got {}", type_name(v)),
        )),
    }
}

/// The text of a `system` prompt or a `tool_result` content: a string or an array of text blocks.
fn text_of(v: &Value, place: &str) -> Result<String, ApiError> {
    match v {
        Value::String(s) => Ok(s.clone()),
        Value::Array(blocks) => {
            let mut texts = Vec::with_capacity(blocks.len());
            for (j, b) in blocks.iter().enumerate() {
                let here = format!("{place}[{j}]");
                let obj = b
                    .as_object()
                    .ok_or_else(|| bad(&here, format!("'{here}' must be a content block object")))?;
                match obj.get("type").and_then(Value::as_str) {
                    Some("text") => texts.push(block_str(obj, "text", &here)?.to_string()),
                    Some(t) => {
                        return Err(bad(
                            &format!("{here}.type"),
                            format!("'{t}' blocks are not supported here; only text blocks are"),
                        ))
                    }
                    None => return Err(bad(&format!("{here}.type"), format!("'{here}.type' is required"))),
                }
            }
            Ok(texts.join("\n"))
        }
        other => Err(bad(
            place,
            format!(
                "'{place}' must be a string or an array of text blocks; got {}",
                type_name(other)
            ),
        )),
    }
}

/// The URL of an `image` block's `source`: a base64 source becomes a `data:` URL.
fn image_url(block: &Map<String, Value>, place: &str) -> Result<String, ApiError> {
    let here = format!("{place}.source");
    let source = block
        .get("source")
        .and_then(Value::as_object)
        .ok_or_else(|| bad(&here, format!("'{here}' must be an object")))?;
    match source.get("type").and_then(Value::as_str) {
        Some("base64") => {
            let media = block_str(source, "media_type", &here)?;
            let data = block_str(source, "data", &here)?;
            Ok(format!("data:{media};base64,{data}"))
        }
        Some("url") => Ok(block_str(source, "url", &here)?.to_string()),
        Some(t) => Err(bad(
            &format!("{here}.type"),
            format!("image source type '{t}' is not supported; use base64 or url"),
        )),
        None => Err(bad(&format!("{here}.type"), format!("'{here}.type' is required"))),
    }
}

/// Converts one user turn: text and images become content parts, each `tool_result` a `tool`
/// message at its place (parts before it go into a user message of their own).
fn user_turn(
    content: &[Value],
    place: &str,
    tool_names: &HashMap<String, String>,
    out: &mut Converted,
) -> Result<(), ApiError> {
    let mut parts: Vec<Value> = Vec::new();
    let flush = |parts: &mut Vec<Value>, out: &mut Converted| {
        if !parts.is_empty() {
            out.messages
                .push(json!({"role": "user", "content": std::mem::take(parts)}));
        }
    };
    for (j, b) in content.iter().enumerate() {
        let here = format!("{place}[{j}]");
        let obj = b
            .as_object()
            .ok_or_else(|| bad(&here, format!("'{here}' must be a content block object")))?;
        match obj.get("type").and_then(Value::as_str) {
            Some("text") => parts.push(json!({"type": "text", "text": block_str(obj, "text", &here)?})),
            Some("image") => {
                let url = image_url(obj, &here)?;
                out.image_places.push(here.clone());
                parts.push(json!({"type": "image_url", "image_url": {"url": url}}));
            }
            Some("tool_result") => {
                flush(&mut parts, out);
                let id = block_str(obj, "tool_use_id", &here)?;
                let mut text = match obj.get("content") {
                    None | Some(Value::Null) => String::new(),
                    Some(v) => text_of(v, &format!("{here}.content"))?,
                };
                match obj.get("is_error") {
                    None | Some(Value::Null | Value::Bool(false)) => {}
                    Some(Value::Bool(true)) => text = format!("Error: {text}"),
                    Some(v) => {
                        return Err(bad(
                            &format!("{here}.is_error"),
                            format!("'{here}.is_error' must be a boolean; got {}", type_name(v)),
                        ))
                    }
                }
                let mut m = json!({"role": "tool", "tool_call_id": id, "content": text});
                if let Some(name) = tool_names.get(id) {
                    m["name"] = name.clone().into();
                }
                out.messages.push(m);
            }
            Some(t @ ("tool_use" | "thinking" | "redacted_thinking")) => {
                return Err(bad(
                    &format!("{here}.type"),
                    format!("'{t}' blocks belong in assistant turns"),
                ))
            }
            Some(t) => {
                return Err(bad(
                    &format!("{here}.type"),
                    format!("'{t}' content blocks are not supported"),
                ))
            }
            None => return Err(bad(&format!("{here}.type"), format!("'{here}.type' is required"))),
        }
    }
    flush(&mut parts, out);
    Ok(())
}

/// Converts one assistant turn: text, thinking (as `reasoning_content`) and `tool_use` blocks (as
/// `tool_calls` with JSON-string arguments). `redacted_thinking` is opaque and left out.
fn assistant_turn(
    content: &[Value],
    place: &str,
    tool_names: &mut HashMap<String, String>,
    out: &mut Converted,
) -> Result<(), ApiError> {
    let mut text = String::new();
    let mut reasoning = String::new();
    let mut calls = Vec::new();
    for (j, b) in content.iter().enumerate() {
        let here = format!("{place}[{j}]");
        let obj = b
            .as_object()
            .ok_or_else(|| bad(&here, format!("'{here}' must be a content block object")))?;
        match obj.get("type").and_then(Value::as_str) {
            Some("text") => text.push_str(block_str(obj, "text", &here)?),
            Some("thinking") => reasoning.push_str(block_str(obj, "thinking", &here)?),
            Some("redacted_thinking") => {}
            Some("tool_use") => {
                let id = block_str(obj, "id", &here)?;
                let name = block_str(obj, "name", &here)?;
                let input = match obj.get("input") {
                    Some(v @ Value::Object(_)) => v,
                    _ => {
                        return Err(bad(
                            &format!("{here}.input"),
                            format!("'{here}.input' must be an object"),
                        ))
                    }
                };
                tool_names.insert(id.to_string(), name.to_string());
                calls.push(json!({
                    "id": id,
                    "type": "function",
                    "function": {"name": name, "arguments": input.to_string()},
                }));
            }
            Some(t @ ("image" | "tool_result")) => {
                return Err(bad(
                    &format!("{here}.type"),
                    format!("'{t}' blocks belong in user turns"),
                ))
            }
            Some(t) => {
                return Err(bad(
                    &format!("{here}.type"),
                    format!("'{t}' content blocks are not supported"),
                ))
            }
            None => return Err(bad(&format!("{here}.type"), format!("'{here}.type' is required"))),
        }
    }
    let mut m = json!({"role": "assistant", "content": text});
    if !reasoning.is_empty() {
        m["reasoning_content"] = reasoning.into();
    }
    if !calls.is_empty() {
        m["tool_calls"] = calls.into();
    }
    out.messages.push(m);
    Ok(())
}

/// Anthropic `tools` as OpenAI function tools; server tools (other `type`s) are refused.
fn convert_tools(tools: &[Value]) -> Result<Value, ApiError> {
    let mut out = Vec::with_capacity(tools.len());
    for (i, t) in tools.iter().enumerate() {
        let here = format!("tools[{i}]");
        let obj = t
            .as_object()
            .ok_or_else(|| bad(&here, format!("'{here}' must be an object")))?;
        match obj.get("type") {
            None | Some(Value::Null) => {}
            Some(Value::String(s)) if s == "custom" => {}
            Some(Value::String(s)) => {
                return Err(bad(
                    &format!("{here}.type"),
                    format!(
                        "server tool '{s}' is not supported; only custom tools (name, description, input_schema) are"
                    ),
                ))
            }
            Some(v) => {
                return Err(bad(
                    &format!("{here}.type"),
                    format!("'{here}.type' must be a string; got {}", type_name(v)),
                ))
            }
        }
        let name = block_str(obj, "name", &here)?;
        let schema = match obj.get("input_schema") {
            Some(s @ Value::Object(_)) => s.clone(),
            None | Some(Value::Null) => {
                return Err(bad(
                    &format!("{here}.input_schema"),
                    format!("'{here}.input_schema' is required"),
                ))
            }
            Some(v) => {
                return Err(bad(
                    &format!("{here}.input_schema"),
                    format!(
                        "'{here}.input_schema' must be a JSON schema object; got {}",
                        type_name(v)
                    ),
                ))
            }
        };
        let mut function = json!({"name": name, "parameters": schema});
        match obj.get("description") {
            None | Some(Value::Null) => {}
            Some(Value::String(d)) => function["description"] = d.clone().into(),
            Some(v) => {
                return Err(bad(
                    &format!("{here}.description"),
                    format!("'{here}.description' must be a string; got {}", type_name(v)),
                ))
            }
        }
        out.push(json!({"type": "function", "function": function}));
    }
    Ok(Value::Array(out))
}

/// Anthropic's `tool_choice` as OpenAI's (`auto`, `required`, a named function, `none`) and
/// `parallel_tool_calls` (false when `disable_parallel_tool_use` is set).
fn convert_tool_choice(choice: &Map<String, Value>) -> Result<(Value, Option<Value>), ApiError> {
    let f = Fields::new(choice, "tool_choice.");
    let openai = match f.str("type")? {
        Some("auto") => json!("auto"),
        Some("any") => json!("required"),
        Some("none") => json!("none"),
        Some("tool") => {
            let name = f.required_str("name")?;
            json!({"type": "function", "function": {"name": name}})
        }
        Some(t) => {
            return Err(bad(
                "tool_choice.type",
                format!("'{t}' is not one of auto, any, tool, none"),
            ))
        }
        None => return Err(bad("tool_choice.type", "'tool_choice.type' is required")),
    };
    let parallel = f
        .bool("disable_parallel_tool_use")?
        .map(|disable| Value::Bool(!disable));
    Ok((openai, parallel))
}

/// Converts an Anthropic request's conversation, tools and thinking switch to the OpenAI shape.
/// `max_tokens` (absent for token counting) bounds the thinking budget.
pub(crate) fn convert(f: &Fields<'_>, max_tokens: Option<i64>) -> Result<Converted, ApiError> {
    let mut out = Converted {
        messages: Vec::new(),
        image_places: Vec::new(),
        tools: None,
        tool_choice: None,
        parallel_tool_calls: None,
        extra: Map::new(),
        response_format: output_format(f)?,
    };
    if let Some(system) = f.raw("system") {
        let text = text_of(system, "system")?;
        if !text.is_empty() {
            out.messages.push(json!({"role": "system", "content": text}));
        }
    }
    let messages = f
        .array("messages")?
        .ok_or_else(|| bad("messages", "'messages' is required"))?;
    if messages.is_empty() {
        return Err(bad("messages", "'messages' must not be empty"));
    }
    let mut tool_names = HashMap::new();
    for (i, m) in messages.iter().enumerate() {
        let place = format!("messages[{i}]");
        let obj = m
            .as_object()
            .ok_or_else(|| bad(&place, format!("'{place}' must be an object")))?;
        let mf = Fields::new(obj, "");
        let role = mf.str("role").map_err(|_| {
            bad(
                &format!("{place}.role"),
                format!("'{place}.role' must be a string"),
            )
        })?;
        let content_place = format!("{place}.content");
        let blocks = match obj.get("content") {
            Some(Value::String(s)) => vec![json!({"type": "text", "text": s})],
            Some(Value::Array(a)) => a.clone(),
            None | Some(Value::Null) => {
                return Err(bad(&content_place, format!("'{content_place}' is required")))
            }
            Some(v) => {
                return Err(bad(
                    &content_place,
                    format!(
                        "'{content_place}' must be a string or an array of content blocks; got {}",
                        type_name(v)
                    ),
                ))
            }
        };
        match role {
            Some("user") => user_turn(&blocks, &content_place, &tool_names, &mut out)?,
            Some("assistant") => {
                if i + 1 == messages.len() {
                    return Err(bad(
                        &place,
                        "a final assistant turn (a prefill to continue) is not supported; end with a user turn",
                    ));
                }
                assistant_turn(&blocks, &content_place, &mut tool_names, &mut out)?
            }
            Some(r) => {
                return Err(bad(
                    &format!("{place}.role"),
                    format!(
                    "'{r}' is not a message role: use user or assistant (the system prompt goes in 'system')"
                ),
                ))
            }
            None => {
                return Err(bad(
                    &format!("{place}.role"),
                    format!("'{place}.role' is required"),
                ))
            }
        }
    }
    if let Some(tools) = f.array("tools")? {
        out.tools = Some(convert_tools(tools)?);
    }
    if let Some(choice) = f.object("tool_choice")? {
        let (openai, parallel) = convert_tool_choice(choice)?;
        out.tool_choice = Some(openai);
        out.parallel_tool_calls = parallel;
    }
    if let Some(thinking) = f.object("thinking")? {
        let tf = Fields::new(thinking, "thinking.");
        match tf.str("type")? {
            Some("enabled") => {
                let budget = tf
                    .int("budget_tokens", MIN_THINKING_BUDGET, u32::MAX as i64)?
                    .ok_or_else(|| bad("thinking.budget_tokens", "'thinking.budget_tokens' is required"))?;
                if let Some(max) = max_tokens.filter(|&m| budget >= m) {
                    return Err(bad(
                        "thinking.budget_tokens",
                        format!("'thinking.budget_tokens' ({budget}) must be less than 'max_tokens' ({max})"),
                    ));
                }
                out.extra.insert("enable_thinking".into(), true.into());
            }
            // The model decides how much to think: reasoning stays on.
            Some("adaptive") => {
                out.extra.insert("enable_thinking".into(), true.into());
            }
            Some("disabled") => {
                out.extra.insert("enable_thinking".into(), false.into());
            }
            Some(t) => {
                return Err(bad(
                    "thinking.type",
                    format!("'{t}' is not one of enabled, adaptive, disabled"),
                ))
            }
            None => return Err(bad("thinking.type", "'thinking.type' is required")),
        }
    }
    Ok(out)
}

/// Structured output: `output_config.format` (what the `anthropic` SDK's `messages.parse` sends),
/// or the structured-outputs beta's top-level `output_format`, both `{"type": "json_schema",
/// "schema": {...}}`, as the OpenAI `response_format` the constraint reads.
/// `output_config.effort` is accepted (one of Anthropic's levels) and changes nothing here.
fn output_format(f: &Fields<'_>) -> Result<Option<Value>, ApiError> {
    let config = f.object("output_config")?;
    let beta = f.object("output_format")?;
    if config.is_some_and(|c| c.contains_key("format")) && beta.is_some() {
        return Err(bad(
            "output_format",
            "give the format in 'output_config.format' or in 'output_format', not both",
        ));
    }
    let (format, place) = match config {
        Some(config) => {
            let cf = Fields::new(config, "output_config.");
            cf.only(&["format", "effort"])?;
            if let Some(e) = cf.str("effort")? {
                if !["low", "medium", "high", "xhigh", "max"].contains(&e) {
                    return Err(bad(
                        "output_config.effort",
                        format!("'{e}' is not one of low, medium, high, xhigh, max"),
                    ));
                }
            }
            (cf.object("format")?.or(beta), "output_config.format")
        }
        None => (beta, "output_format"),
    };
    let Some(format) = format else {
        return Ok(None);
    };
    let prefix = format!("{place}.");
    let ff = Fields::new(format, &prefix);
    ff.only(&["type", "schema"])?;
    match ff.str("type")? {
        Some("json_schema") => {}
        Some(t) => return Err(bad(&format!("{place}.type"), format!("'{t}' is not json_schema"))),
        None => {
            return Err(bad(
                &format!("{place}.type"),
                format!("'{place}.type' is required"),
            ))
        }
    }
    let schema = ff.object("schema")?.ok_or_else(|| {
        bad(
            &format!("{place}.schema"),
            format!("'{place}.schema' is required"),
        )
    })?;
    Ok(Some(json!({
        "type": "json_schema",
        "json_schema": {"name": "output", "schema": schema, "strict": true},
    })))
}

/// Sampling and stopping: `temperature` (0..1), `top_p`, `top_k`, `stop_sequences`, `max_tokens`.
fn decode_options(f: &Fields<'_>, max_tokens: i64) -> Result<DecodeOptions, ApiError> {
    let mut s = SamplingParams::default();
    if let Some(t) = f.num("temperature", 0.0, 1.0)? {
        s.temperature = t as f32;
    }
    if let Some(p) = f.num("top_p", 0.0, 1.0)? {
        s.top_p = p as f32;
    }
    if let Some(k) = f.int("top_k", 0, 1 << 20)? {
        s.top_k = k as usize;
    }
    let stop = match f.raw("stop_sequences") {
        None => Vec::new(),
        Some(Value::Array(_)) => {
            crate::decoding::parse_stop(f.raw("stop_sequences"), "stop_sequences", MAX_STOP_SEQUENCES)
                .map_err(pipeline::param_error)?
        }
        Some(v) => {
            return Err(bad(
                "stop_sequences",
                format!(
                    "'stop_sequences' must be an array of strings; got {}",
                    type_name(v)
                ),
            ))
        }
    };
    Ok(DecodeOptions {
        sampling: s,
        max_tokens: Some(max_tokens as usize),
        stop,
        ..DecodeOptions::default()
    })
}

/// The rendered prompt of a converted request on a model: (rendered text, tokens, image slices).
async fn prompt_for(
    st: &Shared,
    model: &Model,
    conv: &mut Converted,
    render_tools: Option<Vec<Value>>,
) -> Result<(String, Vec<u32>, Vec<JobImage>), ApiError> {
    if model.vision.is_none() {
        if let Some(place) = conv.image_places.first() {
            return Err(bad(
                place,
                format!("{place}: model {} does not take images", model.reference),
            ));
        }
    }
    let mut messages = std::mem::take(&mut conv.messages);
    pipeline::check_messages(&messages)?;
    let images = crate::turn::images::take_openai(&mut messages, st.image_urls).await?;
    let (mut rendered, mut prompt) = pipeline::render(model, messages, render_tools, conv.extra.clone())?;
    let mut slices = Vec::new();
    if !images.is_empty() {
        (rendered, prompt, slices) = crate::turn::images::expand(model, &rendered, &images, false)?;
    }
    Ok((rendered, prompt, slices))
}

/// The tools the template and parser see: none when `tool_choice` is `none`.
fn render_tools(conv: &Converted, rc: &RequestConstraints) -> Option<Vec<Value>> {
    if conv.tool_choice.as_ref().and_then(Value::as_str) == Some("none") {
        None
    } else {
        rc.parser_tools().map(<[Value]>::to_vec)
    }
}

/// Anthropic's `usage`: uncached prompt tokens, cache reads, and output tokens.
fn usage(fin: &Finish) -> Value {
    json!({
        "input_tokens": fin.prompt_tokens.saturating_sub(fin.cached_tokens),
        "output_tokens": fin.completion_tokens,
        "cache_read_input_tokens": fin.cached_tokens,
        "cache_creation_input_tokens": 0,
    })
}

/// Why the reply ended, in Anthropic's words, and the stop sequence that ended it.
fn stop_reason(fin: &Finish, tool_calls: bool) -> (&'static str, Option<String>) {
    if fin.reason == FinishReason::Length {
        ("max_tokens", None)
    } else if tool_calls {
        ("tool_use", None)
    } else if let Some(s) = &fin.stop_sequence {
        ("stop_sequence", Some(s.clone()))
    } else {
        ("end_turn", None)
    }
}

/// A tool call's arguments text as the `input` object (`{}` when it is not a JSON object, as
/// after a cut-off reply).
fn tool_input(arguments: &str) -> Value {
    match serde_json::from_str::<Value>(arguments) {
        Ok(v @ Value::Object(_)) => v,
        _ => json!({}),
    }
}

/// The id of a request's `index`th tool call.
fn tool_use_id(request: &str, index: usize) -> String {
    format!("toolu_{request}_{index}")
}

/// A parsed reply as Anthropic content blocks: thinking, text, then tool uses.
fn content_blocks(msg: &chat::ParsedMessage, request: &str) -> Vec<Value> {
    let mut blocks = Vec::new();
    if let Some(r) = msg.reasoning_content.as_deref().filter(|r| !r.is_empty()) {
        blocks.push(json!({"type": "thinking", "thinking": r, "signature": ""}));
    }
    if let Some(c) = msg.content.as_deref().filter(|c| !c.is_empty()) {
        blocks.push(json!({"type": "text", "text": c}));
    }
    for (i, call) in msg.tool_calls.iter().enumerate() {
        blocks.push(json!({
            "type": "tool_use",
            "id": tool_use_id(request, i),
            "name": call.name,
            "input": tool_input(&call.arguments),
        }));
    }
    blocks
}

/// One server-sent event: `event: TYPE` and its JSON `data`.
fn sse_event(out: &mut String, data: &Value) {
    let kind = data["type"].as_str().unwrap_or("message");
    out.push_str(&format!("event: {kind}\ndata: {data}\n\n"));
}

/// The content block open in a stream.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum OpenBlock {
    /// A `thinking` block.
    Thinking,
    /// A `text` block.
    Text,
    /// A `tool_use` block, for the reply's tool call of this index.
    Tool(usize),
}

/// Turns the chat parser's OpenAI deltas into Anthropic content-block events.
#[derive(Debug)]
struct BlockStream {
    /// The request id part of tool-use ids.
    request: String,
    /// The index the next block gets.
    next_index: usize,
    /// The open block and its index.
    open: Option<(OpenBlock, usize)>,
    /// Whether any tool call was streamed.
    tool_calls: bool,
}

impl BlockStream {
    /// A stream with no block yet.
    fn new(request: &str) -> BlockStream {
        BlockStream {
            request: request.to_string(),
            next_index: 0,
            open: None,
            tool_calls: false,
        }
    }

    /// Closes the open block, if any.
    fn close(&mut self, out: &mut String) {
        if let Some((_, index)) = self.open.take() {
            sse_event(out, &json!({"type": "content_block_stop", "index": index}));
        }
    }

    /// Makes `kind` the open block (closing another, starting it with `start`); its index.
    fn ensure(&mut self, kind: OpenBlock, start: Value, out: &mut String) -> usize {
        if let Some((open, index)) = self.open {
            if open == kind {
                return index;
            }
        }
        self.close(out);
        let index = self.next_index;
        self.next_index += 1;
        self.open = Some((kind, index));
        sse_event(
            out,
            &json!({"type": "content_block_start", "index": index, "content_block": start}),
        );
        index
    }

    /// The events for one parser delta (`reasoning_content`, `content`, `tool_calls`).
    fn push(&mut self, delta: &Value, out: &mut String) {
        if let Some(r) = delta["reasoning_content"].as_str().filter(|r| !r.is_empty()) {
            let start = json!({"type": "thinking", "thinking": "", "signature": ""});
            let index = self.ensure(OpenBlock::Thinking, start, out);
            let d = json!({"type": "thinking_delta", "thinking": r});
            sse_event(
                out,
                &json!({"type": "content_block_delta", "index": index, "delta": d}),
            );
        }
        if let Some(c) = delta["content"].as_str().filter(|c| !c.is_empty()) {
            let index = self.ensure(OpenBlock::Text, json!({"type": "text", "text": ""}), out);
            let d = json!({"type": "text_delta", "text": c});
            sse_event(
                out,
                &json!({"type": "content_block_delta", "index": index, "delta": d}),
            );
        }
        for call in delta["tool_calls"].as_array().into_iter().flatten() {
            let Some(call_index) = call["index"].as_u64().map(|i| i as usize) else {
                continue;
            };
            let kind = OpenBlock::Tool(call_index);
            let index = if let Some(name) = call["function"]["name"].as_str() {
                self.tool_calls = true;
                let start = json!({
                    "type": "tool_use",
                    "id": tool_use_id(&self.request, call_index),
                    "name": name,
                    "input": {},
                });
                self.ensure(kind, start, out)
            } else {
                match self.open {
                    Some((open, index)) if open == kind => index,
                    // Arguments of a call whose block is already closed cannot be sent.
                    _ => continue,
                }
            };
            if let Some(args) = call["function"]["arguments"].as_str().filter(|a| !a.is_empty()) {
                let d = json!({"type": "input_json_delta", "partial_json": args});
                sse_event(
                    out,
                    &json!({"type": "content_block_delta", "index": index, "delta": d}),
                );
            }
        }
    }
}

/// The error event that ends a stream.
fn stream_error(kind: &str, message: &str) -> String {
    let mut out = String::new();
    sse_event(
        &mut out,
        &json!({"type": "error", "error": {"type": kind, "message": message}}),
    );
    out
}

/// `POST /v1/messages`.
pub async fn messages(
    State(st): State<Shared>,
    Extension(RequestId(id)): Extension<RequestId>,
    b: Result<Bytes, BytesRejection>,
) -> Result<Response, AnthropicError> {
    create(st, id, b).await.map_err(AnthropicError)
}

/// The Messages handler, errors in the common shape.
async fn create(st: Shared, id: String, b: Result<Bytes, BytesRejection>) -> Result<Response, ApiError> {
    let body = body(b)?;
    let obj = parse_object(&body)?;
    let f = Fields::new(&obj, "");
    f.only(MESSAGE_FIELDS)?;
    let name = f.required_str("model")?;
    let max_tokens = f
        .int("max_tokens", 1, u32::MAX as i64)?
        .ok_or_else(|| bad("max_tokens", "'max_tokens' is required"))?;
    let mut conv = convert(&f, Some(max_tokens))?;
    let mut decode = decode_options(&f, max_tokens)?;
    let stream = f.bool("stream")?.unwrap_or(false);
    f.object("metadata")?;
    f.str("service_tier")?;
    f.object("cache_control")?;
    let rc = conv.constraints()?;
    let tools = render_tools(&conv, &rc);
    let model = pipeline::model_for(&st, name, None).await?;
    let (rendered, prompt, slices) = prompt_for(&st, &model, &mut conv, tools.clone()).await?;
    let start = chat::prefill(model.detected.format, &rendered);
    let thinking = pipeline::thinking(&model, start, &conv.extra);
    decode.constraint = pipeline::constraint_for(&model, &rc, thinking, start)?;
    let mut parser = StreamParser::new(model.detected.format, start, tools.as_deref());
    let prompt_len = prompt.len();
    let rx = pipeline::submit(&model, &id, prompt, slices, decode)?;
    let request = id.trim_start_matches("req-").to_string();
    let msg_id = format!("msg_{request}");
    let model_name = model.reference.clone();
    if !stream {
        let (text, fin) = pipeline::collect(rx).await?;
        parser.push(&text);
        // A cut reply is parsed as the prefix it is (see `StreamParser::finish_output`).
        let (_, msg) = parser.finish_output(fin.reason == FinishReason::Length);
        let (reason, sequence) = stop_reason(&fin, !msg.tool_calls.is_empty());
        let body = json!({
            "id": msg_id,
            "type": "message",
            "role": "assistant",
            "model": model_name,
            "content": content_blocks(&msg, &request),
            "stop_reason": reason,
            "stop_sequence": sequence,
            "usage": usage(&fin),
        });
        return Ok(axum::Json(body).into_response());
    }
    let start_event = json!({
        "type": "message_start",
        "message": {
            "id": msg_id,
            "type": "message",
            "role": "assistant",
            "model": model_name,
            "content": [],
            "stop_reason": null,
            "stop_sequence": null,
            "usage": {
                "input_tokens": prompt_len,
                "output_tokens": 0,
                "cache_read_input_tokens": 0,
                "cache_creation_input_tokens": 0,
            },
        },
    });
    struct S {
        rx: UnboundedReceiver<Event>,
        parser: StreamParser,
        blocks: BlockStream,
        first: Option<Value>,
        done: bool,
    }
    let state = S {
        rx,
        parser,
        blocks: BlockStream::new(&request),
        first: Some(start_event),
        done: false,
    };
    let stream = futures_util::stream::unfold(state, |mut s| async move {
        if s.done {
            return None;
        }
        if let Some(first) = s.first.take() {
            let mut out = String::new();
            sse_event(&mut out, &first);
            sse_event(&mut out, &json!({"type": "ping"}));
            return Some((Ok(Bytes::from(out)), s));
        }
        loop {
            match s.rx.recv().await {
                Some(Event::Text(t)) => {
                    if let Some(d) = crate::chat::openai_delta(&s.parser.push(&t)) {
                        let mut out = String::new();
                        s.blocks.push(&d, &mut out);
                        if !out.is_empty() {
                            return Some((Ok(Bytes::from(out)), s));
                        }
                    }
                }
                Some(Event::Done(fin)) => {
                    let (d, msg) = s.parser.finish_output(fin.reason == FinishReason::Length);
                    let mut out = String::new();
                    if let Some(d) = crate::chat::openai_delta(&d) {
                        s.blocks.push(&d, &mut out);
                    }
                    s.blocks.close(&mut out);
                    let calls = s.blocks.tool_calls || !msg.tool_calls.is_empty();
                    let (reason, sequence) = stop_reason(&fin, calls);
                    sse_event(
                        &mut out,
                        &json!({
                            "type": "message_delta",
                            "delta": {"stop_reason": reason, "stop_sequence": sequence},
                            "usage": usage(&fin),
                        }),
                    );
                    sse_event(&mut out, &json!({"type": "message_stop"}));
                    s.done = true;
                    return Some((Ok(Bytes::from(out)), s));
                }
                Some(Event::Error(e)) => {
                    s.done = true;
                    return Some((Ok(Bytes::from(stream_error("api_error", &e))), s));
                }
                Some(_) => {}
                None => {
                    s.done = true;
                    let e = stream_error("overloaded_error", "the model was unloaded during the request");
                    return Some((Ok(Bytes::from(e)), s));
                }
            }
        }
    });
    Ok(pipeline::sse(stream))
}

/// `POST /v1/messages/count_tokens`: the prompt tokens the same request would have.
pub async fn count_tokens(
    State(st): State<Shared>,
    b: Result<Bytes, BytesRejection>,
) -> Result<Response, AnthropicError> {
    count(st, b).await.map_err(AnthropicError)
}

/// The token-counting handler, errors in the common shape.
async fn count(st: Shared, b: Result<Bytes, BytesRejection>) -> Result<Response, ApiError> {
    let body = body(b)?;
    let obj = parse_object(&body)?;
    let f = Fields::new(&obj, "");
    f.only(COUNT_FIELDS)?;
    let name = f.required_str("model")?;
    f.object("cache_control")?;
    let mut conv = convert(&f, None)?;
    let rc = conv.constraints()?;
    let tools = render_tools(&conv, &rc);
    let model = pipeline::model_for(&st, name, None).await?;
    let (_, prompt, _) = prompt_for(&st, &model, &mut conv, tools).await?;
    if prompt.is_empty() {
        return Err(bad("messages", "the prompt is empty"));
    }
    Ok(axum::Json(json!({"input_tokens": prompt.len()})).into_response())
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::http::StatusCode;

    /// The converted request of a body, or the error's (status, param).
    fn conv(body: Value) -> Result<Converted, (StatusCode, Option<String>)> {
        let obj = body.as_object().unwrap().clone();
        let f = Fields::new(&obj, "");
        let max = f.int("max_tokens", 1, u32::MAX as i64).ok().flatten();
        convert(&f, max).map_err(|e| (e.status, e.param))
    }

    /// The param named by the 400 a body gets from the whole front half of the handler.
    fn refused(body: Value) -> (StatusCode, Option<String>, String) {
        let obj = body.as_object().unwrap().clone();
        let f = Fields::new(&obj, "");
        let check = || -> Result<(), ApiError> {
            f.only(MESSAGE_FIELDS)?;
            f.required_str("model")?;
            let max = f
                .int("max_tokens", 1, u32::MAX as i64)?
                .ok_or_else(|| bad("max_tokens", "'max_tokens' is required"))?;
            let c = convert(&f, Some(max))?;
            decode_options(&f, max)?;
            c.constraints()?;
            Ok(())
        };
        let e = check().unwrap_err();
        (e.status, e.param, e.message)
    }

    fn weather_tool() -> Value {
        json!({
            "name": "get_weather",
            "description": "Current weather of a city",
            "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
        })
    }

    #[test]
    fn blocks_become_openai_messages_in_order() {
        let c = conv(json!({
            "system": [{"type": "text", "text": "Be brief."}, {"type": "text", "text": "Be kind."}],
            "messages": [
                {"role": "user", "content": [
                    {"type": "text", "text": "Look:"},
                    {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "AAAA"}},
                    {"type": "image", "source": {"type": "url", "url": "https://example.com/a.png"}},
                ]},
                {"role": "assistant", "content": [
                    {"type": "thinking", "thinking": "They want weather.", "signature": "sig"},
                    {"type": "redacted_thinking", "data": "opaque"},
                    {"type": "text", "text": "Checking."},
                    {"type": "tool_use", "id": "toolu_1", "name": "get_weather", "input": {"city": "Paris"}},
                    {"type": "tool_use", "id": "toolu_2", "name": "get_weather", "input": {"city": "Rome"}},
                ]},
                {"role": "user", "content": [
                    {"type": "tool_result", "tool_use_id": "toolu_1", "content": "sunny"},
                    {"type": "tool_result", "tool_use_id": "toolu_2", "is_error": true,
                     "content": [{"type": "text", "text": "no station"}]},
                    {"type": "text", "text": "And so?"},
                ]},
            ],
        }))
        .unwrap();
        let m = &c.messages;
        assert_eq!(m.len(), 6, "{m:#?}");
        assert_eq!(m[0], json!({"role": "system", "content": "Be brief.\nBe kind."}));
        assert_eq!(m[1]["role"], "user");
        assert_eq!(
            m[1]["content"],
            json!([
                {"type": "text", "text": "Look:"},
                {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}},
                {"type": "image_url", "image_url": {"url": "https://example.com/a.png"}},
            ])
        );
        assert_eq!(
            c.image_places,
            vec!["messages[0].content[1]", "messages[0].content[2]"]
        );
        assert_eq!(m[2]["role"], "assistant");
        assert_eq!(m[2]["content"], "Checking.");
        assert_eq!(m[2]["reasoning_content"], "They want weather.");
        let calls = m[2]["tool_calls"].as_array().unwrap();
        assert_eq!(calls.len(), 2);
        assert_eq!(calls[0]["id"], "toolu_1");
        assert_eq!(calls[0]["type"], "function");
        assert_eq!(calls[0]["function"]["name"], "get_weather");
        let args: Value = serde_json::from_str(calls[0]["function"]["arguments"].as_str().unwrap()).unwrap();
        assert_eq!(args, json!({"city": "Paris"}));
        assert_eq!(
            m[3],
            json!({"role": "tool", "tool_call_id": "toolu_1", "content": "sunny", "name": "get_weather"})
        );
        assert_eq!(m[4]["content"], "Error: no station");
        assert_eq!(m[4]["tool_call_id"], "toolu_2");
        assert_eq!(
            m[5],
            json!({"role": "user", "content": [{"type": "text", "text": "And so?"}]})
        );
        assert!(pipeline::check_messages(m).is_ok());
    }

    #[test]
    fn string_content_and_no_system() {
        let c = conv(json!({"messages": [{"role": "user", "content": "Hi"}]})).unwrap();
        assert_eq!(
            c.messages,
            vec![json!({"role": "user", "content": [{"type": "text", "text": "Hi"}]})]
        );
        assert!(c.tools.is_none() && c.tool_choice.is_none() && c.extra.is_empty());
    }

    #[test]
    fn tool_choice_maps_to_openai() {
        let with = |choice: Value| {
            conv(json!({
                "max_tokens": 10,
                "messages": [{"role": "user", "content": "Hi"}],
                "tools": [weather_tool()],
                "tool_choice": choice,
            }))
            .unwrap()
        };
        let c = with(json!({"type": "auto"}));
        assert_eq!(
            (c.tool_choice, c.parallel_tool_calls),
            (Some(json!("auto")), None)
        );
        let c = with(json!({"type": "any", "disable_parallel_tool_use": true}));
        assert_eq!(
            (c.tool_choice.clone(), c.parallel_tool_calls.clone()),
            (Some(json!("required")), Some(json!(false)))
        );
        assert!(c.constraints().is_ok());
        let c = with(json!({"type": "tool", "name": "get_weather", "disable_parallel_tool_use": false}));
        assert_eq!(
            (c.tool_choice.clone(), c.parallel_tool_calls.clone()),
            (
                Some(json!({"type": "function", "function": {"name": "get_weather"}})),
                Some(json!(true))
            )
        );
        assert!(c.constraints().is_ok());
        let c = with(json!({"type": "none"}));
        assert_eq!(c.tool_choice, Some(json!("none")));
        let rc = c.constraints().unwrap();
        assert!(
            render_tools(&c, &rc).is_none(),
            "tool_choice none hides the tools"
        );
        let c = with(json!({"type": "auto"}));
        let rc = c.constraints().unwrap();
        let tools = render_tools(&c, &rc).unwrap();
        assert_eq!(tools[0]["function"]["name"], "get_weather");
        assert_eq!(tools[0]["function"]["parameters"]["required"], json!(["city"]));
        assert_eq!(tools[0]["function"]["description"], "Current weather of a city");
        // A named tool that is not declared.
        let c = with(json!({"type": "tool", "name": "nope"}));
        assert_eq!(c.constraints().unwrap_err().param.as_deref(), Some("tool_choice"));
    }

    #[test]
    fn thinking_sets_the_template_switch() {
        let base = |thinking: Value| {
            conv(json!({
                "max_tokens": 4096,
                "messages": [{"role": "user", "content": "Hi"}],
                "thinking": thinking,
            }))
        };
        let c = base(json!({"type": "enabled", "budget_tokens": 2048})).unwrap();
        assert_eq!(c.extra["enable_thinking"], json!(true));
        let c = base(json!({"type": "disabled"})).unwrap();
        assert_eq!(c.extra["enable_thinking"], json!(false));
        for bad in [
            json!({"type": "enabled"}),
            json!({"type": "enabled", "budget_tokens": 100}),
            json!({"type": "enabled", "budget_tokens": 5000}),
        ] {
            assert_eq!(
                base(bad.clone()).unwrap_err(),
                (
                    StatusCode::BAD_REQUEST,
                    Some("thinking.budget_tokens".to_string())
                ),
                "{bad}"
            );
        }
        assert_eq!(
            base(json!({"type": "sometimes"})).unwrap_err().1.as_deref(),
            Some("thinking.type")
        );
    }

    #[test]
    fn bad_fields_are_400s_naming_them() {
        let ok = json!({"model": "m", "max_tokens": 8, "messages": [{"role": "user", "content": "Hi"}]});
        let with = |key: &str, v: Value| {
            let mut b = ok.clone();
            b[key] = v;
            b
        };
        let without = |key: &str| {
            let mut b = ok.clone();
            b.as_object_mut().unwrap().remove(key);
            b
        };
        let cases: Vec<(Value, &str)> = vec![
            (with("frobnicate", json!(1)), "frobnicate"),
            (without("max_tokens"), "max_tokens"),
            (without("model"), "model"),
            (without("messages"), "messages"),
            (with("max_tokens", json!(0)), "max_tokens"),
            (with("max_tokens", json!("8")), "max_tokens"),
            (with("temperature", json!(1.5)), "temperature"),
            (with("top_p", json!("x")), "top_p"),
            (with("top_k", json!(-1)), "top_k"),
            (with("stop_sequences", json!("END")), "stop_sequences"),
            (with("stop_sequences", json!(["a", 1])), "stop_sequences"),
            (with("system", json!(7)), "system"),
            (with("messages", json!([])), "messages"),
            (with("messages", json!({"role": "user"})), "messages"),
            (
                with("messages", json!([{"role": "system", "content": "x"}])),
                "messages[0].role",
            ),
            (with("messages", json!([{"role": "user"}])), "messages[0].content"),
            (
                with("messages", json!([{"role": "user", "content": 5}])),
                "messages[0].content",
            ),
            (
                with(
                    "messages",
                    json!([{"role": "user", "content": [{"type": "document", "source": {}}]}]),
                ),
                "messages[0].content[0].type",
            ),
            (
                with(
                    "messages",
                    json!([{"role": "user", "content": [{"type": "tool_use", "id": "a", "name": "f", "input": {}}]}]),
                ),
                "messages[0].content[0].type",
            ),
            (
                with(
                    "messages",
                    json!([
                        {"role": "assistant", "content": [{"type": "tool_use", "id": "a", "name": "f", "input": "x"}]},
                        {"role": "user", "content": "ok"},
                    ]),
                ),
                "messages[0].content[0].input",
            ),
            (
                with(
                    "messages",
                    json!([{"role": "user", "content": [{"type": "tool_result", "content": "x"}]}]),
                ),
                "messages[0].content[0].tool_use_id",
            ),
            (
                with(
                    "messages",
                    json!([{"role": "user", "content": [{"type": "image", "source": {"type": "file", "file_id": "f"}}]}]),
                ),
                "messages[0].content[0].source.type",
            ),
            (
                with(
                    "messages",
                    json!([{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "The answer is"}]),
                ),
                "messages[1]",
            ),
            (
                with(
                    "tools",
                    json!([{"type": "web_search_20250305", "name": "web_search"}]),
                ),
                "tools[0].type",
            ),
            (with("tools", json!([{"name": "f"}])), "tools[0].input_schema"),
            (
                with(
                    "tools",
                    json!([{"name": "bad name!", "input_schema": {"type": "object"}}]),
                ),
                "tools[0].name",
            ),
            (with("tool_choice", json!("auto")), "tool_choice"),
            (
                with("tool_choice", json!({"type": "sometimes"})),
                "tool_choice.type",
            ),
            (with("tool_choice", json!({"type": "tool"})), "tool_choice.name"),
            (with("tool_choice", json!({"type": "any"})), "tool_choice"),
        ];
        for (body, param) in cases {
            let (status, got, message) = refused(body.clone());
            assert_eq!(
                (status, got.as_deref()),
                (StatusCode::BAD_REQUEST, Some(param)),
                "{body} -> {message}"
            );
        }
        let (_, _, message) = refused(with("tools", json!([{"type": "bash_20250124", "name": "bash"}])));
        assert!(message.contains("not supported"), "{message}");
        let (_, _, message) = refused(with("frobnicate", json!(1)));
        assert!(message.contains("frobnicate"), "{message}");
        // The accepted fields pass.
        let mut b = ok.clone();
        for (k, v) in [
            ("metadata", json!({"user_id": "u"})),
            ("service_tier", json!("auto")),
            ("stream", json!(false)),
            ("temperature", json!(0)),
            ("top_p", json!(0.9)),
            ("top_k", json!(5)),
            ("stop_sequences", json!(["END"])),
            ("tools", json!([weather_tool()])),
            ("tool_choice", json!({"type": "auto"})),
        ] {
            b[k] = v;
        }
        let obj = b.as_object().unwrap().clone();
        let f = Fields::new(&obj, "");
        assert!(f.only(MESSAGE_FIELDS).is_ok());
        let d = decode_options(&f, 8).unwrap();
        assert_eq!((d.max_tokens, d.stop.clone()), (Some(8), vec!["END".to_string()]));
        assert_eq!((d.sampling.temperature, d.sampling.top_k), (0.0, 5));
    }

    #[tokio::test]
    async fn errors_answer_in_anthropic_shape() {
        let resp =
            crate::api::Shape::Anthropic.respond(ApiError::param("max_tokens", "'max_tokens' is required"));
        assert_eq!(resp.status(), StatusCode::BAD_REQUEST);
        let bytes = axum::body::to_bytes(resp.into_body(), 1 << 16).await.unwrap();
        let v: Value = serde_json::from_slice(&bytes).unwrap();
        assert_eq!(
            v,
            json!({"type": "error", "error": {"type": "invalid_request_error", "message": "'max_tokens' is required"}})
        );
        let resp = crate::api::Shape::Anthropic.respond(ApiError::model_not_found("nope"));
        assert_eq!(resp.status(), StatusCode::NOT_FOUND);
        let bytes = axum::body::to_bytes(resp.into_body(), 1 << 16).await.unwrap();
        let v: Value = serde_json::from_slice(&bytes).unwrap();
        assert_eq!(v["error"]["type"], "not_found_error");
        assert!(v["error"]["message"].as_str().unwrap().contains("nope"));
        // A message that does not name its parameter gets it prefixed.
        let resp = crate::api::Shape::Anthropic.respond(ApiError::param(
            "tools[0].input_schema",
            "must be a JSON schema object",
        ));
        let bytes = axum::body::to_bytes(resp.into_body(), 1 << 16).await.unwrap();
        let v: Value = serde_json::from_slice(&bytes).unwrap();
        assert_eq!(
            v["error"]["message"],
            "tools[0].input_schema: must be a JSON schema object"
        );
        for (status, kind) in [
            (StatusCode::PAYLOAD_TOO_LARGE, "request_too_large"),
            (StatusCode::TOO_MANY_REQUESTS, "rate_limit_error"),
            (StatusCode::SERVICE_UNAVAILABLE, "overloaded_error"),
            (StatusCode::INTERNAL_SERVER_ERROR, "api_error"),
        ] {
            let resp = crate::api::Shape::Anthropic.respond(ApiError::new(status, "x"));
            let bytes = axum::body::to_bytes(resp.into_body(), 1 << 16).await.unwrap();
            let v: Value = serde_json::from_slice(&bytes).unwrap();
            assert_eq!(v["error"]["type"], kind);
        }
    }

    /// The (event, data) pairs of an SSE text.
    fn events(text: &str) -> Vec<(String, Value)> {
        text.split("\n\n")
            .filter(|e| !e.is_empty())
            .map(|e| {
                let (event, data) = e.split_once('\n').unwrap();
                let event = event.strip_prefix("event: ").unwrap().to_string();
                let data: Value = serde_json::from_str(data.strip_prefix("data: ").unwrap()).unwrap();
                assert_eq!(data["type"], event.as_str());
                (event, data)
            })
            .collect()
    }

    #[test]
    fn parser_deltas_become_content_block_events() {
        let mut b = BlockStream::new("7");
        let mut out = String::new();
        b.push(&json!({"reasoning_content": "Hmm"}), &mut out);
        b.push(&json!({"reasoning_content": " ok"}), &mut out);
        b.push(&json!({"content": "Sure."}), &mut out);
        b.push(
            &json!({"tool_calls": [{"index": 0, "id": "call_0", "type": "function",
                    "function": {"name": "get_weather", "arguments": "{\"ci"}}]}),
            &mut out,
        );
        b.push(
            &json!({"tool_calls": [{"index": 0, "function": {"arguments": "ty\": \"Paris\"}"}}]}),
            &mut out,
        );
        b.push(
            &json!({"tool_calls": [{"index": 1, "id": "call_1", "type": "function",
                    "function": {"name": "get_weather", "arguments": ""}}]}),
            &mut out,
        );
        b.close(&mut out);
        let ev = events(&out);
        let kinds: Vec<&str> = ev.iter().map(|(k, _)| k.as_str()).collect();
        assert_eq!(
            kinds,
            [
                "content_block_start",
                "content_block_delta",
                "content_block_delta",
                "content_block_stop",
                "content_block_start",
                "content_block_delta",
                "content_block_stop",
                "content_block_start",
                "content_block_delta",
                "content_block_delta",
                "content_block_stop",
                "content_block_start",
                "content_block_stop",
            ]
        );
        assert_eq!(ev[0].1["content_block"]["type"], "thinking");
        assert_eq!(
            ev[1].1["delta"],
            json!({"type": "thinking_delta", "thinking": "Hmm"})
        );
        assert_eq!(ev[4].1["index"], 1);
        assert_eq!(ev[5].1["delta"], json!({"type": "text_delta", "text": "Sure."}));
        assert_eq!(
            ev[7].1["content_block"],
            json!({"type": "tool_use", "id": "toolu_7_0", "name": "get_weather", "input": {}})
        );
        let joined: String = ev[8..10]
            .iter()
            .map(|(_, d)| d["delta"]["partial_json"].as_str().unwrap())
            .collect();
        assert_eq!(
            serde_json::from_str::<Value>(&joined).unwrap(),
            json!({"city": "Paris"})
        );
        assert_eq!(ev[11].1["index"], 3);
        assert_eq!(ev[11].1["content_block"]["id"], "toolu_7_1");
        assert!(b.tool_calls);
    }

    fn finish(reason: FinishReason, stop: Option<&str>) -> Finish {
        Finish {
            reason,
            prompt_tokens: 10,
            cached_tokens: 4,
            completion_tokens: 3,
            prompt_duration: Default::default(),
            generation_duration: Default::default(),
            stop_sequence: stop.map(str::to_string),
        }
    }

    #[test]
    fn stop_reasons_and_usage() {
        assert_eq!(
            stop_reason(&finish(FinishReason::Stop, None), false),
            ("end_turn", None)
        );
        assert_eq!(
            stop_reason(&finish(FinishReason::Stop, Some("END")), false),
            ("stop_sequence", Some("END".to_string()))
        );
        assert_eq!(
            stop_reason(&finish(FinishReason::Stop, None), true),
            ("tool_use", None)
        );
        assert_eq!(
            stop_reason(&finish(FinishReason::Length, None), true),
            ("max_tokens", None)
        );
        assert_eq!(
            usage(&finish(FinishReason::Stop, None)),
            json!({"input_tokens": 6, "output_tokens": 3, "cache_read_input_tokens": 4, "cache_creation_input_tokens": 0})
        );
        let msg = chat::ParsedMessage {
            reasoning_content: Some("r".into()),
            content: Some("t".into()),
            tool_calls: vec![chat::ToolCall {
                id: "call_0".into(),
                name: "f".into(),
                arguments: "{\"a\": 1}".into(),
            }],
        };
        assert_eq!(
            content_blocks(&msg, "9"),
            vec![
                json!({"type": "thinking", "thinking": "r", "signature": ""}),
                json!({"type": "text", "text": "t"}),
                json!({"type": "tool_use", "id": "toolu_9_0", "name": "f", "input": {"a": 1}}),
            ]
        );
        assert_eq!(tool_input("{\"a\": "), json!({}));
    }
}
