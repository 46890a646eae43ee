//! Model output -> reasoning, content and tool calls, for every chat format, in one pass.
//!
//! Never an error: markup that is not understood stays content. With `is_partial` the text is a
//! prefix of the output so far, and the parse holds back whatever may still change (a marker cut
//! short, an unfinished name or value), so each field of a partial parse is a prefix of the same
//! field of every later parse. Tool markup counts as a call only when the request has tools; in
//! hermes_json and qwen_xml only a call of a tool the request offers is one, and an answer that is
//! only calls written without markup (bare JSON, a fence, a list; see `bare_answer`) is read as
//! calls too, held back while partial until it is known to be one or not.

use serde_json::Value;

use crate::format::{ChatFormat, ParseStart};
use crate::formats;
use crate::message::ParsedMessage;
use crate::scan::{tool_names, Out};

/// Parse model output in the given format, starting in the state the prompt left it in.
pub fn parse(
    format: ChatFormat,
    start: ParseStart,
    text: &str,
    tools: Option<&[Value]>,
    is_partial: bool,
) -> ParsedMessage {
    parse_output(format, start, text, tools, is_partial, false)
}

/// Parse an output that `max_tokens` (or the context) cut short: as the prefix it is (see
/// [`parse`] with `is_partial`), except that a lead-in line held back only because a call written
/// without markup might still have followed is content, since none will.
pub fn parse_cut(
    format: ChatFormat,
    start: ParseStart,
    text: &str,
    tools: Option<&[Value]>,
) -> ParsedMessage {
    parse_output(format, start, text, tools, true, true)
}

