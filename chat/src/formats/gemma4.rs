//! gemma4: `<|tool_call>call:NAME{k:<|"|>v<|"|>}<tool_call|>` and `<|channel>thought` reasoning
//! (Gemma 4), values in Gemma's relaxed syntax typed by the tools' schemas.

use serde_json::{json, Value};

use crate::format::{ChatFormat, ParseStart, Reasoning};
use crate::formats::{Format, MarkerNames};
use crate::grammar::{
    json_rule, kwargs, lit, param_err, properties, repeated, tok, token_wrapped_calls, Lark, Markers, Plan,
};
use crate::request::{ParamError, ToolSpec};
use crate::scan::*;
use crate::schema::schema_typed_pairs;
use crate::values::{self, Dialect};

/// Gemma's string delimiter, a single token.
pub(crate) const G_QUOTE: &str = "<|\"|>";

/// gemma4.
pub(crate) struct Gemma4;

impl Format for Gemma4 {
    fn id(&self) -> ChatFormat {
        ChatFormat::Gemma4
    }
    fn name(&self) -> &'static str {
        "gemma4"
    }
    fn in_template(&self, template: &str) -> bool {
        template.contains(&format!("{G_TOOL_CALL}call:"))
            || (template.contains(G_TURN) && template.contains(G_END_TURN))
    }
    fn in_vocab(&self, has_token: &dyn Fn(&str) -> bool) -> bool {
        has_token(G_TOOL_CALL) && has_token(G_END_TOOL_CALL)
    }
    fn reasoning(&self) -> Option<Reasoning> {
        Some(Reasoning::Gemma4Thought)
    }
    fn prefill(&self, rendered_prompt: &str) -> ParseStart {
        let p = rendered_prompt.trim_end();
        let thought = format!("{G_CHANNEL}{G_THOUGHT}");
        if p.ends_with(&format!("{thought}\n{G_END_CHANNEL}"))
            || p.ends_with(&format!("{thought}{G_END_CHANNEL}"))
        {
            ParseStart::ReasoningClosed
        } else if p.ends_with(&thought) {
            ParseStart::Reasoning
        } else {
            ParseStart::Content
        }
    }
    fn parse(&self, out: &mut Out, text: &str, start: ParseStart) {
        gemma4(out, text, start);
    }
    fn markers(&self) -> MarkerNames {
        MarkerNames {
            tool: Some((G_TOOL_CALL, G_END_TOOL_CALL)),
            quote: Some(G_QUOTE),
            ..MarkerNames::default()
        }
    }
    fn call_grammar(
        &self,
        g: &mut Lark,
        markers: &Markers,
        plan: &Plan,
    ) -> Option<Result<String, ParamError>> {
        let Some(q) = markers.quote else {
            return Some(Err(param_err(format!("gemma4 needs the {G_QUOTE} token"))));
        };
        let call = |g: &mut Lark, i, tool: &ToolSpec| {
            let args = kwargs(g, i, &tool.parameters, ",", |g, key, schema, j| {
                let value = gemma_value(g, &format!("v_{i}_{j}"), schema, q, 0);
                format!("{} {value}", lit(&format!("{key}:")))
            });
            Ok(format!(
                "{} {args} {}",
                lit(&format!("call:{}{{", tool.name)),
                lit("}")
            ))
        };
        Some(token_wrapped_calls(
            g,
            markers,
            plan,
            self.name(),
            call,
            |g, open, close| repeated(g, &format!("{open} call_body {close}"), None, plan),
        ))
    }
    #[cfg(any(test, feature = "testutil"))]
    fn render(&self, s: &crate::testutil::Sample) -> Option<(ParseStart, String)> {
        /// A value in Gemma's syntax: strings between quote tokens, bare keys.
        fn value(v: &Value) -> String {
            match v {
                Value::String(s) => format!("{G_QUOTE}{s}{G_QUOTE}"),
                Value::Array(items) => format!("[{}]", items.iter().map(value).collect::<Vec<_>>().join(",")),
                Value::Object(map) => {
                    let pairs: Vec<String> = map.iter().map(|(k, v)| format!("{k}:{}", value(v))).collect();
                    format!("{{{}}}", pairs.join(","))
                }
                other => other.to_string(),
            }
        }
        let mut t = match &s.reasoning {
            Some(r) => format!("{G_CHANNEL}{G_THOUGHT}\n{r}{G_END_CHANNEL}"),
            None => String::new(),
        };
        t += &s.content;
        for (name, args) in &s.calls {
            let body = value(args);
            t += &format!("{G_TOOL_CALL}call:{name}{body}{G_END_TOOL_CALL}");
        }
        Some((ParseStart::Content, t))
    }
}

pub(crate) const G_CHANNEL: &str = "<|channel>";

pub(crate) const G_END_CHANNEL: &str = "<channel|>";

pub(crate) const G_TOOL_CALL: &str = "<|tool_call>";

pub(crate) const G_END_TOOL_CALL: &str = "<tool_call|>";

pub(crate) const G_TURN_MODEL: &str = "<|turn>model\n";

pub(crate) const G_TURN: &str = "<|turn>";

