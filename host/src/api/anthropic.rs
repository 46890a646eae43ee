//! The Anthropic Messages API: `POST /v1/messages` and `POST /v1/messages/count_tokens`.
//!
//! Its wire types (serde: a field of the wrong type is a 400 naming its path), their mapping into
//! the typed chat turn (system prompt, user and assistant turns of content blocks, `tool_result`
//! blocks as tool messages, tools and `tool_choice` as the constraints, `thinking` as the template's
//! switch), and the encoder of the turn's reply into Anthropic content blocks (`thinking`, `text`,
//! `tool_use`) and server-sent events.

use super::body::{self, field_names, int_in, num_in, Int, RequestBody};
use super::pipeline::{self, GenerationBody, Prepared};
use super::sampling::SamplingExtensions;
use super::{AnthropicError, ApiError};
use crate::chat::{Delta, ParsedMessage};
use crate::constraint::{ParamError, RequestConstraints};
use crate::decoding::{DecodeOptions, FinishReason};
use crate::engine::Finish;
use crate::state::{RequestId, Shared};
use crate::turn::reply::{self, Encoder, End, ReplyEvent};
use crate::turn::{
    Call, ChatRequest, Content, ImageRef, ImageSource, Message, Part, Prompt, Role, Thinking, Turn,
};
use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::State;
use axum::response::{IntoResponse, Response};
use axum::Extension;
use futures_util::StreamExt;
use serde::de::{self, Deserializer, SeqAccess, Visitor};
use serde::Deserialize;
use serde_json::{json, Map, Value};
use std::collections::HashMap;
use std::convert::Infallible;
use std::fmt;

/// The most stop sequences a request may carry.
const MAX_STOP_SEQUENCES: usize = 64;

/// Anthropic's smallest thinking budget.
const MIN_THINKING_BUDGET: i64 = 1024;

/// The body of `POST /v1/messages`: the generation's own fields; the conversation's are
/// [`Conversation`], read from the same object.
#[derive(Debug, Deserialize)]
#[serde(remote = "Self")]
pub struct MessagesRequest {
    /// The model (required).
    pub model: Option<String>,
    /// Most tokens to generate (required, at least 1).
    pub max_tokens: Option<Int>,
    /// Answer as server-sent events.
    pub stream: Option<bool>,
    /// 0-1.
    pub temperature: Option<f64>,
    /// 0-1.
    pub top_p: Option<f64>,
    /// 0 (off) to 2^20.
    pub top_k: Option<Int>,
    /// Strings that end the reply (up to 64).
    pub stop_sequences: Option<Vec<String>>,
    /// Accepted and ignored.
    pub metadata: Option<Map<String, Value>>,
    /// Accepted and ignored.
    pub service_tier: Option<String>,
}

/// The body of `POST /v1/messages/count_tokens`: the model and a [`Conversation`].
#[derive(Debug, Deserialize)]
#[serde(remote = "Self")]
pub struct CountRequest {
    /// The model (required).
    pub model: Option<String>,
}

/// What a Messages request and a token count share: the conversation, its tools and formats.
#[derive(Debug, Deserialize)]
#[serde(remote = "Self")]
pub struct Conversation {
    /// The system prompt: a string or text blocks.
    pub system: Option<Blocks>,
    /// The turns (required, not empty), user and assistant.
    pub messages: Option<Vec<MessageIn>>,
    /// Custom tools (server tools are refused).
    pub tools: Option<Vec<ToolIn>>,
    /// Which tool, if any, the model must call.
    pub tool_choice: Option<ToolChoiceIn>,
    /// Extended thinking on or off.
    pub thinking: Option<ThinkingIn>,
    /// Prompt caching: accepted and ignored (prefix reuse is automatic here).
    pub cache_control: Option<Map<String, Value>>,
    /// Structured output (`format`, what `messages.parse` sends) and the effort level.
    pub output_config: Option<OutputConfig>,
    /// Structured output as the structured-outputs beta sends it.
    pub output_format: Option<OutputFormat>,
}

/// One turn of the conversation.
#[derive(Debug, Deserialize)]
#[serde(remote = "Self")]
pub struct MessageIn {
    /// `user` or `assistant` (required).
    pub role: Option<String>,
    /// Its text or its content blocks (required).
    pub content: Option<Blocks>,
}

/// Content: a string, or a list of content blocks.
#[derive(Debug)]
pub enum Blocks {
    /// Plain text (one text block).
    Text(String),
    /// Content blocks.
    List(Vec<Block>),
}

impl<'de> Deserialize<'de> for Blocks {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Blocks, D::Error> {
        struct BlocksVisitor;
        impl<'de> Visitor<'de> for BlocksVisitor {
            type Value = Blocks;

            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a string or an array of content blocks")
            }

            fn visit_str<E: de::Error>(self, v: &str) -> Result<Blocks, E> {
                Ok(Blocks::Text(v.to_string()))
            }

            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Blocks, A::Error> {
                let mut blocks = Vec::new();
                while let Some(b) = seq.next_element::<Block>()? {
                    blocks.push(b);
                }
                Ok(Blocks::List(blocks))
            }
        }
        d.deserialize_any(BlocksVisitor)
    }
}

/// One content block; its `type` says which of the other fields it has (those of other types
/// are left unread).
#[derive(Debug, Default, Deserialize)]
#[serde(remote = "Self")]
pub struct Block {
    /// `text`, `image`, `tool_use`, `tool_result`, `thinking`, `redacted_thinking` (required).
    #[serde(rename = "type")]
    pub kind: Option<String>,
    /// A text block's text.
    pub text: Option<String>,
    /// An image block's source ([`SourceIn`], typed once the block is known to be an image: a
    /// `search_result` block's source is a string).
    pub source: Option<Value>,
    /// A tool use's id.
    pub id: Option<String>,
    /// A tool use's function.
    pub name: Option<String>,
    /// A tool use's arguments.
    pub input: Option<Map<String, Value>>,
    /// The tool use a tool result answers.
    pub tool_use_id: Option<String>,
    /// A tool result's text: a string or text blocks.
    pub content: Option<Blocks>,
    /// Whether a tool result is an error.
    pub is_error: Option<bool>,
    /// A thinking block's reasoning.
    pub thinking: Option<String>,
}

/// An image block's source: `base64` (`media_type`, `data`) or `url`.
#[derive(Debug, Deserialize)]
#[serde(remote = "Self")]
pub struct SourceIn {
    /// `base64` or `url` (required).
    #[serde(rename = "type")]
    pub kind: Option<String>,
    /// The base64 image's media type.
    pub media_type: Option<String>,
    /// The base64 image's bytes.
    pub data: Option<String>,
    /// The image's URL.
    pub url: Option<String>,
}

