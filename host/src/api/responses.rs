//! OpenAI's Responses API: `POST /v1/responses`, `GET /v1/responses/{id}` and
//! `DELETE /v1/responses/{id}`. This file holds the wire types, their mapping into the typed chat
//! turn (input items become messages; flat function tools, `tool_choice` and `text.format` become
//! constraints; `reasoning.effort` the thinking), and the encoder from typed reply events to
//! output items and Responses events. Stored responses live in a bounded in-memory
//! [`ResponseStore`] so that `previous_response_id` and `item_reference` can continue a
//! conversation.

use super::body::{self, field_names, int_in, Int, Parsed, RequestBody, TextOr};
use super::pipeline::{body as request_body, model_for, now_secs, sse};
use super::sampling::{openai_decode, OpenAiSampling, SamplingExtensions};
use super::ApiError;
use crate::chat::Delta;
use crate::constraint::RequestConstraints;
use crate::decoding::{DecodeOptions, FinishReason};
use crate::engine::Finish;
use crate::state::models::Model;
pub use crate::state::responses::{ResponseStore, StoredResponse, STORE_CAPACITY, STORE_TTL};
use crate::state::{RequestId, Shared};
use crate::turn::reply::{self, Encoder, ReplyEvent};
use crate::turn::{
    Call, ChatRequest, Content, ImageRef, ImageSource, Message, Part, Prompt, Role, Thinking, Turn,
};
use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Extension;
use futures_util::StreamExt;
use serde::de::IgnoredAny;
use serde::Deserialize;
use serde_json::{json, Map, Value};
use std::convert::Infallible;
use std::sync::Arc;

/// The body of `POST /v1/responses`. The sampling fields are [`OpenAiSampling`], read from the
/// same object: `temperature` and `top_p`, and as extensions (llama.cpp-style) `top_k`, `min_p`,
/// `seed`, the penalties and `stop`.
#[derive(Debug, Deserialize)]
#[serde(remote = "Self")]
pub struct ResponsesRequest {
    /// The model (required).
    pub model: Option<String>,
    /// The conversation's new items: a string is one user message.
    pub input: Option<TextOr<InputItem>>,
    /// A system message put first (not inherited by a continuation).
    pub instructions: Option<String>,
    /// Flat function tools.
    pub tools: Option<Vec<Tool>>,
    /// `none`, `auto`, `required` or `{"type": "function", "name": ...}` (checked with the tools).
    pub tool_choice: Option<Value>,
    /// Whether several calls may come in one reply.
    pub parallel_tool_calls: Option<bool>,
    /// The reasoning effort.
    pub reasoning: Option<ReasoningOptions>,
    /// The reply's format.
    pub text: Option<TextOptions>,
    /// Most tokens to generate.
    pub max_output_tokens: Option<Int>,
    /// Answer as server-sent events.
    pub stream: Option<bool>,
    /// Accepted and ignored.
    pub stream_options: Option<Map<String, Value>>,
    /// Keep the response for `previous_response_id` and retrieval (default true).
    pub store: Option<bool>,
    /// A stored response this one continues.
    pub previous_response_id: Option<String>,
    /// String values, echoed.
    pub metadata: Option<Map<String, Value>>,
    /// Echoed.
    pub user: Option<String>,
    /// `auto` or `disabled`, echoed.
    pub truncation: Option<String>,
    /// Accepted and ignored.
    pub include: Option<Vec<String>>,
    /// Accepted and ignored.
    pub service_tier: Option<String>,
    /// Only `false` is served.
    pub background: Option<bool>,
    /// Accepted and ignored (prefix reuse is automatic here).
    pub prompt_cache_key: Option<String>,
    /// Accepted and ignored.
    pub safety_identifier: Option<String>,
    /// Accepted and ignored.
    pub prompt_cache_retention: Option<String>,
    /// Accepted and ignored.
    pub max_tool_calls: Option<Int>,
    /// Only 0 is served.
    pub top_logprobs: Option<Int>,
}

/// The kinds of input item served.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ItemType {
    /// A message (the default when the item has a `role`).
    Message,
    /// A function call the model made.
    FunctionCall,
    /// A function call's result.
    FunctionCallOutput,
    /// The model's reasoning, given back.
    Reasoning,
    /// An item of a stored response, by id.
    ItemReference,
}

/// One input item: the fields of every kind, each checked for its kind.
#[derive(Clone, Debug, Deserialize)]
#[serde(remote = "Self")]
pub struct InputItem {
    /// Its kind (`message` when absent and a `role` is given).
    #[serde(rename = "type")]
    pub kind: Option<ItemType>,
    /// A message's speaker.
    pub role: Option<Role>,
    /// A message's text or parts; a reasoning item's `reasoning_text` parts.
    pub content: Option<TextOr<ContentPart>>,
    /// The item's id (what an `item_reference` names).
    pub id: Option<String>,
    /// The call a function call or its output belongs to.
    pub call_id: Option<String>,
    /// The function called.
    pub name: Option<String>,
    /// The call's arguments (JSON text).
    pub arguments: Option<String>,
    /// A function call's result: text or text parts.
    pub output: Option<TextOr<ContentPart>>,
    /// A reasoning item's summary parts.
    pub summary: Option<Vec<ContentPart>>,
}

/// The kinds of content part.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum PartType {
    /// Text the user wrote.
    InputText,
    /// Text the model wrote.
    OutputText,
    /// A refusal the model wrote.
    Refusal,
    /// An image by URL or data URL.
    InputImage,
    /// A file: refused.
    InputFile,
    /// Audio: refused.
    InputAudio,
    /// A reasoning item's text.
    ReasoningText,
    /// A reasoning item's summary text.
    SummaryText,
}

/// One content part.
#[derive(Clone, Debug, Deserialize)]
#[serde(remote = "Self")]
pub struct ContentPart {
    /// Its kind (required).
    #[serde(rename = "type")]
    pub kind: Option<PartType>,
    /// The text of a text part.
    pub text: Option<String>,
    /// The text of a refusal.
    pub refusal: Option<String>,
    /// An image's `data:` or `http(s)` URL.
    pub image_url: Option<String>,
    /// An uploaded file's id: refused.
    pub file_id: Option<String>,
}

