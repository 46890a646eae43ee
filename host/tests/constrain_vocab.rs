//! Constraints over real vocabularies: Qwen3's tokenizer (hermes_json with `<think>`, markers by
//! id among 151,936 padded ids) and Gemma 3's 262,144-token GGUF vocabulary, fed token by token.

mod common;

use berth::chat::{ChatFormat, Detected, ParseStart, Reasoning};
use berth::constraint::{ConstraintFactory, RequestConstraints, SequenceConstraint};
use berth::sampling::mask_allows;
use berth::tokenizer::Tokenizer;
use serde_json::{json, Value};
use std::path::PathBuf;
use std::process::Command;

fn qwen3_tokenizer() -> Tokenizer {
    let out = Command::new(repo_root().join("scripts/fetch-tokenizers"))
        .arg("qwen3")
        .output()
        .expect("fetch-tokenizers runs");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let path = PathBuf::from(
        String::from_utf8_lossy(&out.stdout)
            .lines()
            .last()
            .unwrap()
            .trim(),
    );
    Tokenizer::from_tokenizer_json(&path).unwrap()
}

use common::repo_root;

/// Feeds `text` through the constraint as decoding would; true when every token is allowed and
/// the grammar accepts at the end.
fn accepts(tok: &Tokenizer, c: &mut SequenceConstraint, text: &str) -> bool {
    for id in tok.encode(text, false) {
        let (mask, _) = c.compute_mask().unwrap();
        if !mask_allows(&mask, id) {
            return false;
        }
        c.consume(id).unwrap();
    }
    c.is_stopped() || c.is_accepting()
}

fn weather() -> Value {
    json!([{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object",
        "properties": {"city": {"type": "string"}}, "required": ["city"]}}}])
}

#[test]
fn qwen3_thinks_then_calls_with_markers_by_id() {
    let tok = qwen3_tokenizer();
    let detected = Detected {
        format: ChatFormat::HermesJson,
        reasoning: Some(Reasoning::ThinkTags),
    };
    let f = ConstraintFactory::new(&tok, &detected, 151_936, true).unwrap();
    let req =
        RequestConstraints::from_openai(Some(&weather()), Some(&json!("required")), None, None).unwrap();
    let lark = f.grammar(&req, true, ParseStart::Content).unwrap().unwrap();
    for id in ["<[151657]>", "<[151658]>", "<[151667]>", "<[151668]>"] {
        assert!(lark.contains(id), "{id} in {lark}");
    }
    let call = "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>";
    let thought = format!("<think>\nThe user wants the weather in Paris.\n</think>\n\n{call}");
    let mut c = f.build(&req, true, ParseStart::Content).unwrap().unwrap();
    assert!(accepts(&tok, &mut c, &thought));
    let mut c = f.build(&req, false, ParseStart::Content).unwrap().unwrap();
    assert!(
        !accepts(&tok, &mut c, &thought),
        "thinking off: no reasoning block"
    );
    let mut c = f
        .build(&req, false, ParseStart::ReasoningClosed)
        .unwrap()
        .unwrap();
    assert!(accepts(&tok, &mut c, call));
    // Qwen3.5-style prefill: the prompt opened `<think>` even with thinking off.
    let mut c = f.build(&req, false, ParseStart::Reasoning).unwrap().unwrap();
    assert!(accepts(
        &tok,
        &mut c,
        &format!("Weather in Paris.\n</think>\n\n{call}")
    ));

    let none = RequestConstraints::from_openai(Some(&weather()), Some(&json!("none")), None, None).unwrap();
    let mut c = f.build(&none, false, ParseStart::Content).unwrap().unwrap();
    assert!(!accepts(&tok, &mut c, call));
    let mut c = f.build(&none, false, ParseStart::Content).unwrap().unwrap();
    assert!(accepts(&tok, &mut c, "It is sunny in Paris."));
}

#[test]
fn gemma3_json_schema_over_262144_ids() {
    let gguf = berth_registry::gguf::GgufFile::open(common::real_model("gemma3-270m")).unwrap();
    let tok = Tokenizer::from_gguf(&gguf).unwrap();
    let detected = Detected {
        format: ChatFormat::ContentOnly,
        reasoning: None,
    };
    let f = ConstraintFactory::new(&tok, &detected, 262_144, false).unwrap();
    let req = RequestConstraints::from_openai(
        None,
        None,
        None,
        Some(&json!({"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "object",
            "properties": {"sky": {"enum": ["sunny", "rainy"]}, "temp": {"type": "integer", "minimum": -20, "maximum": 45}},
            "required": ["sky", "temp"]}}})),
    )
    .unwrap();
    let mut c = f.build(&req, false, ParseStart::Content).unwrap().unwrap();
    let (mask, _) = c.compute_mask().unwrap();
    assert!(mask.len() >= 262_144 / 32, "a bit for every padded id");
    assert!(accepts(&tok, &mut c, "{\"sky\": \"rainy\", \"temp\": 12}"));
    let mut c = f.build(&req, false, ParseStart::Content).unwrap().unwrap();
    assert!(!accepts(&tok, &mut c, "{\"sky\": \"rainy\", \"temp\": 99}"));
    // A tool request on a model without tool markup: required is a 400, auto is free text.
    let tools =
        RequestConstraints::from_openai(Some(&weather()), Some(&json!("required")), None, None).unwrap();
    assert_eq!(
        f.build(&tools, false, ParseStart::Content).unwrap_err().param,
        "tool_choice"
    );
}
