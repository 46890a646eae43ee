//! harmony: OpenAI's channels and recipients (gpt-oss): `analysis` is reasoning, `final` the
//! answer, a message to `functions.NAME` a call whose body is the arguments.

use crate::format::{ChatFormat, ParseStart, Reasoning};
use crate::formats::{Format, MarkerNames};
use crate::grammar::{compact_json_rule, content, lit, param_err, tok, Calls, Lark, Markers, Plan};
use crate::request::{ParamError, ResponseFormat};
use crate::scan::*;

/// The assistant role's header (what the generation prompt ends with).
pub(crate) const ASSISTANT_HEADER: &str = "assistant";
/// The reasoning channel.
pub(crate) const ANALYSIS: &str = "analysis";

/// harmony.
pub(crate) struct Harmony;

impl Format for Harmony {
    fn id(&self) -> ChatFormat {
        ChatFormat::Harmony
    }
    fn name(&self) -> &'static str {
        "harmony"
    }
    fn in_template(&self, template: &str) -> bool {
        template.contains(H_CHANNEL) && template.contains(H_START)
    }
    fn in_vocab(&self, has_token: &dyn Fn(&str) -> bool) -> bool {
        has_token(H_CHANNEL) && has_token(H_MESSAGE)
    }
    fn reasoning(&self) -> Option<Reasoning> {
        Some(Reasoning::HarmonyAnalysis)
    }
    fn prefill(&self, rendered_prompt: &str) -> ParseStart {
        let p = rendered_prompt;
        if p.ends_with(&format!("{H_CHANNEL}{ANALYSIS}{H_MESSAGE}")) {
            ParseStart::Reasoning
        } else if p.ends_with(&format!("{H_START}{ASSISTANT_HEADER}")) {
            ParseStart::AssistantHeader
        } else {
            ParseStart::Content
        }
    }
    fn parse(&self, out: &mut Out, text: &str, start: ParseStart) {
        harmony(out, text, start);
    }
    fn markers(&self) -> MarkerNames {
        MarkerNames {
            harmony: Some([H_CHANNEL, H_MESSAGE, H_CONSTRAIN, H_END, H_START]),
            ..MarkerNames::default()
        }
    }
    fn body_grammar(
        &self,
        g: &mut Lark,
        markers: &Markers,
        plan: &Plan,
    ) -> Option<Result<String, ParamError>> {
        Some(harmony_body(g, markers, plan))
    }
    #[cfg(any(test, feature = "testutil"))]
    fn render(&self, s: &crate::testutil::Sample) -> Option<(ParseStart, String)> {
        if s.calls.len() > 1 || (!s.calls.is_empty() && !s.content.is_empty()) {
            return None;
        }
        let mut t = match &s.reasoning {
            Some(r) => format!("{H_CHANNEL}{ANALYSIS}{H_MESSAGE}{r}{H_END}{H_START}{ASSISTANT_HEADER}"),
            None => String::new(),
        };
        match s.calls.first() {
            Some((name, args)) => {
                t += &format!("{H_CHANNEL}commentary to=functions.{name} {H_CONSTRAIN}json{H_MESSAGE}{args}")
            }
            None => t += &format!("{H_CHANNEL}final{H_MESSAGE}{}", s.content),
        }
        Some((ParseStart::AssistantHeader, t))
    }
}

pub(crate) const H_START: &str = "<|start|>";

pub(crate) const H_CHANNEL: &str = "<|channel|>";

pub(crate) const H_MESSAGE: &str = "<|message|>";

pub(crate) const H_CONSTRAIN: &str = "<|constrain|>";

pub(crate) const H_END: &str = "<|end|>";

pub(crate) const H_CALL: &str = "<|call|>";

pub(crate) const H_RETURN: &str = "<|return|>";

pub(crate) const H_END_OF_TEXT: &str = "<|endoftext|>";

/// What ends a message body: the end tokens, or a new header the model opened without one.
pub(crate) const H_ENDS: [&str; 6] = [H_END, H_CALL, H_RETURN, H_START, H_CHANNEL, H_END_OF_TEXT];