/// A flat function tool (`{"type": "function", "name", "description", "parameters", "strict"}`).
#[derive(Clone, Debug, Deserialize)]
#[serde(remote = "Self")]
pub struct Tool {
    /// Only `function` is served.
    #[serde(rename = "type")]
    pub kind: Option<String>,
    /// The function's name (required).
    pub name: Option<String>,
    /// What it does.
    pub description: Option<String>,
    /// Its arguments' JSON schema (checked by the constraint builder).
    pub parameters: Option<Value>,
    /// Accepted (the schema constrains the arguments whole either way).
    pub strict: Option<bool>,
}

/// `reasoning`.
#[derive(Clone, Debug, Deserialize)]
#[serde(remote = "Self", deny_unknown_fields)]
pub struct ReasoningOptions {
    /// none, minimal, low, medium or high.
    pub effort: Option<String>,
    /// Echoed.
    pub summary: Option<Value>,
    /// Accepted (the older name of `summary`).
    pub generate_summary: Option<IgnoredAny>,
}

/// `text`.
#[derive(Clone, Debug, Deserialize)]
#[serde(remote = "Self", deny_unknown_fields)]
pub struct TextOptions {
    /// The reply's format.
    pub format: Option<TextFormat>,
    /// Accepted and echoed.
    pub verbosity: Option<IgnoredAny>,
}

/// The kinds of `text.format`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum FormatType {
    /// Free text.
    Text,
    /// Any JSON object.
    JsonObject,
    /// JSON following `schema`.
    JsonSchema,
}

/// `text.format`.
#[derive(Clone, Debug, Deserialize)]
#[serde(remote = "Self")]
pub struct TextFormat {
    /// Its kind (required).
    #[serde(rename = "type")]
    pub kind: Option<FormatType>,
    /// A `json_schema` format's name.
    pub name: Option<String>,
    /// A `json_schema` format's schema (required there).
    pub schema: Option<Value>,
    /// Whether the schema is followed exactly.
    pub strict: Option<bool>,
    /// What the format is for.
    pub description: Option<String>,
}

crate::object_only!(
    ResponsesRequest,
    InputItem,
    ContentPart,
    Tool,
    ReasoningOptions,
    TextOptions,
    TextFormat
);

/// The reasoning efforts a template knows.
const EFFORTS: [&str; 5] = ["none", "minimal", "low", "medium", "high"];

fn required(path: &str) -> ApiError {
    ApiError::param(path, format!("'{path}' is required"))
}

/// A string field the item's kind requires (`place.key`).
fn need<'a>(v: &'a Option<String>, place: &str, key: &str) -> Result<&'a str, ApiError> {
    v.as_deref().ok_or_else(|| required(&format!("{place}.{key}")))
}

impl RequestBody for ResponsesRequest {
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
        if self.model.is_none() {
            return Err(required("model"));
        }
        int_in("max_output_tokens", self.max_output_tokens, 1, u32::MAX as i64)?;
        if self.background == Some(true) {
            return Err(ApiError::param(
                "background",
                "background responses are not supported",
            ));
        }
        if int_in("top_logprobs", self.top_logprobs, 0, 20)?.unwrap_or(0) != 0 {
            return Err(ApiError::param("top_logprobs", "'top_logprobs' is not supported"));
        }
        int_in("max_tool_calls", self.max_tool_calls, 0, i64::MAX)?;
        if !["auto", "disabled"].contains(&self.truncation.as_deref().unwrap_or("disabled")) {
            return Err(ApiError::param(
                "truncation",
                "'truncation' is one of auto, disabled",
            ));
        }
        if let Some((k, _)) = self.metadata.iter().flatten().find(|(_, v)| !v.is_string()) {
            return Err(ApiError::param(
                &format!("metadata.{k}"),
                "metadata values must be strings",
            ));
        }
        if let Some(e) = self.reasoning.as_ref().and_then(|r| r.effort.as_deref()) {
            if !EFFORTS.contains(&e) {
                return Err(ApiError::param(
                    "reasoning.effort",
                    "'reasoning.effort' is one of none, minimal, low, medium, high",
                ));
            }
        }
        for (i, tool) in self.tools.iter().flatten().enumerate() {
            tool.check(&format!("tools[{i}]"))?;
        }
        Ok(())
    }
}

impl Tool {
    fn check(&self, at: &str) -> Result<(), ApiError> {
        match self.kind.as_deref() {
            Some("function") => {}
            Some(t) => {
                return Err(ApiError::param(
                    &format!("{at}.type"),
                    format!("tools of type '{t}' are not supported; only 'function' tools are"),
                ))
            }
            None => return Err(required(&format!("{at}.type"))),
        }
        if self.name.is_none() {
            let p = format!("{at}.name");
            return Err(ApiError::param(
                &p,
                format!(
                    "'{p}' is required (Responses tools are flat: {{\"type\": \"function\", \"name\": ...}})"
                ),
            ));
        }
        Ok(())
    }

    /// The tool in the chat-completions shape the constraint builder reads (it skips nulls).
    fn to_chat(&self) -> Value {
        let f = json!({"name": self.name, "description": self.description, "parameters": self.parameters,
            "strict": self.strict});
        json!({"type": "function", "function": f})
    }
}

impl TextFormat {
    /// The format as a chat `response_format` (`None` for plain text); `raw`: the object as
    /// sent, whose keys a `json_schema` format may not go beyond.
    fn to_chat(&self, raw: Option<&Value>) -> Result<Option<Value>, ApiError> {
        match self.kind {
            None => Err(required("text.format.type")),
            Some(FormatType::Text) => Ok(None),
            Some(FormatType::JsonObject) => Ok(Some(json!({"type": "json_object"}))),
            Some(FormatType::JsonSchema) => {
                let known = field_names::<TextFormat>();
                if let Some(k) = raw
                    .and_then(Value::as_object)
                    .and_then(|o| o.keys().find(|k| !known.contains(&k.as_str())))
                {
                    return Err(ApiError::param(
                        &format!("text.format.{k}"),
                        format!("Unrecognized request argument supplied: {k}"),
                    ));
                }
                let schema = match &self.schema {
                    Some(s @ (Value::Object(_) | Value::Bool(true))) => s.clone(),
                    Some(_) => {
                        return Err(ApiError::param(
                            "text.format.schema",
                            "'text.format.schema' must be a JSON schema object",
                        ))
                    }
                    None => return Err(required("text.format.schema")),
                };
                let mut js = json!({"name": self.name.as_deref().unwrap_or("response"), "schema": schema});
                if let Some(strict) = self.strict {
                    js["strict"] = strict.into();
                }
                Ok(Some(json!({"type": "json_schema", "json_schema": js})))
            }
        }
    }
}

