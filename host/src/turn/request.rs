//! The typed chat turn every surface maps its wire request into: messages with typed parts, the
//! tools and formats, the decode options, the number of choices and the template variables.

use crate::constraint::RequestConstraints;
use crate::decoding::DecodeOptions;
use serde_json::{json, Map, Value};

/// Who speaks a message (as the chat APIs spell it; `function` is the legacy name for `tool`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Role {
    /// Instructions.
    System,
    /// Instructions (OpenAI's newer name for `system`).
    Developer,
    /// The user.
    User,
    /// The model.
    Assistant,
    /// A tool's result.
    #[serde(alias = "function")]
    Tool,
}

impl Role {
    /// The role as templates name it.
    pub fn as_str(self) -> &'static str {
        match self {
            Role::System => "system",
            Role::Developer => "developer",
            Role::User => "user",
            Role::Assistant => "assistant",
            Role::Tool => "tool",
        }
    }
}

/// Where an image's bytes come from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ImageSource {
    /// An `http(s)` or `data:` URL.
    Url(String),
    /// Base64 bytes (Ollama's `images`, Anthropic's `base64` source).
    Base64(String),
    /// The bytes themselves (`berth run`'s image files).
    Bytes(Vec<u8>),
}

/// One image of a message, with where the client put it (for errors).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ImageRef {
    /// Its place in the request as the client wrote it (`messages[1].content[2]`).
    pub place: String,
    /// Its bytes' source.
    pub source: ImageSource,
}

/// One part of a message's content.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Part {
    /// Text.
    Text(String),
    /// An image.
    Image(ImageRef),
}

/// A message's content, in the form the client wrote it (templates read it that way: some
/// iterate a list of parts, others print a string).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Content {
    /// Plain text.
    Text(String),
    /// A list of parts.
    Parts(Vec<Part>),
}

impl Content {
    /// Text with images before it (as Ollama and `berth run` place them): plain text when there
    /// are none, so templates see what a client sending text would send.
    pub fn images_then_text(images: Vec<ImageRef>, text: String) -> Content {
        if images.is_empty() {
            return Content::Text(text);
        }
        let mut parts: Vec<Part> = images.into_iter().map(Part::Image).collect();
        parts.push(Part::Text(text));
        Content::Parts(parts)
    }
}

/// A tool call an assistant message made.
#[derive(Clone, Debug, PartialEq)]
pub struct Call {
    /// Its id, when the surface has ids.
    pub id: Option<String>,
    /// The function called.
    pub name: String,
    /// Its arguments as the surface gives them: JSON text (OpenAI, Anthropic, Responses) or an
    /// object (Ollama); templates take either.
    pub arguments: Value,
}

/// One message of the conversation.
#[derive(Clone, Debug, PartialEq)]
pub struct Message {
    /// Who speaks it.
    pub role: Role,
    /// Its content; `None` when the client sent none (an assistant turn of only calls).
    pub content: Option<Content>,
    /// The reasoning of an assistant turn, given back.
    pub reasoning: Option<String>,
    /// The calls of an assistant turn.
    pub tool_calls: Vec<Call>,
    /// The call a tool message answers.
    pub tool_call_id: Option<String>,
    /// The speaker's or tool's name.
    pub name: Option<String>,
}

impl Message {
    /// A message of plain text.
    pub fn text(role: Role, text: impl Into<String>) -> Message {
        Message {
            role,
            content: Some(Content::Text(text.into())),
            reasoning: None,
            tool_calls: Vec::new(),
            tool_call_id: None,
            name: None,
        }
    }

    /// A tool's result for the call `call_id`.
    pub fn tool_result(call_id: Option<String>, name: Option<String>, text: String) -> Message {
        Message {
            tool_call_id: call_id,
            name,
            ..Message::text(Role::Tool, text)
        }
    }

