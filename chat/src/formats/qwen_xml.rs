//! qwen_xml: `<tool_call>\n<function=NAME>\n<parameter=K>\nV\n</parameter>\n</function>\n</tool_call>`
//! (Qwen3.5, Qwen3-Coder), values typed by the tools' schemas; JSON calls inside `<tool_call>`
//! and calls written without markup are read too.

use serde_json::Value;

use crate::bare::bare_answer;
use crate::format::{ChatFormat, ParseStart};
use crate::formats::hermes_json::{hermes_region, END_TOOL_CALL, FUNCTION_CALL, TOOLS, TOOL_CALL};
use crate::formats::{Format, MarkerNames};
use crate::grammar::{
    json_rule, lit, params_in_order, repeated, string_enum, token_wrapped_calls, Lark, Markers, Plan,
};
use crate::request::{ParamError, ToolSpec};
use crate::scan::*;
use crate::schema::typed_value;
use crate::think::think_block;
use crate::values;

/// qwen_xml.
pub(crate) struct QwenXml;

impl Format for QwenXml {
    fn id(&self) -> ChatFormat {
        ChatFormat::QwenXml
    }
    fn name(&self) -> &'static str {
        "qwen_xml"
    }
    fn in_template(&self, template: &str) -> bool {
        [TOOL_CALL, FUNCTION_EQ, PARAMETER_EQ]
            .iter()
            .all(|m| template.contains(m))
    }
    fn parse(&self, out: &mut Out, text: &str, start: ParseStart) {
        if let Some(pos) = think_block(out, text, start, Some(xml_opens_call)) {
            qwen_xml(out, text, pos);
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
        let call = |g: &mut Lark, i, tool: &ToolSpec| {
            let head = lit(&format!("\n{FUNCTION_EQ}{}>\n", tool.name));
            let params = xml_params(g, i, &tool.parameters);
            Ok(format!("{head} {params} {}", lit(&format!("{END_FUNCTION}\n"))))
        };
        Some(token_wrapped_calls(
            g,
            markers,
            plan,
            self.name(),
            call,
            |g, open, close| repeated(g, &format!("{open} call_body {close}"), Some("\"\\n\""), plan),
        ))
    }
    #[cfg(any(test, feature = "testutil"))]
    fn render(&self, s: &crate::testutil::Sample) -> Option<(ParseStart, String)> {
        let mut t = crate::think::render(s.reasoning.as_deref(), "\n", "\n\n") + &s.content;
        for (i, (name, args)) in s.calls.iter().enumerate() {
            if i > 0 || !s.content.is_empty() {
                t.push('\n');
            }
            t += &format!("{TOOL_CALL}\n{FUNCTION_EQ}{name}>\n");
            for (k, v) in args.as_object()? {
                let v = v
                    .as_str()
                    .map_or_else(|| crate::testutil::json_spaced(v), str::to_string);
                t += &format!("{PARAMETER_EQ}{k}>\n{v}\n{END_PARAMETER}\n");
            }
            t += &format!("{END_FUNCTION}\n{END_TOOL_CALL}");
        }
        Some((ParseStart::Content, t))
    }
}

pub(crate) fn xml_opens_call(rest: &str, partial: bool) -> Look {
    match looks_like(rest, FUNCTION_EQ, partial) {
        Look::No => looks_like(rest, "{", partial),
        l => l,
    }
}

pub(crate) const FUNCTION_EQ: &str = "<function=";

pub(crate) const PARAMETER_EQ: &str = "<parameter=";

pub(crate) const END_PARAMETER: &str = "</parameter>";

pub(crate) const END_FUNCTION: &str = "</function>";

/// Wrappers of JSON calls that Qwen models write instead of `<tool_call>`.
pub(crate) const QWEN_JSON_WRAPPERS: [&str; 2] = [FUNCTION_CALL, TOOLS];

pub(crate) fn qwen_xml(out: &mut Out, text: &str, mut pos: usize) {
    if bare_answer(out, text, pos) {
        return;
    }
    // Without `<tool_call>`, `<function=NAME>` opens a call only for a declared name.
    let bare: Vec<String> = out.names.iter().map(|n| format!("{FUNCTION_EQ}{n}>")).collect();
    let mut openers: Vec<&str> = Vec::new();
    if out.has_tools() {
        openers.push(TOOL_CALL);
        openers.extend(QWEN_JSON_WRAPPERS);
        openers.extend(bare.iter().map(String::as_str));
    }
    let mut held = openers.clone();
    if out.has_tools() {
        held.push(END_TOOL_CALL);
    }
    loop {
        let Some((i, op)) = find_first(text, pos, &openers) else {
            return out.content_tail(text, pos, &held);
        };
        out.content.push_str(&text[pos..i]);
        let region = if op == TOOL_CALL {
            let j = skip_ws(text, i + TOOL_CALL.len());
            match xml_opens_call(&text[i + TOOL_CALL.len()..], out.partial) {
                Look::Yes if text[j..].starts_with('{') => hermes_region(out, text, i, TOOL_CALL),
                Look::Yes => xml_call(out, text, j),
                Look::Maybe => Region::Stop,
                Look::No => Region::NotCall,
            }
        } else if QWEN_JSON_WRAPPERS.contains(&op) {
            hermes_region(out, text, i, op)
        } else {
            xml_call(out, text, i)
        };
        match region {
            Region::Done(next) => {
                // A closing `</tool_call>` (absent when the opener was omitted).
                let j = skip_ws(text, next);
                pos = if text[j..].starts_with(END_TOOL_CALL) {
                    j + END_TOOL_CALL.len()
                } else {
                    next
                };
            }
            Region::NotCall => {
                out.content.push_str(op);
                pos = i + op.len();
            }
            Region::Stop => return,
        }
    }
}