/// One input item of the conversation, with where it came from (`input[2]`, or
/// `previous_response_id` for an inherited one) and its JSON as stored with the response.
#[derive(Clone, Debug)]
struct Item {
    place: String,
    item: InputItem,
    json: Value,
}

impl ResponsesRequest {
    /// The conversation's items: those of `previous_response_id`, then the input's, each
    /// `item_reference` replaced by the stored item it names (a 400 naming it when none is).
    fn items(&self, json: &Map<String, Value>, store: &ResponseStore) -> Result<Vec<Item>, ApiError> {
        let mut new = Vec::new();
        match &self.input {
            None => {}
            Some(TextOr::Text(s)) => {
                let json = json!({"type": "message", "role": "user", "content": s});
                let item = body::typed(&json, "input")?;
                new.push(Item {
                    place: "input[0]".into(),
                    item,
                    json,
                });
            }
            Some(TextOr::List(items)) => {
                for (i, item) in items.iter().enumerate() {
                    let place = format!("input[{i}]");
                    if item.kind != Some(ItemType::ItemReference) {
                        let json = json["input"][i].clone();
                        new.push(Item {
                            place,
                            item: item.clone(),
                            json,
                        });
                        continue;
                    }
                    let at = format!("{place}.id");
                    let id = item.id.as_deref().ok_or_else(|| required(&at))?;
                    let json = store.item(id).ok_or_else(|| {
                        ApiError::param(
                            &at,
                            format!("Item with id '{id}' not found (items of stored responses can be referenced while the response is kept)."),
                        )
                    })?;
                    new.push(Item {
                        item: body::typed(&json, &place)?,
                        place,
                        json,
                    });
                }
            }
        }
        let mut items = Vec::new();
        if let Some(prev) = &self.previous_response_id {
            let Some(stored) = store.get(prev) else {
                let mut e = ApiError::param(
                    "previous_response_id",
                    format!("Previous response with id '{prev}' not found."),
                );
                e.code = Some("previous_response_not_found");
                return Err(e);
            };
            for json in &stored.conversation {
                let place = "previous_response_id".to_string();
                let item = body::typed(json, &place)?;
                items.push(Item {
                    place,
                    item,
                    json: json.clone(),
                });
            }
        }
        if new.is_empty() && self.instructions.is_none() {
            return Err(required("input"));
        }
        items.extend(new);
        Ok(items)
    }

    /// The typed turn of the request, with each message's origin (`input[2]`, `instructions`) to
    /// name it in errors found later.
    fn turn(
        &self,
        json: &Map<String, Value>,
        items: &[Item],
        base: &DecodeOptions,
    ) -> Result<(ChatRequest, Vec<String>), ApiError> {
        let (messages, origins) = to_messages(self.instructions.as_deref(), items)?;
        if messages.is_empty() {
            return Err(ApiError::param("input", "'input' must not be empty"));
        }
        let max = int_in("max_output_tokens", self.max_output_tokens, 1, u32::MAX as i64)?;
        let mut req = ChatRequest::new(Prompt::Chat(messages));
        req.decode = openai_decode(json, max.map(|m| m as usize), base)?;
        req.constraints = self.constraints(json)?;
        req.thinking = Thinking {
            enabled: None,
            effort: self.reasoning.as_ref().and_then(|r| r.effort.clone()),
        };
        Ok((req, origins))
    }

    /// Tools, tool choice, parallel calls and `text.format`, checked as chat checks them.
    fn constraints(&self, json: &Map<String, Value>) -> Result<RequestConstraints, ApiError> {
        let tools = self
            .tools
            .as_ref()
            .map(|ts| Value::Array(ts.iter().map(Tool::to_chat).collect()));
        let raw_format = json.get("text").and_then(|t| t.get("format"));
        let format = match self.text.as_ref().and_then(|t| t.format.as_ref()) {
            Some(f) => f.to_chat(raw_format)?,
            None => None,
        };
        RequestConstraints::from_openai(
            tools.as_ref(),
            self.tool_choice.as_ref(),
            self.parallel_tool_calls.map(Value::Bool).as_ref(),
            format.as_ref(),
        )
        .map_err(|e| rename_param(e.into(), &[]))
    }

    /// The fields a response object repeats of its request.
    fn echo(
        &self,
        json: &Map<String, Value>,
        model: &Model,
        parallel_tool_calls: bool,
    ) -> Map<String, Value> {
        let raw = |k: &str| json.get(k).filter(|v| !v.is_null()).cloned();
        let mut text = match raw("text") {
            Some(Value::Object(t)) => t,
            _ => Map::new(),
        };
        text.entry("format").or_insert(json!({"type": "text"}));
        let r = self.reasoning.as_ref();
        let number = |k: &str| raw(k).and_then(|v| v.as_f64()).unwrap_or(1.0);
        let echo = json!({
            "background": false,
            "instructions": self.instructions,
            "max_output_tokens": self.max_output_tokens.map(|Int(n)| n),
            "max_tool_calls": null,
            "model": model.reference,
            "parallel_tool_calls": parallel_tool_calls,
            "previous_response_id": self.previous_response_id,
            "reasoning": {"effort": r.and_then(|r| r.effort.clone()), "summary": r.and_then(|r| r.summary.clone())},
            "service_tier": "default",
            "store": self.store.unwrap_or(true),
            "temperature": number("temperature"),
            "text": text,
            "tool_choice": raw("tool_choice").unwrap_or(json!("auto")),
            "tools": raw("tools").unwrap_or(json!([])),
            "top_p": number("top_p"),
            "truncation": self.truncation.as_deref().unwrap_or("disabled"),
            "user": self.user,
            "metadata": raw("metadata").unwrap_or(json!({})),
        });
        match echo {
            Value::Object(m) => m,
            _ => Map::new(),
        }
    }
}

