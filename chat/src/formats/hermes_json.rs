//! hermes_json: `<tool_call>\n{"name": .., "arguments": ..}\n</tool_call>` (Qwen2.5, Qwen3), with
//! the other wrappers models write instead of `<tool_call>`, and calls written without markup.

use crate::bare::bare_answer;
use crate::format::{ChatFormat, ParseStart};
use crate::formats::minicpm_xml::M_FUNCTION;
use crate::formats::qwen_xml::{END_FUNCTION, FUNCTION_EQ};
use crate::formats::{Format, MarkerNames};
use crate::grammar::{json_rule, lit, repeated, token_wrapped_calls, Lark, Markers, Plan};
use crate::json_scan::*;
use crate::request::{ParamError, ToolSpec};
use crate::scan::*;
use crate::think::think_block;

/// hermes_json.
pub(crate) struct HermesJson;

impl Format for HermesJson {
    fn id(&self) -> ChatFormat {
        ChatFormat::HermesJson
    }
    fn name(&self) -> &'static str {
        "hermes_json"
    }
    fn in_template(&self, template: &str) -> bool {
        template.contains(TOOL_CALL)
    }
    fn in_vocab(&self, has_token: &dyn Fn(&str) -> bool) -> bool {
        has_token(TOOL_CALL)
    }
    fn parse(&self, out: &mut Out, text: &str, start: ParseStart) {
        if let Some(pos) = think_block(out, text, start, Some(hermes_opens_call)) {
            hermes(out, text, pos);
        }
    }
    fn markers(&self) -> MarkerNames {
        MarkerNames {
            tool: Some((TOOL_CALL, END_TOOL_CALL)),
            ..MarkerNames::default()
        }
    }
    fn call_grammar(
        &self,
        g: &mut Lark,
        markers: &Markers,
        plan: &Plan,
    ) -> Option<Result<String, ParamError>> {
        let call = |_: &mut Lark, _, tool: &ToolSpec| {
            let head = format!("{{\"name\": \"{}\", \"arguments\": ", tool.name);
            Ok(format!(
                "{} {} {}",
                lit(&head),
                json_rule(&tool.parameters),
                lit("}")
            ))
        };
        Some(token_wrapped_calls(
            g,
            markers,
            plan,
            self.name(),
            call,
            |g, open, close| {
                repeated(
                    g,
                    &format!("{open} \"\\n\" call_body \"\\n\" {close}"),
                    Some("\"\\n\""),
                    plan,
                )
            },
        ))
    }
    #[cfg(any(test, feature = "testutil"))]
    fn render(&self, s: &crate::testutil::Sample) -> Option<(ParseStart, String)> {
        let mut t = crate::think::render(s.reasoning.as_deref(), "\n", "\n\n") + &s.content;
        for (i, (name, args)) in s.calls.iter().enumerate() {
            if i > 0 || !s.content.is_empty() {
                t.push('\n');
            }
            let args = crate::testutil::json_spaced(args);
            t += &format!("{TOOL_CALL}\n{{\"name\": \"{name}\", \"arguments\": {args}}}\n{END_TOOL_CALL}");
        }
        Some((ParseStart::Content, t))
    }
}

pub(crate) fn hermes_opens_call(rest: &str, partial: bool) -> Look {
    looks_like(rest, "{", partial)
}

pub(crate) const TOOL_CALL: &str = "<tool_call>";

pub(crate) const END_TOOL_CALL: &str = "</tool_call>";

/// The wrappers models write around JSON calls instead of `<tool_call>`, with their closers.
///
/// A Markdown fence is not one: models fence examples they explain as often as calls they make,
/// so a fenced block is read as a call only where the whole answer is the fence, after at most one
/// short lead-in line ([`crate::bare`]), never in the middle of prose.
pub(crate) const WRAPPERS: [(&str, &str); 6] = [
    (FUNCTION_CALL, "</function_call>"),
    (TOOLS, "</tools>"),
    ("<response>", "</response>"),
    ("<json>", "</json>"),
    ("<xml>", "</xml>"),
    ("<JSON>", "</JSON>"),
];
/// `<function_call>`, a wrapper Qwen models write too.
pub(crate) const FUNCTION_CALL: &str = "<function_call>";
/// `<tools>`, a wrapper Qwen models write too.
pub(crate) const TOOLS: &str = "<tools>";