/// `<function=NAME>` at `f`, its parameters, up to `</function>`.
pub(crate) fn xml_call(out: &mut Out, text: &str, f: usize) -> Region {
    if !text[f..].starts_with(FUNCTION_EQ) {
        return Region::NotCall;
    }
    let name_start = f + FUNCTION_EQ.len();
    let Some(n) = text[name_start..].find('>') else {
        return if out.partial {
            Region::Stop
        } else {
            Region::NotCall
        };
    };
    let name = text[name_start..name_start + n].trim().to_string();
    if !is_name(&name) || !out.offers(&name) {
        return Region::NotCall;
    }
    let mut pairs = Vec::new();
    let mut p = name_start + n + 1;
    let mut end = None;
    loop {
        p = skip_ws(text, p);
        let rest = &text[p..];
        if rest.starts_with(PARAMETER_EQ) {
            let k = p + PARAMETER_EQ.len();
            let Some(kn) = text[k..].find('>') else {
                break;
            };
            let key = text[k..k + kn].trim().to_string();
            let vs = k + kn + 1;
            let vs = if text[vs..].starts_with('\n') { vs + 1 } else { vs };
            let Some((ve, next)) = xml_value_end(text, vs, out.partial) else {
                break;
            };
            let raw = &text[vs..ve];
            let raw = raw.strip_suffix('\n').unwrap_or(raw);
            pairs.push((key.clone(), typed_value(out.tools, &name, &key, raw)));
            p = next;
        } else if rest.starts_with(END_FUNCTION) {
            end = Some(p + END_FUNCTION.len());
            break;
        } else if rest.starts_with(END_TOOL_CALL) {
            end = Some(p);
            break;
        } else if rest.is_empty()
            || (out.partial
                && [PARAMETER_EQ, END_FUNCTION, END_TOOL_CALL]
                    .iter()
                    .any(|m| m.starts_with(rest)))
        {
            break;
        } else {
            // Text that is no parameter ends the call; it is content.
            end = Some(p);
            break;
        }
    }
    let open = out.partial && end.is_none();
    out.calls.push((name, values::args_json(&pairs, open)));
    match end {
        Some(e) => Region::Done(e),
        None if out.partial => Region::Stop,
        None => Region::Done(text.len()),
    }
}

/// Where a parameter value starting at `vs` ends, and where scanning resumes: at
/// `</parameter>`, else at the next `<parameter=`, else at a `</function>` that really ends the
/// call (only whitespace and `</tool_call>` or the end after it). Markers after a `</function>`
/// that really ends the call belong to what follows it (content, another call), so the value's
/// own are looked for only before it: otherwise a `<parameter=` written later would pull the
/// call's end, and the text after it, into the value as the stream grows.
pub(crate) fn xml_value_end(text: &str, vs: usize, partial: bool) -> Option<(usize, usize)> {
    let call_end = call_end(text, vs, partial);
    let scope = &text[vs..call_end.unwrap_or(text.len())];
    let close = scope.find(END_PARAMETER).map(|n| vs + n);
    let next = scope.find(PARAMETER_EQ).map(|n| vs + n);
    match (close, next) {
        (Some(c), n) if n.is_none_or(|n| c < n) => Some((c, c + END_PARAMETER.len())),
        (_, Some(n)) => Some((n, n)),
        _ => match call_end {
            Some(e) => Some((e, e)),
            None => (!partial).then_some((text.len(), text.len())),
        },
    }
}

/// The first `</function>` from `from` that really ends the call: `</tool_call>` after it, or
/// (the whole text) nothing.
fn call_end(text: &str, mut from: usize, partial: bool) -> Option<usize> {
    while let Some(n) = text[from..].find(END_FUNCTION) {
        let e = from + n;
        let after = text[e + END_FUNCTION.len()..].trim_start();
        if after.starts_with(END_TOOL_CALL) || (!partial && after.is_empty()) {
            return Some(e);
        }
        from = e + END_FUNCTION.len();
    }
    None
}

