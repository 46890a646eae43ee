//! lfm2_pythonic: `<|tool_call_start|>[f(a=1), g(b="x")]<|tool_call_end|>` (LFM2, LFM2.5), Python
//! calls (or a JSON list) typed by the tools' schemas.

use crate::format::{ChatFormat, ParseStart};
use crate::formats::{Format, MarkerNames};
use crate::grammar::{json_rule, kwargs, lit, token_wrapped_calls, Lark, Markers, Plan};
use crate::json_scan::*;
use crate::request::{ParamError, ToolSpec};
use crate::scan::*;
use crate::schema::schema_typed_pairs;
use crate::think::think_block;
use crate::values::{self, Dialect};

/// The tool list's markers in LFM2's templates.
const TOOL_LIST: (&str, &str) = ("<|tool_list_start|>", "<|tool_list_end|>");
/// LFM2.5's plain-text tool list.
const TOOL_LIST_TEXT: &str = "List of tools: [";

/// lfm2_pythonic.
pub(crate) struct Lfm2Pythonic;

impl Format for Lfm2Pythonic {
    fn id(&self) -> ChatFormat {
        ChatFormat::Lfm2Pythonic
    }
    fn name(&self) -> &'static str {
        "lfm2_pythonic"
    }
    fn in_template(&self, template: &str) -> bool {
        (template.contains(TOOL_LIST.0) && template.contains(TOOL_LIST.1))
            || template.contains(TOOL_LIST_TEXT)
            || template.contains(L_START)
    }
    fn in_vocab(&self, has_token: &dyn Fn(&str) -> bool) -> bool {
        has_token(L_START)
    }
    fn parse(&self, out: &mut Out, text: &str, start: ParseStart) {
        if let Some(pos) = think_block(out, text, start, None) {
            lfm2(out, text, pos);
        }
    }
    fn markers(&self) -> MarkerNames {
        MarkerNames {
            tool: Some((L_START, L_END)),
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
            let args = kwargs(g, i, &tool.parameters, ", ", |g, key, schema, j| {
                let v = format!("v_{i}_{j}");
                g.rule(&v, json_rule(schema));
                format!("{} {v}", lit(&format!("{key}=")))
            });
            Ok(format!("{} {args} {}", lit(&format!("{}(", tool.name)), lit(")")))
        };
        // One list of calls: `[f(..), g(..)]`.
        Some(token_wrapped_calls(
            g,
            markers,
            plan,
            self.name(),
            call,
            |g, open, close| {
                let list = if plan.parallel {
                    "call_body (\", \" call_body)*"
                } else {
                    "call_body"
                };
                g.rule("call", format!("{open} \"[\" {list} \"]\" {close}"));
                "call".into()
            },
        ))
    }
    #[cfg(any(test, feature = "testutil"))]
    fn render(&self, s: &crate::testutil::Sample) -> Option<(ParseStart, String)> {
        let mut t = crate::think::render(s.reasoning.as_deref(), "", "\n") + &s.content;
        if !s.calls.is_empty() {
            let calls: Vec<String> = s
                .calls
                .iter()
                .map(|(name, args)| {
                    let kw: Vec<String> = args
                        .as_object()
                        .into_iter()
                        .flatten()
                        .map(|(k, v)| format!("{k}={}", crate::testutil::json_spaced(v)))
                        .collect();
                    format!("{name}({})", kw.join(", "))
                })
                .collect();
            t += &format!("{L_START}[{}]{L_END}", calls.join(", "));
        }
        Some((ParseStart::Content, t))
    }
}

pub(crate) const L_START: &str = "<|tool_call_start|>";

pub(crate) const L_END: &str = "<|tool_call_end|>";

