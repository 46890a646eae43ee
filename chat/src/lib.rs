//! Berth's chat library: what a model's raw output means in its own chat format.
//!
//! One description per chat format (detected once per model from its template text and its
//! vocabulary) drives three things, so they cannot disagree:
//! - the parser ([`parse()`]): model output -> reasoning, content and tool calls, tolerant of the
//!   irregular forms models emit; it never fails, markup it cannot understand stays content;
//! - the stream ([`StreamParser`]): typed deltas that only grow and fold to the parsed message;
//! - the grammar ([`grammar`]): `tool_choice`, `parallel_tool_calls` and `response_format` as a
//!   Lark grammar (llguidance dialect) over the same markup, for a constrained decoder to match.
//!
//! Each format is one module (`src/formats/`): its marker strings, detection, reasoning markup,
//! prefill, parser, call grammar and single-token markers behind one trait. Adding a format is
//! that module, a [`ChatFormat`] id (appended to [`ChatFormat::BY_ID`], so ids never change
//! meaning) and its place in the detection order.
//!
//! The crate needs no tokenizer and no engine: a vocabulary is a `Fn(&str) -> bool` (detection) or
//! a `Fn(&str) -> Vec<u32>` (the grammar's single-token markers).
//!
//! ```
//! use berth_chat::{detect, parse, prefill, Delta, ParsedMessage, StreamParser};
//! use serde_json::json;
//!
//! let template = "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n\
//!                 {% endfor %}{% if tools %}<tool_call>{% endif %}<|im_start|>assistant\n";
//! let detected = detect(Some(template), |_token| false);
//! assert_eq!(detected.to_string(), "chat format: hermes_json, reasoning: none");
//!
//! let tools = [json!({"type": "function", "function": {"name": "get_time",
//!     "parameters": {"type": "object", "properties": {"tz": {"type": "string"}}}}})];
//! let start = prefill(detected.format, "<|im_start|>assistant\n");
//! let output = "Checking.\n<tool_call>\n{\"name\": \"get_time\", \"arguments\": {\"tz\": \"CET\"}}\n</tool_call>";
//!
//! let message = parse(detected.format, start, output, Some(&tools), false);
//! assert_eq!(message.content.as_deref(), Some("Checking."));
//! assert_eq!(message.tool_calls[0].arguments, r#"{"tz": "CET"}"#);
//!
//! // Streamed in any pieces, the deltas add up to the same message.
//! let mut stream = StreamParser::new(detected.format, start, Some(&tools));
//! let mut deltas: Vec<Delta> = output.split_inclusive(' ').flat_map(|piece| stream.push(piece)).collect();
//! let (last, streamed) = stream.finish();
//! deltas.extend(last);
//! assert_eq!(streamed, message);
//! assert_eq!(ParsedMessage::fold(&deltas), message);
//! assert_eq!(deltas[0], Delta::Content("Checking.".into()));
//! ```

mod bare;
pub mod format;
mod formats;
pub mod grammar;
mod json_scan;
pub mod message;
pub mod parse;
pub mod request;
mod scan;
mod schema;
pub mod stream;
mod think;
pub mod tolerant_forms;
mod values;

#[cfg(any(test, feature = "testutil"))]
pub mod testutil;

pub use format::{detect, prefill, ChatFormat, Detected, ParseStart, Reasoning};
pub use grammar::{MarkerError, Markers};
pub use message::{ParsedMessage, ToolCall};
pub use parse::parse;
pub use request::{ParamError, RequestConstraints, ResponseFormat, ToolChoice, ToolSpec};
pub use stream::{openai_delta, Delta, StreamParser};
