//! minicpm_xml: `<function name="NAME"><param name="K">V</param></function>` (MiniCPM5), values
//! plain or in CDATA blocks, typed by the tools' schemas. The markup is plain text, not special
//! tokens: the grammar keeps free text from opening a call instead of banning a token.

use serde_json::Value;

use crate::format::{ChatFormat, ParseStart};
use crate::formats::qwen_xml::END_FUNCTION;
use crate::formats::Format;
use crate::grammar::{
    call_alternatives, json_rule, lit, params_in_order, repeated, string_enum, Lark, Markers, Plan,
};
use crate::request::ParamError;
use crate::scan::*;
use crate::schema::typed_value;
use crate::think::think_block;
use crate::values;

/// minicpm_xml.
pub(crate) struct MiniCpmXml;

/// The template's tool instructions, which name the markup.
const GUIDELINES: &str = "Tool usage guidelines:";

impl Format for MiniCpmXml {
    fn id(&self) -> ChatFormat {
        ChatFormat::MiniCpmXml
    }
    fn name(&self) -> &'static str {
        "minicpm_xml"
    }
    fn in_template(&self, template: &str) -> bool {
        [GUIDELINES, M_FUNCTION, M_PARAM]
            .iter()
            .all(|m| template.contains(m))
    }
    fn parse(&self, out: &mut Out, text: &str, start: ParseStart) {
        if let Some(pos) = think_block(out, text, start, None) {
            minicpm(out, text, pos);
        }
    }
    fn call_grammar(
        &self,
        g: &mut Lark,
        _markers: &Markers,
        plan: &Plan,
    ) -> Option<Result<String, ParamError>> {
        Some(
            call_alternatives(g, plan, |g, i, tool| {
                let params = minicpm_params(g, i, &tool.parameters);
                Ok(format!(
                    "{} {params} {}",
                    lit(&format!("{}\">", tool.name)),
                    lit(END_FUNCTION)
                ))
            })
            .map(|()| {
                repeated(
                    g,
                    &format!("{} call_body", lit(M_FUNCTION)),
                    Some("\"\\n\""),
                    plan,
                )
            }),
        )
    }
    /// Text without the opener.
    fn text_grammar(&self, g: &mut Lark) -> String {
        g.rule("TEXT_NO_CALL", format!("~/(?s:.*{M_FUNCTION}.*)/"));
        "TEXT_NO_CALL".into()
    }
    /// Text that holds no opener, or that ends lazily at the first opener (with it), then calls.
    fn text_then_calls(&self, g: &mut Lark, _calls: &str, plan: &Plan) -> String {
        g.rule(&format!("lead_text[suffix={}]", lit(M_FUNCTION)), "/(?s:.*)/");
        // As in `repeated`: the turn may end after the newline that follows any call.
        let more = if plan.parallel {
            " (\"\\n\" call)* \"\\n\"?"
        } else {
            ""
        };
        let text = self.text_grammar(g);
        format!("({text} | lead_text call_body{more})")
    }
    #[cfg(any(test, feature = "testutil"))]
    fn render(&self, s: &crate::testutil::Sample) -> Option<(ParseStart, String)> {
        let mut t = crate::think::render(s.reasoning.as_deref(), "\n", "\n\n") + &s.content;
        for (i, (name, args)) in s.calls.iter().enumerate() {
            if i > 0 || !s.content.is_empty() {
                t.push('\n');
            }
            t += &format!("{M_FUNCTION}{name}\">");
            for (k, v) in args.as_object()? {
                let v = match v.as_str() {
                    Some(s) if s.contains(['<', '&', '\n']) => format!("{M_CDATA}{s}{M_END_CDATA}"),
                    Some(s) => s.to_string(),
                    None => crate::testutil::json_spaced(v),
                };
                t += &format!("{M_PARAM}{k}\">{v}{M_END_PARAM}");
            }
            t += END_FUNCTION;
        }
        Some((ParseStart::Content, t))
    }
}

pub(crate) const M_FUNCTION: &str = "<function name=\"";

pub(crate) const M_PARAM: &str = "<param name=\"";

pub(crate) const M_END_PARAM: &str = "</param>";

pub(crate) const M_CDATA: &str = "<![CDATA[";

pub(crate) const M_END_CDATA: &str = "]]>";

