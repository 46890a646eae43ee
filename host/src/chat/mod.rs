//! The host's chat library is the `berth-chat` crate: one description per chat format (detected
//! once per model from its template and vocabulary) drives the parser (model output -> reasoning,
//! content, tool calls), the stream (OpenAI deltas that only grow and add up to the parsed
//! message) and the constraint grammar. Parsing never fails: markup that cannot be understood
//! stays content. Re-exported here so host code names it `crate::chat`; the tests here run it
//! against the host's tokenizers and templates.

pub mod format;
#[cfg(test)]
mod harmony_corpus;
#[cfg(test)]
mod stream_tests;

pub use berth_chat::{
    detect, openai_delta, prefill, ChatFormat, Delta, Detected, ParseStart, ParsedMessage, Reasoning,
    StreamParser, ToolCall,
};
pub use berth_chat::{message, parse, stream, tolerant_forms};
