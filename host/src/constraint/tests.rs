//! Grammar tests on a byte-level toy tokenizer that has every format's marker tokens: outputs are
//! fed token by token through the mask, as decoding would.

use super::*;
use crate::chat::{ChatFormat, Detected, ParseStart, Reasoning};
use serde_json::{json, Value};
use std::sync::OnceLock;

/// Marker tokens of every format; the first two are stop tokens.
const ADDED: &[(&str, bool)] = &[
    ("<|im_end|>", true),
    ("<|endoftext|>", true),
    ("<tool_call>", false),
    ("</tool_call>", false),
    ("<think>", false),
    ("</think>", false),
    ("<|tool_call>", true),
    ("<tool_call|>", true),
    ("<|\"|>", true),
    ("<|channel>", true),
    ("<channel|>", true),
    ("<|tool_call_start|>", true),
    ("<|tool_call_end|>", true),
    ("<|channel|>", true),
    ("<|message|>", true),
    ("<|constrain|>", true),
    ("<|end|>", true),
    ("<|start|>", true),
    ("<|call|>", true),
];

/// A byte-level BPE tokenizer with one token per byte plus [`ADDED`] (ids 256..).
pub(crate) fn toy_tokenizer() -> Tokenizer {
    static T: OnceLock<Tokenizer> = OnceLock::new();
    T.get_or_init(|| {
        let alphabet = crate::tokenizer::byte_level_alphabet();
        let vocab: serde_json::Map<String, Value> = alphabet
            .iter()
            .enumerate()
            .map(|(i, c)| (c.to_string(), json!(i)))
            .collect();
        let added: Vec<Value> = ADDED
            .iter()
            .enumerate()
            .map(|(i, (t, special))| {
                json!({"id": 256 + i, "content": t, "single_word": false, "lstrip": false,
                    "rstrip": false, "normalized": false, "special": special})
            })
            .collect();
        let bl = json!({"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true, "use_regex": true});
        let tj = json!({"version": "1.0", "truncation": null, "padding": null, "added_tokens": added,
            "normalizer": null, "pre_tokenizer": bl, "post_processor": null, "decoder": bl,
            "model": {"type": "BPE", "dropout": null, "unk_token": null, "continuing_subword_prefix": null,
                "end_of_word_suffix": null, "fuse_unk": false, "byte_fallback": false, "vocab": vocab, "merges": []}});
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("tokenizer.json"), tj.to_string()).unwrap();
        std::fs::write(
            dir.path().join("tokenizer_config.json"),
            json!({"eos_token": "<|im_end|>"}).to_string(),
        )
        .unwrap();
        Tokenizer::from_tokenizer_json(&dir.path().join("tokenizer.json")).unwrap()
    })
    .clone()
}

fn stops() -> Vec<u32> {
    vec![256, 257]
}

fn factory(format: ChatFormat, reasoning: Option<Reasoning>) -> ConstraintFactory {
    ConstraintFactory::new(&toy_tokenizer(), &Detected { format, reasoning }, 320, true).unwrap()
}

fn weather_tools() -> Value {
    json!([
        {"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object",
            "properties": {"city": {"type": "string"}, "days": {"type": "integer", "minimum": 1, "maximum": 7}},
            "required": ["city"]}}},
        {"type": "function", "function": {"name": "get_time", "parameters": {"type": "object",
            "properties": {"tz": {"type": "string", "enum": ["CET", "UTC"]}}, "required": ["tz"]}}}
    ])
}

fn req(choice: Value, parallel: bool, format: Value) -> RequestConstraints {
    RequestConstraints::from_openai(
        Some(&weather_tools()),
        Some(&choice),
        Some(&json!(parallel)),
        Some(&format),
    )
    .unwrap()
}

/// Whether the constraint lets `text` through, token by token, and then allows a stop token.
fn accepts(c: &mut SequenceConstraint, text: &str) -> bool {
    for id in toy_tokenizer().encode(text, false) {
        let (mask, _) = match c.compute_mask() {
            Ok(m) => m,
            Err(_) => return false,
        };
        if !crate::sampling::mask_allows(&mask, id) || c.consume(id).is_err() {
            return false;
        }
    }
    c.is_stopped() || c.compute_mask().map(|(_, accepting)| accepting).unwrap_or(false)
}

fn check(
    f: &ConstraintFactory,
    r: &RequestConstraints,
    thinking: bool,
    start: ParseStart,
    text: &str,
) -> bool {
    let mut c = f.build(r, thinking, start).unwrap().expect("a constraint");
    accepts(&mut c, text)
}

const HERMES_CALL: &str =
    "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>";