pub(crate) fn lfm2(out: &mut Out, text: &str, mut pos: usize) {
    let markers: &[&str] = if out.has_tools() { &[L_START, L_END] } else { &[] };
    loop {
        let Some((i, m)) = find_first(text, pos, markers) else {
            return out.content_tail(text, pos, markers);
        };
        out.content.push_str(&text[pos..i]);
        if m == L_END {
            pos = i + L_END.len(); // a stray end marker
            continue;
        }
        match lfm2_calls(out, text, i + L_START.len()) {
            Region::Done(next) => match strip_echo(text, next, out.partial) {
                Some(p) => pos = p,
                None => return,
            },
            Region::NotCall => {
                out.content.push_str(m);
                pos = i + m.len();
            }
            Region::Stop => return,
        }
    }
}

/// LFM2 often repeats the call list after `<|tool_call_end|>`, capped by a second end marker:
/// drop it, up to the last end marker before the next call list (or the end of the output).
/// `None` while a possible echo (text opening with `[`) is still unresolved, which a partial
/// output stays until a next call list starts: a later end marker would take the echo further,
/// and with it text an earlier partial parse had given as content.
pub(crate) fn strip_echo(text: &str, from: usize, partial: bool) -> Option<usize> {
    let rest = &text[from..];
    if !rest.trim_start().starts_with('[') {
        return Some(from);
    }
    let next = rest.find(L_START);
    if partial && next.is_none() {
        return None;
    }
    let limit = next.unwrap_or(rest.len());
    match rest[..limit].rfind(L_END) {
        Some(e) => Some(from + e + L_END.len()),
        None if partial => None,
        None => Some(from),
    }
}