/// Qwen XML parameters: strings raw (up to the closing tag), every other type as JSON.
pub(crate) fn xml_params(g: &mut Lark, call: usize, schema: &Value) -> String {
    let close = lit(&format!("\n{END_PARAMETER}\n"));
    params_in_order(g, call, schema, |g, key, s, v| {
        let open = lit(&format!("{PARAMETER_EQ}{key}>\n"));
        if let Some(options) = string_enum(s) {
            // Raw text, as the template writes strings: one of the enum's values.
            let alts: Vec<String> = options.iter().map(|o| lit(o)).collect();
            g.rule(v, alts.join(" | "));
            format!("{open} {v} {close}")
        } else if s.get("type").and_then(Value::as_str) == Some("string") {
            // Lazy: the value ends at the first closing tag, which the rule includes.
            g.rule(&format!("{v}[suffix={close}]"), "/(?s:.*)/");
            format!("{open} {v}")
        } else {
            g.rule(v, json_rule(s));
            format!("{open} {v} {close}")
        }
    })
}

#[cfg(test)]
mod tests {
    use crate::format::ChatFormat::*;
    use crate::format::ParseStart as S;
    use crate::testutil::{openai_message as msg, parse_openai as run};

    #[test]
    fn a_parameter_marker_after_the_calls_end_is_content_whole_and_streamed() {
        // Found by fuzzing (fuzz/seeds/chat_parse_stream/qwen_xml_marker_after_call): the value of
        // `days` has no `</parameter>`; the call's `</function>` `</tool_call>` ends it, and the
        // `<parameter=` after that is content, not the next parameter of the closed call.
        let out = "<tool_call>\n<function=get_weather>\n<parameter=days>\n12\n</function>\n</tool_call>then\n<parameter=x>";
        assert_eq!(
            run(QwenXml, S::ReasoningClosed, out, true),
            msg(
                None,
                Some("then\n<parameter=x>"),
                &[("get_weather", r#"{"days":12}"#)]
            )
        );
        // Streamed one character at a time: no field shrinks and the deltas add up to the same.
        let pieces: Vec<String> = out.chars().map(String::from).collect();
        let pieces: Vec<&str> = pieces.iter().map(String::as_str).collect();
        crate::testutil::check_growing(
            QwenXml,
            S::ReasoningClosed,
            &pieces,
            Some(&crate::testutil::tools()),
        );
    }

    #[test]
    fn qwen_xml_parameters_are_typed_by_the_schema() {
        let out = "Checking.\n\n<tool_call>\n<function=get_weather>\n<parameter=location>\nParis\n</parameter>\n<parameter=days>\n3\n</parameter>\n<parameter=zip>\n17\n</parameter>\n<parameter=date>\n2025-01-02\n</parameter>\n<parameter=metric>\nTrue\n</parameter>\n<parameter=opts>\n{'a': None}\n</parameter>\n<parameter=ratio>\n2.0\n</parameter>\n<parameter=extra>\n5\n</parameter>\n</function>\n</tool_call>";
        assert_eq!(
            run(QwenXml, S::ReasoningClosed, out, true),
            msg(
                None,
                Some("Checking."),
                &[(
                    "get_weather",
                    r#"{"location":"Paris","days":3,"zip":"17","date":"2025-01-02","metric":true,"opts":{"a":null},"ratio":2,"extra":"5"}"#
                )]
            )
        );
    }

    #[test]
    fn qwen_xml_call_inside_reasoning_ends_it() {
        let out = "Need weather.\n<tool_call>\n<function=get_time>\n<parameter=tz>\nCET\n</parameter>\n</function>\n</tool_call>";
        assert_eq!(
            run(QwenXml, S::Reasoning, out, true),
            msg(Some("Need weather."), None, &[("get_time", r#"{"tz":"CET"}"#)])
        );
    }

    #[test]
    fn qwen_xml_tolerates_missing_markers() {
        // No `<tool_call>` (declared name only), no `</parameter>`, no `</tool_call>`.
        let out = "<function=get_weather>\n<parameter=location>\nParis\n<parameter=days>\n2\n</function>";
        assert_eq!(
            run(QwenXml, S::Content, out, true),
            msg(None, None, &[("get_weather", r#"{"location":"Paris","days":2}"#)])
        );
        let out = "#include <functional>\n<function=unknown>";
        assert_eq!(run(QwenXml, S::Content, out, true), msg(None, Some(out), &[]));
        // A literal `</function>` inside a value.
        let out = "<tool_call>\n<function=get_time>\n<parameter=tz>\na</function>b\n</parameter>\n</function>\n</tool_call>";
        assert_eq!(
            run(QwenXml, S::Content, out, true),
            msg(None, None, &[("get_time", r#"{"tz":"a</function>b"}"#)])
        );
        // An unclosed call at the end.
        let out = "<tool_call>\n<function=get_time>\n<parameter=tz>\nCET";
        assert_eq!(
            run(QwenXml, S::Content, out, true),
            msg(None, None, &[("get_time", r#"{"tz":"CET"}"#)])
        );
    }
}