/// MiniCPM5: calls are `<function name="N"><param name="K">V</param></function>` anywhere in the
/// answer; text around them is content.
pub(crate) fn minicpm(out: &mut Out, text: &str, mut pos: usize) {
    if !out.has_tools() {
        return out.content_tail(text, pos, &[]);
    }
    loop {
        let Some((i, _)) = find_first(text, pos, &[M_FUNCTION]) else {
            return out.content_tail(text, pos, &[M_FUNCTION]);
        };
        out.content.push_str(&text[pos..i]);
        match minicpm_call(out, text, i) {
            Region::Done(next) => pos = next,
            Region::NotCall => {
                out.content.push_str(M_FUNCTION);
                pos = i + M_FUNCTION.len();
            }
            Region::Stop => return,
        }
    }
}

/// `<function name="N">` at `f`, its parameters, up to `</function>`.
pub(crate) fn minicpm_call(out: &mut Out, text: &str, f: usize) -> Region {
    let ns = f + M_FUNCTION.len();
    let Some(n) = text[ns..].find('"') else {
        let rest = &text[ns..];
        // The same bound as the finished name's (`is_name`), or a held name could turn to content
        // and back.
        return if out.partial && (rest.is_empty() || is_name(rest)) {
            Region::Stop
        } else {
            Region::NotCall
        };
    };
    let name = &text[ns..ns + n];
    let after = ns + n + 1;
    match text.as_bytes().get(after) {
        Some(b'>') if is_name(name) => {}
        None if out.partial && is_name(name) => return Region::Stop,
        _ => return Region::NotCall,
    }
    let mut pairs = Vec::new();
    let mut p = after + 1;
    let mut end = None;
    loop {
        let q = skip_ws(text, p);
        let rest = &text[q..];
        if rest.starts_with(M_PARAM) {
            let k = q + M_PARAM.len();
            let Some(kn) = text[k..].find("\">") else {
                break;
            };
            let key = text[k..k + kn].to_string();
            let Some((raw, next)) = minicpm_value(text, k + kn + 2, out.partial) else {
                break;
            };
            pairs.push((key.clone(), typed_value(out.tools, name, &key, &raw)));
            p = next;
        } else if rest.starts_with(END_FUNCTION) {
            end = Some(q + END_FUNCTION.len());
            break;
        } else if rest.is_empty()
            || (out.partial && [M_PARAM, END_FUNCTION].iter().any(|m| m.starts_with(rest)))
        {
            break;
        } else {
            // Text that is no parameter ends the call (its `</function>` is missing): content.
            end = Some(p);
            break;
        }
    }
    let open = out.partial && end.is_none();
    out.calls
        .push((name.to_string(), values::args_json(&pairs, open)));
    match end {
        Some(e) => Region::Done(e),
        None if out.partial => Region::Stop,
        None => Region::Done(text.len()),
    }
}

/// A parameter value from `vs`: a CDATA block or plain text, up to `</param>` (or, when that is
/// missing, the next `<param name="` or `</function>`). Returns the value and where scanning
/// resumes; `None` while the text so far ends inside it.
pub(crate) fn minicpm_value(text: &str, vs: usize, partial: bool) -> Option<(String, usize)> {
    if text[vs..].starts_with(M_CDATA) {
        let b = vs + M_CDATA.len();
        if let Some(n) = text[b..].find(M_END_CDATA) {
            let e = b + n + M_END_CDATA.len();
            let j = skip_ws(text, e);
            if text[j..].starts_with(M_END_PARAM) {
                return Some((text[b..b + n].to_string(), j + M_END_PARAM.len()));
            }
            if partial && M_END_PARAM.starts_with(&text[j..]) {
                return None;
            }
            return Some((text[b..b + n].to_string(), e));
        }
        return (!partial).then(|| (text[b..].to_string(), text.len()));
    }
    if partial && M_CDATA.starts_with(&text[vs..]) {
        return None;
    }
    let close = text[vs..].find(M_END_PARAM).map(|n| vs + n);
    let next = find_first(text, vs, &[M_PARAM, END_FUNCTION]).map(|(n, _)| n);
    match (close, next) {
        (Some(c), n) if n.is_none_or(|n| c < n) => Some((text[vs..c].to_string(), c + M_END_PARAM.len())),
        (_, Some(n)) => Some((text[vs..n].to_string(), n)),
        _ => (!partial).then(|| (text[vs..].to_string(), text.len())),
    }
}