/// What ends a header before its `<|message|>`: the header is broken (no body was opened).
/// `<|channel|>` is not among them: gpt-oss-20b writes a stray `<|channel|>commentary` before
/// its real channel, and the last channel of a header wins.
pub(crate) const H_HEADER_ENDS: [&str; 5] = [H_END, H_CALL, H_RETURN, H_START, H_END_OF_TEXT];

/// What may open a header; outside text ends at these and at [`H_ENDS`].
pub(crate) const H_OPENS: [&str; 3] = [H_START, H_CHANNEL, H_MESSAGE];

/// One harmony message: its recipient and channel, where its body starts, and where the body
/// ends and parsing resumes when the header already fixed that (a broken header's text).
pub(crate) struct HarmonyMessage<'t> {
    recipient: &'t str,
    channel: &'t str,
    body: usize,
    end: Option<(usize, usize)>,
}

/// What reading a header found.
pub(crate) enum HarmonyHeader<'t> {
    /// A message to take in.
    Message(HarmonyMessage<'t>),
    /// A header with nothing to show (cut short, or empty); parsing resumes at the offset.
    Skip(usize),
    /// The header is not finished yet (partial output): show nothing more.
    Hold,
}

/// A harmony header word (`to=functions.x`, `json`) ends at whitespace or a special token.
pub(crate) fn header_word_end(s: &str, i: usize) -> usize {
    s[i..]
        .find(|c: char| c.is_whitespace() || c == '<')
        .map_or(s.len(), |n| i + n)
}

/// The header at `pos` (`<|start|>`, `<|channel|>`, `<|message|>`, or the first message's
/// ` to=` when the prompt wrote the role) up to its `<|message|>`. The channel is the word after
/// the last `<|channel|>`; the recipient is the first `to=` word, in the role part or the channel
/// part (the docs allow both). A header that meets an end token or the end of the output first
/// is broken: text after its channel, recipient and content type is the body the model forgot to
/// open (so nothing it wrote is lost); a lone content-type word or nothing at all is a header cut
/// short (by `max_tokens`) and shows nothing.
pub(crate) fn harmony_header<'t>(out: &Out, text: &'t str, pos: usize) -> HarmonyHeader<'t> {
    let rest = &text[pos..];
    let msg_at = rest.find(H_MESSAGE);
    let opener = if rest.starts_with(H_START) {
        H_START.len()
    } else {
        0
    };
    let stop = find_first(rest, opener, &H_HEADER_ENDS).filter(|&(i, _)| msg_at.is_none_or(|m| i < m));
    let (len, broken, next) = match (msg_at, stop) {
        (_, Some((i, m))) => (i, true, pos + if m == H_START { i } else { i + m.len() }),
        (Some(m), None) => (m, false, pos + m + H_MESSAGE.len()),
        (None, None) if out.partial => return HarmonyHeader::Hold,
        (None, None) => (rest.len(), true, text.len()),
    };
    let h = &rest[..len];
    let role_end = h.find(H_CHANNEL).unwrap_or(h.len());
    let role = h[..role_end].strip_prefix(H_START).unwrap_or(&h[..role_end]);
    let (chan, chan_at) = match h.rfind(H_CHANNEL) {
        Some(c) => (&h[c + H_CHANNEL.len()..], Some(c + H_CHANNEL.len())),
        None => ("", None),
    };
    let channel = &chan[..header_word_end(chan, 0)];
    let words = |s: &'t str| {
        s.split_whitespace()
            .flat_map(|w| w.split(H_CONSTRAIN))
            .filter(|w| !w.is_empty())
    };
    let recipient = words(role)
        .chain(words(chan))
        .find_map(|w| w.strip_prefix("to="))
        .unwrap_or("");
    if !broken {
        return HarmonyHeader::Message(HarmonyMessage {
            recipient,
            channel,
            body: next,
            end: None,
        });
    }
    // A broken header: skip the channel word (or the role word), a `to=` word and a
    // `<|constrain|>` content type; what is left, unless it is one content-type word, is the body.
    let mut i = match chan_at {
        Some(c) => header_word_end(h, c),
        None => {
            let r = skip_ws(h, opener);
            if h[r..].starts_with(ASSISTANT_HEADER) {
                header_word_end(h, r)
            } else {
                r
            }
        }
    };
    i = skip_ws(h, i);
    if h[i..].starts_with("to=") {
        i = skip_ws(h, header_word_end(h, i));
    }
    if h[i..].starts_with(H_CONSTRAIN) {
        i = skip_ws(h, header_word_end(h, i + H_CONSTRAIN.len()));
    }
    let tail = h[i..].trim_end();
    let content_type = tail
        .chars()
        .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-');
    if content_type {
        return HarmonyHeader::Skip(next);
    }
    let body = pos + i;
    HarmonyHeader::Message(HarmonyMessage {
        recipient,
        channel,
        body,
        end: Some((pos + len, next)),
    })
}