/// A tool: custom (`name`, `description`, `input_schema`); server tools are refused.
#[derive(Debug, Deserialize)]
#[serde(remote = "Self")]
pub struct ToolIn {
    /// Absent or `custom`; anything else is a server tool.
    #[serde(rename = "type")]
    pub kind: Option<String>,
    /// The function's name (required).
    pub name: Option<String>,
    /// What it does.
    pub description: Option<String>,
    /// The JSON schema of its input (required).
    pub input_schema: Option<Map<String, Value>>,
}

/// `tool_choice`: `auto`, `any`, `tool` (with `name`) or `none`.
#[derive(Debug, Deserialize)]
#[serde(remote = "Self")]
pub struct ToolChoiceIn {
    /// The choice (required).
    #[serde(rename = "type")]
    pub kind: Option<String>,
    /// The tool a `tool` choice names.
    pub name: Option<String>,
    /// At most one call per reply.
    pub disable_parallel_tool_use: Option<bool>,
}

/// `thinking`: `enabled` (with a budget), `adaptive` or `disabled`.
#[derive(Debug, Deserialize)]
#[serde(remote = "Self")]
pub struct ThinkingIn {
    /// The switch (required).
    #[serde(rename = "type")]
    pub kind: Option<String>,
    /// An `enabled` switch's budget (1024 up, under `max_tokens`).
    pub budget_tokens: Option<Int>,
}

/// `output_config`: the structured-output `format` and an `effort` level (accepted; it changes
/// nothing here).
#[derive(Debug, Deserialize)]
#[serde(remote = "Self", deny_unknown_fields)]
pub struct OutputConfig {
    /// The format the reply must follow.
    pub format: Option<OutputFormat>,
    /// low, medium, high, xhigh or max.
    pub effort: Option<String>,
}

/// A structured-output format: `{"type": "json_schema", "schema": {...}}`.
#[derive(Debug, Deserialize)]
#[serde(remote = "Self", deny_unknown_fields)]
pub struct OutputFormat {
    /// `json_schema` (required).
    #[serde(rename = "type")]
    pub kind: Option<String>,
    /// The schema (required).
    pub schema: Option<Map<String, Value>>,
}

crate::object_only!(
    MessagesRequest,
    CountRequest,
    Conversation,
    MessageIn,
    Block,
    SourceIn,
    ToolIn,
    ToolChoiceIn,
    ThinkingIn,
    OutputConfig,
    OutputFormat
);

impl RequestBody for MessagesRequest {
    fn known_keys() -> Option<Vec<&'static str>> {
        Some(
            [
                field_names::<Self>(),
                field_names::<Conversation>(),
                field_names::<SamplingExtensions>(),
            ]
            .concat(),
        )
    }

    fn validate(&self) -> Result<(), ApiError> {
        self.decode_options(&DecodeOptions::default()).map(|_| ())
    }
}

impl GenerationBody for MessagesRequest {
    fn model_name(&self) -> Option<&str> {
        self.model.as_deref()
    }

    fn turn(&mut self, json: &Map<String, Value>, base: &DecodeOptions) -> Result<ChatRequest, ApiError> {
        let mut decode = self.decode_options(base)?;
        // llama.cpp's extension fields (`min_p`, `seed`, the penalties, ...), as every flat surface.
        body::part::<SamplingExtensions>(json)?.apply(&mut decode.sampling)?;
        let max = decode.max_tokens.map(|m| m as i64);
        let mut req = body::part::<Conversation>(json)?.turn(max)?;
        req.decode = decode;
        Ok(req)
    }
}

impl RequestBody for CountRequest {
    fn known_keys() -> Option<Vec<&'static str>> {
        Some([field_names::<Self>(), field_names::<Conversation>()].concat())
    }
}

impl GenerationBody for CountRequest {
    fn model_name(&self) -> Option<&str> {
        self.model.as_deref()
    }

    fn turn(&mut self, json: &Map<String, Value>, _base: &DecodeOptions) -> Result<ChatRequest, ApiError> {
        body::part::<Conversation>(json)?.turn(None)
    }
}

impl RequestBody for Conversation {}

impl MessagesRequest {
    /// Sampling, the token cap and the stop sequences over `base` (the pack's defaults), each out
    /// of range a 400 naming its field.
    fn decode_options(&self, base: &DecodeOptions) -> Result<DecodeOptions, ApiError> {
        let max_tokens = int_in("max_tokens", self.max_tokens, 1, u32::MAX as i64)?
            .ok_or_else(|| required("max_tokens"))?;
        let mut s = base.sampling.clone();
        if let Some(t) = num_in("temperature", self.temperature, 0.0, 1.0)? {
            s.temperature = t as f32;
        }
        if let Some(p) = num_in("top_p", self.top_p, 0.0, 1.0)? {
            s.top_p = p as f32;
        }
        if let Some(k) = int_in("top_k", self.top_k, 0, 1 << 20)? {
            s.top_k = k as usize;
        }
        let stop = match &self.stop_sequences {
            Some(stop) if stop.len() > MAX_STOP_SEQUENCES => {
                return Err(ApiError::param(
                    "stop_sequences",
                    format!(
                        "'stop_sequences' takes at most {MAX_STOP_SEQUENCES} sequences; got {}",
                        stop.len()
                    ),
                ))
            }
            Some(stop) => stop.clone(),
            None => base.stop.clone(),
        };
        Ok(DecodeOptions {
            sampling: s,
            max_tokens: Some(max_tokens as usize),
            stop: stop.into_iter().filter(|s| !s.is_empty()).collect(),
            ..base.settings()
        })
    }
}

/// A 400 saying `place` is required.
fn required(place: &str) -> ApiError {
    ApiError::param(place, format!("'{place}' is required"))
}

/// A required field of the block at `place`.
fn field<'a, T>(v: &'a Option<T>, place: &str, key: &str) -> Result<&'a T, ApiError> {
    v.as_ref().ok_or_else(|| required(&format!("{place}.{key}")))
}

/// A block's `type` (required).
fn kind<'a>(kind: &'a Option<String>, place: &str) -> Result<&'a str, ApiError> {
    field(kind, place, "type").map(String::as_str)
}

/// A 400 on the `type` of the block at `place`.
fn bad_type(place: &str, message: String) -> ApiError {
    ApiError::param(&format!("{place}.type"), message)
}

