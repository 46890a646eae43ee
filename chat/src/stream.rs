//! Streamed parsing: reparse the accumulated output on every flush and emit only what grew, as
//! typed [`Delta`]s. The parse holds back whatever may still change, so every field only grows and
//! the deltas fold ([`ParsedMessage::apply`]) to the non-streamed message.

use serde_json::{json, Map, Value};

use super::format::{ChatFormat, ParseStart};
use super::message::{ParsedMessage, ToolCall};
use super::parse::{parse, parse_cut};

/// What one flush of model output added: each wire format encodes these its own way.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Delta {
    /// Reasoning text that grew.
    Reasoning(String),
    /// Answer text that grew.
    Content(String),
    /// A tool call began (`index` counts the reply's calls from 0).
    CallStart {
        /// Its place among the reply's calls.
        index: usize,
        /// Its id, unique within the reply.
        id: String,
        /// The function called.
        name: String,
    },
    /// A fragment of a call's arguments (JSON text; the fragments concatenate to the arguments).
    CallArgs {
        /// The call's place among the reply's calls.
        index: usize,
        /// The text that grew.
        fragment: String,
    },
}

/// The OpenAI chat-completions delta object of one flush's deltas (`None` when there are none): a
/// call's start and its first argument fragment share one `tool_calls` entry, as OpenAI sends them.
pub fn openai_delta(deltas: &[Delta]) -> Option<Value> {
    let mut delta = Map::new();
    let mut calls: Vec<Value> = Vec::new();
    for d in deltas {
        match d {
            Delta::Reasoning(t) => push_text(&mut delta, "reasoning_content", t),
            Delta::Content(t) => push_text(&mut delta, "content", t),
            Delta::CallStart { index, id, name } => calls.push(json!({
                "index": index,
                "id": id,
                "type": "function",
                "function": {"name": name, "arguments": ""},
            })),
            Delta::CallArgs { index, fragment } => {
                match calls.iter_mut().rev().find(|c| c["index"] == *index) {
                    Some(c) => {
                        let args = c["function"]["arguments"].as_str().unwrap_or("").to_string() + fragment;
                        c["function"]["arguments"] = args.into();
                    }
                    None => calls.push(json!({"index": index, "function": {"arguments": fragment}})),
                }
            }
        }
    }
    if !calls.is_empty() {
        delta.insert("tool_calls".into(), calls.into());
    }
    (!delta.is_empty()).then_some(Value::Object(delta))
}

fn push_text(delta: &mut Map<String, Value>, key: &str, text: &str) {
    let now = delta.get(key).and_then(Value::as_str).unwrap_or("").to_string() + text;
    delta.insert(key.into(), now.into());
}

impl ParsedMessage {
    /// Adds one delta: the message the deltas of a reply fold to (see [`StreamParser::finish_output`]
    /// for the final normalisation of an empty content).
    pub fn apply(&mut self, d: &Delta) {
        match d {
            Delta::Reasoning(t) => self.reasoning_content.get_or_insert_with(String::new).push_str(t),
            Delta::Content(t) => self.content.get_or_insert_with(String::new).push_str(t),
            Delta::CallStart { id, name, .. } => self.tool_calls.push(ToolCall {
                id: id.clone(),
                name: name.clone(),
                arguments: String::new(),
            }),
            Delta::CallArgs { index, fragment } => {
                if let Some(c) = self.tool_calls.get_mut(*index) {
                    c.arguments.push_str(fragment);
                }
            }
        }
    }

    /// The message a whole reply's deltas fold to: as [`ParsedMessage::apply`], then an empty
    /// content is `""` unless the reply is only tool calls (then `null`), as the parser gives it.
    pub fn fold<'a>(deltas: impl IntoIterator<Item = &'a Delta>) -> ParsedMessage {
        let mut m = ParsedMessage::default();
        for d in deltas {
            m.apply(d);
        }
        if m.content.is_none() && m.tool_calls.is_empty() {
            m.content = Some(String::new());
        }
        m
    }
}

/// Turns model output, flush by flush, into typed deltas.
#[derive(Debug, Clone)]
pub struct StreamParser {
    format: ChatFormat,
    start: ParseStart,
    tools: Option<Vec<Value>>,
    text: String,
    sent_reasoning: String,
    sent_content: String,
    /// Per call sent so far: its name and the arguments text.
    sent_calls: Vec<(String, String)>,
}