/// Openers of a hermes call: `<tool_call>`, the wrappers, and the XML formats' function openers.
pub(crate) const HERMES_OPENERS: &[&str] = &[
    TOOL_CALL,
    WRAPPERS[0].0,
    WRAPPERS[1].0,
    WRAPPERS[2].0,
    WRAPPERS[3].0,
    WRAPPERS[4].0,
    WRAPPERS[5].0,
    FUNCTION_EQ,
    M_FUNCTION,
];

pub(crate) fn hermes(out: &mut Out, text: &str, mut pos: usize) {
    if bare_answer(out, text, pos) {
        return;
    }
    let openers: &[&str] = if out.has_tools() { HERMES_OPENERS } else { &[] };
    loop {
        let Some((i, op)) = find_first(text, pos, openers) else {
            return out.content_tail(text, pos, openers);
        };
        out.content.push_str(&text[pos..i]);
        match hermes_region(out, text, i, op) {
            Region::Done(next) => pos = next,
            Region::NotCall => {
                out.content.push_str(op);
                pos = i + op.len();
            }
            Region::Stop => return,
        }
    }
}

/// Whether `op` is one of the [`WRAPPERS`] models write instead of the format's markup.
fn is_wrapper(op: &str) -> bool {
    WRAPPERS.iter().any(|(open, _)| *open == op)
}

/// The closer of an opener in [`HERMES_OPENERS`].
pub(crate) fn closer_of(op: &str) -> &'static str {
    if op == TOOL_CALL {
        return END_TOOL_CALL;
    }
    WRAPPERS
        .iter()
        .find(|(open, _)| *open == op)
        .map_or(END_FUNCTION, |(_, close)| close)
}

/// One wrapper of JSON call objects (or `<function=NAME>{args}</function>`).
pub(crate) fn hermes_region(out: &mut Out, text: &str, i: usize, op: &str) -> Region {
    let closer = closer_of(op);
    let mut body = i + op.len();
    let mut fixed_name = None;
    if op == FUNCTION_EQ || op == M_FUNCTION {
        let stop = if op == FUNCTION_EQ { ">" } else { "\"" };
        let Some(n) = text[body..].find(stop) else {
            return if out.partial {
                Region::Stop
            } else {
                Region::NotCall
            };
        };
        let name = text[body..body + n].trim();
        if !is_name(name) || !out.offers(name) {
            return Region::NotCall;
        }
        fixed_name = Some(name.to_string());
        body += n + stop.len();
        if op != FUNCTION_EQ {
            match text[body..].find('>') {
                Some(g) if text[body..body + g].trim().is_empty() => body += g + 1,
                Some(_) => return Region::NotCall,
                None => {
                    return if out.partial {
                        Region::Stop
                    } else {
                        Region::NotCall
                    }
                }
            }
        }
    }
    let (end, next, closed) = match text[body..].find(closer) {
        Some(n) => (body + n, body + n + closer.len(), true),
        // Unfinished: trailing space and what may be the start of the closer are not the body's
        // yet (the closed reading drops them), so a partial call never shows more than it keeps.
        None if out.partial => {
            let open = &text[body..];
            let open = open[..open.len() - held_suffix(open, &[closer])].trim_end();
            (body + open.len(), text.len(), false)
        }
        None => (text.len(), text.len(), false),
    };
    let region = &text[..end];
    let mut found = 0;
    let mut k = body;
    while let Some(o) = region[k..].find('{') {
        let o = k + o;
        let obj = if let Some(name) = &fixed_name {
            let args = match json_end(region, o, !out.partial || closed) {
                Some(e) => Some(region[o..e].to_string()),
                None => {
                    // Unfinished: hold back what may be the start of the closer.
                    let r = &region[o..];
                    let held = if closed { 0 } else { held_suffix(r, &[closer]) };
                    Some(r[..r.len() - held].trim_end().to_string())
                }
            };
            let end = json_end(region, o, false);
            CallObject {
                name: Some(name.clone()),
                args,
                end,
            }
        } else {
            scan_call_object(region, o, !out.partial || closed)
        };
        if let Some(name) = obj.name.filter(|n| out.offers(n)) {
            let args = obj.args.unwrap_or_else(|| {
                if out.partial && !closed {
                    String::new()
                } else {
                    "{}".into()
                }
            });
            out.calls.push((name, args));
            found += 1;
        }
        match obj.end {
            Some(e) if fixed_name.is_none() => k = e,
            _ => break,
        }
    }
    if found > 0 {
        if !closed && out.partial {
            Region::Stop
        } else {
            Region::Done(next)
        }
    } else if !closed && out.partial && !(out.cut && is_wrapper(op)) {
        // Held while a call may still follow. A wrapper (not the format's own markup) cut
        // before it held any call never became one: like a bare call begun and cut, it is the
        // content it was written as, so a reply cut by `max_tokens` is not lost.
        Region::Stop
    } else if let (Some(name), true) = (fixed_name, closed) {
        // `<function=NAME></function>`: a call without arguments.
        out.calls.push((name, "{}".into()));
        Region::Done(next)
    } else {
        Region::NotCall
    }
}