/// The text of a system prompt or a tool result: a string, or text blocks joined by newlines.
fn joined_text(content: &Blocks, place: &str) -> Result<String, ApiError> {
    let blocks = match content {
        Blocks::Text(s) => return Ok(s.clone()),
        Blocks::List(blocks) => blocks,
    };
    let mut texts = Vec::with_capacity(blocks.len());
    for (j, b) in blocks.iter().enumerate() {
        let here = format!("{place}[{j}]");
        match kind(&b.kind, &here)? {
            "text" => texts.push(field(&b.text, &here, "text")?.as_str()),
            t => {
                return Err(bad_type(
                    &here,
                    format!("'{t}' blocks are not supported here; only text blocks are"),
                ))
            }
        }
    }
    Ok(texts.join("\n"))
}

/// An image block's source: a base64 payload or a URL.
fn image_source(source: &Option<Value>, place: &str) -> Result<ImageSource, ApiError> {
    let here = format!("{place}.source");
    let source: SourceIn = body::typed(field(source, place, "source")?, &here)?;
    match kind(&source.kind, &here)? {
        "base64" => {
            field(&source.media_type, &here, "media_type")?;
            Ok(ImageSource::Base64(field(&source.data, &here, "data")?.clone()))
        }
        "url" => Ok(ImageSource::Url(field(&source.url, &here, "url")?.clone())),
        t => Err(bad_type(
            &here,
            format!("image source type '{t}' is not supported; use base64 or url"),
        )),
    }
}

impl Conversation {
    /// The typed turn (no decode options yet); `max_tokens` (absent when counting) bounds the
    /// thinking budget.
    fn turn(&self, max_tokens: Option<i64>) -> Result<ChatRequest, ApiError> {
        let response_format = self.response_format()?;
        let mut messages = Vec::new();
        if let Some(system) = &self.system {
            let text = joined_text(system, "system")?;
            if !text.is_empty() {
                messages.push(Message::text(Role::System, text));
            }
        }
        let turns = self.messages.as_deref().ok_or_else(|| required("messages"))?;
        if turns.is_empty() {
            return Err(ApiError::param("messages", "'messages' must not be empty"));
        }
        let mut tool_names = HashMap::new();
        for (i, m) in turns.iter().enumerate() {
            let at = format!("messages[{i}]");
            let content_at = format!("{at}.content");
            let content = m.content.as_ref().ok_or_else(|| required(&content_at))?;
            let one;
            let blocks = match content {
                Blocks::Text(s) => {
                    one = [Block::text(s)];
                    &one[..]
                }
                Blocks::List(list) => list.as_slice(),
            };
            match m.role.as_deref() {
                Some("user") => user_turn(blocks, &content_at, &tool_names, &mut messages)?,
                Some("assistant") if i + 1 == turns.len() => {
                    return Err(ApiError::param(
                        &at,
                        "a final assistant turn (a prefill to continue) is not supported; end with a user turn",
                    ))
                }
                Some("assistant") => messages.push(assistant_turn(blocks, &content_at, &mut tool_names)?),
                Some(r) => {
                    return Err(ApiError::param(
                        &format!("{at}.role"),
                        format!(
                            "'{r}' is not a message role: use user or assistant (the system prompt goes in 'system')"
                        ),
                    ))
                }
                None => return Err(required(&format!("{at}.role"))),
            }
        }
        let mut req = ChatRequest::new(Prompt::Chat(messages));
        req.constraints = self.constraints(response_format)?;
        if let Some(t) = &self.thinking {
            req.thinking = t.switch(max_tokens)?;
        }
        Ok(req)
    }

    /// Tools, `tool_choice` and the structured-output format, checked as the OpenAI fields they
    /// map to, with errors named as the Anthropic client sent them.
    fn constraints(&self, response_format: Option<Value>) -> Result<RequestConstraints, ApiError> {
        let tools = match &self.tools {
            Some(list) => Some(Value::Array(
                list.iter()
                    .enumerate()
                    .map(|(i, t)| t.to_openai(&format!("tools[{i}]")))
                    .collect::<Result<_, _>>()?,
            )),
            None => None,
        };
        let (choice, parallel) = match &self.tool_choice {
            Some(c) => c.to_openai()?,
            None => (None, None),
        };
        RequestConstraints::from_openai(
            tools.as_ref(),
            choice.as_ref(),
            parallel.as_ref(),
            response_format.as_ref(),
        )
        .map_err(anthropic_param)
    }

    /// Structured output: `output_config.format` (what the `anthropic` SDK's `messages.parse`
    /// sends) or the beta's top-level `output_format`, as the OpenAI `response_format`.
    fn response_format(&self) -> Result<Option<Value>, ApiError> {
        let config_format = self.output_config.as_ref().and_then(|c| c.format.as_ref());
        if config_format.is_some() && self.output_format.is_some() {
            return Err(ApiError::param(
                "output_format",
                "give the format in 'output_config.format' or in 'output_format', not both",
            ));
        }
        if let Some(e) = self.output_config.as_ref().and_then(|c| c.effort.as_deref()) {
            if !["low", "medium", "high", "xhigh", "max"].contains(&e) {
                return Err(ApiError::param(
                    "output_config.effort",
                    format!("'{e}' is not one of low, medium, high, xhigh, max"),
                ));
            }
        }
        let (format, place) = match (config_format, &self.output_format) {
            (Some(f), _) => (f, "output_config.format"),
            (None, Some(f)) => (f, "output_format"),
            (None, None) => return Ok(None),
        };
        match field(&format.kind, place, "type")?.as_str() {
            "json_schema" => {}
            t => {
                return Err(ApiError::param(
                    &format!("{place}.type"),
                    format!("'{t}' is not json_schema"),
                ))
            }
        }
        let schema = field(&format.schema, place, "schema")?;
        Ok(Some(json!({
            "type": "json_schema",
            "json_schema": {"name": "output", "schema": schema, "strict": true},
        })))
    }
}

impl Block {
    /// A text block (what a string content is).
    fn text(text: &str) -> Block {
        Block {
            kind: Some("text".into()),
            text: Some(text.into()),
            ..Block::default()
        }
    }
}