/// A Python (or JSON) list of calls after `<|tool_call_start|>`.
pub(crate) fn lfm2_calls(out: &mut Out, text: &str, b: usize) -> Region {
    let bytes = text.as_bytes();
    let mut k = skip_ws(text, b);
    let listed = bytes.get(k) == Some(&b'[');
    if listed {
        k = skip_ws(text, k + 1);
    }
    let first = out.calls.len();
    let mut invalid = false;
    let mut closed = None;
    loop {
        match bytes.get(k) {
            None => break,
            Some(b']') if listed => {
                closed = Some(k + 1);
                break;
            }
            Some(b'{') => {
                let obj = scan_call_object(text, k, !out.partial);
                if let Some(name) = obj.name {
                    let done = obj.end.is_some();
                    let args = obj.args.unwrap_or_default();
                    let args = if args.is_empty() && (done || !out.partial) {
                        "{}".into()
                    } else {
                        args
                    };
                    out.calls.push((name, args));
                }
                match obj.end {
                    Some(e) => k = e,
                    None => break,
                }
            }
            Some(_) => {
                let rest = &text[k..];
                let n = rest
                    .find(|c: char| !(c.is_alphanumeric() || c == '_' || c == '.' || c == '-'))
                    .unwrap_or(rest.len());
                match bytes.get(k + n) {
                    None => break,
                    Some(b'(') if n > 0 => {}
                    _ => {
                        invalid = true;
                        break;
                    }
                }
                let kw = values::read_kwargs(text, k + n + 1, b'=', b')', Dialect::Python, !out.partial);
                let open = out.partial && kw.closed_at.is_none();
                let pairs = schema_typed_pairs(out.tools, &rest[..n], text, &kw);
                out.calls
                    .push((rest[..n].to_string(), values::args_json(&pairs, open)));
                match kw.closed_at {
                    Some(e) => k = e,
                    None => {
                        invalid = kw.invalid;
                        break;
                    }
                }
            }
        }
        k = skip_ws(text, k);
        match bytes.get(k) {
            Some(b',') => k = skip_ws(text, k + 1),
            Some(b']') if listed => {}
            None => break,
            Some(_) if !listed => {
                closed = Some(k);
                break;
            }
            Some(_) => {
                invalid = true;
                break;
            }
        }
    }
    let found = out.calls.len() > first;
    let from = closed.unwrap_or(k);
    let end_marker = text[from..].find(L_END).map(|n| from + n);
    if let Some(c) = closed {
        let j = skip_ws(text, c);
        if text[j..].starts_with(L_END) {
            return Region::Done(j + L_END.len());
        }
        if out.partial && L_END.starts_with(&text[j..]) {
            return Region::Stop;
        }
        return if found || listed {
            Region::Done(c)
        } else {
            Region::NotCall
        };
    }
    if invalid {
        // A broken list: keep the calls read, drop the rest of it.
        return match end_marker {
            Some(e) if found || listed => Region::Done(e + L_END.len()),
            None if out.partial => Region::Stop,
            _ if found => Region::Done(text.len()),
            _ => Region::NotCall,
        };
    }
    // The text ended inside the list.
    if out.partial {
        Region::Stop
    } else if found {
        Region::Done(text.len())
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
    fn lfm2_python_calls_become_json() {
        let out = "<|tool_call_start|>[get_weather(location=\"Paris\", days=3, metric=True), get_time(tz='CET')]<|tool_call_end|>Checking.";
        assert_eq!(
            run(Lfm2Pythonic, S::Content, out, true),
            msg(
                None,
                Some("Checking."),
                &[
                    ("get_weather", r#"{"location":"Paris","days":3,"metric":true}"#),
                    ("get_time", r#"{"tz":"CET"}"#)
                ]
            )
        );
    }

    #[test]
    fn lfm2_tolerates_irregular_forms() {
        // The echo after the end marker, capped by a second end marker.
        let out = "<|tool_call_start|>[get_time(tz='CET')]<|tool_call_end|>[get_time(tz='CET')]<|tool_call_end|>Done.";
        assert_eq!(
            run(Lfm2Pythonic, S::Content, out, true),
            msg(None, Some("Done."), &[("get_time", r#"{"tz":"CET"}"#)])
        );
        // Missing end marker; leading zeros; a keyword as name; inner quotes.
        let out = "<|tool_call_start|>[get_weather(month=07, from=1, command='sed -n '1,9p' f.py')]";
        assert_eq!(
            run(Lfm2Pythonic, S::Content, out, true),
            msg(
                None,
                None,
                &[(
                    "get_weather",
                    r#"{"month":7,"from":1,"command":"sed -n '1,9p' f.py"}"#
                )]
            )
        );
        // The JSON list form; an empty list reports no calls.
        let out = "<|tool_call_start|>[{\"name\": \"get_time\", \"arguments\": {\"tz\": \"CET\"}}]<|tool_call_end|>";
        assert_eq!(
            run(Lfm2Pythonic, S::Content, out, true),
            msg(None, None, &[("get_time", r#"{"tz": "CET"}"#)])
        );
        let out = "<|tool_call_start|>[]<|tool_call_end|>Nothing to call.";
        assert_eq!(
            run(Lfm2Pythonic, S::Content, out, true),
            msg(None, Some("Nothing to call."), &[])
        );
        let out = "<think>plan</think>Ok";
        assert_eq!(
            run(Lfm2Pythonic, S::Content, out, true),
            msg(Some("plan"), Some("Ok"), &[])
        );
    }

    #[test]
    fn text_after_an_echo_waits_for_the_next_call_list_or_the_end() {
        // The echo reaches the last end marker: "z" is part of it once the third marker comes,
        // so a partial parse must not give it as content before (the chat_parse_stream fuzzer
        // found content that shrank here).
        let t = crate::testutil::tools();
        let content = |text: &str, partial: bool| {
            crate::parse::parse(Lfm2Pythonic, S::Content, text, Some(&t[..]), partial).content
        };
        let start = "k <|tool_call_start|>[<|tool_call_end|>[<|tool_call_end|>z";
        assert_eq!(content(start, true).as_deref(), Some("k"));
        let whole = format!("{start}<|tool_call_end|>");
        assert_eq!(content(&whole, true).as_deref(), Some("k"));
        assert_eq!(content(&whole, false).as_deref(), Some("k"));
        // A next call list settles where the echo ends.
        let next = format!("{start}<|tool_call_start|>[get_time(tz='CET')]<|tool_call_end|>");
        assert_eq!(content(&next, true).as_deref(), Some("k z"));
        assert_eq!(content(&next, false).as_deref(), Some("k z"));
    }
}
