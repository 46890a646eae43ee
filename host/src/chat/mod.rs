//! The host's chat library: one description per chat format (detected once per model from its
//! template and vocabulary) drives the parser (model output -> reasoning, content, tool calls) and
//! the stream (OpenAI deltas that only grow and add up to the parsed message). Parsing never
//! fails: markup that cannot be understood stays content.

pub mod format;
#[cfg(test)]
mod harmony_corpus;
pub mod message;
pub mod parse;
pub mod stream;
pub mod tolerant_forms;
mod values;

pub use format::{detect, prefill, ChatFormat, Detected, ParseStart, Reasoning};
pub use message::{ParsedMessage, ToolCall};
pub use parse::parse;
pub use stream::StreamParser;
