//! Shared test material: the tools and the corpus of outputs in every format that the parser,
//! stream and host tests all run, and the stream checks (deltas only grow and add up to the
//! non-streamed message). Built for this crate's tests and, with the `testutil` feature, for
//! other crates' tests.

use serde_json::{json, Value};

use crate::format::{ChatFormat, ParseStart};
use crate::message::{ParsedMessage, ToolCall};
use crate::parse::parse;
use crate::stream::{openai_delta, StreamParser};
use ChatFormat::*;
use ParseStart as S;

/// Tools used by the tests: a string `zip` that reads like a number, an integer `days`.
pub fn tools() -> Vec<Value> {
    vec![
        json!({"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object", "properties": {
            "location": {"type": "string"}, "days": {"type": "integer"}, "zip": {"type": "string"},
            "date": {"type": "string"}, "metric": {"type": "boolean"}, "opts": {"type": "object"}, "ratio": {"type": "number"}}}}}),
        json!({"type": "function", "function": {"name": "get_time", "parameters": {"type": "object", "properties": {"tz": {"type": "string"}}}}}),
    ]
}

/// Outputs that only look like calls: with tools they stay content, byte for byte.
pub fn not_bare_calls() -> Vec<&'static str> {
    vec![
        r#"{"name": "reverse_string", "arguments": {"s": "abc"}}"#,
        "```json\n{\"name\": \"reverse_string\", \"arguments\": {\"s\": \"abc\"}}\n```",
        "<tool_call>\n{\"name\": \"reverse_string\", \"arguments\": {\"s\": \"abc\"}}\n</tool_call>",
        r#"{"city": "Lima", "unit": "celsius"}"#,
        r#"{"name": "get_weather"}"#,
        r#"{"name": "get_weather", "arguments": 3}"#,
        r#"{"name": "get_weather", "arguments": {"location": "Lima"}, "note": "x"}"#,
        r#"[{"name": "get_time", "arguments": {}}, 3]"#,
        "Here is an example: {\"name\": \"get_weather\", \"arguments\": {\"location\": \"Lima\"}} which you can send.",
        "Here is an example of how you can call it:\n\n```json\n{\"name\": \"get_weather\", \"arguments\": {\"location\": \"Lima\"}}\n```\n\nIt returns the weather in Lima.",
        "The get_weather tool takes a location.\nFor example:\n```json\n{\"name\": \"get_weather\", \"arguments\": {\"location\": \"Lima\"}}\n```",
        "First line.\nSecond line {\"name\": \"get_weather\", \"arguments\": {}}",
        "```python\nprint({\"name\": \"get_weather\", \"arguments\": {}})\n```",
        "[1, 2, 3]",
        "The capital of France is Paris.",
    ]
}