/// One user turn: text and images become one user message's parts, each `tool_result` a tool
/// message at its place (the parts before it a user message of their own).
fn user_turn(
    blocks: &[Block],
    place: &str,
    tool_names: &HashMap<String, String>,
    out: &mut Vec<Message>,
) -> Result<(), ApiError> {
    let mut parts = Vec::new();
    let flush = |parts: &mut Vec<Part>, out: &mut Vec<Message>| {
        if !parts.is_empty() {
            out.push(Message {
                content: Some(Content::Parts(std::mem::take(parts))),
                ..Message::text(Role::User, "")
            });
        }
    };
    for (j, b) in blocks.iter().enumerate() {
        let here = format!("{place}[{j}]");
        match kind(&b.kind, &here)? {
            "text" => parts.push(Part::Text(field(&b.text, &here, "text")?.clone())),
            "image" => parts.push(Part::Image(ImageRef {
                source: image_source(&b.source, &here)?,
                place: here,
            })),
            "tool_result" => {
                flush(&mut parts, out);
                let id = field(&b.tool_use_id, &here, "tool_use_id")?;
                let mut text = match &b.content {
                    Some(c) => joined_text(c, &format!("{here}.content"))?,
                    None => String::new(),
                };
                if b.is_error == Some(true) {
                    text = format!("Error: {text}");
                }
                out.push(Message::tool_result(
                    Some(id.clone()),
                    tool_names.get(id).cloned(),
                    text,
                ));
            }
            t @ ("tool_use" | "thinking" | "redacted_thinking") => {
                return Err(bad_type(&here, format!("'{t}' blocks belong in assistant turns")))
            }
            t => return Err(bad_type(&here, format!("'{t}' content blocks are not supported"))),
        }
    }
    flush(&mut parts, out);
    Ok(())
}

/// One assistant turn: its text, its thinking (as the reasoning given back) and its `tool_use`
/// blocks (as calls with JSON-text arguments). `redacted_thinking` is opaque and left out.
fn assistant_turn(
    blocks: &[Block],
    place: &str,
    tool_names: &mut HashMap<String, String>,
) -> Result<Message, ApiError> {
    let mut text = String::new();
    let mut reasoning = String::new();
    let mut calls = Vec::new();
    for (j, b) in blocks.iter().enumerate() {
        let here = format!("{place}[{j}]");
        match kind(&b.kind, &here)? {
            "text" => text.push_str(field(&b.text, &here, "text")?),
            "thinking" => reasoning.push_str(field(&b.thinking, &here, "thinking")?),
            "redacted_thinking" => {}
            "tool_use" => {
                let id = field(&b.id, &here, "id")?;
                let name = field(&b.name, &here, "name")?;
                let input = field(&b.input, &here, "input")?;
                tool_names.insert(id.clone(), name.clone());
                calls.push(Call {
                    id: Some(id.clone()),
                    name: name.clone(),
                    arguments: Value::String(Value::Object(input.clone()).to_string()),
                });
            }
            t @ ("image" | "tool_result") => {
                return Err(bad_type(&here, format!("'{t}' blocks belong in user turns")))
            }
            t => return Err(bad_type(&here, format!("'{t}' content blocks are not supported"))),
        }
    }
    Ok(Message {
        reasoning: (!reasoning.is_empty()).then_some(reasoning),
        tool_calls: calls,
        ..Message::text(Role::Assistant, text)
    })
}

impl ToolIn {
    /// The tool as an OpenAI function tool; a server tool (another `type`) is refused.
    fn to_openai(&self, place: &str) -> Result<Value, ApiError> {
        match self.kind.as_deref() {
            None | Some("custom") => {}
            Some(s) => {
                return Err(bad_type(
                    place,
                    format!(
                        "server tool '{s}' is not supported; only custom tools (name, description, input_schema) are"
                    ),
                ))
            }
        }
        let name = field(&self.name, place, "name")?;
        let schema = field(&self.input_schema, place, "input_schema")?;
        let mut function = json!({"name": name, "parameters": schema});
        if let Some(d) = &self.description {
            function["description"] = d.clone().into();
        }
        Ok(json!({"type": "function", "function": function}))
    }
}

impl ToolChoiceIn {
    /// The OpenAI `tool_choice` (`auto`, `required`, a named function, `none`) and
    /// `parallel_tool_calls` (false when `disable_parallel_tool_use` is set).
    fn to_openai(&self) -> Result<(Option<Value>, Option<Value>), ApiError> {
        let choice = match field(&self.kind, "tool_choice", "type")?.as_str() {
            "auto" => json!("auto"),
            "any" => json!("required"),
            "none" => json!("none"),
            "tool" => {
                let name = field(&self.name, "tool_choice", "name")?;
                json!({"type": "function", "function": {"name": name}})
            }
            t => {
                return Err(ApiError::param(
                    "tool_choice.type",
                    format!("'{t}' is not one of auto, any, tool, none"),
                ))
            }
        };
        let parallel = self.disable_parallel_tool_use.map(|d| Value::Bool(!d));
        Ok((Some(choice), parallel))
    }
}

