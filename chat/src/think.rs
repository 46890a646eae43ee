//! `<think>` reasoning blocks, shared by the formats whose reasoning is think tags.

use crate::format::ParseStart;
use crate::formats::hermes_json::TOOL_CALL;
use crate::scan::*;

/// Where parsing starts after a prompt whose reasoning is think tags: inside an opened block, after
/// an empty closed one (thinking off), or in the content.
pub(crate) fn prefill(rendered_prompt: &str) -> ParseStart {
    let p = rendered_prompt.trim_end();
    if p.ends_with(END_THINK) {
        ParseStart::ReasoningClosed
    } else if p.ends_with(THINK) {
        ParseStart::Reasoning
    } else {
        ParseStart::Content
    }
}

/// The reasoning block's open and close.
pub(crate) const MARKERS: (&str, &str) = (THINK, END_THINK);

pub(crate) const THINK: &str = "<think>";

pub(crate) const END_THINK: &str = "</think>";

/// A `<think>` block at the start (opened by the model or by the prompt). Returns where the
/// answer starts, or `None` when the text so far ends inside the reasoning. With tools, a
/// `<tool_call>` that really opens a call also ends the reasoning (models call from inside it).
pub(crate) fn think_block(
    out: &mut Out,
    text: &str,
    start: ParseStart,
    opens_call: Option<fn(&str, bool) -> Look>,
) -> Option<usize> {
    let mut pos = match start {
        ParseStart::Reasoning => 0,
        ParseStart::ReasoningClosed => return Some(0),
        ParseStart::Content | ParseStart::AssistantHeader => {
            let t = skip_ws(text, 0);
            let rest = &text[t..];
            if rest.starts_with(THINK) {
                t + THINK.len()
            } else if out.partial && THINK.starts_with(rest) {
                return None;
            } else {
                return Some(0);
            }
        }
    };
    let opens_call = opens_call.filter(|_| out.has_tools());
    let ends: &[&str] = if opens_call.is_some() {
        &[END_THINK, TOOL_CALL]
    } else {
        &[END_THINK]
    };
    let begin = pos;
    loop {
        match find_first(text, pos, ends) {
            None => {
                let end = out.safe_end(text, pos, ends);
                out.reasoning.push_str(&text[begin..end]);
                return if out.partial { None } else { Some(text.len()) };
            }
            Some((i, END_THINK)) => {
                out.reasoning.push_str(&text[begin..i]);
                return Some(i + END_THINK.len());
            }
            Some((i, _)) => {
                match opens_call.map_or(Look::No, |f| f(&text[i + TOOL_CALL.len()..], out.partial)) {
                    Look::Yes => {
                        out.reasoning.push_str(&text[begin..i]);
                        return Some(i);
                    }
                    Look::Maybe => {
                        out.reasoning.push_str(&text[begin..i]);
                        return None;
                    }
                    Look::No => pos = i + TOOL_CALL.len(),
                }
            }
        }
    }
}

/// A `<think>` block holding `reasoning` (`inside` around the text, `after` after the block), or
/// nothing.
#[cfg(any(test, feature = "testutil"))]
pub(crate) fn render(reasoning: Option<&str>, inside: &str, after: &str) -> String {
    reasoning.map_or_else(String::new, |r| {
        format!("{THINK}{inside}{r}{inside}{END_THINK}{after}")
    })
}