/// Harmony: a sequence of messages (spec §1.5). Bodies on `analysis` are reasoning; bodies on any
/// other channel are content (`final`, and a `commentary` preamble); `to=functions.NAME` is a call
/// when the request has tools; other recipients (`browser.*`, `python`) are built-in calls: dropped.
pub(crate) fn harmony(out: &mut Out, text: &str, start: ParseStart) {
    // Markers a partial parse holds back the start of, at the end of a body or outside text.
    let held: Vec<&str> = H_ENDS.iter().chain([&H_MESSAGE]).copied().collect();
    let mut pos = 0;
    let mut first = true;
    while pos < text.len() {
        let rest = &text[pos..];
        // With `<|start|>assistant` in the prompt, the first header may begin with its recipient.
        let role_given = first && start == ParseStart::AssistantHeader;
        let opens = H_OPENS.iter().any(|m| rest.starts_with(m))
            || (role_given && rest.trim_start().starts_with("to="));
        let message = if first && start == ParseStart::Reasoning {
            Some(HarmonyMessage {
                recipient: "",
                channel: ANALYSIS,
                body: pos,
                end: None,
            })
        } else if opens {
            match harmony_header(out, text, pos) {
                HarmonyHeader::Message(m) => Some(m),
                HarmonyHeader::Skip(next) => {
                    pos = next;
                    first = false;
                    continue;
                }
                HarmonyHeader::Hold => return,
            }
        } else if out.partial
            && (H_OPENS.iter().any(|m| m.starts_with(rest))
                || (role_given && "to=".starts_with(rest.trim_start())))
        {
            return;
        } else {
            None
        };
        first = false;
        let Some(HarmonyMessage {
            recipient,
            channel,
            body,
            end,
        }) = message
        else {
            // Text outside any message (a model ignoring the format): content, a piece of its
            // own, up to the next end token or header.
            let end = match find_first(text, pos, &held) {
                Some((i, m)) if H_OPENS.contains(&m) => Some((i, i)),
                Some((i, m)) => Some((i, i + m.len())),
                None => None,
            };
            let body_end = end.map_or_else(|| out.safe_end(text, pos, &held), |(e, _)| e);
            push_piece(&mut out.content, &text[pos..body_end]);
            match end {
                Some((_, next)) => pos = next,
                None => return,
            }
            continue;
        };
        let (body_end, next) = match end {
            Some((e, n)) => (e, Some(n)),
            None => match find_first(text, body, &H_ENDS) {
                Some((i, m)) if H_OPENS.contains(&m) => (i, Some(i)),
                Some((i, m)) => (i, Some(i + m.len())),
                None => (out.safe_end(text, body, &held), None),
            },
        };
        let body_text = &text[body..body_end];
        if let Some(name) = recipient.strip_prefix("functions.").filter(|_| out.has_tools()) {
            let args = if next.is_some() || !out.partial {
                body_text.trim()
            } else {
                body_text.trim_end()
            };
            out.calls.push((name.to_string(), args.trim_start().to_string()));
        } else if recipient.is_empty() || recipient.starts_with("functions.") {
            let field = if channel == ANALYSIS {
                &mut out.reasoning
            } else {
                &mut out.content
            };
            push_piece(field, body_text);
        }
        // Any other recipient (browser.*, python, assistant) is a built-in call: dropped.
        match next {
            Some(p) => pos = p,
            None => return,
        }
    }
}