/// A corpus of outputs for every format: (format, start, text).
pub fn corpus() -> Vec<(ChatFormat, ParseStart, &'static str)> {
    vec![
        (HermesJson, S::Content, "<think>\nIt is Paris.\n</think>\n\nLet me check.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"location\": \"Paris\", \"days\": -12}}\n</tool_call>\n<tool_call>\n{\"name\": \"get_time\", \"arguments\": \"{\\\"tz\\\": 1}\"}"),
        (HermesJson, S::Content, "Use <tool_call> like </tool_call> then ```json\n{\"name\": \"get_time\", \"arguments\": {}}\n``` and <function=get_time>{\"tz\": \"x\"}</function> bye <"),
        (HermesJson, S::Reasoning, "hm <tool_call> no\n</think>\n\nok <tool_call>{\"arguments\": {\"a\": [1, {\"b\": \"}\"}]}, \"name\": \"get_time\"} stray}</tool_call> end"),
        (QwenXml, S::Reasoning, "Need it.\n<tool_call>\n<function=get_weather>\n<parameter=location>\nNew York\n</parameter>\n<parameter=days>\n12\n</parameter>\n<parameter=zip>\n017\n</parameter>\n</function>\n</tool_call>\n<tool_call>\n<function=get_time>\n<parameter=tz>\na</function>b\n</parameter>\n</function>\n</tool_call>"),
        (QwenXml, S::ReasoningClosed, "#include <functional>\nText <function=get_time>\n<parameter=tz>\nCET\n<parameter=x>\n1.5\n</function>\nafter"),
        (Gemma4, S::Content, "<|channel>thought\nUser wants weather.<channel|>Sure.<|tool_call>call:get_weather{location:<|\"|>Paris<|\"|>,days:31,opts:{a:[true,null]}}<tool_call|><|tool_call>call:get_time{tz:<|\"|>CET<|\"|>}<turn|>"),
        (Gemma4, S::ReasoningClosed, "thought\nHello <|channel>other<channel|>there<|channel>thought\n<channel|><|tool_call>call:get_time{<|\"|>tz<|\"|>:nil,n:-0.5}<eos>"),
        (Lfm2Pythonic, S::Content, "<think>plan</think>Ok <|tool_call_start|>[get_weather(location=\"Paris\", days=07, metric=True), get_time(tz='sed -n '1,9p' f.py')]<|tool_call_end|>[get_time(tz='CET')]<|tool_call_end|>Done."),
        (Lfm2Pythonic, S::Content, "A <|tool_call_start|>[{\"name\": \"get_time\", \"arguments\": {\"tz\": \"CET\"}}]<|tool_call_end|> B <|tool_call_start|>[]<|tool_call_end|> C [not echo"),
        // Found by the chat_parse_stream fuzzer (fuzz/seeds/chat_parse_stream/lfm2_unclosed_list_then_echo).
        (Lfm2Pythonic, S::ReasoningClosed, "k <|tool_call_start|>[<|tool_call_end|>[<|tool_call_end|>z<|tool_call_end|>"),
        (Harmony, S::AssistantHeader, "<|channel|>analysis<|message|>Need weather.<|end|><|start|>assistant<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>{\"location\":\"SF\"}<|call|><|start|>assistant<|channel|>final<|message|>It is sunny.<|return|>"),
        (Harmony, S::AssistantHeader, "<|channel|>commentary<|channel|>analysis<|message|>hm<|end|><|start|>assistant to=browser.search<|channel|>analysis<|message|>{}<|call|><|start|>assistant<|channel|>commentary<|message|>Looking.<|end|>plain <|start|>assistant to=functions.get_time<|channel|>commentary json<|message|>{\"tz\": 12"),
        (Harmony, S::AssistantHeader, " to=functions.get_time<|channel|>commentary json<|message|>{\"tz\":\"CET\"}<|call|><|channel|>final Hello there.<|end|><|message|>bare<|end|><|start|>assistant<|channel|>analysis<|end|><|start|>assistant<|channel|>commentary to=functions.get_weather <|constrain|>json {\"location\": \"Paris\"}<|call|>text<|start|>assistant<|channel|>commentary to=functions.get_wea"),
        (ContentOnly, S::Content, "<think>hm</think>Hi <tool_call> there é\n"),
        (HermesJson, S::Content, "Sure, I'll check.\n\n```json\n[{\"name\": \"get_weather\", \"arguments\": {\"location\": \"Lima\"}},\n {\"type\": \"function\", \"function\": {\"name\": \"get_time\", \"parameters\": \"{\\\"tz\\\": \\\"CET\\\"}\"}}]\n```\n"),
        (QwenXml, S::Reasoning, "hm\n</think>\n\n{\"name\": \"get_time\", \"arguments\": {\"tz\": \"é\"}}\n{\"name\": \"get_weather\", \"arguments\": {}}</tool_call>"),
        (HermesJson, S::Content, "{\"name\": \"get_weather\", \"arguments\": {\"location\": \"Lima\"}} is the call. <tool_call>{\"name\": \"reverse\", \"arguments\": {}}</tool_call> ```json\n{\"name\": \"get_time\", \"arguments\": {}}\n```"),
        (MiniCpmXml, S::Reasoning, "plan\n</think>\n\nOk <function name=\"get_weather\"><param name=\"location\"><![CDATA[a\n<b>]]></param><param name=\"days\">07</param></function>\n<function name=\"get_time\"><param name=\"tz\">CET<param name=\"x\">1</function> after <function name=\"get_time\"><param name=\"tz\">]]></param>"),
    ]
}