#[cfg(test)]
mod tests {
    use crate::format::ChatFormat::*;
    use crate::format::ParseStart as S;
    use crate::testutil::{openai_message as msg, parse_openai as run};

    #[test]
    fn hermes_reasoning_content_and_call() {
        let out = "<think>\nIt is Paris.\n</think>\n\nLet me check.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"location\": \"Paris\"}}\n</tool_call>";
        assert_eq!(
            run(HermesJson, S::Content, out, true),
            msg(
                Some("It is Paris."),
                Some("Let me check."),
                &[("get_weather", r#"{"location": "Paris"}"#)]
            )
        );
    }

    #[test]
    fn hermes_only_calls_have_null_content_and_several_calls_parse() {
        let out = "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {}}\n</tool_call>\n<tool_call>\n{\"name\": \"get_time\", \"arguments\": {\"tz\": \"CET\"}}\n</tool_call>";
        assert_eq!(
            run(HermesJson, S::Content, out, true),
            msg(
                None,
                None,
                &[("get_weather", "{}"), ("get_time", r#"{"tz": "CET"}"#)]
            )
        );
    }

    #[test]
    fn hermes_missing_close_runs_to_the_end() {
        let out = "<tool_call>\n{\"name\": \"get_time\", \"arguments\": {\"tz\": \"CET\"}}";
        assert_eq!(
            run(HermesJson, S::Content, out, true),
            msg(None, None, &[("get_time", r#"{"tz": "CET"}"#)])
        );
    }

    #[test]
    fn hermes_tolerates_stray_text_and_an_extra_marker() {
        let out = "<tool_call>\n<tool_call>\n{\"name\": \"get_time\", \"arguments\": {\"tz\": \"}\"}, oops}\n</tool_call>";
        assert_eq!(
            run(HermesJson, S::Content, out, true),
            msg(None, None, &[("get_time", r#"{"tz": "}"}"#)])
        );
    }

    #[test]
    fn hermes_accepts_alternative_wrappers() {
        for (open, close) in [
            ("<function_call>", "</function_call>"),
            ("<tools>", "</tools>"),
            ("<json>", "</json>"),
            ("```json\n", "\n```"),
        ] {
            let out = format!("{open}{{\"name\": \"get_time\", \"arguments\": {{\"tz\": \"CET\"}}}}{close}");
            assert_eq!(
                run(HermesJson, S::Content, &out, true),
                msg(None, None, &[("get_time", r#"{"tz": "CET"}"#)]),
                "{open}"
            );
        }
        let out = "<function=get_time>{\"tz\": \"CET\"}</function>";
        assert_eq!(
            run(HermesJson, S::Content, out, true),
            msg(None, None, &[("get_time", r#"{"tz": "CET"}"#)])
        );
        let out = "<function name=\"get_time\">{\"tz\": \"CET\"}</function>";
        assert_eq!(
            run(HermesJson, S::Content, out, true),
            msg(None, None, &[("get_time", r#"{"tz": "CET"}"#)])
        );
    }

    #[test]
    fn a_wrapper_cut_before_any_call_is_named_is_content_not_lost() {
        // Found end to end (Qwen2.5-Coder, `max_tokens` 14): the reply was held back while the
        // wrapper might still hold a call, then dropped when the output was cut, so the client
        // got an empty message for 14 generated tokens.
        let t = crate::testutil::tools();
        for text in [
            "<tools>\n{\"type\": \"function\", \"function\": {\"name",
            "<function_call>\n{\"na",
            "```json\n{\"type\": \"function\"",
        ] {
            let m = crate::parse::parse_cut(HermesJson, S::Content, text, Some(&t));
            assert!(m.tool_calls.is_empty(), "{text:?}: {m:?}");
            assert_eq!(m.content.as_deref(), Some(text), "{text:?}");
        }
        // A call whose name was read is still a call, cut or not.
        let text = "<tools>\n{\"name\": \"get_time\", \"arguments\": {\"tz\": \"CE";
        let m = crate::parse::parse_cut(HermesJson, S::Content, text, Some(&t));
        assert_eq!(m.tool_calls.len(), 1, "{m:?}");
    }

    #[test]
    fn a_partial_wrapped_call_never_shows_what_the_closed_one_drops() {
        // Found by fuzzing: a malformed call in a wrapper (then a ```json fence) showed the
        // closer's start in its partial arguments, then lost it when the wrapper closed. Every
        // prefix must be a prefix of the next.
        let t = crate::testutil::tools();
        for out in [
            "Sure.\n<tools>\n[{\"name\": \"get_time\", \"arguments\": {\"tz\": \"CET\", x}]\n</tools>",
            "Sure.\n```json\n[{\"name\": \"get_time\", \"arguments\": {\"tz\": \"CET\", x}]\n```",
            "<tool_call>{\"name\": \"get_time\", \"arguments\": {\"tz\": \"CET\" oops \n</tool_call>",
        ] {
            let mut prev: Vec<String> = Vec::new();
            for cut in (0..=out.len()).filter(|&c| out.is_char_boundary(c)) {
                let m = crate::parse::parse(HermesJson, S::Content, &out[..cut], Some(&t), cut < out.len());
                let args: Vec<String> = m.tool_calls.iter().map(|c| c.arguments.clone()).collect();
                for (a, b) in prev.iter().zip(&args) {
                    assert!(b.starts_with(a.as_str()), "{out:?} cut {cut}: {a:?} then {b:?}");
                }
                prev = args;
            }
        }
    }

    #[test]
    fn hermes_arguments_as_a_json_string_are_decoded() {
        let out = r#"<tool_call>{"name": "get_time", "arguments": "{\"tz\": \"CET\"}"}</tool_call>"#;
        assert_eq!(
            run(HermesJson, S::Content, out, true),
            msg(None, None, &[("get_time", r#"{"tz": "CET"}"#)])
        );
    }

    #[test]
    fn hermes_call_inside_unclosed_think_ends_the_reasoning() {
        let out = "I should call it.\n<tool_call>\n{\"name\": \"get_time\", \"arguments\": {}}\n</tool_call>";
        assert_eq!(
            run(HermesJson, S::Reasoning, out, true),
            msg(Some("I should call it."), None, &[("get_time", "{}")])
        );
    }
}