pub(crate) const G_END_TURN: &str = "<turn|>";

pub(crate) const G_STOPS: [&str; 3] = [G_END_TURN, "<eos>", "<|tool_response>"];

pub(crate) const G_THOUGHT: &str = "thought";

pub(crate) fn gemma4(out: &mut Out, text: &str, start: ParseStart) {
    let mut pos = 0;
    if text.starts_with(G_TURN_MODEL) {
        pos = G_TURN_MODEL.len();
    } else if out.partial && G_TURN_MODEL.starts_with(text) {
        return;
    }
    if start == ParseStart::Reasoning {
        match gemma_thought(out, text, pos) {
            Some(p) => pos = p,
            None => return,
        }
    } else {
        // A spurious `thought\n` label with thinking off.
        let rest = &text[pos..];
        if rest.starts_with("thought\n") {
            pos += "thought\n".len();
        } else if out.partial && "thought\n".starts_with(rest) {
            return;
        }
    }
    let mut markers = vec![G_CHANNEL, G_END_CHANNEL];
    markers.extend(G_STOPS);
    if out.has_tools() {
        markers.extend([G_TOOL_CALL, G_END_TOOL_CALL]);
    }
    loop {
        let Some((i, m)) = find_first(text, pos, &markers) else {
            return out.content_tail(text, pos, &markers);
        };
        out.content.push_str(&text[pos..i]);
        let after = i + m.len();
        match m {
            G_CHANNEL => {
                let rest = &text[after..];
                if rest.starts_with(G_THOUGHT) {
                    match gemma_thought(out, text, after + G_THOUGHT.len()) {
                        Some(p) => pos = p,
                        None => return,
                    }
                } else if out.partial && G_THOUGHT.starts_with(rest) {
                    return;
                } else {
                    // Another channel: skipped whole.
                    match text[after..].find(G_END_CHANNEL) {
                        Some(n) => pos = after + n + G_END_CHANNEL.len(),
                        None => return,
                    }
                }
            }
            G_END_CHANNEL | G_END_TOOL_CALL => pos = after,
            G_TOOL_CALL => match gemma_call(out, text, i) {
                Region::Done(next) => pos = next,
                Region::NotCall => {
                    out.content.push_str(m);
                    pos = after;
                }
                Region::Stop => return,
            },
            _ => return, // a stop marker: what follows is not part of the reply
        }
    }
}

/// Reasoning from `from` (just after `thought`) to `<channel|>`; `None` when the text ends first.
pub(crate) fn gemma_thought(out: &mut Out, text: &str, from: usize) -> Option<usize> {
    match text[from..].find(G_END_CHANNEL) {
        Some(n) => {
            out.reasoning.push_str(&text[from..from + n]);
            Some(from + n + G_END_CHANNEL.len())
        }
        None => {
            let end = out.safe_end(text, from, &[G_END_CHANNEL]);
            out.reasoning.push_str(&text[from..end]);
            None
        }
    }
}

/// `<|tool_call>call:NAME{k:v,..}` at `i`, ended by `<tool_call|>`, `<turn|>`, `<eos>` or the end.
pub(crate) fn gemma_call(out: &mut Out, text: &str, i: usize) -> Region {
    let after = i + G_TOOL_CALL.len();
    let rest = &text[after..];
    if !rest.starts_with("call:") {
        return if out.partial && "call:".starts_with(rest) {
            Region::Stop
        } else {
            Region::NotCall
        };
    }
    let ns = after + "call:".len();
    let n = text[ns..]
        .find(|c: char| !(c.is_alphanumeric() || c == '_' || c == '-' || c == '.'))
        .unwrap_or(text.len() - ns);
    let brace = ns + n;
    match text.as_bytes().get(brace) {
        None if out.partial => return Region::Stop,
        Some(b'{') if n > 0 => {}
        _ => return Region::NotCall,
    }
    let name = text[ns..brace].to_string();
    let kw = values::read_kwargs(text, brace + 1, b':', b'}', Dialect::Gemma, !out.partial);
    let resume = match kw.closed_at {
        Some(e) => {
            let j = skip_ws(text, e);
            Some(if text[j..].starts_with(G_END_TOOL_CALL) {
                j + G_END_TOOL_CALL.len()
            } else {
                e
            })
        }
        None if kw.invalid => text[brace..]
            .find(G_END_TOOL_CALL)
            .map(|n| brace + n + G_END_TOOL_CALL.len()),
        None => None,
    };
    let open = out.partial && resume.is_none();
    let pairs = schema_typed_pairs(out.tools, &name, text, &kw);
    out.calls.push((name, values::args_json(&pairs, open)));
    match resume {
        Some(p) => Region::Done(p),
        None if out.partial => Region::Stop,
        None => Region::Done(text.len()),
    }
}