impl ThinkingIn {
    /// The template's thinking switch; `max_tokens` (when known) must exceed an `enabled` budget.
    fn switch(&self, max_tokens: Option<i64>) -> Result<Thinking, ApiError> {
        let on = match field(&self.kind, "thinking", "type")?.as_str() {
            "enabled" => {
                let budget = int_in(
                    "thinking.budget_tokens",
                    self.budget_tokens,
                    MIN_THINKING_BUDGET,
                    u32::MAX as i64,
                )?
                .ok_or_else(|| required("thinking.budget_tokens"))?;
                if let Some(max) = max_tokens.filter(|&m| budget >= m) {
                    return Err(ApiError::param(
                        "thinking.budget_tokens",
                        format!("'thinking.budget_tokens' ({budget}) must be less than 'max_tokens' ({max})"),
                    ));
                }
                true
            }
            // The model decides how much to think: reasoning stays on.
            "adaptive" => true,
            "disabled" => false,
            t => {
                return Err(ApiError::param(
                    "thinking.type",
                    format!("'{t}' is not one of enabled, adaptive, disabled"),
                ))
            }
        };
        Ok(Thinking {
            enabled: Some(on),
            effort: None,
        })
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
fn stop_reason(end: &End) -> (&'static str, Option<String>) {
    match end.reason() {
        FinishReason::Length => ("max_tokens", None),
        FinishReason::ToolCalls => ("tool_use", None),
        _ => match &end.finish.stop_sequence {
            Some(s) => ("stop_sequence", Some(s.clone())),
            None => ("end_turn", None),
        },
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
fn content_blocks(msg: &ParsedMessage, request: &str) -> Vec<Value> {
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

/// The kind of content block open in a stream.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum OpenBlock {
    /// A `thinking` block.
    Thinking,
    /// A `text` block.
    Text,
    /// A `tool_use` block, for the reply's tool call of this index.
    Tool(usize),
}

/// Anthropic's event stream of a reply: `message_start`, content blocks opened and closed as the
/// reply's deltas change kind, then `message_delta` (stop reason, usage) and `message_stop`; an
/// `error` event when the engine fails the reply or the model goes away.
struct BlockEncoder {
    /// `message_start`'s message, sent first.
    message: Value,
    /// The request id part of tool-use ids.
    request: String,
    /// The index the next block gets.
    next_index: usize,
    /// The open block and its index.
    open: Option<(OpenBlock, usize)>,
    /// Whether the reply ended (or failed): nothing more is sent.
    over: bool,
}

impl BlockEncoder {
    /// The encoder of a reply whose `message_start` carries `message`.
    fn new(request: &str, message: Value) -> BlockEncoder {
        BlockEncoder {
            message,
            request: request.to_string(),
            next_index: 0,
            open: None,
            over: false,
        }
    }

    /// Closes the open block, if any.
    fn close(&mut self, out: &mut String) {
        if let Some((_, index)) = self.open.take() {
            sse_event(out, &json!({"type": "content_block_stop", "index": index}));
        }
    }

    /// Makes `kind` the open block (closing another, starting it with `start`); its index.
    fn open(&mut self, kind: OpenBlock, start: Value, out: &mut String) -> usize {
        match self.open {
            Some((open, index)) if open == kind => return index,
            _ => {}
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

    /// The events of a flush's deltas.
    fn push(&mut self, deltas: &[Delta], out: &mut String) {
        for d in deltas {
            let (index, delta) = match d {
                Delta::Reasoning(r) if !r.is_empty() => {
                    let start = json!({"type": "thinking", "thinking": "", "signature": ""});
                    let index = self.open(OpenBlock::Thinking, start, out);
                    (index, json!({"type": "thinking_delta", "thinking": r}))
                }
                Delta::Content(c) if !c.is_empty() => {
                    let index = self.open(OpenBlock::Text, json!({"type": "text", "text": ""}), out);
                    (index, json!({"type": "text_delta", "text": c}))
                }
                Delta::CallStart { index, name, .. } => {
                    let id = tool_use_id(&self.request, *index);
                    let start = json!({"type": "tool_use", "id": id, "name": name, "input": {}});
                    self.open(OpenBlock::Tool(*index), start, out);
                    continue;
                }
                Delta::CallArgs { index, fragment } if !fragment.is_empty() => match self.open {
                    Some((OpenBlock::Tool(i), block)) if i == *index => (
                        block,
                        json!({"type": "input_json_delta", "partial_json": fragment}),
                    ),
                    // Arguments of a call whose block is already closed cannot be sent.
                    _ => continue,
                },
                _ => continue,
            };
            sse_event(
                out,
                &json!({"type": "content_block_delta", "index": index, "delta": delta}),
            );
        }
    }
}

/// The `error` event that ends a stream.
fn stream_error(out: &mut String, kind: &str, message: &str) {
    sse_event(
        out,
        &json!({"type": "error", "error": {"type": kind, "message": message}}),
    );
}

impl Encoder for BlockEncoder {
    fn start(&mut self) -> String {
        let mut out = String::new();
        sse_event(
            &mut out,
            &json!({"type": "message_start", "message": self.message}),
        );
        sse_event(&mut out, &json!({"type": "ping"}));
        out
    }

    fn event(&mut self, _choice: usize, event: ReplyEvent) -> String {
        let mut out = String::new();
        match event {
            ReplyEvent::Grew { deltas, .. } => self.push(&deltas, &mut out),
            ReplyEvent::Ended { deltas, end, .. } => {
                self.push(&deltas, &mut out);
                self.close(&mut out);
                let (reason, sequence) = stop_reason(&end);
                sse_event(
                    &mut out,
                    &json!({
                        "type": "message_delta",
                        "delta": {"stop_reason": reason, "stop_sequence": sequence},
                        "usage": usage(&end.finish),
                    }),
                );
                sse_event(&mut out, &json!({"type": "message_stop"}));
                self.over = true;
            }
            ReplyEvent::Failed(e) => {
                stream_error(&mut out, "api_error", &e);
                self.over = true;
            }
        }
        out
    }

    fn end(&mut self) -> String {
        let mut out = String::new();
        if !self.over {
            stream_error(
                &mut out,
                "overloaded_error",
                "the model was unloaded during the request",
            );
        }
        out
    }
}

/// `POST /v1/messages`.
pub async fn messages(
    State(st): State<Shared>,
    Extension(RequestId(id)): Extension<RequestId>,
    b: Result<Bytes, BytesRejection>,
) -> Result<Response, AnthropicError> {
    let Prepared {
        request,
        turn: chat,
        model,
        ..
    } = pipeline::prepare::<MessagesRequest>(&st, b).await?;
    let mut turn = Turn::prepare(&model, chat, st.image_urls).await?;
    let prompt_len = turn.prompt.len();
    let rxs = turn.submit(&model, &id)?;
    let request_id = id.trim_start_matches("req-").to_string();
    let message = |content: Vec<Value>, stop: (Option<&str>, Option<String>), usage: Value| {
        json!({
            "id": format!("msg_{request_id}"),
            "type": "message",
            "role": "assistant",
            "model": model.reference,
            "content": content,
            "stop_reason": stop.0,
            "stop_sequence": stop.1,
            "usage": usage,
        })
    };
    if !request.stream.unwrap_or(false) {
        let replies = reply::collect_all(rxs, turn.parsers()).await?;
        let r = &replies[0];
        let (reason, sequence) = stop_reason(&r.end);
        let body = message(
            content_blocks(&r.message, &request_id),
            (Some(reason), sequence),
            usage(&r.end.finish),
        );
        return Ok(axum::Json(body).into_response());
    }
    let start = message(
        Vec::new(),
        (None, None),
        json!({
            "input_tokens": prompt_len,
            "output_tokens": 0,
            "cache_read_input_tokens": 0,
            "cache_creation_input_tokens": 0,
        }),
    );
    let events = reply::merged(rxs, turn.parsers());
    let wire = reply::encode(events, BlockEncoder::new(&request_id, start));
    Ok(pipeline::sse(wire.map(|s| Ok::<_, Infallible>(Bytes::from(s)))))
}

/// `POST /v1/messages/count_tokens`: the prompt tokens the same request would have.
pub async fn count_tokens(
    State(st): State<Shared>,
    b: Result<Bytes, BytesRejection>,
) -> Result<Response, AnthropicError> {
    let Prepared {
        turn: chat, model, ..
    } = pipeline::prepare::<CountRequest>(&st, b).await?;
    let turn = Turn::prepare(&model, chat, st.image_urls).await?;
    if turn.prompt.is_empty() {
        return Err(ApiError::param("messages", "the prompt is empty").into());
    }
    Ok(axum::Json(json!({"input_tokens": turn.prompt.len()})).into_response())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::constraint::ToolChoice;
    use axum::http::StatusCode;

    /// The typed turn of a Messages body (a model and `max_tokens` added when it has none), or
    /// the error's (status, param, message).
    fn checked(mut body: Value) -> Result<ChatRequest, (StatusCode, Option<String>, String)> {
        let b = body.as_object_mut().unwrap();
        b.entry("model").or_insert(json!("m"));
        b.entry("max_tokens").or_insert(json!(100_000));
        pipeline::check_body::<MessagesRequest>(body.to_string().as_bytes())
            .map(|(_, turn)| turn)
            .map_err(|e| (e.status, e.param, e.message))
    }

    /// The param named by the 400 a body gets before its model is looked up.
    fn refused(body: Value) -> (StatusCode, Option<String>, String) {
        let e = pipeline::check_body::<MessagesRequest>(body.to_string().as_bytes())
            .map(|_| ())
            .unwrap_err();
        (e.status, e.param, e.message)
    }

    /// The conversation of a turn.
    fn messages(r: &ChatRequest) -> &[Message] {
        match &r.prompt {
            Prompt::Chat(m) => m,
            Prompt::Raw { .. } => panic!("a raw prompt"),
        }
    }

    fn weather_tool() -> Value {
        json!({
            "name": "get_weather",
            "description": "Current weather of a city",
            "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
        })
    }

    #[test]
    fn blocks_become_typed_messages_in_order() {
        let r = checked(json!({
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
        let m = messages(&r);
        assert_eq!(m.len(), 6, "{m:#?}");
        assert_eq!(m[0], Message::text(Role::System, "Be brief.\nBe kind."));
        assert_eq!(m[1].role, Role::User);
        let image = |j: usize, source: ImageSource| {
            Part::Image(ImageRef {
                place: format!("messages[0].content[{j}]"),
                source,
            })
        };
        assert_eq!(
            m[1].content,
            Some(Content::Parts(vec![
                Part::Text("Look:".into()),
                image(1, ImageSource::Base64("AAAA".into())),
                image(2, ImageSource::Url("https://example.com/a.png".into())),
            ]))
        );
        assert_eq!(m[2].role, Role::Assistant);
        assert_eq!(m[2].content, Some(Content::Text("Checking.".into())));
        assert_eq!(m[2].reasoning.as_deref(), Some("They want weather."));
        assert_eq!(m[2].tool_calls.len(), 2);
        let call = &m[2].tool_calls[0];
        assert_eq!(
            (call.id.as_deref(), call.name.as_str()),
            (Some("toolu_1"), "get_weather")
        );
        let args: Value = serde_json::from_str(call.arguments.as_str().unwrap()).unwrap();
        assert_eq!(args, json!({"city": "Paris"}));
        // The template sees what the OpenAI-shaped conversion gave it before.
        let template = |k: usize| m[k].to_template(0, crate::turn::images::marker);
        assert_eq!(
            template(3),
            json!({"role": "tool", "tool_call_id": "toolu_1", "content": "sunny", "name": "get_weather"})
        );
        assert_eq!(m[4].content, Some(Content::Text("Error: no station".into())));
        assert_eq!(m[4].tool_call_id.as_deref(), Some("toolu_2"));
        assert_eq!(
            template(5),
            json!({"role": "user", "content": [{"type": "text", "text": "And so?"}]})
        );
        assert_eq!(template(2)["tool_calls"][1]["id"], "toolu_2");
    }

    #[test]
    fn string_content_and_no_system() {
        let r = checked(json!({"messages": [{"role": "user", "content": "Hi"}]})).unwrap();
        assert_eq!(
            messages(&r)[0].to_template(0, crate::turn::images::marker),
            json!({"role": "user", "content": [{"type": "text", "text": "Hi"}]})
        );
        assert_eq!(messages(&r).len(), 1);
        assert_eq!(r.constraints, RequestConstraints::default());
        assert!(r.template_extra().is_empty());
    }

    #[test]
    fn tool_choice_maps_to_the_constraints() {
        let with = |choice: Value| {
            checked(json!({
                "max_tokens": 10,
                "messages": [{"role": "user", "content": "Hi"}],
                "tools": [weather_tool()],
                "tool_choice": choice,
            }))
            .map(|r| r.constraints)
        };
        let c = with(json!({"type": "auto"})).unwrap();
        assert_eq!((c.tool_choice, c.parallel_tool_calls), (ToolChoice::Auto, true));
        let c = with(json!({"type": "any", "disable_parallel_tool_use": true})).unwrap();
        assert_eq!(
            (c.tool_choice, c.parallel_tool_calls),
            (ToolChoice::Required, false)
        );
        let c =
            with(json!({"type": "tool", "name": "get_weather", "disable_parallel_tool_use": false})).unwrap();
        assert_eq!(
            (c.tool_choice, c.parallel_tool_calls),
            (ToolChoice::Named("get_weather".into()), true)
        );
        let c = with(json!({"type": "none"})).unwrap();
        assert!(c.parser_tools().is_none(), "tool_choice none hides the tools");
        let c = with(json!({"type": "auto"})).unwrap();
        let tools = c.parser_tools().unwrap();
        assert_eq!(tools[0]["function"]["name"], "get_weather");
        assert_eq!(tools[0]["function"]["parameters"]["required"], json!(["city"]));
        assert_eq!(tools[0]["function"]["description"], "Current weather of a city");
        // A named tool that is not declared.
        let e = with(json!({"type": "tool", "name": "nope"})).unwrap_err();
        assert_eq!(e.1.as_deref(), Some("tool_choice"));
    }

    #[test]
    fn output_config_format_is_the_response_format() {
        let schema = json!({"type": "object", "properties": {"a": {"type": "integer"}}});
        let format = json!({"type": "json_schema", "schema": schema});
        for (key, v) in [
            ("output_config", json!({"format": format, "effort": "high"})),
            ("output_format", format.clone()),
        ] {
            let mut body = json!({"messages": [{"role": "user", "content": "Hi"}]});
            body[key] = v;
            let r = checked(body).unwrap();
            assert_eq!(
                r.constraints.response_format,
                crate::constraint::ResponseFormat::JsonSchema(schema.clone())
            );
        }
        for (key, v, param) in [
            (
                "output_config",
                json!({"format": format, "colour": 1}),
                "output_config",
            ),
            (
                "output_config",
                json!({"effort": "extreme"}),
                "output_config.effort",
            ),
            (
                "output_format",
                json!({"type": "json_object"}),
                "output_format.type",
            ),
            (
                "output_format",
                json!({"type": "json_schema"}),
                "output_format.schema",
            ),
        ] {
            let mut body = json!({"messages": [{"role": "user", "content": "Hi"}]});
            body[key] = v;
            let e = checked(body).unwrap_err();
            assert_eq!(e.1.as_deref().map(|p| p.starts_with(param)), Some(true), "{e:?}");
        }
    }

    #[test]
    fn thinking_sets_the_template_switch() {
        let base = |thinking: Value| {
            checked(json!({
                "max_tokens": 4096,
                "messages": [{"role": "user", "content": "Hi"}],
                "thinking": thinking,
            }))
        };
        let r = base(json!({"type": "enabled", "budget_tokens": 2048})).unwrap();
        assert_eq!(r.template_extra()["enable_thinking"], json!(true));
        let r = base(json!({"type": "disabled"})).unwrap();
        assert_eq!(r.template_extra()["enable_thinking"], json!(false));
        for bad in [
            json!({"type": "enabled"}),
            json!({"type": "enabled", "budget_tokens": 100}),
            json!({"type": "enabled", "budget_tokens": 5000}),
        ] {
            let (status, param, _) = base(bad.clone()).unwrap_err();
            assert_eq!(
                (status, param.as_deref()),
                (StatusCode::BAD_REQUEST, Some("thinking.budget_tokens")),
                "{bad}"
            );
        }
        let e = base(json!({"type": "sometimes"})).unwrap_err();
        assert_eq!(e.1.as_deref(), Some("thinking.type"));
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
        let user = |blocks: Value| with("messages", json!([{"role": "user", "content": blocks}]));
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
            (with("min_p", json!(2)), "min_p"),
            (with("seed", json!("x")), "seed"),
            (with("stop_sequences", json!("END")), "stop_sequences"),
            (with("stop_sequences", json!(["a", 1])), "stop_sequences[1]"),
            (with("stop_sequences", json!(vec!["x"; 65])), "stop_sequences"),
            (with("system", json!(7)), "system"),
            (with("system", json!([{"type": "image"}])), "system[0].type"),
            (with("metadata", json!("x")), "metadata"),
            (with("messages", json!([])), "messages"),
            (with("messages", json!({"role": "user"})), "messages"),
            (with("messages", json!([7])), "messages[0]"),
            (
                with("messages", json!([{"role": "system", "content": "x"}])),
                "messages[0].role",
            ),
            (
                with("messages", json!([{"role": 5, "content": "x"}])),
                "messages[0].role",
            ),
            (with("messages", json!([{"role": "user"}])), "messages[0].content"),
            (
                with("messages", json!([{"role": "user", "content": 5}])),
                "messages[0].content",
            ),
            (user(json!([{"text": "x"}])), "messages[0].content[0].type"),
            (
                user(json!([{"type": "text", "text": 5}])),
                "messages[0].content[0].text",
            ),
            (
                user(json!([{"type": "document", "source": {}}])),
                "messages[0].content[0].type",
            ),
            (
                user(json!([{"type": "search_result", "source": "https://x", "title": "t", "content": []}])),
                "messages[0].content[0].type",
            ),
            (
                user(json!([{"type": "tool_use", "id": "a", "name": "f", "input": {}}])),
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
                user(json!([{"type": "tool_result", "content": "x"}])),
                "messages[0].content[0].tool_use_id",
            ),
            (
                user(json!([{"type": "tool_result", "tool_use_id": "a", "is_error": "yes"}])),
                "messages[0].content[0].is_error",
            ),
            (
                user(json!([{"type": "tool_result", "tool_use_id": "a", "content": [{"type": "image"}]}])),
                "messages[0].content[0].content[0].type",
            ),
            (
                user(json!([{"type": "image", "source": {"type": "file", "file_id": "f"}}])),
                "messages[0].content[0].source.type",
            ),
            (
                with(
                    "messages",
                    json!([
                        {"role": "user", "content": "Hi"},
                        {"role": "assistant", "content": "Hello"},
                        {"role": "user", "content": [{"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": 5}}]},
                    ]),
                ),
                "messages[2].content[0].source.data",
            ),
            (
                user(json!([{"type": "image", "source": {"type": "base64", "data": "AAAA"}}])),
                "messages[0].content[0].source.media_type",
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
                with("tools", json!([{"name": "f", "input_schema": "x"}])),
                "tools[0].input_schema",
            ),
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
        let (_, _, message) = refused(user(json!([{"type": "audio"}])));
        assert_eq!(message, "'audio' content blocks are not supported");
        // The accepted fields pass, and reach the decode options.
        let mut b = ok.clone();
        for (k, v) in [
            ("metadata", json!({"user_id": "u"})),
            ("service_tier", json!("auto")),
            ("stream", json!(false)),
            ("cache_control", json!({"type": "ephemeral"})),
            ("temperature", json!(0)),
            ("top_p", json!(0.9)),
            ("top_k", json!(5)),
            ("stop_sequences", json!(["END", ""])),
            ("tools", json!([weather_tool()])),
            ("tool_choice", json!({"type": "auto"})),
        ] {
            b[k] = v;
        }
        let d = checked(b).unwrap().decode;
        assert_eq!((d.max_tokens, d.stop.clone()), (Some(8), vec!["END".to_string()]));
        assert_eq!((d.sampling.temperature, d.sampling.top_k), (0.0, 5));
        // count_tokens takes the conversation, not the generation's fields.
        let count = |b: &Value| pipeline::check_body::<CountRequest>(b.to_string().as_bytes()).map(|_| ());
        assert!(count(&without("max_tokens")).is_ok());
        assert_eq!(count(&ok).unwrap_err().param.as_deref(), Some("max_tokens"));
    }

    #[test]
    fn min_p_and_seed_are_extension_fields() {
        let r = checked(json!({"messages": [{"role": "user", "content": "Hi"}],
            "top_k": 40, "min_p": 0.05, "seed": 42}))
        .unwrap();
        let s = &r.decode.sampling;
        assert_eq!((s.top_k, s.min_p, s.seed), (40, 0.05, Some(42)));
        let r = checked(json!({"messages": [{"role": "user", "content": "Hi"}]})).unwrap();
        let d = crate::sampling::SamplingParams::default();
        assert_eq!((r.decode.sampling.min_p, r.decode.sampling.seed), (d.min_p, None));
    }

    #[test]
    fn repeat_last_n_reaches_messages_as_every_flat_surface_takes_it() {
        let r = checked(json!({"messages": [{"role": "user", "content": "Hi"}],
            "repetition_penalty": 1.3, "repeat_last_n": 7}))
        .unwrap();
        assert_eq!(
            (r.decode.sampling.repeat_penalty, r.decode.sampling.repeat_last_n),
            (1.3, 7)
        );
        let e = checked(json!({"messages": [{"role": "user", "content": "Hi"}], "repeat_last_n": -2}))
            .unwrap_err();
        assert_eq!(e.1.as_deref(), Some("repeat_last_n"));
    }

    #[tokio::test]
    async fn errors_answer_in_anthropic_shape() {
        let body = |e: ApiError| async move {
            let resp = AnthropicError(e).into_response();
            let status = resp.status();
            let bytes = axum::body::to_bytes(resp.into_body(), 1 << 16).await.unwrap();
            (status, serde_json::from_slice::<Value>(&bytes).unwrap())
        };
        let (status, v) = body(ApiError::param("max_tokens", "'max_tokens' is required")).await;
        assert_eq!(status, StatusCode::BAD_REQUEST);
        assert_eq!(
            v,
            json!({"type": "error", "error": {"type": "invalid_request_error", "message": "'max_tokens' is required"}})
        );
        let (status, v) = body(ApiError::model_not_found("nope")).await;
        assert_eq!(status, StatusCode::NOT_FOUND);
        assert_eq!(v["error"]["type"], "not_found_error");
        assert!(v["error"]["message"].as_str().unwrap().contains("nope"));
        // A message that does not name its parameter gets it prefixed.
        let (_, v) = body(ApiError::param(
            "tools[0].input_schema",
            "must be a JSON schema object",
        ))
        .await;
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
            let (_, v) = body(ApiError::new(status, "x")).await;
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
    fn deltas_become_content_block_events() {
        let mut enc = BlockEncoder::new("7", json!({"id": "msg_7"}));
        let grew = |deltas: Vec<Delta>| ReplyEvent::Grew {
            deltas,
            logprobs: Vec::new(),
        };
        let call = |index: usize, name: &str| Delta::CallStart {
            index,
            id: format!("call_{index}"),
            name: name.into(),
        };
        let args = |index: usize, fragment: &str| Delta::CallArgs {
            index,
            fragment: fragment.into(),
        };
        let mut out = enc.start();
        out += &enc.event(0, grew(vec![Delta::Reasoning("Hmm".into())]));
        out += &enc.event(
            0,
            grew(vec![
                Delta::Reasoning(" ok".into()),
                Delta::Content("Sure.".into()),
            ]),
        );
        out += &enc.event(0, grew(vec![call(0, "get_weather"), args(0, "{\"ci")]));
        out += &enc.event(0, grew(vec![args(0, "ty\": \"Paris\"}")]));
        out += &enc.event(0, grew(vec![call(1, "get_weather"), args(1, "")]));
        let end = End {
            finish: finish(FinishReason::Stop, None),
            calls: true,
        };
        out += &enc.event(
            0,
            ReplyEvent::Ended {
                deltas: Vec::new(),
                logprobs: Vec::new(),
                end,
            },
        );
        assert_eq!(enc.end(), "", "nothing follows message_stop");
        let ev = events(&out);
        let kinds: Vec<&str> = ev.iter().map(|(k, _)| k.as_str()).collect();
        assert_eq!(
            kinds,
            [
                "message_start",
                "ping",
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
                "message_delta",
                "message_stop",
            ]
        );
        assert_eq!(ev[0].1["message"]["id"], "msg_7");
        assert_eq!(ev[2].1["content_block"]["type"], "thinking");
        assert_eq!(
            ev[3].1["delta"],
            json!({"type": "thinking_delta", "thinking": "Hmm"})
        );
        assert_eq!(ev[6].1["index"], 1);
        assert_eq!(ev[7].1["delta"], json!({"type": "text_delta", "text": "Sure."}));
        assert_eq!(
            ev[9].1["content_block"],
            json!({"type": "tool_use", "id": "toolu_7_0", "name": "get_weather", "input": {}})
        );
        let joined: String = ev[10..12]
            .iter()
            .map(|(_, d)| d["delta"]["partial_json"].as_str().unwrap())
            .collect();
        assert_eq!(
            serde_json::from_str::<Value>(&joined).unwrap(),
            json!({"city": "Paris"})
        );
        assert_eq!(ev[13].1["index"], 3);
        assert_eq!(ev[13].1["content_block"]["id"], "toolu_7_1");
        assert_eq!(
            ev[15].1["delta"],
            json!({"stop_reason": "tool_use", "stop_sequence": null})
        );
        assert_eq!(ev[15].1["usage"]["output_tokens"], 3);
    }

    #[test]
    fn a_failed_or_vanished_reply_ends_with_an_error_event() {
        let mut enc = BlockEncoder::new("7", json!({}));
        let out = enc.event(0, ReplyEvent::Failed("boom".into()));
        assert_eq!(
            events(&out)[0].1["error"],
            json!({"type": "api_error", "message": "boom"})
        );
        assert_eq!(enc.end(), "");
        let mut enc = BlockEncoder::new("7", json!({}));
        enc.event(
            0,
            ReplyEvent::Grew {
                deltas: vec![Delta::Content("Hi".into())],
                logprobs: Vec::new(),
            },
        );
        let ev = events(&enc.end());
        assert_eq!(ev[0].1["error"]["type"], "overloaded_error");
    }

    #[test]
    fn stop_reasons_and_usage() {
        let end = |reason, stop: Option<&str>, calls| End {
            finish: finish(reason, stop),
            calls,
        };
        assert_eq!(
            stop_reason(&end(FinishReason::Stop, None, false)),
            ("end_turn", None)
        );
        assert_eq!(
            stop_reason(&end(FinishReason::Stop, Some("END"), false)),
            ("stop_sequence", Some("END".to_string()))
        );
        assert_eq!(
            stop_reason(&end(FinishReason::Stop, None, true)),
            ("tool_use", None)
        );
        assert_eq!(
            stop_reason(&end(FinishReason::Length, None, true)),
            ("max_tokens", None)
        );
        assert_eq!(
            usage(&finish(FinishReason::Stop, None)),
            json!({"input_tokens": 6, "output_tokens": 3, "cache_read_input_tokens": 4, "cache_creation_input_tokens": 0})
        );
        let msg = ParsedMessage {
            reasoning_content: Some("r".into()),
            content: Some("t".into()),
            tool_calls: vec![crate::chat::ToolCall {
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