/// Appends one message's text to a field, on a new line after earlier text.
pub(crate) fn push_piece(field: &mut String, piece: &str) {
    if piece.is_empty() {
        return;
    }
    if !field.trim().is_empty() {
        field.push('\n');
    }
    field.push_str(piece);
}

/// Harmony (spec §1.5): the answer is a `final` message, a call a message to
/// `functions.NAME` whose body is the arguments. The recipient may sit in the channel part
/// (`<|channel|>commentary to=functions.NAME <|constrain|>json<|message|>`, as OpenAI's docs write
/// it) or in the role part (` to=functions.NAME<|channel|>commentary json<|message|>`, as the
/// chat template renders past calls), on `commentary` or `analysis`, with or without a content
/// type: the grammar allows every form the parser reads. A user-visible preamble (`commentary`
/// without recipient) may precede a call. A JSON `response_format` constrains the `final` body
/// only (analysis stays free); the header may carry ` <|constrain|>json`, which llama.cpp also
/// allows, though OpenAI's docs and vLLM's grammar have the model write none. Arguments are
/// compact JSON (`{"city":"Paris"}`), as in OpenAI's docs and the arguments its API returns.
///
/// One call per turn whatever `parallel_tool_calls` says: harmony ends the turn at `<|call|>`
/// (a stop token) and the grammar ends with the arguments, so `true` and `false` both hold (the
/// client sends the result and the model may call again in the next turn).
pub(crate) fn harmony_body(g: &mut Lark, markers: &Markers, plan: &Plan) -> Result<String, ParamError> {
    let [channel, message, constrain, end, start] = markers
        .harmony
        .ok_or_else(|| param_err("harmony markers are missing"))?;
    let (channel, message, constrain) = (tok(channel), tok(message), tok(constrain));
    // ` <|constrain|>json`, `<|constrain|>json` or ` json`.
    g.rule("json_type", format!("(\" \"? {constrain} | \" \") \"json\""));
    let content = content(g, &Harmony, plan);
    let final_type = match plan.content {
        ResponseFormat::Text => "",
        _ => "json_type?",
    };
    g.rule(
        "final",
        format!("{channel} \"final\" {final_type} {message} {content}"),
    );
    if plan.calls == Calls::Never {
        return Ok("final".into());
    }
    if plan.tools.is_empty() {
        return Err(param_err("no declared tool can be called"));
    }
    g.rule(
        "preamble",
        format!(
            "{channel} \"commentary\" {message} TEXT {} {} \"assistant\"",
            tok(end),
            tok(start)
        ),
    );
    g.rule("call_channel", "\"commentary\" | \"analysis\"");
    let mut alts = Vec::new();
    for (i, tool) in plan.tools.iter().enumerate() {
        let name = format!("call_{i}");
        let to = lit(&format!(" to=functions.{}", tool.name));
        g.rule(
            &name,
            format!(
                "({channel} call_channel {to} | {to} {channel} call_channel) json_type? {message} {}",
                compact_json_rule(&tool.parameters)
            ),
        );
        alts.push(name);
    }
    g.rule("call", format!("preamble? ({})", alts.join(" | ")));
    Ok(match plan.calls {
        Calls::Forced => "call".into(),
        _ => "(final | call)".into(),
    })
}

#[cfg(test)]
mod tests {
    use crate::format::ChatFormat::*;
    use crate::format::ParseStart as S;
    use crate::testutil::{openai_message as msg, parse_openai as run};