impl InputItem {
    /// The text of a reasoning item: its `reasoning_text` content, else its summary.
    fn reasoning_text(&self, place: &str) -> Result<String, ApiError> {
        let texts = |parts: Option<&[ContentPart]>, key: &str| -> Result<Option<String>, ApiError> {
            let Some(parts) = parts else { return Ok(None) };
            let mut text = String::new();
            for (j, p) in parts.iter().enumerate() {
                text.push_str(need(&p.text, &format!("{place}.{key}[{j}]"), "text")?);
            }
            Ok(Some(text))
        };
        let content = match &self.content {
            Some(TextOr::List(p)) => texts(Some(p), "content")?,
            Some(TextOr::Text(t)) => Some(t.clone()),
            None => None,
        };
        let summary = texts(self.summary.as_deref(), "summary")?;
        Ok(content.filter(|t| !t.is_empty()).or(summary).unwrap_or_default())
    }
}

/// A message's content (`at`: its place, `input[2].content`) as turn content: text, or parts
/// when it holds images (an assistant's may not).
fn content(c: Option<&TextOr<ContentPart>>, at: &str, assistant: bool) -> Result<Content, ApiError> {
    let parts = match c {
        None => return Err(required(at)),
        Some(TextOr::Text(s)) => return Ok(Content::Text(s.clone())),
        Some(TextOr::List(parts)) => parts,
    };
    let mut out = Vec::with_capacity(parts.len());
    for (j, part) in parts.iter().enumerate() {
        let p = format!("{at}[{j}]");
        let text = |v: &Option<String>, key: &str| need(v, &p, key).map(|t| Part::Text(t.to_string()));
        out.push(match part.kind {
            None => return Err(required(&format!("{p}.type"))),
            Some(PartType::InputText | PartType::OutputText) => text(&part.text, "text")?,
            Some(PartType::Refusal) => text(&part.refusal, "refusal")?,
            Some(PartType::InputImage) => {
                if assistant {
                    return Err(ApiError::param(&p, format!("{p}: an assistant message cannot hold images")));
                }
                let url = match &part.image_url {
                    Some(u) if !u.is_empty() => u.clone(),
                    _ if part.file_id.is_some() => {
                        return Err(ApiError::param(
                            &format!("{p}.file_id"),
                            format!("{p}: images by 'file_id' are not supported; send 'image_url' (a data: or http(s) URL)"),
                        ))
                    }
                    _ => return Err(required(&format!("{p}.image_url"))),
                };
                Part::Image(ImageRef {
                    place: p,
                    source: ImageSource::Url(url),
                })
            }
            Some(t @ (PartType::InputFile | PartType::InputAudio)) => {
                let t = if t == PartType::InputFile { "input_file" } else { "input_audio" };
                return Err(ApiError::param(&p, format!("{p}: content parts of type '{t}' are not supported")));
            }
            Some(PartType::ReasoningText | PartType::SummaryText) => {
                return Err(ApiError::param(
                    &format!("{p}.type"),
                    format!("{p}: reasoning text belongs in a reasoning item"),
                ))
            }
        });
    }
    if out.iter().any(|p| matches!(p, Part::Image(_))) {
        return Ok(Content::Parts(out));
    }
    let text = out
        .into_iter()
        .map(|p| match p {
            Part::Text(t) => t,
            Part::Image(_) => String::new(),
        })
        .collect();
    Ok(Content::Text(text))
}