const HERMES_TIME: &str =
    "<tool_call>\n{\"name\": \"get_time\", \"arguments\": {\"tz\": \"UTC\"}}\n</tool_call>";

#[test]
fn hermes_tool_choice_by_parallel_by_thinking() {
    let f = factory(ChatFormat::HermesJson, Some(Reasoning::ThinkTags));
    let none = Value::Null;
    let named = json!({"type": "function", "function": {"name": "get_time"}});
    let two = format!("{HERMES_CALL}\n{HERMES_TIME}");
    let think = "<think>\nhmm\n</think>\n\n";
    for thinking in [false, true] {
        let pre = if thinking { think } else { "" };
        let s = ParseStart::Content;
        for parallel in [true, false] {
            let auto = req(json!("auto"), parallel, none.clone());
            assert!(check(&f, &auto, thinking, s, &format!("{pre}It is sunny.")));
            assert!(check(
                &f,
                &auto,
                thinking,
                s,
                &format!("{pre}Let me look.\n{HERMES_CALL}")
            ));
            assert_eq!(check(&f, &auto, thinking, s, &format!("{pre}{two}")), parallel);
            assert!(!check(
                &f,
                &auto,
                thinking,
                s,
                &format!("{pre}<tool_call>\n{{\"name\": \"nope\"")
            ));
            assert!(
                !check(
                    &f,
                    &auto,
                    thinking,
                    s,
                    &format!(
                        "{pre}<tool_call>\n{{\"name\": \"get_weather\", \"arguments\": {{}}}}\n</tool_call>"
                    )
                ),
                "city is required"
            );

            let required = req(json!("required"), parallel, none.clone());
            assert!(!check(&f, &required, thinking, s, &format!("{pre}It is sunny.")));
            assert!(check(&f, &required, thinking, s, &format!("{pre}{HERMES_TIME}")));
            assert_eq!(
                check(&f, &required, thinking, s, &format!("{pre}{two}")),
                parallel
            );

            let named = req(named.clone(), parallel, none.clone());
            assert!(check(&f, &named, thinking, s, &format!("{pre}{HERMES_TIME}")));
            assert!(!check(&f, &named, thinking, s, &format!("{pre}{HERMES_CALL}")));

            let never = req(json!("none"), parallel, none.clone());
            assert!(check(&f, &never, thinking, s, &format!("{pre}It is sunny.")));
            assert!(!check(&f, &never, thinking, s, &format!("{pre}{HERMES_CALL}")));
        }
        // Thinking off: no reasoning block.
        let auto = req(json!("required"), true, none.clone());
        assert_eq!(
            check(
                &f,
                &auto,
                thinking,
                ParseStart::Content,
                &format!("{think}{HERMES_CALL}")
            ),
            thinking
        );
    }
}

#[test]
fn the_prefill_starts_inside_reasoning_even_with_thinking_off() {
    let f = factory(ChatFormat::QwenXml, Some(Reasoning::ThinkTags));
    let r = req(json!("required"), true, Value::Null);
    let call = "<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n</function>\n</tool_call>";
    for thinking in [true, false] {
        assert!(check(
            &f,
            &r,
            thinking,
            ParseStart::Reasoning,
            &format!("the user wants weather\n</think>\n\n{call}")
        ));
        assert!(
            !check(&f, &r, thinking, ParseStart::Reasoning, call),
            "the block must close first"
        );
    }
    assert!(check(&f, &r, false, ParseStart::ReasoningClosed, call));
}

#[test]
fn response_format_constrains_content_after_reasoning() {
    let f = factory(ChatFormat::HermesJson, Some(Reasoning::ThinkTags));
    let schema = json!({"type": "object", "properties": {"n": {"type": "integer", "minimum": 0, "maximum": 9}}, "required": ["n"]});
    let r = RequestConstraints::from_openai(
        None,
        None,
        None,
        Some(&json!({"type": "json_schema", "json_schema": {"name": "x", "schema": schema}})),
    )
    .unwrap();
    assert!(check(&f, &r, false, ParseStart::Content, "{\"n\": 3}"));
    assert!(!check(&f, &r, false, ParseStart::Content, "{\"n\": 12}"));
    assert!(!check(&f, &r, false, ParseStart::Content, "Sure: {\"n\": 3}"));
    assert!(check(
        &f,
        &r,
        true,
        ParseStart::Content,
        "<think>\nok\n</think>\n\n{\"n\": 3}"
    ));
    let obj =
        RequestConstraints::from_openai(None, None, None, Some(&json!({"type": "json_object"}))).unwrap();
    assert!(check(&f, &obj, false, ParseStart::Content, "{\"a\": [1, 2]}"));
    assert!(!check(&f, &obj, false, ParseStart::Content, "[1]"));
}