    #[test]
    fn harmony_channels_and_recipients() {
        let out = "<|channel|>analysis<|message|>Need weather.<|end|><|start|>assistant<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>{\"location\":\"SF\"}<|call|>";
        assert_eq!(
            run(Harmony, S::AssistantHeader, out, true),
            msg(
                Some("Need weather."),
                None,
                &[("get_weather", r#"{"location":"SF"}"#)]
            )
        );
        let out = "<|channel|>analysis<|message|>2+2<|end|><|start|>assistant<|channel|>final<|message|>4<|return|>";
        assert_eq!(
            run(Harmony, S::AssistantHeader, out, true),
            msg(Some("2+2"), Some("4"), &[])
        );
    }

    #[test]
    fn harmony_tolerates_irregular_forms() {
        // Recipient in the role part, no `<|constrain|>`, bare `json`.
        let out = "<|start|>assistant to=functions.get_time<|channel|>commentary json<|message|>{\"tz\":\"CET\"}<|call|>";
        assert_eq!(
            run(Harmony, S::AssistantHeader, out, true),
            msg(None, None, &[("get_time", r#"{"tz":"CET"}"#)])
        );
        // A stray commentary prefix; a built-in call dropped; a commentary preamble is content.
        let out = "<|channel|>commentary<|channel|>analysis<|message|>hm<|end|><|start|>assistant<|channel|>analysis to=browser.search<|message|>{}<|call|><|start|>assistant<|channel|>commentary<|message|>Looking.<|end|>";
        assert_eq!(
            run(Harmony, S::AssistantHeader, out, true),
            msg(Some("hm"), Some("Looking."), &[])
        );
        // A call on the analysis channel, `to=X<|constrain|>json` without a space.
        let out = "<|channel|>analysis to=functions.get_time<|constrain|>json<|message|>{}<|call|>";
        assert_eq!(
            run(Harmony, S::AssistantHeader, out, true),
            msg(None, None, &[("get_time", "{}")])
        );
    }

    #[test]
    fn harmony_broken_headers_keep_what_the_model_wrote() {
        // The prompt's `<|start|>assistant` wrote the role: the first header starts at ` to=`.
        let out = " to=functions.get_time<|channel|>commentary json<|message|>{\"tz\":\"CET\"}";
        assert_eq!(
            run(Harmony, S::AssistantHeader, out, true),
            msg(None, None, &[("get_time", r#"{"tz":"CET"}"#)])
        );
        // No `<|message|>`: the text after the header words is the body.
        let out = "<|channel|>commentary to=functions.get_time <|constrain|>json {\"tz\": \"CET\"}";
        assert_eq!(
            run(Harmony, S::AssistantHeader, out, true),
            msg(None, None, &[("get_time", r#"{"tz": "CET"}"#)])
        );
        let out = "<|channel|>final Hello there.";
        assert_eq!(
            run(Harmony, S::AssistantHeader, out, true),
            msg(None, Some("Hello there."), &[])
        );
        // A header ended by `<|end|>` has no body; the next message is read as usual.
        let out = "<|channel|>analysis<|end|><|start|>assistant<|channel|>final<|message|>Hi.";
        assert_eq!(
            run(Harmony, S::AssistantHeader, out, true),
            msg(None, Some("Hi."), &[])
        );
        // A header cut short by max_tokens shows nothing; `<|message|>` alone opens a message.
        for cut in [
            "<|start|>assistant",
            "<|start|>assistant<|channel|>commentary to=functions.get_wea",
            "<|start|>assistant to=functions.get_time<|channel|>commentary json",
        ] {
            let out = format!("<|channel|>analysis<|message|>ok<|end|>{cut}");
            assert_eq!(
                run(Harmony, S::AssistantHeader, &out, true),
                msg(Some("ok"), Some(""), &[]),
                "{cut}"
            );
        }
        let out = "<|message|>Hi.<|return|>more";
        assert_eq!(
            run(Harmony, S::AssistantHeader, out, true),
            msg(None, Some("Hi.\nmore"), &[])
        );
    }
}
