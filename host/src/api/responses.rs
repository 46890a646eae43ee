//! OpenAI's Responses API: `POST /v1/responses`, `GET /v1/responses/{id}` and
//! `DELETE /v1/responses/{id}`, over the same engine, chat parsing and constraints as
//! `/v1/chat/completions`. A request's input items become chat messages, its flat function tools
//! and `text.format` become chat `tools` / `response_format`, and the parsed reply becomes output
//! items (reasoning, message, function calls). Stored responses live in a bounded in-memory
//! [`ResponseStore`] so that `previous_response_id` can continue a conversation.

use super::openai::{decode_options, template_extra};
use super::pipeline::{
    body, check_messages, constraint_for, model_for, now_secs, param_error, refuse_images, render, sse,
    submit, thinking,
};
use super::{parse_object, ApiError, Fields};
use crate::chat::{self, ParsedMessage, StreamParser};
use crate::constraint::RequestConstraints;
use crate::decoding::FinishReason;
use crate::engine::{Event, Finish};
use crate::state::models::Model;
pub use crate::state::responses::{ResponseStore, StoredResponse, STORE_CAPACITY, STORE_TTL};
use crate::state::{RequestId, Shared};
use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Extension;
use serde_json::{json, Map, Value};
use std::convert::Infallible;
use std::sync::Arc;
use tokio::sync::mpsc::{unbounded_channel, UnboundedReceiver, UnboundedSender};

/// The request fields `/v1/responses` accepts; any other is a 400 naming it.
const RESPONSE_FIELDS: &[&str] = &[
    "model",
    "input",
    "instructions",
    "tools",
    "tool_choice",
    "parallel_tool_calls",
    "reasoning",
    "text",
    "max_output_tokens",
    "temperature",
    "top_p",
    "stream",
    "stream_options",
    "store",
    "previous_response_id",
    "metadata",
    "user",
    "truncation",
    "include",
    "service_tier",
    "background",
    "prompt_cache_key",
    "safety_identifier",
    "prompt_cache_retention",
    "max_tool_calls",
    "top_logprobs",
];

/// The chat conversation of a request: messages in the chat-completions shape, and for each the
/// request place it came from (`input[2]`, `instructions`, `previous_response_id`), to name in
/// errors.
#[derive(Debug, Default, PartialEq)]
pub(crate) struct ChatConversation {
    /// Chat messages.
    pub messages: Vec<Value>,
    /// Where each message came from.
    pub origins: Vec<String>,
}

/// `input` as a list of items: a string is one user message.
pub(crate) fn input_items(input: Option<&Value>) -> Result<Vec<Value>, ApiError> {
    match input {
        None | Some(Value::Null) => Ok(Vec::new()),
        Some(Value::String(s)) => Ok(vec![json!({"type": "message", "role": "user", "content": s})]),
        Some(Value::Array(items)) => Ok(items.clone()),
        Some(_) => Err(ApiError::param(
            "input",
            "'input' must be a string or an array of input items",
        )),
    }
}

/// Replaces each `item_reference` input item with the stored item it names (`lookup`: an item
/// of a stored response by id); an id nothing stored holds is a 400 naming the item.
pub(crate) fn resolve_references(
    items: Vec<Value>,
    lookup: impl Fn(&str) -> Option<Value>,
) -> Result<Vec<Value>, ApiError> {
    items
        .into_iter()
        .enumerate()
        .map(|(i, item)| {
            if item.get("type").and_then(Value::as_str) != Some("item_reference") {
                return Ok(item);
            }
            let place = format!("input[{i}].id");
            match item.get("id") {
                Some(Value::String(id)) => lookup(id).ok_or_else(|| {
                    bad(
                        &place,
                        format!("Item with id '{id}' not found (items of stored responses can be referenced while the response is kept)."),
                    )
                }),
                _ => Err(bad(&place, format!("'{place}' must be a string"))),
            }
        })
        .collect()
}

fn bad(place: &str, message: impl Into<String>) -> ApiError {
    ApiError::param(place, message)
}

/// The text of a string field of an item.
fn item_str<'a>(o: &'a Map<String, Value>, place: &str, key: &str) -> Result<&'a str, ApiError> {
    match o.get(key) {
        Some(Value::String(s)) => Ok(s),
        None | Some(Value::Null) => Err(bad(
            &format!("{place}.{key}"),
            format!("'{place}.{key}' is required"),
        )),
        Some(_) => Err(bad(
            &format!("{place}.{key}"),
            format!("'{place}.{key}' must be a string"),
        )),
    }
}

/// A message item's content as chat content: a string, or chat parts when it holds images.
fn message_content(content: Option<&Value>, place: &str, role: &str) -> Result<Value, ApiError> {
    let parts = match content {
        Some(Value::String(s)) => return Ok(Value::String(s.clone())),
        Some(Value::Array(parts)) => parts,
        None | Some(Value::Null) => {
            return Err(bad(
                &format!("{place}.content"),
                format!("'{place}.content' is required"),
            ))
        }
        Some(_) => {
            return Err(bad(
                &format!("{place}.content"),
                format!("'{place}.content' must be a string or an array of content parts"),
            ))
        }
    };
    let mut chat_parts = Vec::with_capacity(parts.len());
    let mut images = false;
    for (j, part) in parts.iter().enumerate() {
        let p = format!("{place}.content[{j}]");
        let Some(o) = part.as_object() else {
            return Err(bad(&p, format!("'{p}' must be an object with a 'type'")));
        };
        match o.get("type").and_then(Value::as_str) {
            Some("input_text" | "output_text") => {
                chat_parts.push(json!({"type": "text", "text": item_str(o, &p, "text")?}));
            }
            Some("refusal") => {
                chat_parts.push(json!({"type": "text", "text": item_str(o, &p, "refusal")?}));
            }
            Some("input_image") => {
                if role == "assistant" {
                    return Err(bad(&p, format!("{p}: an assistant message cannot hold images")));
                }
                let url = match o.get("image_url") {
                    Some(Value::String(u)) if !u.is_empty() => u.clone(),
                    _ if o.get("file_id").is_some_and(|v| !v.is_null()) => {
                        return Err(bad(
                            &format!("{p}.file_id"),
                            format!("{p}: images by 'file_id' are not supported; send 'image_url' (a data: or http(s) URL)"),
                        ))
                    }
                    _ => return Err(bad(&format!("{p}.image_url"), format!("'{p}.image_url' is required"))),
                };
                images = true;
                chat_parts.push(json!({"type": "image_url", "image_url": {"url": url}}));
            }
            Some(t @ ("input_file" | "input_audio")) => {
                return Err(bad(
                    &p,
                    format!("{p}: content parts of type '{t}' are not supported"),
                ))
            }
            Some(t) => {
                return Err(bad(
                    &format!("{p}.type"),
                    format!("{p}: unknown content part type '{t}'"),
                ))
            }
            None => return Err(bad(&format!("{p}.type"), format!("'{p}.type' is required"))),
        }
    }
    if images {
        return Ok(Value::Array(chat_parts));
    }
    let text: String = chat_parts
        .iter()
        .filter_map(|p| p.get("text").and_then(Value::as_str))
        .collect();
    Ok(Value::String(text))
}

