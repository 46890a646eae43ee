//! Streamed parsing: reparse the accumulated output on every flush and emit only what grew, as
//! OpenAI chat-completion deltas. The parse holds back whatever may still change, so every field
//! only grows and the deltas concatenate to the non-streamed message.

use serde_json::{json, Map, Value};

use super::format::{ChatFormat, ParseStart};
use super::message::ParsedMessage;
use super::parse::parse;

/// Turns model output, flush by flush, into OpenAI deltas.
#[derive(Debug, Clone)]
pub struct StreamParser {
    format: ChatFormat,
    start: ParseStart,
    tools: Option<Vec<Value>>,
    text: String,
    sent_reasoning: String,
    sent_content: String,
    /// Per call sent so far: its name and the arguments text.
    sent_calls: Vec<(String, String)>,
}

impl StreamParser {
    /// A parser for one reply in `format`, starting where the prompt left off.
    pub fn new(format: ChatFormat, start: ParseStart, tools: Option<&[Value]>) -> StreamParser {
        StreamParser {
            format,
            start,
            tools: tools.map(<[Value]>::to_vec),
            text: String::new(),
            sent_reasoning: String::new(),
            sent_content: String::new(),
            sent_calls: Vec::new(),
        }
    }

    /// The output so far.
    pub fn text(&self) -> &str {
        &self.text
    }

    /// Add decoded text; returns the delta (`{"content": ..}` and so on) if anything grew.
    pub fn push(&mut self, chunk: &str) -> Option<Value> {
        self.text.push_str(chunk);
        let msg = parse(self.format, self.start, &self.text, self.tools.as_deref(), true);
        self.diff(&msg)
    }

    /// The output is complete: the last delta, if any, and the final message (equal to what the
    /// deltas add up to).
    pub fn finish(&mut self) -> (Option<Value>, ParsedMessage) {
        let msg = parse(self.format, self.start, &self.text, self.tools.as_deref(), false);
        (self.diff(&msg), msg)
    }

    fn diff(&mut self, msg: &ParsedMessage) -> Option<Value> {
        let mut delta = Map::new();
        let reasoning = msg.reasoning_content.as_deref().unwrap_or("");
        if let Some(grown) = growth(&mut self.sent_reasoning, reasoning) {
            delta.insert("reasoning_content".into(), grown.into());
        }
        let content = msg.content.as_deref().unwrap_or("");
        if let Some(grown) = growth(&mut self.sent_content, content) {
            delta.insert("content".into(), grown.into());
        }
        let mut calls = Vec::new();
        for (index, call) in msg.tool_calls.iter().enumerate() {
            if index == self.sent_calls.len() {
                self.sent_calls.push((call.name.clone(), call.arguments.clone()));
                calls.push(json!({
                    "index": index,
                    "id": call.id,
                    "type": "function",
                    "function": {"name": call.name, "arguments": call.arguments},
                }));
                continue;
            }
            let (_, sent_args) = &mut self.sent_calls[index];
            if let Some(grown) = growth(sent_args, &call.arguments) {
                calls.push(json!({"index": index, "function": {"arguments": grown}}));
            }
        }
        if !calls.is_empty() {
            delta.insert("tool_calls".into(), calls.into());
        }
        (!delta.is_empty()).then_some(Value::Object(delta))
    }
}

/// What `now` adds to `sent`, recorded as sent; `None` when nothing grew. A value that does not
/// extend what was sent (the parser changed its mind) is not sent.
fn growth(sent: &mut String, now: &str) -> Option<String> {
    if now.len() > sent.len() && now.starts_with(sent.as_str()) {
        let grown = now[sent.len()..].to_string();
        sent.push_str(&grown);
        Some(grown)
    } else {
        None
    }
}