/// MiniCPM5 parameters, in schema order (optional ones may be left out): strings as plain text
/// without `<`, `&` or a newline, or in a CDATA block (as its template writes them), every other
/// type as JSON.
pub(crate) fn minicpm_params(g: &mut Lark, call: usize, schema: &Value) -> String {
    let close = lit(M_END_PARAM);
    params_in_order(g, call, schema, |g, key, s, v| {
        let open = lit(&format!("{M_PARAM}{key}\">"));
        if let Some(options) = string_enum(s) {
            let cdata = |o: &str| format!("{M_CDATA}{o}{M_END_CDATA}");
            let alts: Vec<String> = options
                .iter()
                .map(|o| {
                    lit(&if o.contains(['<', '&', '\n']) {
                        cdata(o)
                    } else {
                        o.to_string()
                    })
                })
                .collect();
            g.rule(v, alts.join(" | "));
        } else if s.get("type").and_then(Value::as_str) == Some("string") {
            g.rule("MINICPM_PLAIN", "/[^<&\\n]+/");
            g.rule(
                &format!("minicpm_cdata[suffix={}]", lit(M_END_CDATA)),
                "/(?s:.*)/",
            );
            g.rule(
                "minicpm_string",
                format!("({} minicpm_cdata | MINICPM_PLAIN)?", lit(M_CDATA)),
            );
            g.rule(v, "minicpm_string");
        } else {
            g.rule(v, json_rule(s));
        }
        format!("{open} {v} {close}")
    })
}

#[cfg(test)]
mod tests {
    use crate::format::ChatFormat::*;
    use crate::format::ParseStart as S;
    use crate::message::ParsedMessage;
    use crate::parse::parse;
    use crate::testutil::{assert_grows, openai_message as msg, parse_openai as run, tools};

    #[test]
    fn minicpm_calls_with_cdata_and_typed_values() {
        let out = "<think>\nplan\n</think>\n\nChecking.<function name=\"get_weather\"><param name=\"location\"><![CDATA[New\nYork & <co>]]></param><param name=\"days\">3</param><param name=\"zip\">017</param><param name=\"metric\">True</param><param name=\"opts\">{'a': None}</param></function>\n<function name=\"get_time\"><param name=\"tz\">CET</param></function>";
        assert_eq!(
            run(MiniCpmXml, S::Content, out, true),
            msg(
                Some("plan"),
                Some("Checking."),
                &[
                    (
                        "get_weather",
                        r#"{"location":"New\nYork & <co>","days":3,"zip":"017","metric":true,"opts":{"a":null}}"#
                    ),
                    ("get_time", r#"{"tz":"CET"}"#)
                ]
            )
        );
        // Without tools the markup is content.
        let plain = "Use <function name=\"get_time\"></function> here";
        assert_eq!(
            run(MiniCpmXml, S::Content, plain, false),
            msg(None, Some(plain), &[])
        );
    }

    #[test]
    fn minicpm_tolerates_missing_closers() {
        // A missing `</param>` ends at the next parameter; a missing `</function>` at the end.
        let out =
            "<function name=\"get_weather\"><param name=\"location\">Paris<param name=\"days\">2</param>";
        assert_eq!(
            run(MiniCpmXml, S::Content, out, true),
            msg(None, None, &[("get_weather", r#"{"location":"Paris","days":2}"#)])
        );
        // Text after the parameters ends the call and is content; a malformed opener is content.
        let out = "<function name=\"get_time\"><param name=\"tz\">UTC</param> done <function name=\"a b\">x";
        assert_eq!(
            run(MiniCpmXml, S::Content, out, true),
            msg(
                None,
                Some("done <function name=\"a b\">x"),
                &[("get_time", r#"{"tz":"UTC"}"#)]
            )
        );
    }

    #[test]
    fn minicpm_name_of_the_longest_allowed_length_is_held_until_it_is_known() {
        // Found by fuzzing (scripts/fuzz-chat): a 128-byte name was content while unfinished and
        // a call opener once its quote arrived, so content shrank.
        let t = tools();
        let name = format!("get_{}", "é".repeat(62));
        let text = format!("Ok <function name=\"{name}\"><param name=\"tz\">x</param></function>");
        let mut prev = ParsedMessage::default();
        for cut in (0..=text.len()).filter(|&c| text.is_char_boundary(c)) {
            let part = parse(MiniCpmXml, S::Content, &text[..cut], Some(&t), true);
            assert_grows(&prev, &part, &format!("cut {cut}"));
            prev = part;
        }
        assert_grows(
            &prev,
            &parse(MiniCpmXml, S::Content, &text, Some(&t), false),
            "final",
        );
    }
}