    /// The images of the message, in order.
    pub fn images(&self) -> impl Iterator<Item = &ImageRef> {
        let parts = match &self.content {
            Some(Content::Parts(p)) => p.as_slice(),
            _ => &[],
        };
        parts.iter().filter_map(|p| match p {
            Part::Image(i) => Some(i),
            Part::Text(_) => None,
        })
    }

    /// The message as chat templates (and openai-harmony) read it: OpenAI's message shape. A
    /// message with images has its parts joined into one string, each image replaced by
    /// `marker(k)` (`k` counts the images of the conversation, from `first_image`).
    pub fn to_template(&self, first_image: usize, marker: impl Fn(usize) -> String) -> Value {
        let mut m = Map::new();
        m.insert("role".into(), self.role.as_str().into());
        let content = match &self.content {
            None => Value::Null,
            Some(Content::Text(t)) => t.clone().into(),
            Some(Content::Parts(parts)) if self.images().next().is_some() => {
                let mut text = String::new();
                let mut k = first_image;
                for p in parts {
                    match p {
                        Part::Text(t) => text.push_str(t),
                        Part::Image(_) => {
                            text.push_str(&marker(k));
                            k += 1;
                        }
                    }
                }
                text.into()
            }
            Some(Content::Parts(parts)) => parts
                .iter()
                .map(|p| match p {
                    Part::Text(t) => json!({"type": "text", "text": t}),
                    Part::Image(_) => Value::Null,
                })
                .collect::<Vec<_>>()
                .into(),
        };
        m.insert("content".into(), content);
        if let Some(r) = &self.reasoning {
            m.insert("reasoning_content".into(), r.clone().into());
        }
        if !self.tool_calls.is_empty() {
            let calls = self
                .tool_calls
                .iter()
                .map(|c| {
                    let mut call =
                        json!({"type": "function", "function": {"name": c.name, "arguments": c.arguments}});
                    if let Some(id) = &c.id {
                        call["id"] = id.clone().into();
                    }
                    call
                })
                .collect::<Vec<_>>();
            m.insert("tool_calls".into(), calls.into());
        }
        if let Some(id) = &self.tool_call_id {
            m.insert("tool_call_id".into(), id.clone().into());
        }
        if let Some(n) = &self.name {
            m.insert("name".into(), n.clone().into());
        }
        Value::Object(m)
    }
}

/// What the model is asked to continue.
#[derive(Clone, Debug, PartialEq)]
pub enum Prompt {
    /// A conversation, rendered with the model's chat template (or openai-harmony).
    Chat(Vec<Message>),
    /// Text completed as it is (`/v1/completions`, Ollama's `raw`), with images before it.
    Raw {
        /// The text.
        text: String,
        /// Images put before the text.
        images: Vec<ImageRef>,
    },
}

/// How much a model should think, where the request says.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Thinking {
    /// Thinking on or off (`enable_thinking` in templates); `None` leaves the template's default.
    pub enabled: Option<bool>,
    /// The reasoning effort (`none` … `high`), for templates and gpt-oss.
    pub effort: Option<String>,
}

/// One chat turn, whatever surface asked for it.
#[derive(Debug)]
pub struct ChatRequest {
    /// The conversation or raw text.
    pub prompt: Prompt,
    /// Tools, tool choice, parallel calls and response format.
    pub constraints: RequestConstraints,
    /// Sampling, token cap, stop strings and log-probabilities (no constraint yet).
    pub decode: DecodeOptions,
    /// OpenAI's `logit_bias` as sent, checked against the model's vocabulary when it is known.
    pub logit_bias: Option<Value>,
    /// Choices to generate (at least 1).
    pub n: usize,
    /// Thinking switches.
    pub thinking: Thinking,
    /// Further template variables (`chat_template_kwargs`).
    pub template_vars: Map<String, Value>,
    /// Whether the reply is parsed into reasoning, content and calls (`/v1/completions` streams
    /// the text exactly as generated: false).
    pub parse_reply: bool,
    /// Whether a conversation longer than the context drops its oldest turns (Ollama's chat and
    /// generate) instead of failing (`context_length_exceeded`, the OpenAI surfaces).
    pub truncate: bool,
}