impl StreamParser {
    /// A parser for one reply in `format`, starting where the prompt left off.
    pub fn new(format: ChatFormat, start: ParseStart, tools: Option<&[Value]>) -> StreamParser {
        StreamParser {
            format,
            start,
            tools: tools.map(<[Value]>::to_vec),
            text: String::new(),
            sent_reasoning: String::new(),
            sent_content: String::new(),
            sent_calls: Vec::new(),
        }
    }

    /// The output so far.
    pub fn text(&self) -> &str {
        &self.text
    }

    /// Add decoded text; returns what grew (nothing when the parse holds it back).
    pub fn push(&mut self, chunk: &str) -> Vec<Delta> {
        self.text.push_str(chunk);
        let msg = parse(self.format, self.start, &self.text, self.tools.as_deref(), true);
        self.diff(&msg)
    }

    /// The output is complete: the last delta, if any, and the final message (equal to what the
    /// deltas add up to).
    pub fn finish(&mut self) -> (Vec<Delta>, ParsedMessage) {
        self.finish_output(false)
    }

    /// The output ended, `cut_short` when by `max_tokens` or the context rather than by the model:
    /// the last delta, if any, and the final message (equal to what the deltas add up to).
    ///
    /// A cut output is parsed as the prefix it is, so nothing the cut left unfinished is completed:
    /// a tool call keeps the arguments text the model wrote (an unclosed JSON prefix, `""` when it
    /// stopped before them), never a made-up `{}`; a name or marker cut short is no call at all.
    /// The caller reports the end as `length`, which tells the client the last call is unfinished.
    /// This is what OpenAI serves (a cut call streams its argument deltas, then `finish_reason:
    /// "length"`) and how llama.cpp parses any output its model did not end; it keeps the streamed
    /// and the non-streamed answers equal, as deltas already sent cannot be taken back, so the cut
    /// call is not dropped from the message (vLLM drops it when not streaming, and they differ).
    ///
    /// A lead-in line held back only because a call written without markup might have followed
    /// it is content when the output is cut, and so is a bare call (one without markup) begun and
    /// cut, or a wrapper models write instead of the markup (`<tools>`, `<function_call>`)
    /// cut before it held a call: it never became a call, and a parse of the same text reads it
    /// as content.
    pub fn finish_output(&mut self, cut_short: bool) -> (Vec<Delta>, ParsedMessage) {
        let tools = self.tools.as_deref();
        let msg = if cut_short {
            parse_cut(self.format, self.start, &self.text, tools)
        } else {
            parse(self.format, self.start, &self.text, tools, false)
        };
        (self.diff(&msg), msg)
    }

    fn diff(&mut self, msg: &ParsedMessage) -> Vec<Delta> {
        let mut out = Vec::new();
        let reasoning = msg.reasoning_content.as_deref().unwrap_or("");
        if let Some(grown) = growth(&mut self.sent_reasoning, reasoning) {
            out.push(Delta::Reasoning(grown));
        }
        let content = msg.content.as_deref().unwrap_or("");
        if let Some(grown) = growth(&mut self.sent_content, content) {
            out.push(Delta::Content(grown));
        }
        for (index, call) in msg.tool_calls.iter().enumerate() {
            if index == self.sent_calls.len() {
                self.sent_calls.push((call.name.clone(), String::new()));
                out.push(Delta::CallStart {
                    index,
                    id: call.id.clone(),
                    name: call.name.clone(),
                });
            }
            let (_, sent_args) = &mut self.sent_calls[index];
            if let Some(grown) = growth(sent_args, &call.arguments) {
                out.push(Delta::CallArgs {
                    index,
                    fragment: grown,
                });
            }
        }
        out
    }
}