/// Every field of `a` is a prefix of the same field of `b`.
pub fn assert_grows(a: &ParsedMessage, b: &ParsedMessage, what: &str) {
    let s = |o: &Option<String>| o.clone().unwrap_or_default();
    assert!(
        s(&b.reasoning_content).starts_with(&s(&a.reasoning_content)),
        "reasoning shrank: {what}\n{a:?}\n{b:?}"
    );
    assert!(
        s(&b.content).starts_with(&s(&a.content)),
        "content shrank: {what}\n{a:?}\n{b:?}"
    );
    assert!(
        b.tool_calls.len() >= a.tool_calls.len(),
        "calls vanished: {what}\n{a:?}\n{b:?}"
    );
    for (x, y) in a.tool_calls.iter().zip(&b.tool_calls) {
        assert_eq!((&x.id, &x.name), (&y.id, &y.name), "call changed: {what}");
        assert!(
            y.arguments.starts_with(&x.arguments),
            "arguments shrank: {what}\n{a:?}\n{b:?}"
        );
    }
}

/// What the deltas add up to: (reasoning, content, calls as (id, name, arguments)).
pub type Sum = (String, String, Vec<(String, String, String)>);

/// Adds one delta to the running sum, checking that a call's first delta carries its id, type
/// and name and later ones do not.
pub fn add(sum: &mut Sum, delta: &Value) {
    if let Some(r) = delta["reasoning_content"].as_str() {
        sum.0.push_str(r);
    }
    if let Some(c) = delta["content"].as_str() {
        sum.1.push_str(c);
    }
    for call in delta["tool_calls"].as_array().into_iter().flatten() {
        let index = call["index"]
            .as_u64()
            .expect("every tool-call delta has an index") as usize;
        if index == sum.2.len() {
            assert_eq!(call["type"], "function", "first delta of a call has its type");
            let id = call["id"].as_str().expect("first delta of a call has its id");
            let name = call["function"]["name"]
                .as_str()
                .expect("first delta has the name");
            sum.2.push((id.into(), name.into(), String::new()));
        } else {
            assert!(call.get("id").is_none() && call["function"].get("name").is_none());
        }
        sum.2[index]
            .2
            .push_str(call["function"]["arguments"].as_str().unwrap_or(""));
    }
}

/// Stream `text` in the given pieces; assert the deltas add up to the final message.
pub fn check(format: ChatFormat, start: ParseStart, pieces: &[&str], tools: Option<&[Value]>) {
    let mut p = StreamParser::new(format, start, tools);
    let mut sum = Sum::default();
    let mut deltas_all = Vec::new();
    for piece in pieces {
        let deltas = p.push(piece);
        if let Some(d) = openai_delta(&deltas) {
            add(&mut sum, &d);
        }
        deltas_all.extend(deltas);
    }
    let (last, msg) = p.finish();
    deltas_all.extend(last.iter().cloned());
    if let Some(d) = openai_delta(&last) {
        add(&mut sum, &d);
    }
    assert_eq!(
        ParsedMessage::fold(&deltas_all),
        msg,
        "the deltas fold to the message"
    );
    let text: String = pieces.concat();
    assert_eq!(msg, parse(format, start, &text, tools, false));
    assert_eq!(
        sum.0,
        msg.reasoning_content.clone().unwrap_or_default(),
        "reasoning of {text:?}"
    );
    assert_eq!(
        sum.1,
        msg.content.clone().unwrap_or_default(),
        "content of {text:?}"
    );
    let calls: Vec<_> = msg
        .tool_calls
        .iter()
        .map(|c| (c.id.clone(), c.name.clone(), c.arguments.clone()))
        .collect();
    assert_eq!(sum.2, calls, "tool calls of {text:?}");
}