/// The text of a reasoning item: its `reasoning_text` content, else its summary.
fn reasoning_text(o: &Map<String, Value>, place: &str) -> Result<String, ApiError> {
    let texts = |key: &str| -> Result<Option<String>, ApiError> {
        match o.get(key) {
            None | Some(Value::Null) => Ok(None),
            Some(Value::Array(parts)) => {
                let mut text = String::new();
                for (j, part) in parts.iter().enumerate() {
                    let p = format!("{place}.{key}[{j}]");
                    let t = part
                        .get("text")
                        .and_then(Value::as_str)
                        .ok_or_else(|| bad(&p, format!("'{p}' must be an object with a 'text'")))?;
                    text.push_str(t);
                }
                Ok(Some(text))
            }
            Some(_) => Err(bad(
                &format!("{place}.{key}"),
                format!("'{place}.{key}' must be an array"),
            )),
        }
    };
    let content = texts("content")?;
    let summary = texts("summary")?;
    Ok(content.filter(|t| !t.is_empty()).or(summary).unwrap_or_default())
}

/// Converts Responses input items into chat messages. `instructions` comes first as a system
/// message; the first `inherited` items come from `previous_response_id`. A `reasoning` item
/// becomes the `reasoning_content` of the assistant turn that follows it; consecutive
/// `function_call` items join one assistant message's `tool_calls`.
pub(crate) fn to_chat(
    instructions: Option<&str>,
    items: &[Value],
    inherited: usize,
) -> Result<ChatConversation, ApiError> {
    let mut conv = ChatConversation::default();
    if let Some(text) = instructions {
        conv.messages.push(json!({"role": "system", "content": text}));
        conv.origins.push("instructions".into());
    }
    let mut reasoning: Option<String> = None;
    // Whether the last message is an assistant turn that later function calls may join.
    let mut open_assistant = false;
    for (i, item) in items.iter().enumerate() {
        let place = if i < inherited {
            "previous_response_id".to_string()
        } else {
            format!("input[{}]", i - inherited)
        };
        let Some(o) = item.as_object() else {
            return Err(bad(&place, format!("'{place}' must be an object")));
        };
        let kind = match o.get("type") {
            None | Some(Value::Null) if o.contains_key("role") => "message",
            Some(Value::String(t)) => t.as_str(),
            _ => {
                return Err(bad(
                    &format!("{place}.type"),
                    format!("'{place}.type' is required"),
                ))
            }
        };
        match kind {
            "message" => {
                let role = match o.get("role").and_then(Value::as_str) {
                    Some(r @ ("user" | "system" | "assistant")) => r,
                    Some("developer") => "system",
                    Some(r) => return Err(bad(&format!("{place}.role"), format!("{place}: unknown role '{r}'"))),
                    None => return Err(bad(&format!("{place}.role"), format!("'{place}.role' is required"))),
                };
                let content = message_content(o.get("content"), &place, role)?;
                let mut m = json!({"role": role, "content": content});
                if role == "assistant" {
                    if let Some(r) = reasoning.take() {
                        m["reasoning_content"] = r.into();
                    }
                } else if reasoning.is_some() {
                    // Reasoning followed by something other than an assistant turn has nothing
                    // to belong to: it is dropped, as a chat template would drop it.
                    reasoning = None;
                }
                open_assistant = role == "assistant";
                conv.messages.push(m);
                conv.origins.push(place);
            }
            "function_call" => {
                let call_id = item_str(o, &place, "call_id")?;
                let name = item_str(o, &place, "name")?;
                let arguments = item_str(o, &place, "arguments")?;
                let call = json!({"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}});
                let joined = match conv.messages.last_mut() {
                    Some(last) if open_assistant => {
                        if let Some(r) = reasoning.take() {
                            let before = last.get("reasoning_content").and_then(Value::as_str).unwrap_or("");
                            last["reasoning_content"] = format!("{before}{r}").into();
                        }
                        match last.get_mut("tool_calls").and_then(Value::as_array_mut) {
                            Some(calls) => calls.push(call.clone()),
                            None => last["tool_calls"] = json!([call.clone()]),
                        }
                        true
                    }
                    _ => false,
                };
                if !joined {
                    let mut m = json!({"role": "assistant", "content": null, "tool_calls": [call]});
                    if let Some(r) = reasoning.take() {
                        m["reasoning_content"] = r.into();
                    }
                    conv.messages.push(m);
                    conv.origins.push(place);
                    open_assistant = true;
                }
            }
            "function_call_output" => {
                let call_id = item_str(o, &place, "call_id")?;
                let output = match o.get("output") {
                    Some(Value::String(s)) => s.clone(),
                    Some(Value::Array(_)) => match message_content(o.get("output"), &place, "tool")? {
                        Value::String(s) => s,
                        _ => {
                            return Err(bad(
                                &format!("{place}.output"),
                                format!("{place}: a function call output holds text only"),
                            ))
                        }
                    },
                    None | Some(Value::Null) => {
                        return Err(bad(&format!("{place}.output"), format!("'{place}.output' is required")))
                    }
                    Some(_) => {
                        return Err(bad(
                            &format!("{place}.output"),
                            format!("'{place}.output' must be a string"),
                        ))
                    }
                };
                let name = conv
                    .messages
                    .iter()
                    .rev()
                    .filter_map(|m| m.get("tool_calls").and_then(Value::as_array))
                    .flatten()
                    .find(|c| c.get("id").and_then(Value::as_str) == Some(call_id))
                    .and_then(|c| c.pointer("/function/name").cloned());
                let mut m = json!({"role": "tool", "tool_call_id": call_id, "content": output});
                if let Some(name) = name {
                    m["name"] = name;
                }
                conv.messages.push(m);
                conv.origins.push(place);
                open_assistant = false;
                reasoning = None;
            }
            "reasoning" => {
                let text = reasoning_text(o, &place)?;
                let before = reasoning.take().unwrap_or_default();
                reasoning = Some(before + &text);
            }
            "item_reference" => {
                // resolve_references replaced every reference the request held.
                return Err(bad(&place, format!("{place}: unresolved 'item_reference'")));
            }
            other => {
                return Err(bad(
                    &format!("{place}.type"),
                    format!("{place}: input items of type '{other}' are not supported (message, function_call, function_call_output and reasoning are)"),
                ))
            }
        }
    }
    Ok(conv)
}

/// Responses' flat function tools (`{type, name, description, parameters, strict}`) in the chat
/// shape (`{type, function: {...}}`); any other tool type is a 400.
pub(crate) fn chat_tools(tools: Option<&Value>) -> Result<Option<Value>, ApiError> {
    let list = match tools {
        None | Some(Value::Null) => return Ok(None),
        Some(Value::Array(list)) => list,
        Some(_) => return Err(ApiError::param("tools", "'tools' must be an array of tools")),
    };
    let mut out = Vec::with_capacity(list.len());
    for (i, tool) in list.iter().enumerate() {
        let p = format!("tools[{i}]");
        let Some(o) = tool.as_object() else {
            return Err(ApiError::param(&p, format!("'{p}' must be an object")));
        };
        match o.get("type").and_then(Value::as_str) {
            Some("function") => {}
            Some(t) => {
                return Err(ApiError::param(
                    &format!("{p}.type"),
                    format!("tools of type '{t}' are not supported; only 'function' tools are"),
                ))
            }
            None => {
                return Err(ApiError::param(
                    &format!("{p}.type"),
                    format!("'{p}.type' is required"),
                ))
            }
        }
        if !o.get("name").is_some_and(Value::is_string) {
            return Err(ApiError::param(
                &format!("{p}.name"),
                format!("'{p}.name' is required (Responses tools are flat: {{\"type\": \"function\", \"name\": ...}})"),
            ));
        }
        let mut function = Map::new();
        for (k, v) in o {
            if k != "type" && !v.is_null() {
                function.insert(k.clone(), v.clone());
            }
        }
        out.push(json!({"type": "function", "function": function}));
    }
    Ok(Some(Value::Array(out)))
}

/// `text.format` as a chat `response_format` (`None` for plain text).
pub(crate) fn chat_response_format(text: Option<&Map<String, Value>>) -> Result<Option<Value>, ApiError> {
    let Some(text) = text else { return Ok(None) };
    let f = Fields::new(text, "text.");
    f.only(&["format", "verbosity"])?;
    let Some(format) = f.object("format")? else {
        return Ok(None);
    };
    let ff = Fields::new(format, "text.format.");
    match ff.required_str("type")? {
        "text" => Ok(None),
        "json_object" => Ok(Some(json!({"type": "json_object"}))),
        "json_schema" => {
            ff.only(&["type", "name", "schema", "strict", "description"])?;
            let schema = match ff.raw("schema") {
                Some(s @ (Value::Object(_) | Value::Bool(true))) => s.clone(),
                Some(_) => {
                    return Err(ApiError::param(
                        "text.format.schema",
                        "'text.format.schema' must be a JSON schema object",
                    ))
                }
                None => {
                    return Err(ApiError::param(
                        "text.format.schema",
                        "'text.format.schema' is required",
                    ))
                }
            };
            let name = ff.str("name")?.unwrap_or("response");
            let mut js = json!({"name": name, "schema": schema});
            if let Some(strict) = ff.bool("strict")? {
                js["strict"] = strict.into();
            }
            Ok(Some(json!({"type": "json_schema", "json_schema": js})))
        }
        t => Err(ApiError::param(
            "text.format.type",
            format!("'{t}' is not one of text, json_object, json_schema"),
        )),
    }
}

/// The template variables of `reasoning` (`effort` as chat's `reasoning_effort`).
pub(crate) fn reasoning_extra(
    reasoning: Option<&Map<String, Value>>,
) -> Result<Map<String, Value>, ApiError> {
    let Some(r) = reasoning else {
        return template_extra(&Fields::new(&Map::new(), ""));
    };
    let f = Fields::new(r, "reasoning.");
    f.only(&["effort", "summary", "generate_summary"])?;
    let mut chat = Map::new();
    if let Some(effort) = f.str("effort")? {
        chat.insert("reasoning_effort".into(), effort.into());
    }
    template_extra(&Fields::new(&chat, "")).map_err(rename_reasoning)
}

fn rename_reasoning(mut e: ApiError) -> ApiError {
    if e.param.as_deref() == Some("reasoning_effort") {
        e.param = Some("reasoning.effort".into());
        e.message = e.message.replace("'reasoning_effort'", "'reasoning.effort'");
    }
    e
}

/// An error from the chat machinery with its parameter named as the Responses request names it.
fn rename_param(mut e: ApiError, origins: &[String]) -> ApiError {
    let Some(param) = e.param.clone() else { return e };
    let renamed = if param == "messages" {
        Some("input".to_string())
    } else if let Some(rest) = param.strip_prefix("messages[") {
        rest.split_once(']').and_then(|(i, tail)| {
            let origin = origins.get(i.parse::<usize>().ok()?)?;
            Some(format!("{origin}{tail}"))
        })
    } else if let Some(rest) = param.strip_prefix("response_format") {
        Some(format!("text.format{}", rest.replacen(".json_schema", "", 1)))
    } else if param.starts_with("tools[") {
        Some(param.replacen(".function.", ".", 1))
    } else if param == "reasoning_effort" {
        Some("reasoning.effort".into())
    } else {
        None
    };
    if let Some(new) = renamed {
        e.message = e.message.replace(&param, &new);
        e.param = Some(new);
    }
    e
}

/// Everything a response echoes of its request.
#[derive(Debug, Clone)]
struct Echo {
    model: String,
    instructions: Option<String>,
    tools: Value,
    tool_choice: Value,
    parallel_tool_calls: bool,
    temperature: f64,
    top_p: f64,
    max_output_tokens: Option<i64>,
    previous_response_id: Option<String>,
    text: Value,
    reasoning: Value,
    store: bool,
    metadata: Value,
    user: Option<String>,
    truncation: String,
    service_tier: String,
}

/// Builds response objects for one response id.
#[derive(Debug, Clone)]
struct Shape {
    id: String,
    created_at: u64,
    echo: Echo,
}

impl Shape {
    fn object(&self, status: &str, output: Vec<Value>, usage: Value, error: Value) -> Value {
        let e = &self.echo;
        let incomplete = if status == "incomplete" {
            json!({"reason": "max_output_tokens"})
        } else {
            Value::Null
        };
        json!({
            "id": self.id,
            "object": "response",
            "created_at": self.created_at,
            "status": status,
            "background": false,
            "error": error,
            "incomplete_details": incomplete,
            "instructions": e.instructions,
            "max_output_tokens": e.max_output_tokens,
            "max_tool_calls": null,
            "model": e.model,
            "output": output,
            "parallel_tool_calls": e.parallel_tool_calls,
            "previous_response_id": e.previous_response_id,
            "reasoning": e.reasoning,
            "service_tier": e.service_tier,
            "store": e.store,
            "temperature": e.temperature,
            "text": e.text,
            "tool_choice": e.tool_choice,
            "tools": e.tools,
            "top_p": e.top_p,
            "truncation": e.truncation,
            "usage": usage,
            "user": e.user,
            "metadata": e.metadata,
        })
    }
}

/// Which output item is being written.
#[derive(Debug, Clone, PartialEq)]
enum ItemKind {
    Reasoning,
    Message,
    /// A function call, by its index among the parser's calls.
    Call(usize),
}

#[derive(Debug)]
struct OpenItem {
    kind: ItemKind,
    id: String,
    text: String,
    call_id: String,
    name: String,
}

/// Turns parser deltas into output items and, for streams, into the Responses events that build
/// them (each event is `(type, payload without type and sequence_number)`).
#[derive(Debug)]
struct OutputBuilder {
    suffix: String,
    items: Vec<Value>,
    open: Option<OpenItem>,
    call_names: Vec<String>,
    reasoning_text: String,
}

type Events = Vec<(&'static str, Value)>;

impl OutputBuilder {
    fn new(response_id: &str) -> OutputBuilder {
        OutputBuilder {
            suffix: response_id.trim_start_matches("resp_").to_string(),
            items: Vec::new(),
            open: None,
            call_names: Vec::new(),
            reasoning_text: String::new(),
        }
    }

    fn index(&self) -> usize {
        self.items.len()
    }

    /// Opens an item of `kind` unless it is the one being written.
    fn ensure(&mut self, kind: ItemKind, ev: &mut Events) {
        if self.open.as_ref().is_some_and(|o| o.kind == kind) {
            return;
        }
        self.close("completed", ev);
        let n = self.index();
        let (id, item, call_id, name) = match &kind {
            ItemKind::Reasoning => {
                let id = format!("rs_{}_{n}", self.suffix);
                let item = json!({"type": "reasoning", "id": id, "summary": [], "content": [], "status": "in_progress"});
                (id, item, String::new(), String::new())
            }
            ItemKind::Message => {
                let id = format!("msg_{}_{n}", self.suffix);
                let item = json!({"type": "message", "id": id, "status": "in_progress", "role": "assistant", "content": []});
                (id, item, String::new(), String::new())
            }
            ItemKind::Call(k) => {
                let id = format!("fc_{}_{n}", self.suffix);
                let call_id = format!("call_{}_{k}", self.suffix);
                let name = self.call_names.get(*k).cloned().unwrap_or_default();
                let item = json!({"type": "function_call", "id": id, "call_id": call_id, "name": name, "arguments": "", "status": "in_progress"});
                (id, item, call_id, name)
            }
        };
        ev.push((
            "response.output_item.added",
            json!({"output_index": n, "item": item}),
        ));
        if kind == ItemKind::Message {
            ev.push((
                "response.content_part.added",
                json!({"item_id": id, "output_index": n, "content_index": 0,
                       "part": {"type": "output_text", "text": "", "annotations": []}}),
            ));
        }
        self.open = Some(OpenItem {
            kind,
            id,
            text: String::new(),
            call_id,
            name,
        });
    }

    /// Finishes the item being written with `status`.
    fn close(&mut self, status: &str, ev: &mut Events) {
        let Some(o) = self.open.take() else { return };
        let n = self.index();
        let item = match o.kind {
            ItemKind::Reasoning => {
                ev.push((
                    "response.reasoning_text.done",
                    json!({"item_id": o.id, "output_index": n, "content_index": 0, "text": o.text}),
                ));
                json!({"type": "reasoning", "id": o.id, "summary": [], "status": status,
                       "content": [{"type": "reasoning_text", "text": o.text}]})
            }
            ItemKind::Message => {
                let part = json!({"type": "output_text", "text": o.text, "annotations": []});
                ev.push((
                    "response.output_text.done",
                    json!({"item_id": o.id, "output_index": n, "content_index": 0, "text": o.text, "logprobs": []}),
                ));
                ev.push((
                    "response.content_part.done",
                    json!({"item_id": o.id, "output_index": n, "content_index": 0, "part": part}),
                ));
                json!({"type": "message", "id": o.id, "status": status, "role": "assistant", "content": [part]})
            }
            ItemKind::Call(_) => {
                ev.push((
                    "response.function_call_arguments.done",
                    json!({"item_id": o.id, "output_index": n, "arguments": o.text}),
                ));
                json!({"type": "function_call", "id": o.id, "call_id": o.call_id, "name": o.name,
                       "arguments": o.text, "status": status})
            }
        };
        ev.push((
            "response.output_item.done",
            json!({"output_index": n, "item": item}),
        ));
        self.items.push(item);
    }

    /// Adds text to the item being written (opened as `kind`), with its delta event.
    fn grow(&mut self, kind: ItemKind, text: &str, ev: &mut Events) {
        self.ensure(kind, ev);
        let n = self.index();
        let Some(o) = self.open.as_mut() else { return };
        if text.is_empty() {
            return;
        }
        o.text.push_str(text);
        let (kind, payload) = match o.kind {
            ItemKind::Reasoning => {
                self.reasoning_text.push_str(text);
                (
                    "response.reasoning_text.delta",
                    json!({"item_id": o.id, "output_index": n, "content_index": 0, "delta": text}),
                )
            }
            ItemKind::Message => (
                "response.output_text.delta",
                json!({"item_id": o.id, "output_index": n, "content_index": 0, "delta": text, "logprobs": []}),
            ),
            ItemKind::Call(_) => (
                "response.function_call_arguments.delta",
                json!({"item_id": o.id, "output_index": n, "delta": text}),
            ),
        };
        ev.push((kind, payload));
    }

    /// Applies one chat delta (`reasoning_content`, `content`, `tool_calls`) of the stream parser.
    fn apply(&mut self, delta: &Value) -> Events {
        let mut ev = Vec::new();
        if let Some(r) = delta.get("reasoning_content").and_then(Value::as_str) {
            self.grow(ItemKind::Reasoning, r, &mut ev);
        }
        if let Some(c) = delta.get("content").and_then(Value::as_str) {
            self.grow(ItemKind::Message, c, &mut ev);
        }
        for call in delta
            .get("tool_calls")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
        {
            let Some(k) = call.get("index").and_then(Value::as_u64).map(|k| k as usize) else {
                continue;
            };
            if let Some(name) = call.pointer("/function/name").and_then(Value::as_str) {
                if self.call_names.len() <= k {
                    self.call_names.resize(k + 1, String::new());
                }
                self.call_names[k] = name.to_string();
            }
            let args = call
                .pointer("/function/arguments")
                .and_then(Value::as_str)
                .unwrap_or("");
            self.grow(ItemKind::Call(k), args, &mut ev);
        }
        ev
    }

    /// Ends the output: closes the item being written (`incomplete` when generation was cut);
    /// an output with no item gets an empty message.
    fn finish(&mut self, incomplete: bool, ev: &mut Events) {
        if self.items.is_empty() && self.open.is_none() {
            self.ensure(ItemKind::Message, ev);
        }
        self.close(if incomplete { "incomplete" } else { "completed" }, ev);
    }
}

/// A whole parsed message as one delta (what a stream's deltas add up to).
fn message_delta(msg: &ParsedMessage) -> Value {
    let mut d = Map::new();
    if let Some(r) = msg.reasoning_content.as_deref().filter(|r| !r.is_empty()) {
        d.insert("reasoning_content".into(), r.into());
    }
    if let Some(c) = msg.content.as_deref().filter(|c| !c.is_empty()) {
        d.insert("content".into(), c.into());
    }
    let calls: Vec<Value> = msg
        .tool_calls
        .iter()
        .enumerate()
        .map(|(k, c)| json!({"index": k, "id": c.id, "type": "function", "function": {"name": c.name, "arguments": c.arguments}}))
        .collect();
    if !calls.is_empty() {
        d.insert("tool_calls".into(), calls.into());
    }
    Value::Object(d)
}

/// The Responses usage object of a finished generation.
fn usage(fin: &Finish, reasoning_tokens: usize) -> Value {
    json!({
        "input_tokens": fin.prompt_tokens,
        "input_tokens_details": {"cached_tokens": fin.cached_tokens},
        "output_tokens": fin.completion_tokens,
        "output_tokens_details": {"reasoning_tokens": reasoning_tokens.min(fin.completion_tokens)},
        "total_tokens": fin.prompt_tokens + fin.completion_tokens,
    })
}

/// A validated request, ready to run.
struct Prepared {
    model: Arc<Model>,
    rx: UnboundedReceiver<Event>,
    parser: StreamParser,
    shape: Shape,
    /// The conversation's items (inherited and new), to store with the output.
    items: Vec<Value>,
    stream: bool,
}

fn echo_number(f: &Fields<'_>, key: &str, lo: f64, hi: f64) -> Result<f64, ApiError> {
    Ok(f.num(key, lo, hi)?.unwrap_or(1.0))
}

async fn prepare(st: &Shared, id: &str, obj: &Map<String, Value>) -> Result<Prepared, ApiError> {
    let f = Fields::new(obj, "");
    f.only(RESPONSE_FIELDS)?;
    let name = f.required_str("model")?;
    let instructions = match f.raw("instructions") {
        None => None,
        Some(Value::String(s)) => Some(s.clone()),
        Some(_) => return Err(ApiError::param("instructions", "'instructions' must be a string")),
    };
    let new_items = resolve_references(input_items(f.raw("input"))?, |id| st.responses.item(id))?;
    let previous = f.str("previous_response_id")?;
    let mut items = match previous {
        Some(prev) => match st.responses.get(prev) {
            Some(stored) => stored.conversation.clone(),
            None => {
                let mut e = ApiError::param(
                    "previous_response_id",
                    format!("Previous response with id '{prev}' not found."),
                );
                e.code = Some("previous_response_not_found");
                return Err(e);
            }
        },
        None => Vec::new(),
    };
    let inherited = items.len();
    items.extend(new_items);
    if items.len() == inherited && instructions.is_none() {
        return Err(ApiError::param("input", "'input' is required"));
    }
    let conv = to_chat(instructions.as_deref(), &items, inherited)?;
    if conv.messages.is_empty() {
        return Err(ApiError::param("input", "'input' must not be empty"));
    }
    check_messages(&conv.messages).map_err(|e| rename_param(e, &conv.origins))?;
    let stream = f.bool("stream")?.unwrap_or(false);
    let store = f.bool("store")?.unwrap_or(true);
    if f.bool("background")? == Some(true) {
        return Err(ApiError::param(
            "background",
            "background responses are not supported",
        ));
    }
    if f.int("top_logprobs", 0, 20)?.unwrap_or(0) != 0 {
        return Err(ApiError::param("top_logprobs", "'top_logprobs' is not supported"));
    }
    f.object("stream_options")?;
    f.int("max_tool_calls", 0, i64::MAX)?;
    for key in [
        "user",
        "service_tier",
        "prompt_cache_key",
        "safety_identifier",
        "prompt_cache_retention",
    ] {
        f.str(key)?;
    }
    let truncation = f.str("truncation")?.unwrap_or("disabled");
    if !["auto", "disabled"].contains(&truncation) {
        return Err(ApiError::param(
            "truncation",
            "'truncation' is one of auto, disabled",
        ));
    }
    if let Some(include) = f.array("include")? {
        if !include.iter().all(Value::is_string) {
            return Err(ApiError::param(
                "include",
                "'include' must be an array of strings",
            ));
        }
    }
    let metadata = match f.object("metadata")? {
        Some(m) => {
            if let Some((k, _)) = m.iter().find(|(_, v)| !v.is_string()) {
                return Err(ApiError::param(
                    &format!("metadata.{k}"),
                    "metadata values must be strings",
                ));
            }
            Value::Object(m.clone())
        }
        None => json!({}),
    };
    let mut decode = decode_options(&f, &["max_output_tokens"])?;
    let tools = chat_tools(f.raw("tools"))?;
    let response_format = chat_response_format(f.object("text")?)?;
    let rc = RequestConstraints::from_openai(
        tools.as_ref(),
        f.raw("tool_choice"),
        f.raw("parallel_tool_calls"),
        response_format.as_ref(),
    )
    .map_err(|e| rename_param(param_error(e), &[]))?;
    let reasoning = f.object("reasoning")?;
    let extra = reasoning_extra(reasoning)?;
    let render_tools = rc.parser_tools().map(<[Value]>::to_vec);
    let model = model_for(st, name, None).await?;
    let mut messages = conv.messages;
    let origins = conv.origins;
    let renamed = |e| rename_param(e, &origins);
    if model.vision.is_none() {
        refuse_images(&model, &messages).map_err(renamed)?;
    }
    let images = crate::turn::images::take_openai(&mut messages, st.image_urls)
        .await
        .map_err(renamed)?;
    let (mut rendered, mut prompt) =
        render(&model, messages, render_tools.clone(), extra.clone()).map_err(renamed)?;
    let mut slices = Vec::new();
    if !images.is_empty() {
        (rendered, prompt, slices) =
            crate::turn::images::expand(&model, &rendered, &images, false).map_err(renamed)?;
    }
    let start = chat::prefill(model.detected.format, &rendered);
    decode.constraint =
        constraint_for(&model, &rc, thinking(&model, start, &extra), start).map_err(renamed)?;
    let parser = StreamParser::new(model.detected.format, start, render_tools.as_deref());
    let rx = submit(&model, id, prompt, slices, decode).map_err(renamed)?;
    let text = match f.object("text")? {
        Some(t) => {
            let mut t = t.clone();
            t.entry("format").or_insert(json!({"type": "text"}));
            Value::Object(t)
        }
        None => json!({"format": {"type": "text"}}),
    };
    let reasoning = json!({
        "effort": reasoning.and_then(|r| r.get("effort")).cloned().unwrap_or(Value::Null),
        "summary": reasoning.and_then(|r| r.get("summary")).cloned().unwrap_or(Value::Null),
    });
    let echo = Echo {
        model: model.reference.clone(),
        instructions,
        tools: f.raw("tools").cloned().unwrap_or(json!([])),
        tool_choice: f.raw("tool_choice").cloned().unwrap_or(json!("auto")),
        parallel_tool_calls: rc.parallel_tool_calls,
        temperature: echo_number(&f, "temperature", 0.0, 2.0)?,
        top_p: echo_number(&f, "top_p", 0.0, 1.0)?,
        max_output_tokens: f.int("max_output_tokens", 0, u32::MAX as i64)?,
        previous_response_id: previous.map(str::to_string),
        text,
        reasoning,
        store,
        metadata,
        user: f.str("user")?.map(str::to_string),
        truncation: truncation.to_string(),
        service_tier: "default".into(),
    };
    let shape = Shape {
        id: st.responses.new_id(),
        created_at: now_secs(),
        echo,
    };
    Ok(Prepared {
        model,
        rx,
        parser,
        shape,
        items,
        stream,
    })
}

/// Tokens of the reasoning text, as the model's tokenizer counts them.
fn reasoning_tokens(model: &Model, text: &str) -> usize {
    if text.is_empty() {
        0
    } else {
        model.tokenizer.encode(text, false).len()
    }
}

/// Stores a finished response (when the request asked for it).
fn keep(st: &Shared, shape: &Shape, response: &Value, mut items: Vec<Value>, output: &[Value]) {
    if !shape.echo.store {
        return;
    }
    items.extend(output.iter().cloned());
    st.responses.insert(
        &shape.id,
        StoredResponse {
            response: response.clone(),
            conversation: items,
        },
    );
}

/// `POST /v1/responses`.
pub async fn create(
    State(st): State<Shared>,
    Extension(RequestId(id)): Extension<RequestId>,
    b: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    let body = body(b)?;
    let obj = parse_object(&body)?;
    let p = prepare(&st, &id, &obj).await?;
    if p.stream {
        return Ok(stream(st, p));
    }
    let Prepared {
        model,
        mut rx,
        mut parser,
        shape,
        items,
        ..
    } = p;
    let fin = loop {
        match rx.recv().await {
            Some(Event::Text(t)) => {
                parser.push(&t);
            }
            Some(Event::Done(fin)) => break fin,
            Some(Event::Error(e)) => return Err(ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, e)),
            Some(_) => {}
            None => {
                return Err(ApiError::new(
                    StatusCode::SERVICE_UNAVAILABLE,
                    "the model was unloaded during the request",
                ))
            }
        }
    };
    // A cut reply is parsed as the prefix it is: an unfinished call keeps the arguments written
    // and its item is `incomplete` (see `StreamParser::finish_output`).
    let incomplete = fin.reason == FinishReason::Length;
    let (_, msg) = parser.finish_output(incomplete);
    let mut out = OutputBuilder::new(&shape.id);
    let mut ignored = Vec::new();
    out.apply(&message_delta(&msg));
    out.finish(incomplete, &mut ignored);
    let status = if incomplete { "incomplete" } else { "completed" };
    let usage = usage(&fin, reasoning_tokens(&model, &out.reasoning_text));
    let response = shape.object(status, out.items.clone(), usage, Value::Null);
    keep(&st, &shape, &response, items, &out.items);
    Ok(axum::Json(response).into_response())
}

/// Writes numbered server-sent events.
struct EventWriter {
    tx: UnboundedSender<Bytes>,
    sequence: u64,
}

impl EventWriter {
    /// Sends one event; false when the client has gone.
    fn send(&mut self, kind: &str, mut payload: Value) -> bool {
        if let Value::Object(m) = &mut payload {
            m.insert("type".into(), kind.into());
            m.insert("sequence_number".into(), self.sequence.into());
        }
        self.sequence += 1;
        self.tx
            .send(Bytes::from(format!("event: {kind}\ndata: {payload}\n\n")))
            .is_ok()
    }

    fn send_all(&mut self, events: Events) -> bool {
        events.into_iter().all(|(k, p)| self.send(k, p))
    }
}

/// The streamed answer: the events run on their own task, which stops (dropping the engine's
/// receiver, which cancels the job) once the client has gone.
fn stream(st: Shared, p: Prepared) -> Response {
    let (tx, out_rx) = unbounded_channel::<Bytes>();
    tokio::spawn(run_stream(st, p, EventWriter { tx, sequence: 0 }));
    let body = futures_util::stream::unfold(out_rx, |mut rx| async move {
        rx.recv().await.map(|b| (Ok::<_, Infallible>(b), rx))
    });
    sse(body)
}

async fn run_stream(st: Shared, p: Prepared, mut w: EventWriter) {
    let Prepared {
        model,
        mut rx,
        mut parser,
        shape,
        items,
        ..
    } = p;
    let start = shape.object("in_progress", Vec::new(), Value::Null, Value::Null);
    if !w.send("response.created", json!({"response": start.clone()}))
        || !w.send("response.in_progress", json!({"response": start}))
    {
        return;
    }
    let mut out = OutputBuilder::new(&shape.id);
    loop {
        match rx.recv().await {
            Some(Event::Text(t)) => {
                if let Some(d) = crate::chat::openai_delta(&parser.push(&t)) {
                    if !w.send_all(out.apply(&d)) {
                        return;
                    }
                }
            }
            Some(Event::Done(fin)) => {
                let incomplete = fin.reason == FinishReason::Length;
                let (d, _) = parser.finish_output(incomplete);
                let mut ev = crate::chat::openai_delta(&d)
                    .map(|d| out.apply(&d))
                    .unwrap_or_default();
                out.finish(incomplete, &mut ev);
                if !w.send_all(ev) {
                    return;
                }
                let status = if incomplete { "incomplete" } else { "completed" };
                let usage = usage(&fin, reasoning_tokens(&model, &out.reasoning_text));
                let response = shape.object(status, out.items.clone(), usage, Value::Null);
                keep(&st, &shape, &response, items, &out.items);
                w.send(&format!("response.{status}"), json!({"response": response}));
                return;
            }
            Some(Event::Error(e)) => {
                let mut ev = Vec::new();
                out.finish(true, &mut ev);
                w.send_all(ev);
                let error = json!({"code": "server_error", "message": e});
                let response = shape.object("failed", out.items.clone(), Value::Null, error);
                w.send("response.failed", json!({"response": response}));
                return;
            }
            Some(_) => {}
            None => {
                let error =
                    json!({"code": "server_error", "message": "the model was unloaded during the request"});
                let response = shape.object("failed", out.items.clone(), Value::Null, error);
                w.send("response.failed", json!({"response": response}));
                return;
            }
        }
    }
}

fn not_found(id: &str) -> ApiError {
    let mut e = ApiError::new(
        StatusCode::NOT_FOUND,
        format!("Response with id '{id}' not found."),
    );
    e.param = Some("response_id".into());
    e
}

/// `GET /v1/responses/{id}`.
pub async fn retrieve(State(st): State<Shared>, Path(id): Path<String>) -> Result<Response, ApiError> {
    match st.responses.get(&id) {
        Some(stored) => Ok(axum::Json(stored.response.clone()).into_response()),
        None => Err(not_found(&id)),
    }
}

/// `DELETE /v1/responses/{id}`.
pub async fn delete(State(st): State<Shared>, Path(id): Path<String>) -> Result<Response, ApiError> {
    if st.responses.remove(&id) {
        Ok(axum::Json(json!({"id": id, "object": "response", "deleted": true})).into_response())
    } else {
        Err(not_found(&id))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn items(v: Value) -> Vec<Value> {
        v.as_array().unwrap().clone()
    }

    fn param_of(e: ApiError) -> (StatusCode, String) {
        (e.status, e.param.unwrap_or_default())
    }

    #[test]
    fn a_string_input_is_one_user_message_after_the_instructions() {
        let input = input_items(Some(&json!("hi"))).unwrap();
        let conv = to_chat(Some("Be brief."), &input, 0).unwrap();
        assert_eq!(
            conv.messages,
            vec![
                json!({"role": "system", "content": "Be brief."}),
                json!({"role": "user", "content": "hi"})
            ]
        );
        assert_eq!(conv.origins, ["instructions", "input[0]"]);
        assert_eq!(param_of(input_items(Some(&json!(7))).unwrap_err()).1, "input");
    }

    #[test]
    fn items_become_chat_messages_with_calls_outputs_and_reasoning() {
        let input = items(json!([
            {"role": "developer", "content": [{"type": "input_text", "text": "Use tools."}]},
            {"type": "message", "role": "user", "content": [
                {"type": "input_text", "text": "Weather in "}, {"type": "input_text", "text": "Paris?"}]},
            {"type": "reasoning", "id": "rs_1", "summary": [], "content": [{"type": "reasoning_text", "text": "Call it."}]},
            {"type": "function_call", "call_id": "call_a", "name": "get_weather", "arguments": "{\"city\":\"Paris\"}"},
            {"type": "function_call", "call_id": "call_b", "name": "get_time", "arguments": "{}"},
            {"type": "function_call_output", "call_id": "call_a", "output": "sunny"},
            {"type": "function_call_output", "call_id": "call_b", "output": [{"type": "input_text", "text": "noon"}]},
            {"type": "message", "role": "assistant", "status": "completed",
             "content": [{"type": "output_text", "text": "Sunny at noon.", "annotations": []}]},
            {"role": "user", "content": [{"type": "input_text", "text": "And this?"},
                {"type": "input_image", "image_url": "data:image/png;base64,AAAA", "detail": "auto"}]}
        ]));
        let conv = to_chat(None, &input, 1).unwrap();
        assert_eq!(
            conv.messages,
            vec![
                json!({"role": "system", "content": "Use tools."}),
                json!({"role": "user", "content": "Weather in Paris?"}),
                json!({"role": "assistant", "content": null, "reasoning_content": "Call it.", "tool_calls": [
                    {"id": "call_a", "type": "function", "function": {"name": "get_weather", "arguments": "{\"city\":\"Paris\"}"}},
                    {"id": "call_b", "type": "function", "function": {"name": "get_time", "arguments": "{}"}}]}),
                json!({"role": "tool", "tool_call_id": "call_a", "name": "get_weather", "content": "sunny"}),
                json!({"role": "tool", "tool_call_id": "call_b", "name": "get_time", "content": "noon"}),
                json!({"role": "assistant", "content": "Sunny at noon."}),
                json!({"role": "user", "content": [{"type": "text", "text": "And this?"},
                    {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}}]}),
            ]
        );
        assert_eq!(
            conv.origins,
            [
                "previous_response_id",
                "input[0]",
                "input[2]",
                "input[4]",
                "input[5]",
                "input[6]",
                "input[7]"
            ]
        );
        check_messages(&conv.messages).unwrap();
    }

    #[test]
    fn an_assistant_message_and_its_calls_are_one_turn() {
        let input = items(json!([
            {"role": "user", "content": "q"},
            {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "Let me look."}]},
            {"type": "function_call", "call_id": "c", "name": "f", "arguments": "{}"}
        ]));
        let conv = to_chat(None, &input, 0).unwrap();
        assert_eq!(conv.messages.len(), 2);
        assert_eq!(conv.messages[1]["content"], "Let me look.");
        assert_eq!(conv.messages[1]["tool_calls"][0]["id"], "c");
    }

    #[test]
    fn malformed_items_are_400s_naming_the_item() {
        let cases = [
            (json!([{"type": "item_reference", "id": "msg_1"}]), "input[0]"),
            (json!([{"role": "wizard", "content": "x"}]), "input[0].role"),
            (json!([{"role": "user"}]), "input[0].content"),
            (
                json!([{"role": "user", "content": [{"type": "input_file", "file_id": "f"}]}]),
                "input[0].content[0]",
            ),
            (
                json!([{"role": "user", "content": [{"type": "input_image", "file_id": "f"}]}]),
                "input[0].content[0].file_id",
            ),
            (
                json!([{"role": "user", "content": [{"type": "input_text"}]}]),
                "input[0].content[0].text",
            ),
            (json!(["hi"]), "input[0]"),
            (json!([{"content": "x"}]), "input[0].type"),
            (
                json!([{"type": "function_call", "name": "f", "arguments": "{}"}]),
                "input[0].call_id",
            ),
            (
                json!([{"type": "function_call_output", "call_id": "c", "output": 3}]),
                "input[0].output",
            ),
            (json!([{"type": "web_search_call", "id": "ws"}]), "input[0].type"),
        ];
        for (input, place) in cases {
            let e = to_chat(None, &items(input.clone()), 0).unwrap_err();
            assert_eq!(
                param_of(e),
                (StatusCode::BAD_REQUEST, place.to_string()),
                "{input}"
            );
        }
    }

    #[test]
    fn item_references_become_the_stored_items_they_name() {
        let stored = json!({"type": "message", "id": "msg_1", "role": "assistant",
            "content": [{"type": "output_text", "text": "Paris."}]});
        let lookup = |id: &str| (id == "msg_1").then(|| stored.clone());
        let input = items(json!([
            {"role": "user", "content": "Capital of France?"},
            {"type": "item_reference", "id": "msg_1"},
            {"role": "user", "content": "And of Spain?"},
        ]));
        let resolved = resolve_references(input, lookup).unwrap();
        assert_eq!(resolved[1], stored);
        let conv = to_chat(None, &resolved, 0).unwrap();
        assert_eq!(
            conv.messages[1],
            json!({"role": "assistant", "content": "Paris."})
        );
        for (input, place) in [
            (json!([{"type": "item_reference", "id": "msg_2"}]), "input[0].id"),
            (
                json!([{"role": "user", "content": "x"}, {"type": "item_reference"}]),
                "input[1].id",
            ),
        ] {
            let e = resolve_references(items(input), lookup).unwrap_err();
            assert_eq!(param_of(e), (StatusCode::BAD_REQUEST, place.to_string()));
        }
    }

    #[test]
    fn flat_function_tools_map_to_chat_tools_and_others_are_refused() {
        let tools = json!([{"type": "function", "name": "get_weather", "description": "d",
            "parameters": {"type": "object"}, "strict": true}]);
        let chat = chat_tools(Some(&tools)).unwrap().unwrap();
        assert_eq!(
            chat,
            json!([{"type": "function", "function": {"name": "get_weather", "description": "d",
                "parameters": {"type": "object"}, "strict": true}}])
        );
        let rc = RequestConstraints::from_openai(
            Some(&chat),
            Some(&json!({"type": "function", "name": "get_weather"})),
            None,
            None,
        )
        .unwrap();
        assert_eq!(rc.tools[0].name, "get_weather");
        for (tools, place) in [
            (json!([{"type": "web_search_preview"}]), "tools[0].type"),
            (
                json!([{"type": "function", "function": {"name": "f"}}]),
                "tools[0].name",
            ),
            (json!([{"name": "f"}]), "tools[0].type"),
            (json!({"type": "function"}), "tools"),
        ] {
            let e = chat_tools(Some(&tools)).unwrap_err();
            assert_eq!(
                param_of(e),
                (StatusCode::BAD_REQUEST, place.to_string()),
                "{tools}"
            );
        }
        assert_eq!(chat_tools(None).unwrap(), None);
        // A bad name found by the chat checks is named as Responses names it.
        let chat = chat_tools(Some(&json!([{"type": "function", "name": "bad name"}]))).unwrap();
        let e = RequestConstraints::from_openai(chat.as_ref(), None, None, None).unwrap_err();
        assert_eq!(
            rename_param(param_error(e), &[]).param.as_deref(),
            Some("tools[0].name")
        );
    }

    #[test]
    fn text_format_maps_to_response_format() {
        let fmt = |v: Value| chat_response_format(Some(v.as_object().unwrap()));
        assert_eq!(fmt(json!({"format": {"type": "text"}})).unwrap(), None);
        assert_eq!(fmt(json!({})).unwrap(), None);
        assert_eq!(
            fmt(json!({"format": {"type": "json_object"}})).unwrap(),
            Some(json!({"type": "json_object"}))
        );
        let schema = json!({"type": "object", "properties": {"a": {"type": "string"}}});
        assert_eq!(
            fmt(json!({"format": {"type": "json_schema", "name": "A", "schema": schema, "strict": true}}))
                .unwrap(),
            Some(
                json!({"type": "json_schema", "json_schema": {"name": "A", "schema": schema, "strict": true}})
            )
        );
        let rc = RequestConstraints::from_openai(
            None,
            None,
            None,
            fmt(json!({"format": {"type": "json_schema", "schema": schema}}))
                .unwrap()
                .as_ref(),
        )
        .unwrap();
        assert!(!rc.is_unconstrained());
        for (text, place) in [
            (json!({"format": {"type": "yaml"}}), "text.format.type"),
            (
                json!({"format": {"type": "json_schema", "name": "x"}}),
                "text.format.schema",
            ),
            (
                json!({"format": {"type": "json_schema", "schema": 3}}),
                "text.format.schema",
            ),
            (json!({"format": {}}), "text.format.type"),
            (json!({"format": "json"}), "text.format"),
            (json!({"colour": 1}), "text.colour"),
        ] {
            let e = fmt(text.clone()).unwrap_err();
            assert_eq!(
                param_of(e),
                (StatusCode::BAD_REQUEST, place.to_string()),
                "{text}"
            );
        }
    }

    #[test]
    fn reasoning_effort_reaches_the_template() {
        let r = json!({"effort": "low", "summary": "auto"});
        let extra = reasoning_extra(r.as_object()).unwrap();
        assert_eq!(
            (&extra["reasoning_effort"], &extra["enable_thinking"]),
            (&json!("low"), &json!(true))
        );
        let r = json!({"effort": "none"});
        assert_eq!(reasoning_extra(r.as_object()).unwrap()["enable_thinking"], false);
        assert!(reasoning_extra(None).unwrap().is_empty());
        let r = json!({"effort": "extreme"});
        assert_eq!(
            param_of(reasoning_extra(r.as_object()).unwrap_err()).1,
            "reasoning.effort"
        );
    }

    #[test]
    fn errors_from_the_chat_path_name_the_responses_places() {
        let origins = vec!["instructions".to_string(), "input[3]".to_string()];
        let e = rename_param(
            ApiError::param("messages[1].content[2]", "messages[1].content[2]: bad image"),
            &origins,
        );
        assert_eq!(e.param.as_deref(), Some("input[3].content[2]"));
        assert_eq!(e.message, "input[3].content[2]: bad image");
        assert_eq!(
            rename_param(ApiError::param("messages", "too long"), &origins)
                .param
                .as_deref(),
            Some("input")
        );
        let e = rename_param(
            ApiError::param("response_format.json_schema.schema", "x"),
            &origins,
        );
        assert_eq!(e.param.as_deref(), Some("text.format.schema"));
    }

    #[test]
    fn the_output_builder_streams_items_in_order_and_matches_the_whole_message() {
        let mut b = OutputBuilder::new("resp_x");
        let mut ev = b.apply(&json!({"reasoning_content": "Hmm"}));
        ev.extend(b.apply(&json!({"content": "Hello"})));
        ev.extend(b.apply(&json!({"content": " there"})));
        ev.extend(b.apply(
            &json!({"tool_calls": [{"index": 0, "id": "call_0", "type": "function",
            "function": {"name": "f", "arguments": "{\"a\""}}]}),
        ));
        ev.extend(b.apply(&json!({"tool_calls": [{"index": 0, "function": {"arguments": ":1}"}}]})));
        b.finish(false, &mut ev);
        let kinds: Vec<&str> = ev.iter().map(|(k, _)| *k).collect();
        assert_eq!(
            kinds,
            [
                "response.output_item.added",
                "response.reasoning_text.delta",
                "response.reasoning_text.done",
                "response.output_item.done",
                "response.output_item.added",
                "response.content_part.added",
                "response.output_text.delta",
                "response.output_text.delta",
                "response.output_text.done",
                "response.content_part.done",
                "response.output_item.done",
                "response.output_item.added",
                "response.function_call_arguments.delta",
                "response.function_call_arguments.delta",
                "response.function_call_arguments.done",
                "response.output_item.done",
            ]
        );
        assert_eq!(
            b.items,
            vec![
                json!({"type": "reasoning", "id": "rs_x_0", "summary": [], "status": "completed",
                    "content": [{"type": "reasoning_text", "text": "Hmm"}]}),
                json!({"type": "message", "id": "msg_x_1", "status": "completed", "role": "assistant",
                    "content": [{"type": "output_text", "text": "Hello there", "annotations": []}]}),
                json!({"type": "function_call", "id": "fc_x_2", "call_id": "call_x_0", "name": "f",
                    "arguments": "{\"a\":1}", "status": "completed"}),
            ]
        );
        // The same message whole (the non-streamed path) gives the same items.
        let msg = ParsedMessage {
            reasoning_content: Some("Hmm".into()),
            content: Some("Hello there".into()),
            tool_calls: vec![crate::chat::ToolCall {
                id: "call_0".into(),
                name: "f".into(),
                arguments: "{\"a\":1}".into(),
            }],
        };
        let mut whole = OutputBuilder::new("resp_x");
        whole.apply(&message_delta(&msg));
        whole.finish(false, &mut Vec::new());
        assert_eq!(whole.items, b.items);
        assert_eq!(whole.reasoning_text, "Hmm");
    }

    #[test]
    fn an_empty_or_cut_reply_still_has_a_message_item() {
        let mut b = OutputBuilder::new("resp_y");
        let mut ev = Vec::new();
        b.finish(true, &mut ev);
        assert_eq!(b.items.len(), 1);
        assert_eq!(b.items[0]["status"], "incomplete");
        assert_eq!(b.items[0]["content"][0]["text"], "");
        assert_eq!(ev.first().map(|e| e.0), Some("response.output_item.added"));
        assert_eq!(ev.last().map(|e| e.0), Some("response.output_item.done"));
    }
}
