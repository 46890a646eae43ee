//! The stream check the parser targets share: the parse of the whole text, and the stream fed in
//! chunks, must not panic; no streamed field may shrink, and the deltas must add up to the
//! non-streamed message.

use berth_chat::{openai_delta, parse, ChatFormat, ParseStart, ParsedMessage, StreamParser};
use serde_json::{json, Value};

/// The parse starts an input's start byte picks from (`0` content, `1` reasoning, `2` closed,
/// `3` the assistant header, modulo 4).
pub const STARTS: [ParseStart; 4] = [
    ParseStart::Content,
    ParseStart::Reasoning,
    ParseStart::ReasoningClosed,
    ParseStart::AssistantHeader,
];

/// Two tools, one with every JSON type among its parameters.
pub fn tools() -> Vec<Value> {
    let f = |name: &str, props: Value| json!({"type": "function", "function": {"name": name, "parameters": {"type": "object", "properties": props}}});
    vec![
        f(
            "get_weather",
            json!({"location": {"type": "string"}, "days": {"type": "integer"}, "zip": {"type": "string"},
                   "metric": {"type": "boolean"}, "ratio": {"type": "number"}, "opts": {"type": "object"},
                   "tags": {"type": "array", "items": {"type": "string"}}, "when": {"type": ["string", "null"]}}),
        ),
        f("get_time", json!({"tz": {"type": "string"}})),
    ]
}

/// What the deltas add up to: reasoning, content, and per call (id, name, arguments).
#[derive(Default, Debug, PartialEq)]
struct Sum {
    reasoning: String,
    content: String,
    calls: Vec<(String, String, String)>,
}

impl Sum {
    fn add(&mut self, delta: &Value) {
        if let Some(r) = delta["reasoning_content"].as_str() {
            self.reasoning.push_str(r);
        }
        if let Some(c) = delta["content"].as_str() {
            self.content.push_str(c);
        }
        for call in delta["tool_calls"].as_array().into_iter().flatten() {
            let index = call["index"].as_u64().expect("every call delta has an index") as usize;
            if index == self.calls.len() {
                let id = call["id"].as_str().expect("a call's first delta has its id");
                let name = call["function"]["name"]
                    .as_str()
                    .expect("a call's first delta has its name");
                self.calls.push((id.into(), name.into(), String::new()));
            }
            assert!(index < self.calls.len(), "call index {index} skips ahead");
            self.calls[index]
                .2
                .push_str(call["function"]["arguments"].as_str().unwrap_or(""));
        }
    }

    fn of(msg: &ParsedMessage) -> Sum {
        Sum {
            reasoning: msg.reasoning_content.clone().unwrap_or_default(),
            content: msg.content.clone().unwrap_or_default(),
            calls: msg
                .tool_calls
                .iter()
                .map(|c| (c.id.clone(), c.name.clone(), c.arguments.clone()))
                .collect(),
        }
    }

    /// Every field of `self` is a prefix of the same field of `later`.
    fn assert_prefix_of(&self, later: &Sum, what: &str) {
        assert!(
            later.reasoning.starts_with(&self.reasoning),
            "reasoning shrank {what}"
        );
        assert!(later.content.starts_with(&self.content), "content shrank {what}");
        assert!(later.calls.len() >= self.calls.len(), "calls vanished {what}");
        for (a, b) in self.calls.iter().zip(&later.calls) {
            assert_eq!((&a.0, &a.1), (&b.0, &b.1), "a call changed {what}");
            assert!(b.2.starts_with(&a.2), "arguments shrank {what}");
        }
    }
}

/// Parses `text` as `format` from `start` whole and streamed in `chunk`-character flushes, and
/// checks the stream against the whole.
pub fn check(format: ChatFormat, start: ParseStart, tools: Option<&[Value]>, chunk: usize, text: &str) {
    let full = parse(format, start, text, tools, false);
    let _ = full.to_openai();

    let mut stream = StreamParser::new(format, start, tools);
    let mut sum = Sum::default();
    let mut deltas = Vec::new();
    let mut prev = Sum::default();
    let chars: Vec<char> = text.chars().collect();
    for piece in chars.chunks(chunk) {
        let piece: String = piece.iter().collect();
        let grew = stream.push(&piece);
        if let Some(d) = openai_delta(&grew) {
            sum.add(&d);
        }
        deltas.extend(grew);
        let now = Sum::of(&parse(format, start, stream.text(), tools, true));
        prev.assert_prefix_of(&now, "between flushes");
        sum.assert_prefix_of(&now, "(sent vs partial parse)");
        prev = now;
    }
    let (last, msg) = stream.finish();
    if let Some(d) = openai_delta(&last) {
        sum.add(&d);
    }
    deltas.extend(last);
    assert_eq!(
        ParsedMessage::fold(&deltas),
        msg,
        "the deltas do not fold to the message"
    );
    assert_eq!(msg, full, "the stream's final message differs from the parse");
    prev.assert_prefix_of(&Sum::of(&full), "at the end");
    assert_eq!(sum, Sum::of(&full), "deltas do not add up to the message");
}