#[test]
fn other_formats_force_calls_in_their_own_markup() {
    let r = req(
        json!({"type": "function", "function": {"name": "get_weather"}}),
        false,
        Value::Null,
    );
    let cases: &[(ChatFormat, Option<Reasoning>, &str, &str)] = &[
        (
            ChatFormat::QwenXml,
            None,
            "<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n<parameter=days>\n3\n</parameter>\n</function>\n</tool_call>",
            "<tool_call>\n<function=get_time>\n",
        ),
        (
            ChatFormat::Gemma4,
            Some(Reasoning::Gemma4Thought),
            "<|tool_call>call:get_weather{city:<|\"|>Paris<|\"|>,days:3}<tool_call|>",
            "<|tool_call>call:get_weather{days:3}<tool_call|>",
        ),
        (
            ChatFormat::Lfm2Pythonic,
            None,
            "<|tool_call_start|>[get_weather(city=\"Paris\", days=2)]<|tool_call_end|>",
            "<|tool_call_start|>[get_weather(city=\"Paris\", days=9)]<|tool_call_end|>",
        ),
        (
            ChatFormat::Harmony,
            Some(Reasoning::HarmonyAnalysis),
            "<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>{\"city\": \"Paris\"}",
            "<|channel|>final<|message|>Sunny.",
        ),
    ];
    for (format, reasoning, good, bad) in cases {
        let f = factory(*format, *reasoning);
        assert!(
            check(&f, &r, false, ParseStart::Content, good),
            "{format}: {good}"
        );
        assert!(!check(&f, &r, false, ParseStart::Content, bad), "{format}: {bad}");
    }
}

#[test]
fn harmony_reasoning_then_final_json() {
    let f = factory(ChatFormat::Harmony, Some(Reasoning::HarmonyAnalysis));
    let r = RequestConstraints::from_openai(None, None, None, Some(&json!({"type": "json_object"}))).unwrap();
    let text =
        "<|channel|>analysis<|message|>think<|end|><|start|>assistant<|channel|>final<|message|>{\"a\": 1}";
    assert!(check(&f, &r, true, ParseStart::AssistantHeader, text));
    assert!(!check(&f, &r, false, ParseStart::AssistantHeader, text));
    assert!(check(
        &f,
        &r,
        false,
        ParseStart::Reasoning,
        "think<|end|><|start|>assistant<|channel|>final<|message|>{\"a\": 1}"
    ));
}

#[test]
fn validation_errors_name_the_parameter() {
    let r = req(json!("required"), true, Value::Null);
    let no_tools = ConstraintFactory::new(
        &toy_tokenizer(),
        &Detected {
            format: ChatFormat::HermesJson,
            reasoning: None,
        },
        320,
        false,
    )
    .unwrap();
    assert_eq!(
        no_tools.build(&r, false, ParseStart::Content).unwrap_err().param,
        "tool_choice"
    );
    let auto = req(json!("auto"), true, Value::Null);
    assert!(
        no_tools
            .build(&auto, false, ParseStart::Content)
            .unwrap()
            .is_none(),
        "auto gets no tool grammar"
    );
    let content_only = factory(ChatFormat::ContentOnly, None);
    assert_eq!(
        content_only
            .build(&r, false, ParseStart::Content)
            .unwrap_err()
            .param,
        "tool_choice"
    );

    let bad_schema = json!({"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "object", "foo_unknown_keyword": 1, "properties": {"a": {"type": "string", "format": "no-such-format"}}}}});
    let r = RequestConstraints::from_openai(None, None, None, Some(&bad_schema)).unwrap();
    let f = factory(ChatFormat::HermesJson, None);
    assert_eq!(
        f.build(&r, false, ParseStart::Content).unwrap_err().param,
        "response_format"
    );
}

#[test]
fn unconstrained_requests_get_no_grammar() {
    let f = factory(ChatFormat::HermesJson, None);
    let r = RequestConstraints::from_openai(None, None, None, None).unwrap();
    assert!(f.build(&r, false, ParseStart::Content).unwrap().is_none());
}

#[test]
fn markers_must_be_single_tokens() {
    let d = Detected {
        format: ChatFormat::HermesJson,
        reasoning: None,
    };
    let m = Markers::resolve(&d, |t| toy_tokenizer().encode(t, false)).unwrap();
    assert_eq!(m.tool, Some((258, 259)));
    let e = Markers::resolve(&d, |t| t.bytes().map(u32::from).collect()).unwrap_err();
    assert!(e.to_string().contains("not one"), "{e}");
    let _ = stops();
}