/// Stream the pieces, asserting after every flush that no field shrank, then that the deltas
/// add up to the final message.
pub fn check_growing(format: ChatFormat, start: ParseStart, pieces: &[&str], tools: Option<&[Value]>) {
    let mut p = StreamParser::new(format, start, tools);
    let mut prev = ParsedMessage::default();
    for piece in pieces {
        p.push(piece);
        let now = parse(format, start, p.text(), tools, true);
        assert_grows(&prev, &now, &format!("{format} after {:?}", p.text()));
        prev = now;
    }
    check(format, start, pieces, tools);
}

/// CI lays shared/ beside the clone; sessions have it at /work/shared.
pub fn templates_dir() -> std::path::PathBuf {
    let beside = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../shared/fixtures/templates");
    if beside.is_dir() {
        beside
    } else {
        "/work/shared/fixtures/templates".into()
    }
}

/// The text of one template fixture (`shared/fixtures/templates/NAME`).
pub fn fixture(name: &str) -> String {
    std::fs::read_to_string(templates_dir().join(name)).expect("template fixture")
}

/// `text` parsed (with the test tools, or none) as the OpenAI message a client gets.
pub fn parse_openai(format: ChatFormat, start: ParseStart, text: &str, with_tools: bool) -> Value {
    let t = tools();
    parse(format, start, text, with_tools.then_some(&t[..]), false).to_openai()
}

/// The OpenAI message with these fields (call ids `call_0`, `call_1`, ..).
pub fn openai_message(reasoning: Option<&str>, content: Option<&str>, calls: &[(&str, &str)]) -> Value {
    let m = ParsedMessage {
        reasoning_content: reasoning.map(str::to_string),
        content: content.map(str::to_string),
        tool_calls: calls
            .iter()
            .enumerate()
            .map(|(i, (n, a))| ToolCall {
                id: format!("call_{i}"),
                name: n.to_string(),
                arguments: a.to_string(),
            })
            .collect(),
    };
    m.to_openai()
}

/// `text` cut at the given points (taken modulo its length, at character boundaries).
pub fn split_at(text: &str, cuts: &[usize]) -> Vec<String> {
    let mut points: Vec<usize> = cuts
        .iter()
        .map(|c| c % (text.len() + 1))
        .filter(|&c| text.is_char_boundary(c))
        .collect();
    points.sort_unstable();
    points.dedup();
    let mut out = Vec::new();
    let mut prev = 0;
    for p in points.into_iter().chain([text.len()]) {
        out.push(text[prev..p].to_string());
        prev = p;
    }
    out
}

/// One message as a model writes it: reasoning, content, and calls (name, arguments object).
#[derive(Clone, Debug, PartialEq)]
pub struct Sample {
    /// The reasoning, if any (never empty).
    pub reasoning: Option<String>,
    /// The content (empty for none).
    pub content: String,
    /// The calls: the function's name and its arguments, in schema order.
    pub calls: Vec<(String, Value)>,
}

/// A random message rendered in one format's own markup, and what parsing it must give back.
#[derive(Clone, Debug)]
pub struct RoundTrip {
    /// The format.
    pub format: ChatFormat,
    /// Where parsing starts (what the prompt opened).
    pub start: ParseStart,
    /// The model's output.
    pub text: String,
    /// The message it holds.
    pub sample: Sample,
}

/// The tools of the round trips: every JSON type, an enum, arrays and a nested object; required
/// parameters come first (as the grammars write keyword arguments).
pub fn round_trip_tools() -> Vec<Value> {
    let f = |name: &str, props: Value, required: Value| {
        json!({"type": "function", "function": {"name": name, "parameters": {"type": "object",
            "properties": props, "required": required}}})
    };
    vec![
        f(
            "get_weather",
            json!({"location": {"type": "string"}, "days": {"type": "integer"}, "metric": {"type": "boolean"},
                "ratio": {"type": "number"}, "unit": {"type": "string", "enum": ["C", "F"]}}),
            json!(["location", "days"]),
        ),
        f(
            "search",
            json!({"query": {"type": "string"}, "tags": {"type": "array", "items": {"type": "string"}},
                "limit": {"type": "integer"}}),
            json!(["query"]),
        ),
        f(
            "book",
            json!({"when": {"type": "object", "properties": {"day": {"type": "integer"}, "note": {"type": "string"}},
                "required": ["day", "note"]}, "seats": {"type": "array", "items": {"type": "integer"}}}),
            json!(["when"]),
        ),
    ]
}

