//! Chat messages as the OpenAI and Ollama chat APIs take them: typed for checking (every field of
//! the wrong type is a 400 naming its path), then handed on as JSON to the chat template, which
//! reads them as the client wrote them.

use super::body::typed;
use super::ApiError;
use crate::turn::{Call, Content, ImageRef, ImageSource, Message, Part, Role};
use serde::de::{self, Deserializer, SeqAccess, Visitor};
use serde::Deserialize;
use serde_json::Value;
use std::fmt;

/// One chat message.
#[derive(Clone, Debug, Deserialize)]
#[serde(remote = "Self")]
pub struct ChatMessage {
    /// Who speaks it (required).
    pub role: Option<Role>,
    /// Its text, or its parts.
    pub content: Option<MessageContent>,
    /// The call a tool message answers (OpenAI; required there on a tool message).
    pub tool_call_id: Option<String>,
    /// The calls an assistant message made.
    pub tool_calls: Option<Vec<ToolCallIn>>,
    /// The speaker's name (OpenAI), passed to the template.
    pub name: Option<String>,
    /// The reasoning of an assistant turn, given back (an extension several clients send).
    pub reasoning_content: Option<String>,
    /// Ollama: the reasoning of an assistant turn, given back.
    pub thinking: Option<String>,
    /// Ollama: the tool a tool message answers for.
    pub tool_name: Option<String>,
    /// Ollama: base64 images, placed before the text.
    pub images: Option<Vec<Value>>,
}

/// A message's content: text, or a list of parts.
#[derive(Clone, Debug)]
pub enum MessageContent {
    /// Plain text.
    Text(String),
    /// Typed parts (text, images, ...).
    Parts(Vec<ContentPart>),
}

impl<'de> Deserialize<'de> for MessageContent {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<MessageContent, D::Error> {
        struct ContentVisitor;
        impl<'de> Visitor<'de> for ContentVisitor {
            type Value = MessageContent;

            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a string or an array of parts")
            }

            fn visit_str<E: de::Error>(self, v: &str) -> Result<MessageContent, E> {
                Ok(MessageContent::Text(v.to_string()))
            }

            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<MessageContent, A::Error> {
                let mut parts = Vec::new();
                while let Some(p) = seq.next_element::<ContentPart>()? {
                    parts.push(p);
                }
                Ok(MessageContent::Parts(parts))
            }
        }
        d.deserialize_any(ContentVisitor)
    }
}

/// The kinds of content part the chat APIs define.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum PartType {
    /// Text.
    Text,
    /// An image by URL or data URL.
    ImageUrl,
    /// Audio input.
    InputAudio,
    /// A file.
    File,
    /// A refusal (assistant messages).
    Refusal,
    /// An image (some clients' name).
    Image,
}

/// One content part; fields other than `type` and `text` are read by the image code.
#[derive(Clone, Debug, Deserialize)]
#[serde(remote = "Self")]
pub struct ContentPart {
    /// Its kind (required).
    #[serde(rename = "type")]
    pub kind: Option<PartType>,
    /// Its text (required on a text part).
    pub text: Option<String>,
    /// An `image_url` part's image: a URL string, or `{"url": ...}`.
    pub image_url: Option<Value>,
}

/// A tool call an assistant message made.
#[derive(Clone, Debug, Deserialize)]
#[serde(remote = "Self")]
pub struct ToolCallIn {
    /// The call's id.
    pub id: Option<String>,
    /// The function called (required).
    pub function: Option<FunctionCallIn>,
}

/// The function of a tool call.
#[derive(Clone, Debug, Deserialize)]
#[serde(remote = "Self")]
pub struct FunctionCallIn {
    /// Its name (required).
    pub name: Option<String>,
    /// Its arguments: a JSON string (OpenAI) or an object (Ollama).
    pub arguments: Option<Value>,
}

crate::object_only!(ChatMessage, ContentPart, ToolCallIn, FunctionCallIn);

/// A 400 saying `path` is required.
fn required(path: &str, what: &str) -> ApiError {
    ApiError::param(path, format!("'{path}' is required{what}"))
}

