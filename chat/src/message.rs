//! The parsed assistant message, in the OpenAI chat-completions shape.

use serde::ser::{Serialize, SerializeMap, Serializer};
use serde_json::{json, Value};

/// One tool call of a parsed message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ToolCall {
    /// The call id (`call_0`, ...), unique within the message.
    pub id: String,
    /// The function name.
    pub name: String,
    /// The arguments as JSON text (an object, in the model's key order).
    pub arguments: String,
}

impl ToolCall {
    /// The OpenAI `tool_calls[]` entry.
    pub fn to_openai(&self) -> Value {
        json!({
            "id": self.id,
            "type": "function",
            "function": {"name": self.name, "arguments": self.arguments},
        })
    }
}

/// Model output split into reasoning, content and tool calls.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ParsedMessage {
    /// The reasoning (chain of thought), `None` when there was none.
    pub reasoning_content: Option<String>,
    /// The user-visible answer; `None` only for a reply that is nothing but tool calls.
    pub content: Option<String>,
    /// The tool calls, in order.
    pub tool_calls: Vec<ToolCall>,
}

impl ParsedMessage {
    /// The OpenAI assistant message object (`content: null` for a reply that is only tool calls).
    pub fn to_openai(&self) -> Value {
        serde_json::to_value(self).unwrap_or(Value::Null)
    }
}

impl Serialize for ParsedMessage {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let mut m = s.serialize_map(None)?;
        m.serialize_entry("role", "assistant")?;
        m.serialize_entry("content", &self.content)?;
        if let Some(r) = &self.reasoning_content {
            m.serialize_entry("reasoning_content", r)?;
        }
        if !self.tool_calls.is_empty() {
            let calls: Vec<Value> = self.tool_calls.iter().map(ToolCall::to_openai).collect();
            m.serialize_entry("tool_calls", &calls)?;
        }
        m.end()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reply_of_only_tool_calls_serializes_with_null_content() {
        let msg = ParsedMessage {
            reasoning_content: None,
            content: None,
            tool_calls: vec![ToolCall {
                id: "call_0".into(),
                name: "get_weather".into(),
                arguments: r#"{"location":"Paris"}"#.into(),
            }],
        };
        assert_eq!(
            msg.to_openai().to_string(),
            r#"{"role":"assistant","content":null,"tool_calls":[{"id":"call_0","type":"function","function":{"name":"get_weather","arguments":"{\"location\":\"Paris\"}"}}]}"#
        );
    }

    #[test]
    fn reasoning_is_written_only_when_present() {
        let msg = ParsedMessage {
            content: Some("4".into()),
            ..Default::default()
        };
        assert_eq!(
            msg.to_openai().to_string(),
            r#"{"role":"assistant","content":"4"}"#
        );
        let msg = ParsedMessage {
            reasoning_content: Some("2+2".into()),
            ..msg
        };
        assert_eq!(
            msg.to_openai().to_string(),
            r#"{"role":"assistant","content":"4","reasoning_content":"2+2"}"#
        );
    }
}