/// A small deterministic generator (xorshift64*), so the samples need no dependency.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }

    fn chance(&mut self, percent: u64) -> bool {
        self.next() % 100 < percent
    }

    /// Text from `alphabet`, 1 to `max` characters, with no whitespace at either end.
    fn text(&mut self, alphabet: &[char], max: usize) -> String {
        let n = 1 + self.below(max);
        let s: String = (0..n).map(|_| alphabet[self.below(alphabet.len())]).collect();
        match s.trim() {
            "" => "x".into(),
            t => t.into(),
        }
    }
}

/// Prose: no markup, no JSON, no fences.
const PROSE: &[char] = &[
    'a', 'b', 'c', 'd', 'e', 'i', 'n', 'o', 'r', 's', 't', 'T', 'W', ' ', ' ', '.', ',', '!', '?', '\'', '-',
    ':', '0', '7', 'é', 'ü', '\n',
];
/// String values: prose characters and `&`, `_`, `/`, `"` (never `<`: markup).
const VALUE: &[char] = &[
    'a', 'b', 'k', 'o', 'r', 's', 'x', 'P', 'Z', ' ', ' ', '.', ',', '&', '_', '/', '"', '-', '1', '9', 'é',
    '\n',
];

/// A random value that follows `schema`.
fn random_value(rng: &mut Rng, schema: &Value) -> Value {
    if let Some(options) = schema.get("enum").and_then(Value::as_array) {
        return options[rng.below(options.len())].clone();
    }
    match schema["type"].as_str() {
        Some("string") => Value::String(rng.text(VALUE, 12)),
        Some("integer") => json!(rng.below(2001) as i64 - 1000),
        // Quarters that are not whole: exact in binary, and never written as an integer.
        Some("number") => json!((2.0 * rng.below(400) as f64 - 399.0) / 4.0),
        Some("boolean") => json!(rng.chance(50)),
        Some("array") => {
            let n = rng.below(4);
            Value::Array((0..n).map(|_| random_value(rng, &schema["items"])).collect())
        }
        Some("object") => random_arguments(rng, schema),
        other => panic!("no values for type {other:?}"),
    }
}

/// Random arguments for an object schema: every required property, some optional ones, in
/// schema order.
fn random_arguments(rng: &mut Rng, schema: &Value) -> Value {
    let required: Vec<&str> = schema["required"]
        .as_array()
        .map(|r| r.iter().filter_map(Value::as_str).collect())
        .unwrap_or_default();
    let mut args = serde_json::Map::new();
    for (key, s) in schema["properties"].as_object().into_iter().flatten() {
        if required.contains(&key.as_str()) || rng.chance(50) {
            args.insert(key.clone(), random_value(rng, s));
        }
    }
    Value::Object(args)
}

/// A random message for `format` (from `seed`), rendered in its markup; a message the format
/// cannot hold (calls without call markup, harmony's content beside a call) is cut down until it
/// can.
pub fn round_trip(format: ChatFormat, seed: u64) -> RoundTrip {
    let mut rng = Rng(seed | 1);
    let tools = round_trip_tools();
    let mut sample = Sample {
        reasoning: rng.chance(50).then(|| rng.text(PROSE, 40)),
        content: if rng.chance(60) {
            rng.text(PROSE, 60)
        } else {
            String::new()
        },
        calls: (0..rng.below(4))
            .map(|_| {
                let f = &tools[rng.below(tools.len())]["function"];
                (
                    f["name"].as_str().unwrap().to_string(),
                    random_arguments(&mut rng, &f["parameters"]),
                )
            })
            .collect(),
    };
    loop {
        if let Some((start, text)) = crate::formats::of(format).render(&sample) {
            return RoundTrip {
                format,
                start,
                text,
                sample,
            };
        }
        if sample.calls.len() > 1 {
            sample.calls.truncate(1);
        } else if !sample.calls.is_empty() && !sample.content.is_empty() {
            sample.content.clear();
        } else {
            sample.calls.clear();
        }
    }
}