impl ChatMessage {
    /// Checks what the types cannot: the role is given, a tool message names its call
    /// (`openai`; Ollama's name the tool instead), only assistant messages carry calls and each
    /// call names its function, a text part has text. `at` is the message's path (`messages[2]`).
    pub fn check(&self, at: &str, openai: bool) -> Result<(), ApiError> {
        let Some(role) = self.role else {
            return Err(required(&format!("{at}.role"), ""));
        };
        if openai && role == Role::Tool && self.tool_call_id.is_none() {
            return Err(required(
                &format!("{at}.tool_call_id"),
                " (a string) on a tool message",
            ));
        }
        if let Some(calls) = &self.tool_calls {
            if role != Role::Assistant {
                let p = format!("{at}.tool_calls");
                return Err(ApiError::param(
                    &p,
                    format!("'{p}' is only allowed on an assistant message"),
                ));
            }
            for (k, call) in calls.iter().enumerate() {
                let q = format!("{at}.tool_calls[{k}].function");
                let Some(function) = &call.function else {
                    return Err(required(&q, ""));
                };
                if function.name.is_none() {
                    return Err(required(&format!("{q}.name"), " (a string)"));
                }
                if function
                    .arguments
                    .as_ref()
                    .is_some_and(|a| !(a.is_string() || a.is_object() || a.is_null()))
                {
                    let p = format!("{q}.arguments");
                    return Err(ApiError::param(
                        &p,
                        format!("'{p}' must be a JSON string or an object"),
                    ));
                }
            }
        }
        for (j, img) in self.images.iter().flatten().enumerate() {
            if !img.is_string() {
                let p = format!("{at}.images[{j}]");
                return Err(ApiError::param(&p, format!("{p}: must be a base64 string")));
            }
        }
        if let Some(MessageContent::Parts(parts)) = &self.content {
            for (j, part) in parts.iter().enumerate() {
                let p = format!("{at}.content[{j}]");
                match part.kind {
                    None => return Err(required(&format!("{p}.type"), " (text, image_url, ...)")),
                    Some(PartType::Text) if part.text.is_none() => {
                        return Err(required(&format!("{p}.text"), " (a string)"))
                    }
                    _ => {}
                }
            }
        }
        Ok(())
    }
}

impl ChatMessage {
    /// The typed turn message of a checked message (`at`: its path, for the images' places).
    pub fn to_turn(&self, at: &str) -> Message {
        let role = self.role.unwrap_or(Role::User);
        let images: Vec<Part> = self
            .images
            .iter()
            .flatten()
            .enumerate()
            .map(|(j, b)| {
                Part::Image(ImageRef {
                    place: format!("{at}.images[{j}]"),
                    source: ImageSource::Base64(b.as_str().unwrap_or_default().to_string()),
                })
            })
            .collect();
        let content = self.content.as_ref().map(|c| match c {
            MessageContent::Text(t) => Content::Text(t.clone()),
            MessageContent::Parts(parts) => Content::Parts(
                parts
                    .iter()
                    .enumerate()
                    .filter_map(|(j, p)| match p.kind {
                        Some(PartType::Text) => Some(Part::Text(p.text.clone().unwrap_or_default())),
                        Some(PartType::ImageUrl) => {
                            let url = match &p.image_url {
                                Some(Value::String(s)) => s.clone(),
                                Some(Value::Object(o)) => {
                                    o.get("url").and_then(Value::as_str).unwrap_or("").to_string()
                                }
                                _ => String::new(),
                            };
                            Some(Part::Image(ImageRef {
                                place: format!("{at}.content[{j}]"),
                                source: ImageSource::Url(url),
                            }))
                        }
                        _ => None,
                    })
                    .collect(),
            ),
        });
        let tool_calls = self
            .tool_calls
            .iter()
            .flatten()
            .filter_map(|c| {
                let f = c.function.as_ref()?;
                Some(Call {
                    id: c.id.clone(),
                    name: f.name.clone().unwrap_or_default(),
                    arguments: f.arguments.clone().unwrap_or(Value::Null),
                })
            })
            .collect();
        // Ollama's images go before the message's text, as Ollama puts them.
        let content = match (images.is_empty(), content) {
            (true, c) => c,
            (false, Some(Content::Text(t))) => Some(Content::Parts([images, vec![Part::Text(t)]].concat())),
            (false, Some(Content::Parts(p))) => Some(Content::Parts([images, p].concat())),
            (false, None) => Some(Content::Parts(images)),
        };
        Message {
            role,
            content,
            reasoning: self.reasoning_content.clone().or_else(|| self.thinking.clone()),
            tool_calls,
            tool_call_id: self.tool_call_id.clone(),
            name: self.name.clone().or_else(|| self.tool_name.clone()),
        }
    }
}

/// The typed turn messages of a checked conversation (none when absent).
pub fn to_turn(messages: Option<&Vec<ChatMessage>>) -> Vec<Message> {
    messages
        .into_iter()
        .flatten()
        .enumerate()
        .map(|(i, m)| m.to_turn(&format!("messages[{i}]")))
        .collect()
}

