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
            ChatFormat::MiniCpmXml,
            Some(Reasoning::ThinkTags),
            "<function name=\"get_weather\"><param name=\"city\"><![CDATA[Paris\n<b>]]></param><param name=\"days\">3</param></function>",
            "<function name=\"get_weather\"><param name=\"city\">Paris\n</param></function>",
        ),
        (
            ChatFormat::Harmony,
            Some(Reasoning::HarmonyAnalysis),
            "<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>{\"city\":\"Paris\"}",
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
    let named = req(
        json!({"type": "function", "function": {"name": "get_time"}}),
        true,
        Value::Null,
    );
    let e = no_tools.build(&named, false, ParseStart::Content).unwrap_err();
    assert_eq!(e.param, "tool_choice");
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

const MINICPM_WEATHER: &str = "<function name=\"get_weather\"><param name=\"city\">Paris</param></function>";
const MINICPM_TIME: &str = "<function name=\"get_time\"><param name=\"tz\">UTC</param></function>";

/// One format's sample outputs for the tool_choice matrix.
struct Samples {
    format: ChatFormat,
    reasoning: Reasoning,
    think: &'static str,
    text: &'static str,
    weather: &'static str,
    time: &'static str,
    /// Both calls in one turn, where the format can write that.
    two: Option<String>,
}

fn samples() -> Vec<Samples> {
    let xml_w = "<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n</function>\n</tool_call>";
    let xml_t =
        "<tool_call>\n<function=get_time>\n<parameter=tz>\nUTC\n</parameter>\n</function>\n</tool_call>";
    let g_w = "<|tool_call>call:get_weather{city:<|\"|>Paris<|\"|>}<tool_call|>";
    let g_t = "<|tool_call>call:get_time{tz:<|\"|>UTC<|\"|>}<tool_call|>";
    vec![
        Samples {
            format: ChatFormat::HermesJson,
            reasoning: Reasoning::ThinkTags,
            think: "<think>\nhm\n</think>\n\n",
            text: "It is sunny.",
            weather: HERMES_CALL,
            time: HERMES_TIME,
            two: Some(format!("{HERMES_CALL}\n{HERMES_TIME}")),
        },
        Samples {
            format: ChatFormat::QwenXml,
            reasoning: Reasoning::ThinkTags,
            think: "<think>\nhm\n</think>\n\n",
            text: "It is sunny.",
            weather: xml_w,
            time: xml_t,
            two: Some(format!("{xml_w}\n{xml_t}")),
        },
        Samples {
            format: ChatFormat::Gemma4,
            reasoning: Reasoning::Gemma4Thought,
            think: "<|channel>thought\nhm<channel|>",
            text: "It is sunny.",
            weather: g_w,
            time: g_t,
            two: Some(format!("{g_w}{g_t}")),
        },
        Samples {
            format: ChatFormat::Lfm2Pythonic,
            reasoning: Reasoning::ThinkTags,
            think: "<think>hm</think>\n",
            text: "It is sunny.",
            weather: "<|tool_call_start|>[get_weather(city=\"Paris\")]<|tool_call_end|>",
            time: "<|tool_call_start|>[get_time(tz=\"UTC\")]<|tool_call_end|>",
            two: Some("<|tool_call_start|>[get_weather(city=\"Paris\"), get_time(tz=\"UTC\")]<|tool_call_end|>".into()),
        },
        Samples {
            format: ChatFormat::MiniCpmXml,
            reasoning: Reasoning::ThinkTags,
            think: "<think>\nhm\n</think>\n\n",
            text: "It is sunny.",
            weather: MINICPM_WEATHER,
            time: MINICPM_TIME,
            two: Some(format!("{MINICPM_WEATHER}\n{MINICPM_TIME}")),
        },
        Samples {
            format: ChatFormat::Harmony,
            reasoning: Reasoning::HarmonyAnalysis,
            think: "<|channel|>analysis<|message|>hm<|end|><|start|>assistant",
            text: "<|channel|>final<|message|>It is sunny.",
            weather: "<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>{\"city\":\"Paris\"}",
            time: "<|channel|>commentary to=functions.get_time <|constrain|>json<|message|>{\"tz\":\"UTC\"}",
            // A harmony call ends the turn (`<|call|>`): one call per turn.
            two: None,
        },
    ]
}

#[test]
fn tool_choice_by_parallel_by_thinking_by_format() {
    let named = json!({"type": "function", "function": {"name": "get_time"}});
    for s in samples() {
        let f = factory(s.format, Some(s.reasoning));
        let start = if s.format == ChatFormat::Harmony {
            ParseStart::AssistantHeader
        } else {
            ParseStart::Content
        };
        for thinking in [false, true] {
            let pre = if thinking { s.think } else { "" };
            let ok =
                |r: &RequestConstraints, out: &str| check(&f, r, thinking, start, &format!("{pre}{out}"));
            let ctx = |what: &str| format!("{} thinking={thinking}: {what}", s.format);
            for parallel in [true, false] {
                let none = req(json!("none"), parallel, Value::Null);
                assert!(ok(&none, s.text), "{}", ctx("none allows text"));
                assert!(!ok(&none, s.weather), "{}", ctx("none bans calls"));

                let auto = req(json!("auto"), parallel, Value::Null);
                assert!(ok(&auto, s.text), "{}", ctx("auto allows text"));
                assert!(
                    ok(&auto, s.weather) && ok(&auto, s.time),
                    "{}",
                    ctx("auto allows calls")
                );

                let required = req(json!("required"), parallel, Value::Null);
                assert!(!ok(&required, s.text), "{}", ctx("required bans text"));
                assert!(
                    ok(&required, s.weather) && ok(&required, s.time),
                    "{}",
                    ctx("required allows calls")
                );

                let named = req(named.clone(), parallel, Value::Null);
                assert!(ok(&named, s.time), "{}", ctx("named allows its function"));
                assert!(!ok(&named, s.weather), "{}", ctx("named bans the others"));

                if let Some(two) = &s.two {
                    assert_eq!(
                        ok(&auto, two),
                        parallel,
                        "{}",
                        ctx("auto: two calls iff parallel")
                    );
                    assert_eq!(
                        ok(&required, two),
                        parallel,
                        "{}",
                        ctx("required: two calls iff parallel")
                    );
                }
            }
            // Thinking off: no reasoning block before the call.
            let required = req(json!("required"), true, Value::Null);
            assert_eq!(
                check(
                    &f,
                    &required,
                    thinking,
                    start,
                    &format!("{}{}", s.think, s.weather)
                ),
                thinking,
                "{}",
                ctx("reasoning block only with thinking on")
            );
        }
    }
}

/// The tokens the constraint allows after `text` (fed token by token), stop tokens included
/// where the grammar accepts; empty once the grammar has ended (only the turn's end is left).
fn allowed_after(c: &mut SequenceConstraint, text: &str) -> Vec<u32> {
    for id in toy_tokenizer().encode(text, false) {
        c.consume(id).expect("the text follows the grammar");
    }
    if c.is_stopped() {
        return Vec::new();
    }
    let (mask, accepting) = c.compute_mask().expect("a mask");
    let mut ids: Vec<u32> = (0..320u32)
        .filter(|&id| crate::sampling::mask_allows(&mask, id))
        .collect();
    if accepting {
        ids.extend(stops());
    }
    ids
}

/// Issue 28: under `required` (Anthropic `any`) and `auto` with parallel calls, a model that
/// writes the separator after its call must still be able to end the turn; before, the grammar
/// `call ("\n" call)*` allowed only another call after the newline, so Qwen2.5-Coder called
/// again until `max_tokens`, or forever without it.
#[test]
fn the_end_of_turn_is_reachable_after_every_complete_call() {
    for s in samples() {
        let Some(two) = &s.two else { continue };
        // The formats whose calls are joined by a newline (Gemma 4's are back to back).
        let joined = format!("{}\n{}", s.weather, s.time);
        if *two != joined {
            continue;
        }
        let f = factory(s.format, Some(s.reasoning));
        for choice in [json!("required"), json!("auto")] {
            let r = req(choice.clone(), true, Value::Null);
            for out in [
                s.weather.to_string(),
                format!("{}\n", s.weather),
                format!("{two}\n"),
            ] {
                let mut c = f
                    .build(&r, false, ParseStart::Content)
                    .unwrap()
                    .expect("a constraint");
                let after = allowed_after(&mut c, &out);
                assert!(
                    stops().iter().all(|id| after.contains(id)),
                    "{} {choice}: the turn may end after {out:?}",
                    s.format
                );
            }
            // A call identical to the one before may still follow (see grammar::repeated).
            assert!(check(
                &f,
                &r,
                false,
                ParseStart::Content,
                &format!("{}\n{}", s.weather, s.weather)
            ));
        }
    }
}

#[test]
fn a_named_tool_choice_allows_exactly_one_call_then_only_the_end_of_turn() {
    let named = json!({"type": "function", "function": {"name": "get_time"}});
    for s in samples() {
        let f = factory(s.format, Some(s.reasoning));
        let start = if s.format == ChatFormat::Harmony {
            ParseStart::AssistantHeader
        } else {
            ParseStart::Content
        };
        let twice = match s.format {
            ChatFormat::HermesJson | ChatFormat::QwenXml | ChatFormat::MiniCpmXml => {
                Some(format!("{}\n{}", s.time, s.time))
            }
            ChatFormat::Gemma4 => Some(format!("{}{}", s.time, s.time)),
            ChatFormat::Lfm2Pythonic => Some(
                "<|tool_call_start|>[get_time(tz=\"UTC\"), get_time(tz=\"UTC\")]<|tool_call_end|>".into(),
            ),
            _ => None,
        };
        for parallel in [true, false] {
            let ctx = format!("{} parallel={parallel}", s.format);
            let r = req(named.clone(), parallel, Value::Null);
            assert!(check(&f, &r, false, start, s.time), "{ctx}: the one call");
            if let Some(twice) = &twice {
                assert!(!check(&f, &r, false, start, twice), "{ctx}: a second call");
                // `required` with parallel calls does allow the same function twice.
                let required = req(json!("required"), parallel, Value::Null);
                assert_eq!(check(&f, &required, false, start, twice), parallel, "{ctx}");
            }
            let mut c = f.build(&r, false, start).unwrap().expect("a constraint");
            let after = allowed_after(&mut c, s.time);
            assert!(
                after.iter().all(|id| stops().contains(id)),
                "{ctx}: only the end of the turn may follow the call, not {after:?}"
            );
            // `parallel_tool_calls: false` is one call as well.
            let required = req(json!("required"), false, Value::Null);
            let mut c = f.build(&required, false, start).unwrap().expect("a constraint");
            let after = allowed_after(&mut c, s.weather);
            assert!(after.iter().all(|id| stops().contains(id)), "{ctx}: {after:?}");
        }
    }
}

#[test]
fn auto_with_a_json_response_format_allows_json_or_a_call() {
    let f = factory(ChatFormat::HermesJson, None);
    let r = req(json!("auto"), true, json!({"type": "json_object"}));
    assert!(check(&f, &r, false, ParseStart::Content, "{\"a\": 1}"));
    assert!(check(&f, &r, false, ParseStart::Content, HERMES_CALL));
    assert!(!check(&f, &r, false, ParseStart::Content, "It is sunny."));
}

#[test]
fn decode_state_allows_stop_tokens_only_where_the_grammar_accepts() {
    use crate::decoding::{DecodeOptions, DecodeState, FinishReason};
    use crate::sampling::SamplingParams;
    let f = factory(ChatFormat::HermesJson, None);
    for parallel in [false, true] {
        let r = req(
            json!({"type": "function", "function": {"name": "get_weather"}}),
            parallel,
            Value::Null,
        );
        let tok = toy_tokenizer();
        let stop_set: std::collections::HashSet<u32> = stops().into_iter().collect();
        let mut st = DecodeState::new(
            DecodeOptions {
                sampling: SamplingParams::greedy(),
                max_tokens: Some(200),
                stop: Vec::new(),
                context: None,
                constraint: f.build(&r, false, ParseStart::Content).unwrap(),
                logprobs: None,
            },
            &tok,
            &stop_set,
            1000,
        );
        // The model wants to stop at once; failing that, `"` and `}` (the shortest valid call).
        let mut logits = vec![0.0f32; 320];
        logits[256] = 10.0;
        logits[b'"' as usize] = 5.0;
        logits[b'}' as usize] = 4.0;
        let mut text = String::new();
        let mut forced = 0;
        loop {
            st.prepare().unwrap();
            let t = st.pick(&logits);
            let step = st.accept(t);
            text.push_str(&step.text);
            if let Some(reason) = step.finished {
                assert_eq!(reason, FinishReason::Stop);
                break;
            }
            for t in st.forced() {
                forced += 1;
                let step = st.accept(t);
                text.push_str(&step.text);
                if step.finished.is_some() {
                    break;
                }
            }
            if let Some(reason) = st.finished() {
                // A complete call with parallel calls off: the grammar itself ends the turn.
                assert_eq!(reason, FinishReason::Stop);
                break;
            }
        }
        assert_eq!(
            text,
            "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"\"}}\n</tool_call>"
        );
        assert!(
            forced > 20,
            "the fixed call prefix is forced, not sampled ({forced})"
        );
        let parsed = crate::chat::parse(
            ChatFormat::HermesJson,
            ParseStart::Content,
            &text,
            r.parser_tools(),
            false,
        );
        assert_eq!(parsed.tool_calls[0].name, "get_weather");
    }
}

#[test]
fn a_rejected_forced_token_ends_the_sequence_cleanly() {
    use crate::decoding::{DecodeOptions, DecodeState, FinishReason};
    let f = factory(ChatFormat::HermesJson, None);
    let r = req(json!("required"), true, Value::Null);
    let stop_set: std::collections::HashSet<u32> = stops().into_iter().collect();
    let mut st = DecodeState::new(
        DecodeOptions {
            context: None,
            constraint: f.build(&r, false, ParseStart::Content).unwrap(),
            ..DecodeOptions::default()
        },
        &toy_tokenizer(),
        &stop_set,
        1000,
    );
    // A plugin forces plain text where the grammar wants a call: the sequence stops.
    let step = st.accept(u32::from(b'x'));
    assert_eq!(step.finished, Some(FinishReason::Stop));
    assert_eq!(st.accept(u32::from(b'y')).finished, Some(FinishReason::Stop));
}

#[test]
fn local_refs_and_defs_compile() {
    let f = factory(ChatFormat::HermesJson, None);
    let schema = json!({"type": "object", "$defs": {"Item": {"type": "object",
        "properties": {"n": {"type": "integer"}}, "required": ["n"]}},
        "properties": {"items": {"type": "array", "items": {"$ref": "#/$defs/Item"}}}, "required": ["items"]});
    let r = RequestConstraints::from_openai(
        None,
        None,
        None,
        Some(&json!({"type": "json_schema", "json_schema": {"name": "x", "schema": schema}})),
    )
    .unwrap();
    assert!(check(
        &f,
        &r,
        false,
        ParseStart::Content,
        "{\"items\": [{\"n\": 1}, {\"n\": 2}]}"
    ));
    assert!(!check(
        &f,
        &r,
        false,
        ParseStart::Content,
        "{\"items\": [{\"m\": 1}]}"
    ));
}

#[test]
fn minicpm_calls_the_grammar_accepts_parse_back_as_valid_calls() {
    let f = factory(ChatFormat::MiniCpmXml, Some(Reasoning::ThinkTags));
    let call = "<function name=\"get_weather\"><param name=\"city\"><![CDATA[Paris\n<1er>]]></param><param name=\"days\">3</param></function>";
    let named = json!({"type": "function", "function": {"name": "get_weather"}});
    for choice in [json!("auto"), json!("required"), named] {
        for parallel in [true, false] {
            let r = req(choice.clone(), parallel, Value::Null);
            for text in [call.to_string(), format!("{call}\n{MINICPM_TIME}")] {
                let two = text.len() > call.len();
                let allowed = !two || (parallel && choice["type"].is_null());
                assert_eq!(
                    check(&f, &r, false, ParseStart::Content, &text),
                    allowed,
                    "{choice} parallel={parallel}: {text}"
                );
            }
            let parsed = crate::chat::parse(
                ChatFormat::MiniCpmXml,
                ParseStart::Content,
                call,
                r.parser_tools(),
                false,
            );
            assert_eq!(parsed.content, None);
            assert_eq!(parsed.tool_calls.len(), 1);
            let args: Value = serde_json::from_str(&parsed.tool_calls[0].arguments).unwrap();
            assert_eq!(args, json!({"city": "Paris\n<1er>", "days": 3}));
        }
    }
    // Under `auto` a lead-in sentence may come first; it stays content.
    let r = req(json!("auto"), true, Value::Null);
    let text = format!("Let me check.\n{call}");
    assert!(check(&f, &r, false, ParseStart::Content, &text));
    let parsed = crate::chat::parse(
        ChatFormat::MiniCpmXml,
        ParseStart::Content,
        &text,
        r.parser_tools(),
        false,
    );
    assert_eq!(parsed.content.as_deref(), Some("Let me check."));
    assert_eq!(parsed.tool_calls[0].name, "get_weather");
}

proptest::proptest! {
    #![proptest_config(proptest::prelude::ProptestConfig { cases: 64, ..proptest::prelude::ProptestConfig::default() })]

    /// Every format with call markup: a random message written in its markup (berth-chat's round
    /// trips: reasoning, content, calls with random schema-valid arguments) is what its grammar
    /// accepts under `auto`, and under `required` when it is only calls; the same text parses back
    /// to that message in berth-chat's own property test.
    #[test]
    fn every_format_grammar_accepts_a_rendered_random_message(
        which in 0usize..ChatFormat::ALL.len(),
        seed in proptest::prelude::any::<u64>(),
    ) {
        use berth_chat::testutil::{render, round_trip, round_trip_tools};
        let format = ChatFormat::ALL[which];
        if format != ChatFormat::ContentOnly {
            let trip = round_trip(format, seed);
            let reasoning = match format {
                ChatFormat::Gemma4 => Reasoning::Gemma4Thought,
                ChatFormat::Harmony => Reasoning::HarmonyAnalysis,
                _ => Reasoning::ThinkTags,
            };
            let f = factory(format, Some(reasoning));
            let tools = json!(round_trip_tools());
            let request = |choice: Value| {
                RequestConstraints::from_openai(Some(&tools), Some(&choice), Some(&json!(true)), None).unwrap()
            };
            assert!(check(&f, &request(json!("auto")), true, trip.start, &trip.text), "{format} auto: {:?}", trip.text);
            // Exactly that markup: a call of an undeclared function, or an argument of the wrong
            // type, is refused.
            if !trip.sample.calls.is_empty() {
                let mut wrong = trip.sample.clone();
                wrong.calls[0].0 = "unknown_tool".into();
                let (start, text) = render(format, &wrong).unwrap();
                assert!(!check(&f, &request(json!("auto")), true, start, &text), "{format}: {text:?}");
                // A string where the schema wants another type (a number where it wants a string
                // reads as that string in the XML formats: no wrong markup).
                let mut wrong = trip.sample.clone();
                let args = wrong.calls[0].1.as_object_mut().unwrap();
                if let Some(value) = args.values_mut().find(|v| !v.is_string()) {
                    *value = json!("seven");
                    let (start, text) = render(format, &wrong).unwrap();
                    assert!(!check(&f, &request(json!("auto")), true, start, &text), "{format}: {text:?}");
                }
            }
            if trip.sample.content.is_empty() && !trip.sample.calls.is_empty() {
                assert!(
                    check(&f, &request(json!("required")), true, trip.start, &trip.text),
                    "{format} required: {:?}",
                    trip.text
                );
            }
        }
    }
}