/// `sample` written in `format`'s markup, with the parse start the text assumes; `None` when the
/// format cannot hold it.
pub fn render(format: ChatFormat, sample: &Sample) -> Option<(ParseStart, String)> {
    crate::formats::of(format).render(sample)
}

/// JSON with `, ` and `: ` between items and after keys, as Python's `json.dumps` (and the
/// grammars' `%json`) write it.
pub fn json_spaced(v: &Value) -> String {
    match v {
        Value::Array(items) => format!(
            "[{}]",
            items.iter().map(json_spaced).collect::<Vec<_>>().join(", ")
        ),
        Value::Object(map) => {
            let pairs: Vec<String> = map
                .iter()
                .map(|(k, v)| format!("{}: {}", Value::String(k.clone()), json_spaced(v)))
                .collect();
            format!("{{{}}}", pairs.join(", "))
        }
        other => other.to_string(),
    }
}

/// Asserts that `parsed` holds exactly `sample` (arguments compared as JSON values).
pub fn assert_parsed_as(parsed: &ParsedMessage, sample: &Sample, what: &str) {
    assert_eq!(parsed.reasoning_content, sample.reasoning, "reasoning of {what}");
    let content = (!sample.content.is_empty() || sample.calls.is_empty()).then(|| sample.content.clone());
    assert_eq!(parsed.content, content, "content of {what}");
    let calls: Vec<(String, Value)> = parsed
        .tool_calls
        .iter()
        .map(|c| {
            let args = serde_json::from_str(&c.arguments)
                .unwrap_or_else(|e| panic!("arguments {:?} of {what}: {e}", c.arguments));
            (c.name.clone(), args)
        })
        .collect();
    assert_eq!(calls, sample.calls, "calls of {what}");
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn round_trips_cover_every_format_with_reasoning_content_and_calls() {
        for format in ChatFormat::ALL {
            let trips: Vec<RoundTrip> = (0..200).map(|seed| round_trip(format, seed)).collect();
            assert!(trips.iter().any(|t| t.sample.reasoning.is_some()), "{format}");
            assert!(trips.iter().any(|t| !t.sample.content.is_empty()), "{format}");
            if format != ChatFormat::ContentOnly {
                assert!(trips.iter().any(|t| !t.sample.calls.is_empty()), "{format}");
            }
            if !matches!(format, ChatFormat::ContentOnly | ChatFormat::Harmony) {
                assert!(trips.iter().any(|t| t.sample.calls.len() > 1), "{format}");
            }
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

        /// Every format: a random message written in its markup parses back to itself, and
        /// streams back to itself at random boundaries with no field ever shrinking.
        #[test]
        fn a_rendered_message_parses_and_streams_back_equal(
            which in 0usize..ChatFormat::ALL.len(),
            seed in any::<u64>(),
            cuts in proptest::collection::vec(0usize..4096, 0..24),
        ) {
            let trip = round_trip(ChatFormat::ALL[which], seed);
            let tools = round_trip_tools();
            let what = format!("{} {:?}", trip.format, trip.text);
            let parsed = parse(trip.format, trip.start, &trip.text, Some(&tools), false);
            assert_parsed_as(&parsed, &trip.sample, &what);
            let pieces = split_at(&trip.text, &cuts);
            let pieces: Vec<&str> = pieces.iter().map(String::as_str).collect();
            check_growing(trip.format, trip.start, &pieces, Some(&tools));
        }
    }
}