/// The conversation as turn messages, and each message's origin. `instructions` comes first as
/// a system message. A `reasoning` item becomes the reasoning of the assistant turn that follows
/// it (reasoning followed by anything else is dropped, as a chat template would drop it);
/// consecutive `function_call` items join one assistant turn.
fn to_messages(instructions: Option<&str>, items: &[Item]) -> Result<(Vec<Message>, Vec<String>), ApiError> {
    let mut messages: Vec<Message> = Vec::new();
    let mut origins = Vec::new();
    if let Some(text) = instructions {
        messages.push(Message::text(Role::System, text));
        origins.push("instructions".to_string());
    }
    let mut reasoning: Option<String> = None;
    // Whether the last message is an assistant turn that later function calls may join.
    let mut open_assistant = false;
    for Item { place, item, .. } in items {
        let kind = match item.kind {
            Some(k) => k,
            None if item.role.is_some() => ItemType::Message,
            None => return Err(required(&format!("{place}.type"))),
        };
        match kind {
            ItemType::Message => {
                let role = match item.role {
                    // As before the typed turn: templates know `system`.
                    Some(Role::Developer) => Role::System,
                    Some(Role::Tool) => {
                        return Err(ApiError::param(
                            &format!("{place}.role"),
                            format!("{place}: a tool's result is a 'function_call_output' item"),
                        ))
                    }
                    Some(role) => role,
                    None => return Err(required(&format!("{place}.role"))),
                };
                let assistant = role == Role::Assistant;
                let content = content(item.content.as_ref(), &format!("{place}.content"), assistant)?;
                let mut m = Message {
                    content: Some(content),
                    ..Message::text(role, "")
                };
                // Reasoning belongs to the assistant turn after it, and to nothing else.
                let r = reasoning.take();
                if assistant {
                    m.reasoning = r;
                }
                open_assistant = assistant;
                messages.push(m);
                origins.push(place.clone());
            }
            ItemType::FunctionCall => {
                let call = Call {
                    id: Some(need(&item.call_id, place, "call_id")?.to_string()),
                    name: need(&item.name, place, "name")?.to_string(),
                    arguments: need(&item.arguments, place, "arguments")?.into(),
                };
                match messages.last_mut() {
                    Some(last) if open_assistant => {
                        if let Some(r) = reasoning.take() {
                            last.reasoning = Some(last.reasoning.take().unwrap_or_default() + &r);
                        }
                        last.tool_calls.push(call);
                    }
                    _ => {
                        messages.push(Message {
                            content: None,
                            reasoning: reasoning.take(),
                            tool_calls: vec![call],
                            ..Message::text(Role::Assistant, "")
                        });
                        origins.push(place.clone());
                        open_assistant = true;
                    }
                }
            }
            ItemType::FunctionCallOutput => {
                let call_id = need(&item.call_id, place, "call_id")?;
                let at = format!("{place}.output");
                let output = match content(item.output.as_ref(), &at, false)? {
                    Content::Text(t) => t,
                    Content::Parts(_) => {
                        return Err(ApiError::param(
                            &at,
                            format!("{place}: a function call output holds text only"),
                        ))
                    }
                };
                let name = messages
                    .iter()
                    .rev()
                    .flat_map(|m| &m.tool_calls)
                    .find(|c| c.id.as_deref() == Some(call_id))
                    .map(|c| c.name.clone());
                messages.push(Message::tool_result(Some(call_id.to_string()), name, output));
                origins.push(place.clone());
                open_assistant = false;
                reasoning = None;
            }
            ItemType::Reasoning => {
                let text = item.reasoning_text(place)?;
                reasoning = Some(reasoning.take().unwrap_or_default() + &text);
            }
            // `ResponsesRequest::items` replaced every reference the request held.
            ItemType::ItemReference => {
                return Err(ApiError::param(
                    place,
                    format!("{place}: unresolved 'item_reference'"),
                ))
            }
        }
    }
    Ok((messages, origins))
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

/// Builds the response objects of one response.
#[derive(Debug, Clone)]
struct Envelope {
    id: String,
    created_at: u64,
    /// The fields repeated from the request ([`ResponsesRequest::echo`]).
    echo: Map<String, Value>,
}

impl Envelope {
    fn object(&self, status: &str, output: Vec<Value>, usage: Value, error: Value) -> Value {
        let incomplete = match status {
            "incomplete" => json!({"reason": "max_output_tokens"}),
            _ => Value::Null,
        };
        let mut o = self.echo.clone();
        for (k, v) in [
            ("id", self.id.clone().into()),
            ("object", "response".into()),
            ("created_at", self.created_at.into()),
            ("status", status.into()),
            ("error", error),
            ("incomplete_details", incomplete),
            ("output", output.into()),
            ("usage", usage),
        ] {
            o.insert(k.into(), v);
        }
        Value::Object(o)
    }

    fn store(&self) -> bool {
        self.echo.get("store") == Some(&Value::Bool(true))
    }
}

/// Which output item is being written.
#[derive(Debug, Clone, PartialEq)]
enum ItemKind {
    Reasoning,
    Message,
    /// A function call, by its index among the reply's calls.
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

/// Events as `(type, payload without type and sequence_number)`.
type Events = Vec<(&'static str, Value)>;

/// Folds a reply's typed deltas into output items and the Responses events that build them.
#[derive(Debug)]
struct OutputBuilder {
    suffix: String,
    items: Vec<Value>,
    open: Option<OpenItem>,
    call_names: Vec<String>,
    reasoning_text: String,
}

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

    /// Applies one flush's deltas.
    fn apply(&mut self, deltas: &[Delta], ev: &mut Events) {
        for d in deltas {
            match d {
                Delta::Reasoning(t) => self.grow(ItemKind::Reasoning, t, ev),
                Delta::Content(t) => self.grow(ItemKind::Message, t, ev),
                Delta::CallStart { index, name, .. } => {
                    if self.call_names.len() <= *index {
                        self.call_names.resize(index + 1, String::new());
                    }
                    self.call_names[*index] = name.clone();
                    self.ensure(ItemKind::Call(*index), ev);
                }
                Delta::CallArgs { index, fragment } => self.grow(ItemKind::Call(*index), fragment, ev),
            }
        }
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

/// One response being written: the reply's events become output items and Responses events,
/// and its end the final response object (stored when the request asked for it). The stream
/// sends the events; the non-streamed answer is the final object.
struct ResponseWriter {
    st: Shared,
    model: Arc<Model>,
    envelope: Envelope,
    /// The conversation's items (inherited and new), to store with the output.
    items: Vec<Value>,
    out: OutputBuilder,
    sequence: u64,
    /// The final response object, once the reply ended.
    done: Option<Value>,
}

impl ResponseWriter {
    /// The Responses events of one reply event.
    fn apply(&mut self, event: ReplyEvent) -> Events {
        let mut ev = Vec::new();
        match event {
            ReplyEvent::Grew { deltas, .. } => self.out.apply(&deltas, &mut ev),
            ReplyEvent::Ended { deltas, end, .. } => {
                // A cut reply keeps what was written; its last item is `incomplete`.
                let incomplete = end.finish.reason == FinishReason::Length;
                self.out.apply(&deltas, &mut ev);
                self.out.finish(incomplete, &mut ev);
                let reasoning = match self.out.reasoning_text.as_str() {
                    "" => 0,
                    text => self.model.tokenizer.encode(text, false).len(),
                };
                let (status, kind) = if incomplete {
                    ("incomplete", "response.incomplete")
                } else {
                    ("completed", "response.completed")
                };
                let response = self.envelope.object(
                    status,
                    self.out.items.clone(),
                    usage(&end.finish, reasoning),
                    Value::Null,
                );
                if self.envelope.store() {
                    let mut conversation = std::mem::take(&mut self.items);
                    conversation.extend(self.out.items.iter().cloned());
                    let stored = StoredResponse {
                        response: response.clone(),
                        conversation,
                    };
                    self.st.responses.insert(&self.envelope.id, stored);
                }
                ev.push((kind, json!({"response": response})));
                self.done = Some(response);
            }
            ReplyEvent::Failed(e) => {
                self.out.finish(true, &mut ev);
                ev.push(self.failed(&e));
            }
        }
        ev
    }

    fn failed(&mut self, message: &str) -> (&'static str, Value) {
        let error = json!({"code": "server_error", "message": message});
        let response = self
            .envelope
            .object("failed", self.out.items.clone(), Value::Null, error);
        self.done = Some(response.clone());
        ("response.failed", json!({"response": response}))
    }

    /// Server-sent events, numbered.
    fn frame(&mut self, events: Events) -> String {
        let mut out = String::new();
        for (kind, mut payload) in events {
            if let Value::Object(m) = &mut payload {
                m.insert("type".into(), kind.into());
                m.insert("sequence_number".into(), self.sequence.into());
            }
            self.sequence += 1;
            out.push_str(&format!("event: {kind}\ndata: {payload}\n\n"));
        }
        out
    }
}

impl Encoder for ResponseWriter {
    fn start(&mut self) -> String {
        let start = self
            .envelope
            .object("in_progress", Vec::new(), Value::Null, Value::Null);
        let events = vec![
            ("response.created", json!({"response": start.clone()})),
            ("response.in_progress", json!({"response": start})),
        ];
        self.frame(events)
    }

    fn event(&mut self, _index: usize, event: ReplyEvent) -> String {
        let events = self.apply(event);
        self.frame(events)
    }

    fn end(&mut self) -> String {
        if self.done.is_some() {
            return String::new();
        }
        let failed = self.failed("the model was unloaded during the request");
        self.frame(vec![failed])
    }
}

/// The typed turn of a body before the model is looked up, as [`create`] checks it (over
/// Berth's own defaults), with each message's origin.
pub(crate) fn check_turn(body: &[u8], store: &ResponseStore) -> Result<(ChatRequest, Vec<String>), ApiError> {
    let Parsed { request, json } = body::parse::<ResponsesRequest>(body)?;
    let items = request.items(&json, store)?;
    request.turn(&json, &items, &DecodeOptions::default())
}

/// `POST /v1/responses`.
pub async fn create(
    State(st): State<Shared>,
    Extension(RequestId(id)): Extension<RequestId>,
    b: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    let Parsed { request, json } = body::parse::<ResponsesRequest>(&request_body(b)?)?;
    let items = request.items(&json, &st.responses)?;
    // Every 400 of the body before the model is looked up (and perhaps loaded); then the turn
    // again over the pack's defaults.
    request.turn(&json, &items, &DecodeOptions::default())?;
    let model = model_for(&st, request.model.as_deref().unwrap_or_default(), None).await?;
    let (chat, origins) = request.turn(&json, &items, &model.defaults.decode)?;
    let parallel_tool_calls = chat.constraints.parallel_tool_calls;
    let renamed = |e: ApiError| rename_param(e, &origins);
    let mut turn = Turn::prepare(&model, chat, st.image_urls)
        .await
        .map_err(renamed)?;
    let rxs = turn.submit(&model, &id).map_err(renamed)?;
    let events = reply::merged(rxs, turn.parsers());
    let response_id = st.responses.new_id();
    let mut writer = ResponseWriter {
        out: OutputBuilder::new(&response_id),
        envelope: Envelope {
            id: response_id,
            created_at: now_secs(),
            echo: request.echo(&json, &model, parallel_tool_calls),
        },
        st,
        model,
        items: items.into_iter().map(|i| i.json).collect(),
        sequence: 0,
        done: None,
    };
    if request.stream.unwrap_or(false) {
        let body = reply::encode(events, writer).map(|s| Ok::<_, Infallible>(Bytes::from(s)));
        return Ok(sse(body));
    }
    let mut events = Box::pin(events);
    while let Some((_, event)) = events.next().await {
        if let ReplyEvent::Failed(e) = event {
            return Err(ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, e));
        }
        writer.apply(event);
        if let Some(response) = writer.done.take() {
            return Ok(axum::Json(response).into_response());
        }
    }
    Err(ApiError::new(
        StatusCode::SERVICE_UNAVAILABLE,
        "the model was unloaded during the request",
    ))
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

    /// The typed turn of a body (`store`: for references and continuations), and each message's
    /// origin.
    fn turn_in(body: Value, store: &ResponseStore) -> Result<(ChatRequest, Vec<String>), ApiError> {
        check_turn(body.to_string().as_bytes(), store)
    }

    fn turn_of(body: Value) -> Result<(ChatRequest, Vec<String>), ApiError> {
        turn_in(body, &ResponseStore::default())
    }

    #[test]
    fn repeat_last_n_reaches_responses_as_every_flat_surface_takes_it() {
        let mut body = with_input(json!("Hi"));
        body["repeat_last_n"] = json!(7);
        body["repetition_penalty"] = json!(1.3);
        let (req, _) = turn_of(body.clone()).unwrap();
        assert_eq!(
            (
                req.decode.sampling.repeat_penalty,
                req.decode.sampling.repeat_last_n
            ),
            (1.3, 7)
        );
        body["repeat_last_n"] = json!("all");
        let e = turn_of(body).unwrap_err();
        assert_eq!(e.param.as_deref(), Some("repeat_last_n"));
    }

    fn with_input(input: Value) -> Value {
        json!({"model": "m", "input": input})
    }

    fn param_of(e: ApiError) -> (StatusCode, String) {
        (e.status, e.param.unwrap_or_default())
    }

    /// The messages as chat templates read them (images as `<image{k}>`).
    fn template(req: &ChatRequest) -> Vec<Value> {
        let Prompt::Chat(messages) = &req.prompt else {
            panic!("a chat prompt")
        };
        let mut k = 0;
        messages
            .iter()
            .map(|m| {
                let v = m.to_template(k, |k| format!("<image{k}>"));
                k += m.images().count();
                v
            })
            .collect()
    }

    /// A store holding one response whose conversation is `items`; its id.
    fn stored(store: &ResponseStore, items: Value) -> String {
        let id = store.new_id();
        let conversation = items.as_array().unwrap().clone();
        store.insert(
            &id,
            StoredResponse {
                response: json!({"id": id}),
                conversation,
            },
        );
        id
    }

    #[test]
    fn a_string_input_is_one_user_message_after_the_instructions() {
        let (req, origins) =
            turn_of(json!({"model": "m", "input": "hi", "instructions": "Be brief."})).unwrap();
        assert_eq!(
            template(&req),
            vec![
                json!({"role": "system", "content": "Be brief."}),
                json!({"role": "user", "content": "hi"})
            ]
        );
        assert_eq!(origins, ["instructions", "input[0]"]);
        let e = turn_of(with_input(json!(7))).unwrap_err();
        assert_eq!(param_of(e).1, "input");
    }

    #[test]
    fn items_become_chat_messages_with_calls_outputs_and_reasoning() {
        let store = ResponseStore::default();
        let previous = stored(
            &store,
            json!([{"role": "developer", "content": [{"type": "input_text", "text": "Use tools."}]}]),
        );
        let input = json!([
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
        ]);
        let body = json!({"model": "m", "input": input, "previous_response_id": previous});
        let (req, origins) = turn_in(body, &store).unwrap();
        assert_eq!(
            template(&req),
            vec![
                json!({"role": "system", "content": "Use tools."}),
                json!({"role": "user", "content": "Weather in Paris?"}),
                json!({"role": "assistant", "content": null, "reasoning_content": "Call it.", "tool_calls": [
                    {"id": "call_a", "type": "function", "function": {"name": "get_weather", "arguments": "{\"city\":\"Paris\"}"}},
                    {"id": "call_b", "type": "function", "function": {"name": "get_time", "arguments": "{}"}}]}),
                json!({"role": "tool", "tool_call_id": "call_a", "name": "get_weather", "content": "sunny"}),
                json!({"role": "tool", "tool_call_id": "call_b", "name": "get_time", "content": "noon"}),
                json!({"role": "assistant", "content": "Sunny at noon."}),
                json!({"role": "user", "content": "And this?<image0>"}),
            ]
        );
        let Prompt::Chat(messages) = &req.prompt else {
            unreachable!()
        };
        let images: Vec<&ImageRef> = messages.iter().flat_map(Message::images).collect();
        assert_eq!(
            images,
            [&ImageRef {
                place: "input[7].content[1]".into(),
                source: ImageSource::Url("data:image/png;base64,AAAA".into()),
            }]
        );
        assert_eq!(
            origins,
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
    }

    #[test]
    fn an_assistant_message_and_its_calls_are_one_turn() {
        let (req, _) = turn_of(with_input(json!([
            {"role": "user", "content": "q"},
            {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "Let me look."}]},
            {"type": "function_call", "call_id": "c", "name": "f", "arguments": "{}"}
        ])))
        .unwrap();
        let messages = template(&req);
        assert_eq!(messages.len(), 2);
        assert_eq!(messages[1]["content"], "Let me look.");
        assert_eq!(messages[1]["tool_calls"][0]["id"], "c");
    }

    #[test]
    fn malformed_items_are_400s_naming_the_item() {
        let cases = [
            (json!([{"type": "item_reference", "id": "msg_1"}]), "input[0].id"),
            (json!([{"role": "wizard", "content": "x"}]), "input[0].role"),
            (json!([{"role": "tool", "content": "x"}]), "input[0].role"),
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
            (
                json!([{"role": "user", "content": [{"type": "input_text", "text": 5}]}]),
                "input[0].content[0].text",
            ),
            (
                json!([{"role": "user", "content": [{"type": "input_hologram"}]}]),
                "input[0].content[0].type",
            ),
            (
                json!([{"role": "assistant", "content": [{"type": "input_image", "image_url": "data:,"}]}]),
                "input[0].content[0]",
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
            (
                json!([{"type": "function_call_output", "call_id": "c",
                        "output": [{"type": "input_image", "image_url": "data:,"}]}]),
                "input[0].output",
            ),
            (
                json!([{"type": "reasoning", "content": [{"type": "reasoning_text"}]}]),
                "input[0].content[0].text",
            ),
            (json!([{"type": "web_search_call", "id": "ws"}]), "input[0].type"),
            (json!([{"type": "reasoning", "summary": []}]), "input"),
            (json!([]), "input"),
        ];
        for (input, place) in cases {
            let e = turn_of(with_input(input.clone())).unwrap_err();
            assert_eq!(
                param_of(e),
                (StatusCode::BAD_REQUEST, place.to_string()),
                "{input}"
            );
        }
    }

    #[test]
    fn a_wrong_field_is_a_400_naming_its_path() {
        let input = json!([{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"},
            {"role": "user", "content": [{"type": "input_image", "image_url": {"url": "data:,"}}]}]);
        let e = turn_of(with_input(input)).unwrap_err();
        assert_eq!(e.param.as_deref(), Some("input[2].content[0].image_url"));
        assert_eq!(
            e.message,
            "'input[2].content[0].image_url' must be a string; got an object"
        );
        for (key, v) in [
            ("instructions", json!(5)),
            ("stream", json!("yes")),
            ("previous_response_id", json!(5)),
            ("metadata", json!({"a": 1})),
            ("max_output_tokens", json!(0)),
            ("truncation", json!("sometimes")),
            ("top_logprobs", json!(3)),
            ("background", json!(true)),
        ] {
            let mut body = with_input(json!("hi"));
            body[key] = v;
            let e = turn_of(body.clone()).unwrap_err();
            assert_eq!(e.status, StatusCode::BAD_REQUEST, "{body}");
            assert!(e.param.as_deref().unwrap_or("").starts_with(key), "{body}: {e:?}");
        }
    }

    #[test]
    fn item_references_become_the_stored_items_they_name() {
        let store = ResponseStore::default();
        stored(
            &store,
            json!([{"role": "user", "content": "Capital of France?"},
                {"type": "message", "id": "msg_1", "role": "assistant",
                 "content": [{"type": "output_text", "text": "Paris."}]}]),
        );
        let input = json!([
            {"role": "user", "content": "Capital of France?"},
            {"type": "item_reference", "id": "msg_1"},
            {"role": "user", "content": "And of Spain?"},
        ]);
        let (req, _) = turn_in(with_input(input), &store).unwrap();
        assert_eq!(
            template(&req)[1],
            json!({"role": "assistant", "content": "Paris."})
        );
        for (input, place) in [
            (json!([{"type": "item_reference", "id": "msg_2"}]), "input[0].id"),
            (
                json!([{"role": "user", "content": "x"}, {"type": "item_reference"}]),
                "input[1].id",
            ),
        ] {
            let e = turn_in(with_input(input), &store).unwrap_err();
            assert_eq!(param_of(e), (StatusCode::BAD_REQUEST, place.to_string()));
        }
        let e = turn_in(
            json!({"model": "m", "input": "hi", "previous_response_id": "resp_gone"}),
            &store,
        )
        .unwrap_err();
        assert_eq!(e.param.as_deref(), Some("previous_response_id"));
        assert_eq!(e.code, Some("previous_response_not_found"));
    }

    #[test]
    fn flat_function_tools_map_to_chat_tools_and_others_are_refused() {
        let tools = json!([{"type": "function", "name": "get_weather", "description": "d",
            "parameters": {"type": "object"}, "strict": true}]);
        let tool: Tool = body::typed(&tools[0], "tools[0]").unwrap();
        assert_eq!(
            tool.to_chat(),
            json!({"type": "function", "function": {"name": "get_weather", "description": "d",
                "parameters": {"type": "object"}, "strict": true}})
        );
        // What the template sees: no `strict`, no nulls.
        let tool: Tool = body::typed(&json!({"type": "function", "name": "f"}), "tools[0]").unwrap();
        let rc = RequestConstraints::from_openai(Some(&json!([tool.to_chat()])), None, None, None).unwrap();
        assert_eq!(
            rc.parser_tools().unwrap(),
            [json!({"type": "function", "function": {"name": "f"}})]
        );
        let body = json!({"model": "m", "input": "hi", "tools": tools,
            "tool_choice": {"type": "function", "name": "get_weather"}});
        let (req, _) = turn_of(body).unwrap();
        assert_eq!(req.constraints.tools[0].name, "get_weather");
        for (tools, place) in [
            (json!([{"type": "web_search_preview"}]), "tools[0].type"),
            (
                json!([{"type": "function", "function": {"name": "f"}}]),
                "tools[0].name",
            ),
            (json!([{"name": "f"}]), "tools[0].type"),
            (json!({"type": "function"}), "tools"),
            // Found by the chat checks, named as Responses names them.
            (json!([{"type": "function", "name": "bad name"}]), "tools[0].name"),
            (
                json!([{"type": "function", "name": "f", "parameters": "x"}]),
                "tools[0].parameters",
            ),
        ] {
            let body = json!({"model": "m", "input": "hi", "tools": tools});
            let e = turn_of(body).unwrap_err();
            assert_eq!(
                param_of(e),
                (StatusCode::BAD_REQUEST, place.to_string()),
                "{tools}"
            );
        }
        let e = turn_of(json!({"model": "m", "input": "hi", "tool_choice": "required"})).unwrap_err();
        assert_eq!(e.param.as_deref(), Some("tool_choice"));
    }

    #[test]
    fn text_format_maps_to_response_format() {
        let fmt = |text: Value| -> Result<Option<Value>, ApiError> {
            let body = json!({"model": "m", "input": "hi", "text": text});
            let Parsed { request, json } = body::parse::<ResponsesRequest>(body.to_string().as_bytes())?;
            match request.text.and_then(|t| t.format) {
                Some(f) => f.to_chat(json["text"].get("format")),
                None => Ok(None),
            }
        };
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
        let body = json!({"model": "m", "input": "hi",
            "text": {"format": {"type": "json_schema", "schema": schema}}});
        assert!(!turn_of(body).unwrap().0.constraints.is_unconstrained());
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
            (
                json!({"format": {"type": "json_schema", "schema": {}, "colour": 1}}),
                "text.format.colour",
            ),
            (json!({"format": {}}), "text.format.type"),
            (json!({"format": "json"}), "text.format"),
            (json!({"colour": 1}), "text.colour"),
            (json!("x"), "text"),
        ] {
            let e = fmt(text.clone()).unwrap_err();
            assert_eq!(
                param_of(e),
                (StatusCode::BAD_REQUEST, place.to_string()),
                "{text}"
            );
        }
        let e = fmt(json!({"colour": 1})).unwrap_err();
        assert_eq!(e.message, "Unrecognized request argument supplied: colour");
    }

    #[test]
    fn reasoning_effort_reaches_the_template() {
        let extra = |reasoning: Value| {
            turn_of(json!({"model": "m", "input": "hi", "reasoning": reasoning}))
                .map(|(r, _)| r.template_extra())
        };
        let e = extra(json!({"effort": "low", "summary": "auto"})).unwrap();
        assert_eq!(
            (&e["reasoning_effort"], &e["enable_thinking"]),
            (&json!("low"), &json!(true))
        );
        assert_eq!(
            extra(json!({"effort": "none"})).unwrap()["enable_thinking"],
            false
        );
        assert!(extra(json!({})).unwrap().is_empty());
        for bad in [
            json!({"effort": "extreme"}),
            json!({"effort": 3}),
            json!({"budget": 3}),
        ] {
            let e = extra(bad.clone()).unwrap_err();
            assert!(e.param.unwrap().starts_with("reasoning."), "{bad}");
        }
    }

    #[test]
    fn sampling_extensions_reach_the_decode_options() {
        let body = json!({"model": "m", "input": "hi", "temperature": 0.3, "top_p": 0.9,
            "top_k": 5, "min_p": 0.2, "seed": 7, "max_output_tokens": 9, "stop": "END"});
        let (req, _) = turn_of(body).unwrap();
        let s = &req.decode.sampling;
        assert_eq!(
            (s.temperature, s.top_p, s.top_k, s.min_p, s.seed),
            (0.3, 0.9, 5, 0.2, Some(7))
        );
        assert_eq!(
            (req.decode.max_tokens, req.decode.stop.clone()),
            (Some(9), vec!["END".to_string()])
        );
        for (key, v) in [
            ("top_k", json!("x")),
            ("min_p", json!(2)),
            ("seed", json!(1.5)),
            ("temperature", json!("hot")),
            ("frobnicate", json!(1)),
        ] {
            let mut body = json!({"model": "m", "input": "hi"});
            body[key] = v;
            let e = turn_of(body).unwrap_err();
            assert_eq!(param_of(e), (StatusCode::BAD_REQUEST, key.to_string()));
        }
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

    fn call_start(name: &str) -> Delta {
        Delta::CallStart {
            index: 0,
            id: "call_0".into(),
            name: name.into(),
        }
    }

    fn call_args(fragment: &str) -> Delta {
        Delta::CallArgs {
            index: 0,
            fragment: fragment.into(),
        }
    }

    #[test]
    fn the_output_builder_streams_items_in_order_and_matches_the_whole_message() {
        let flushes = vec![
            vec![Delta::Reasoning("Hmm".into())],
            vec![Delta::Content("Hello".into())],
            vec![Delta::Content(" there".into())],
            vec![call_start("f"), call_args("{\"a\"")],
            vec![call_args(":1}")],
        ];
        let mut b = OutputBuilder::new("resp_x");
        let mut ev = Vec::new();
        for deltas in &flushes {
            b.apply(deltas, &mut ev);
        }
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
        // The same deltas in one flush give the same items.
        let mut whole = OutputBuilder::new("resp_x");
        whole.apply(&flushes.concat(), &mut Vec::new());
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