/// Checks typed messages (400 naming the first bad field); `openai` as in [`ChatMessage::check`].
pub fn check(messages: &[ChatMessage], openai: bool) -> Result<(), ApiError> {
    if messages.is_empty() {
        return Err(ApiError::param("messages", "'messages' must not be empty"));
    }
    for (i, m) in messages.iter().enumerate() {
        m.check(&format!("messages[{i}]"), openai)?;
    }
    Ok(())
}

/// Checks messages given as JSON (the shape other APIs convert theirs to).
pub fn check_json(messages: &[Value], openai: bool) -> Result<(), ApiError> {
    if messages.is_empty() {
        return Err(ApiError::param("messages", "'messages' must not be empty"));
    }
    for (i, m) in messages.iter().enumerate() {
        let at = format!("messages[{i}]");
        typed::<ChatMessage>(m, &at)?.check(&at, openai)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::check_json;
    use serde_json::{json, Value};

    /// (status, param) of a message list's refusal.
    fn refusal(messages: Value, openai: bool) -> Result<(), (u16, String)> {
        check_json(messages.as_array().unwrap(), openai)
            .map_err(|e| (e.status.as_u16(), e.param.unwrap_or_default()))
    }

    #[test]
    fn each_malformed_message_names_its_field() {
        let user = json!({"role": "user", "content": "hi"});
        for (bad, param) in [
            (json!([{"role": "tool"}]), "messages[0].tool_call_id"),
            (
                json!([user, {"role": "tool", "tool_call_id": 7}]),
                "messages[1].tool_call_id",
            ),
            (json!([{"content": "hi"}]), "messages[0].role"),
            (json!([{"role": 5}]), "messages[0].role"),
            (json!([{"role": "wizard"}]), "messages[0].role"),
            (json!([7]), "messages[0]"),
            (json!([{"role": "user", "content": 5}]), "messages[0].content"),
            (
                json!([{"role": "user", "content": [{"type": "text"}]}]),
                "messages[0].content[0].text",
            ),
            (
                json!([{"role": "user", "content": [{"type": "text", "text": 1}]}]),
                "messages[0].content[0].text",
            ),
            (
                json!([{"role": "user", "content": [{"type": "video"}]}]),
                "messages[0].content[0].type",
            ),
            (
                json!([{"role": "user", "content": [{"text": "x"}]}]),
                "messages[0].content[0].type",
            ),
            (
                json!([{"role": "user", "content": ["x"]}]),
                "messages[0].content[0]",
            ),
            (
                json!([{"role": "assistant", "tool_calls": "f()"}]),
                "messages[0].tool_calls",
            ),
            (
                json!([{"role": "user", "tool_calls": []}]),
                "messages[0].tool_calls",
            ),
            (
                json!([{"role": "assistant", "tool_calls": [{"function": {"arguments": "{}"}}]}]),
                "messages[0].tool_calls[0].function.name",
            ),
            (
                json!([{"role": "assistant", "tool_calls": [{}]}]),
                "messages[0].tool_calls[0].function",
            ),
            (
                json!([{"role": "assistant", "tool_calls": [{"function": {"name": "f", "arguments": 3}}]}]),
                "messages[0].tool_calls[0].function.arguments",
            ),
            (json!([]), "messages"),
        ] {
            assert_eq!(refusal(bad.clone(), true), Err((400, param.to_string())), "{bad}");
        }
    }

    #[test]
    fn well_formed_conversations_pass_and_null_is_absent() {
        let good = json!([{"role": "system", "content": null},
            {"role": "user", "content": [{"type": "text", "text": "hi"}, {"type": "image_url", "image_url": {"url": "x"}}]},
            {"role": "assistant", "content": null, "tool_calls": [{"id": "c", "type": "function",
                "function": {"name": "f", "arguments": "{}"}}]},
            {"role": "tool", "tool_call_id": "c", "content": "1", "extra": {"kept": true}}]);
        assert_eq!(refusal(good, true), Ok(()));
        // Ollama's tool messages name the tool, not a call id; its arguments are objects.
        let ollama = json!([{"role": "user", "content": "hi"},
            {"role": "assistant", "tool_calls": [{"function": {"name": "f", "arguments": {"a": 1}}}]},
            {"role": "tool", "tool_name": "f", "content": "1"}]);
        assert_eq!(refusal(ollama.clone(), false), Ok(()));
        assert_eq!(
            refusal(ollama, true),
            Err((400, "messages[2].tool_call_id".to_string()))
        );
    }
}