/// What `now` adds to `sent`, recorded as sent; `None` when nothing grew. A value that does not
/// extend what was sent (the parser changed its mind) is not sent.
fn growth(sent: &mut String, now: &str) -> Option<String> {
    if now.len() > sent.len() && now.starts_with(sent.as_str()) {
        let grown = now[sent.len()..].to_string();
        sent.push_str(&grown);
        Some(grown)
    } else {
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testutil::{add, assert_grows, check, corpus, split_at, tools, Sum};
    use proptest::prelude::*;

    #[test]
    fn streamed_deltas_concatenate_to_final_message_one_char_at_a_time() {
        let t = tools();
        for (format, start, text) in corpus() {
            let pieces: Vec<String> = text.chars().map(String::from).collect();
            let pieces: Vec<&str> = pieces.iter().map(String::as_str).collect();
            check(format, start, &pieces, Some(&t));
            check(format, start, &pieces, None);
        }
    }

    #[test]
    fn tool_call_deltas_carry_index_and_the_first_carries_id_type_and_name() {
        let t = tools();
        let mut p = StreamParser::new(ChatFormat::QwenXml, ParseStart::ReasoningClosed, Some(&t));
        let first = openai_delta(&p.push("<tool_call>\n<function=get_time>\n")).expect("a delta");
        assert_eq!(
            first,
            json!({"tool_calls": [{"index": 0, "id": "call_0", "type": "function", "function": {"name": "get_time", "arguments": "{"}}]})
        );
        let next = openai_delta(&p.push("<parameter=tz>\nCET\n</parameter>\n")).expect("a delta");
        assert_eq!(
            next,
            json!({"tool_calls": [{"index": 0, "function": {"arguments": "\"tz\":\"CET\""}}]})
        );
        let (last, _) = p.finish();
        assert_eq!(
            openai_delta(&last),
            Some(json!({"tool_calls": [{"index": 0, "function": {"arguments": "}"}}]}))
        );
    }

    #[test]
    fn a_call_cut_short_keeps_the_arguments_written_and_is_never_completed() {
        let t = tools();
        let cut = |text: &str, cut_short: bool| {
            let mut p = StreamParser::new(ChatFormat::HermesJson, ParseStart::Content, Some(&t));
            p.push(text);
            p.finish_output(cut_short).1
        };
        let call = |args: &str| vec![("get_weather".to_string(), args.to_string())];
        let calls = |m: &ParsedMessage| -> Vec<(String, String)> {
            m.tool_calls
                .iter()
                .map(|c| (c.name.clone(), c.arguments.clone()))
                .collect()
        };
        let open = "<tool_call>\n{\"name\": \"get_weather\", \"argu";
        // A finished output reads a call without arguments as `{}`; a cut one does not.
        assert_eq!(calls(&cut(open, false)), call("{}"));
        assert_eq!(calls(&cut(open, true)), call(""));
        let text = "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"location\": \"Pa";
        assert_eq!(calls(&cut(text, true)), call("{\"location\": \"Pa"));
        // A name cut short is no call, not a call of a function that does not exist.
        assert_eq!(calls(&cut("<tool_call>\n{\"name\": \"get_wea", true)), vec![]);
        assert_eq!(
            cut("<tool_call>\n{\"name\": \"get_wea", true).content,
            Some(String::new())
        );
    }

    #[test]
    fn output_cut_at_every_byte_ends_as_the_prefix_it_is() {
        let t = tools();
        for (format, start, text) in corpus() {
            let full = parse(format, start, text, Some(&t), false);
            for cut in (0..=text.len()).filter(|&c| text.is_char_boundary(c)) {
                let prefix = &text[..cut];
                let half = (0..=cut / 2)
                    .rev()
                    .find(|&h| text.is_char_boundary(h))
                    .unwrap_or(0);
                let mut p = StreamParser::new(format, start, Some(&t));
                let mut sum = Sum::default();
                for piece in [&prefix[..half], &prefix[half..]] {
                    if let Some(d) = openai_delta(&p.push(piece)) {
                        add(&mut sum, &d);
                    }
                }
                let (last, msg) = p.finish_output(true);
                if let Some(d) = openai_delta(&last) {
                    add(&mut sum, &d);
                }
                let what = format!("{format} cut {cut} of {text:?}");
                // Every call (name and arguments) is a prefix of what the whole output says; so is
                // the content, unless the cut left a bare call unfinished: then that text is the
                // content, as it was written.
                let content = msg.content.clone().unwrap_or_default();
                let bare_cut = !full.content.clone().unwrap_or_default().starts_with(&content);
                if bare_cut {
                    assert!(
                        prefix.trim_end().ends_with(&content),
                        "content of {what}: {msg:?}"
                    );
                    assert!(msg.tool_calls.is_empty(), "{what}: {msg:?}");
                }
                let without_content = |m: &ParsedMessage| ParsedMessage {
                    content: None,
                    ..m.clone()
                };
                assert_grows(&without_content(&msg), &without_content(&full), &what);
                if !bare_cut {
                    assert_grows(&msg, &full, &what);
                }
                let calls: Vec<_> = msg
                    .tool_calls
                    .iter()
                    .map(|c| (c.id.clone(), c.name.clone(), c.arguments.clone()))
                    .collect();
                assert_eq!(sum.2, calls, "streamed calls of {what}");
                assert_eq!(
                    sum.1,
                    msg.content.clone().unwrap_or_default(),
                    "content of {what}"
                );
            }
        }
    }

    #[test]
    fn partial_markers_and_bare_values_are_held_back() {
        let t = tools();
        let mut p = StreamParser::new(ChatFormat::HermesJson, ParseStart::Content, Some(&t));
        assert_eq!(p.push("Hi <tool_"), vec![Delta::Content("Hi".into())]);
        let mut p = StreamParser::new(ChatFormat::Gemma4, ParseStart::Content, Some(&t));
        let d = openai_delta(&p.push("<|tool_call>call:get_weather{days:1")).expect("the call opens");
        assert_eq!(d["tool_calls"][0]["function"]["arguments"], "{");
        assert_eq!(p.push("2"), vec![], "a bare number may still continue");
        let d = p.push(",");
        assert_eq!(
            d,
            vec![Delta::CallArgs {
                index: 0,
                fragment: "\"days\":12".into()
            }],
            "the value is finished"
        );
    }

    #[test]
    fn a_cut_output_held_as_a_possible_bare_call_ends_as_the_prefix_it_is() {
        let t = tools();
        // (format, output cut short, its content): a lead-in is content, and so is a bare call
        // begun and cut (it never became a call).
        let cases = [
            (
                ChatFormat::HermesJson,
                "The capital of France",
                "The capital of France",
            ),
            (
                ChatFormat::QwenXml,
                "Sure, let me check.\n",
                "Sure, let me check.",
            ),
            (
                ChatFormat::HermesJson,
                "{\"name\": \"get_wea",
                "{\"name\": \"get_wea",
            ),
            (
                ChatFormat::QwenXml,
                "Sure:\n```json\n{\"name\": \"get_time\", \"arguments\": {\"tz\"",
                "Sure:\n```json\n{\"name\": \"get_time\", \"arguments\": {\"tz\"",
            ),
        ];
        for (format, text, content) in cases {
            let mut p = StreamParser::new(format, ParseStart::Content, Some(&t));
            let mut sum = Sum::default();
            for c in text.chars() {
                if let Some(d) = openai_delta(&p.push(&c.to_string())) {
                    add(&mut sum, &d);
                }
            }
            assert_eq!(sum, Sum::default(), "held while it may become a call: {text:?}");
            let (last, msg) = p.finish_output(true);
            if let Some(d) = openai_delta(&last) {
                add(&mut sum, &d);
            }
            assert_eq!(msg.content.as_deref(), Some(content), "{text:?}");
            assert!(msg.tool_calls.is_empty());
            assert_eq!(sum.1, content);
        }
        // A bare call is read only when the model ended the output; cut, it is content.
        let call = r#"{"name": "get_time", "arguments": {"tz": "CET"}}"#;
        for (cut, calls) in [(true, 0), (false, 1)] {
            let mut p = StreamParser::new(ChatFormat::QwenXml, ParseStart::Content, Some(&t));
            p.push(call);
            assert_eq!(p.finish_output(cut).1.tool_calls.len(), calls, "cut {cut}");
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]

        #[test]
        fn streamed_deltas_concatenate_to_final_message_for_random_flushes(
            cuts in proptest::collection::vec(0usize..4096, 0..40),
            which in 0usize..64,
            with_tools in any::<bool>(),
        ) {
            let t = tools();
            let corpus = corpus();
            let (format, start, text) = corpus[which % corpus.len()];
            let pieces = split_at(text, &cuts);
            let pieces: Vec<&str> = pieces.iter().map(String::as_str).collect();
            check(format, start, &pieces, with_tools.then_some(&t[..]));
        }
    }
}