/// A Gemma 4 value: strings between `<|"|>` tokens, bare keys, JSON numbers and literals.
pub(crate) fn gemma_value(g: &mut Lark, name: &str, schema: &Value, quote: u32, depth: usize) -> String {
    let ty = schema.get("type").and_then(Value::as_str);
    let q = tok(quote);
    let body = if let Some(options) = schema.get("enum").and_then(Value::as_array) {
        let alts: Vec<String> = options
            .iter()
            .map(|o| match o {
                Value::String(s) => format!("{q} {} {q}", lit(s)),
                other => lit(&other.to_string()),
            })
            .collect();
        format!("({})", alts.join(" | "))
    } else {
        match ty {
            Some("string") => {
                g.rule("GEMMA_STR", "/[^<]*/");
                format!("{q} GEMMA_STR {q}")
            }
            Some("object") if depth < 4 => {
                let props = properties(schema);
                let mut req = Vec::new();
                let mut opt = Vec::new();
                for (j, (k, s, r)) in props.iter().enumerate() {
                    let v = format!("{name}_{j}");
                    let val = gemma_value(g, &v, s, quote, depth + 1);
                    let a = format!("{} {val}", lit(&format!("{k}:")));
                    if *r {
                        req.push(a)
                    } else {
                        opt.push(a)
                    }
                }
                let mut inner = req.join(" \",\" ");
                for a in opt {
                    inner = if inner.is_empty() {
                        format!("({a})?")
                    } else {
                        format!("{inner} (\",\" {a})?")
                    };
                }
                format!(
                    "\"{{\" {} \"}}\"",
                    if inner.is_empty() { "\"\"".into() } else { inner }
                )
            }
            Some("array") if depth < 4 => {
                let item = format!("{name}_i");
                let items = schema.get("items").cloned().unwrap_or(json!({}));
                let v = gemma_value(g, &item, &items, quote, depth + 1);
                format!("\"[\" ({v} (\",\" {v})*)? \"]\"")
            }
            Some("integer") | Some("number") | Some("boolean") | Some("null") => {
                let v = format!("{name}_j");
                g.rule(&v, json_rule(schema));
                v
            }
            _ => {
                g.rule("GEMMA_STR", "/[^<]*/");
                g.rule(
                    "gemma_any",
                    format!(
                        "{q} GEMMA_STR {q} | /-?[0-9]+(\\.[0-9]+)?/ | \"true\" | \"false\" | \"null\" | \"{{\" (GEMMA_KEY \":\" gemma_any (\",\" GEMMA_KEY \":\" gemma_any)*)? \"}}\" | \"[\" (gemma_any (\",\" gemma_any)*)? \"]\""
                    ),
                );
                g.rule("GEMMA_KEY", "/[A-Za-z_][A-Za-z0-9_]*/");
                "gemma_any".into()
            }
        }
    };
    g.rule(name, body);
    name.into()
}

#[cfg(test)]
mod tests {
    use crate::format::ChatFormat::*;
    use crate::format::ParseStart as S;
    use crate::testutil::{openai_message as msg, parse_openai as run};

    #[test]
    fn gemma4_thought_content_and_call() {
        let out = "<|channel>thought\nUser wants weather.<channel|>Sure.<|tool_call>call:get_weather{location:<|\"|>Paris<|\"|>,days:3,zip:<|\"|>17<|\"|>}<tool_call|><|tool_response>";
        assert_eq!(
            run(Gemma4, S::Content, out, true),
            msg(
                Some("User wants weather."),
                Some("Sure."),
                &[("get_weather", r#"{"location":"Paris","days":3,"zip":"17"}"#)]
            )
        );
    }

    #[test]
    fn gemma4_tolerates_irregular_forms() {
        // `<turn|>` as terminator, quoted keys, `none`, dotted/dashed names, two calls.
        let out = "<|tool_call>call:get-time.v2{<|\"|>tz<|\"|>:none}<turn|>";
        assert_eq!(
            run(Gemma4, S::Content, out, true),
            msg(None, None, &[("get-time.v2", r#"{"tz":null}"#)])
        );
        let out = "<|tool_call>call:get_time{tz:<|\"|>CET<|\"|>}<|tool_call>call:get_time{}<eos>";
        assert_eq!(
            run(Gemma4, S::Content, out, true),
            msg(None, None, &[("get_time", r#"{"tz":"CET"}"#), ("get_time", "{}")])
        );
        // A spurious `thought\n` label with thinking off; an empty trailing thought; a stray `<channel|>`.
        let out = "thought\nHello<|channel>thought\n<channel|><channel|>";
        assert_eq!(
            run(Gemma4, S::ReasoningClosed, out, true),
            msg(None, Some("Hello"), &[])
        );
        // An unterminated string takes the rest.
        let out = "<|tool_call>call:get_time{tz:<|\"|>CET";
        assert_eq!(
            run(Gemma4, S::Content, out, true),
            msg(None, None, &[("get_time", r#"{"tz":"CET"}"#)])
        );
        // Non-thought channels are skipped; `<|turn>model\n` at the start is dropped.
        let out = "<|turn>model\n<|channel>other<channel|>Hi";
        assert_eq!(run(Gemma4, S::Content, out, true), msg(None, Some("Hi"), &[]));
    }

    #[test]
    fn gemma4_prefilled_thought_starts_in_reasoning() {
        assert_eq!(
            run(Gemma4, S::Reasoning, "hmm<channel|>Hi", true),
            msg(Some("hmm"), Some("Hi"), &[])
        );
    }
}