impl ChatRequest {
    /// A turn with default options.
    pub fn new(prompt: Prompt) -> ChatRequest {
        ChatRequest {
            prompt,
            constraints: RequestConstraints::default(),
            decode: DecodeOptions::default(),
            logit_bias: None,
            n: 1,
            thinking: Thinking::default(),
            template_vars: Map::new(),
            parse_reply: true,
            truncate: false,
        }
    }

    /// The variables the chat template gets: `chat_template_kwargs`, then `reasoning_effort`
    /// (with `enable_thinking` unless the kwargs set it), then an explicit on/off (which wins).
    pub fn template_extra(&self) -> Map<String, Value> {
        let mut extra = self.template_vars.clone();
        if let Some(effort) = &self.thinking.effort {
            extra.insert("reasoning_effort".into(), effort.clone().into());
            extra
                .entry("enable_thinking")
                .or_insert((effort != "none").into());
        }
        if let Some(on) = self.thinking.enabled {
            extra.insert("enable_thinking".into(), on.into());
        }
        extra
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn image(place: &str) -> Part {
        Part::Image(ImageRef {
            place: place.into(),
            source: ImageSource::Url("data:,".into()),
        })
    }

    #[test]
    fn messages_reach_the_template_in_openais_shape_as_the_client_wrote_them() {
        let text = Message::text(Role::User, "hi");
        assert_eq!(
            text.to_template(0, |k| format!("<{k}>")),
            json!({"role": "user", "content": "hi"})
        );
        // A list of text parts stays a list (templates that iterate parts see parts).
        let parts = Message {
            content: Some(Content::Parts(vec![
                Part::Text("a".into()),
                Part::Text("b".into()),
            ])),
            ..Message::text(Role::User, "")
        };
        assert_eq!(
            parts.to_template(0, |k| format!("<{k}>"))["content"],
            json!([{"type": "text", "text": "a"}, {"type": "text", "text": "b"}])
        );
        // Images become markers numbered across the conversation, joined with the text.
        let with_images = Message {
            content: Some(Content::Parts(vec![
                image("p0"),
                Part::Text("what?".into()),
                image("p1"),
            ])),
            ..Message::text(Role::User, "")
        };
        assert_eq!(
            with_images.to_template(3, |k| format!("<{k}>"))["content"],
            "<3>what?<4>"
        );
        let call = Message {
            content: None,
            reasoning: Some("think".into()),
            tool_calls: vec![Call {
                id: Some("c1".into()),
                name: "f".into(),
                arguments: json!("{\"a\":1}"),
            }],
            ..Message::text(Role::Assistant, "")
        };
        assert_eq!(
            call.to_template(0, |k| format!("<{k}>")),
            json!({"role": "assistant", "content": null, "reasoning_content": "think",
                   "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{\"a\":1}"}}]})
        );
        let result = Message::tool_result(Some("c1".into()), Some("f".into()), "2".into());
        assert_eq!(
            result.to_template(0, |k| format!("<{k}>")),
            json!({"role": "tool", "content": "2", "tool_call_id": "c1", "name": "f"})
        );
    }

    #[test]
    fn thinking_switches_become_template_variables_with_an_explicit_switch_winning() {
        let mut req = ChatRequest::new(Prompt::Chat(Vec::new()));
        assert!(req.template_extra().is_empty());
        req.thinking.effort = Some("none".into());
        assert_eq!(
            Value::Object(req.template_extra()),
            json!({"reasoning_effort": "none", "enable_thinking": false})
        );
        // The kwargs' own `enable_thinking` wins over the effort's, an explicit switch over both.
        req.template_vars.insert("enable_thinking".into(), true.into());
        assert_eq!(req.template_extra()["enable_thinking"], true);
        req.thinking.enabled = Some(false);
        assert_eq!(req.template_extra()["enable_thinking"], false);
    }
}