fn parse_output(
    format: ChatFormat,
    start: ParseStart,
    text: &str,
    tools: Option<&[Value]>,
    is_partial: bool,
    cut: bool,
) -> ParsedMessage {
    let tools = tools.unwrap_or(&[]);
    let mut out = Out {
        partial: is_partial,
        cut,
        tools,
        names: tool_names(tools),
        ..Out::default()
    };
    formats::of(format).parse(&mut out, text, start);
    out.finish()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testutil::{assert_grows, corpus, openai_message as msg, parse_openai as run, tools};
    use serde_json::json;

    use ChatFormat::*;
    use ParseStart as S;

    #[test]
    fn tool_markup_without_tools_stays_content() {
        let out = "<tool_call>\n{\"name\": \"get_time\", \"arguments\": {}}\n</tool_call>";
        assert_eq!(run(HermesJson, S::Content, out, false), msg(None, Some(out), &[]));
        let out = "<|tool_call>call:get_time{}<tool_call|>";
        assert_eq!(run(Gemma4, S::Content, out, false), msg(None, Some(out), &[]));
    }

    #[test]
    fn unparseable_markup_stays_content() {
        let out = "Use <tool_call> tags like this </tool_call> ok";
        assert_eq!(run(HermesJson, S::Content, out, true), msg(None, Some(out), &[]));
        let out = "<|tool_call_start|>not a call<|tool_call_end|>";
        assert_eq!(
            run(Lfm2Pythonic, S::Content, out, true)["tool_calls"],
            Value::Null
        );
    }

    #[test]
    fn truncated_reasoning_is_all_reasoning_and_thinking_off_is_all_content() {
        assert_eq!(
            run(HermesJson, S::Reasoning, "still thinking", true),
            msg(Some("still thinking"), Some(""), &[])
        );
        assert_eq!(
            run(HermesJson, S::ReasoningClosed, "the answer", true),
            msg(None, Some("the answer"), &[])
        );
        assert_eq!(
            run(ContentOnly, S::Content, "<think>hm</think>Hi", false),
            msg(Some("hm"), Some("Hi"), &[])
        );
    }

    #[test]
    fn non_ascii_whitespace_after_tool_call_is_not_skipped_as_if_ascii() {
        // Found by fuzzing (scripts/fuzz-chat): a vertical tab after `<tool_call>` counted as
        // whitespace when deciding what follows, but not when indexing, and the parser read past
        // the end of the text.
        let out = "Ok.\n<tool_call>\u{b}{\"name\": \"get_weathe\u{0}";
        for format in [QwenXml, HermesJson] {
            for partial in [true, false] {
                let t = tools();
                let msg = parse(format, S::Content, out, Some(&t), partial);
                assert!(msg.tool_calls.is_empty() || msg.tool_calls[0].name.starts_with("get_"));
            }
        }
        // The opener is not taken for a call; the declared name's bare `<function=` still is.
        assert_eq!(
            run(
                QwenXml,
                S::Content,
                "<tool_call>\u{b}<function=get_time>\n</function>",
                true
            ),
            msg(None, Some("<tool_call>"), &[("get_time", "{}")])
        );
    }

    #[test]
    fn unfinished_function_arguments_hold_back_a_partial_closer() {
        // Found by fuzzing (scripts/fuzz-chat): `<function=NAME>{unfinished json` streamed the
        // start of `</function>` as arguments, then took it back when the closer completed.
        let t = tools();
        let text = "<function=get_time>{\"tz</function>x";
        let mut prev = ParsedMessage::default();
        for cut in 0..=text.len() {
            let part = parse(HermesJson, S::Content, &text[..cut], Some(&t), true);
            assert_grows(&prev, &part, &format!("cut {cut}"));
            prev = part;
        }
        let full = parse(HermesJson, S::Content, text, Some(&t), false);
        assert_grows(&prev, &full, "final");
        assert_eq!(full.tool_calls[0].arguments, "{\"tz");
    }

    #[test]
    fn gemma4_and_lfm2_values_are_typed_by_the_schema() {
        // A bare number for a string parameter stays the text as written; a quoted number for an
        // integer parameter becomes the integer; a string `True` for a boolean becomes true.
        let out = "<|tool_call>call:get_weather{zip:017,date:<|\"|>2025-01-02<|\"|>,days:<|\"|>3<|\"|>,metric:<|\"|>True<|\"|>,ratio:<|\"|>2.5<|\"|>,location:null,extra:17}<tool_call|>";
        assert_eq!(
            run(Gemma4, S::Content, out, true),
            msg(
                None,
                None,
                &[(
                    "get_weather",
                    r#"{"zip":"017","date":"2025-01-02","days":3,"metric":true,"ratio":2.5,"location":"null","extra":17}"#
                )]
            )
        );
        let out = "<|tool_call_start|>[get_weather(zip=94103, days='07', opts='{\"a\": None}', location=True)]<|tool_call_end|>";
        assert_eq!(
            run(Lfm2Pythonic, S::Content, out, true),
            msg(
                None,
                None,
                &[(
                    "get_weather",
                    r#"{"zip":"94103","days":7,"opts":{"a":null},"location":"True"}"#
                )]
            )
        );
        // Without tools nothing is retyped.
        let out = "<|tool_call_start|>[get_weather(zip=94103)]<|tool_call_end|>";
        let t = tools();
        let calls = |tools: Option<&[Value]>| parse(Lfm2Pythonic, S::Content, out, tools, false).tool_calls;
        assert_eq!(calls(Some(&t[..]))[0].arguments, r#"{"zip":"94103"}"#);
        let other = [json!({"type": "function", "function": {"name": "get_weather"}})];
        assert_eq!(calls(Some(&other[..]))[0].arguments, r#"{"zip":94103}"#);
    }

    #[test]
    fn output_cut_at_every_byte_never_panics_and_partials_only_grow() {
        let t = tools();
        for (format, start, text) in corpus() {
            for with_tools in [true, false] {
                let tools = with_tools.then_some(&t[..]);
                let full = parse(format, start, text, tools, false);
                let mut prev = ParsedMessage::default();
                for cut in 0..=text.len() {
                    let lossy = String::from_utf8_lossy(&text.as_bytes()[..cut]).into_owned();
                    let _ = parse(format, start, &lossy, tools, true);
                    let _ = parse(format, start, &lossy, tools, false);
                    if !text.is_char_boundary(cut) {
                        continue;
                    }
                    let part = parse(format, start, &text[..cut], tools, true);
                    assert_grows(&prev, &part, &format!("{format} cut {cut} of {text:?}"));
                    assert_grows(&part, &full, &format!("{format} cut {cut} vs final of {text:?}"));
                    prev = part;
                }
            }
        }
    }
}
