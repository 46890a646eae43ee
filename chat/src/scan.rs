//! Scanning shared by every format's parser: the parse under construction ([`Out`]), marker
//! search that holds back a marker cut short, and the small predicates the formats share.

use serde_json::Value;

use crate::message::{ParsedMessage, ToolCall};

/// The parse under construction: raw field text, trimmed at the end.
#[derive(Default)]
pub(crate) struct Out<'a> {
    pub(crate) partial: bool,
    /// The output ended, cut short: nothing more will come.
    pub(crate) cut: bool,
    pub(crate) tools: &'a [Value],
    /// The names of the request's tools.
    pub(crate) names: Vec<String>,
    pub(crate) reasoning: String,
    pub(crate) content: String,
    pub(crate) calls: Vec<(String, String)>,
}

impl Out<'_> {
    pub(crate) fn has_tools(&self) -> bool {
        !self.tools.is_empty()
    }

    /// Whether the request offers a tool of this name (a call of any other is no call).
    pub(crate) fn offers(&self, name: &str) -> bool {
        self.names.iter().any(|n| n == name)
    }

    /// Content from `pos` to the end, less (when partial) a suffix that may begin a marker.
    pub(crate) fn content_tail(&mut self, text: &str, pos: usize, markers: &[&str]) {
        let end = self.safe_end(text, pos, markers);
        self.content.push_str(&text[pos..end]);
    }

    pub(crate) fn safe_end(&self, text: &str, pos: usize, markers: &[&str]) -> usize {
        if self.partial {
            text.len() - held_suffix(&text[pos..], markers)
        } else {
            text.len()
        }
    }

    pub(crate) fn finish(self) -> ParsedMessage {
        let reasoning = self.reasoning.trim();
        let content = self.content.trim();
        let tool_calls: Vec<ToolCall> = self
            .calls
            .into_iter()
            .enumerate()
            .map(|(i, (name, arguments))| ToolCall {
                id: format!("call_{i}"),
                name,
                arguments,
            })
            .collect();
        ParsedMessage {
            reasoning_content: (!reasoning.is_empty()).then(|| reasoning.to_string()),
            content: (!content.is_empty() || tool_calls.is_empty()).then(|| content.to_string()),
            tool_calls,
        }
    }
}

/// The length of the longest suffix of `s` that is a proper prefix of one of `markers`.
pub(crate) fn held_suffix(s: &str, markers: &[&str]) -> usize {
    let mut best = 0;
    for m in markers {
        for k in (best + 1..m.len().min(s.len() + 1)).rev() {
            if s.is_char_boundary(s.len() - k) && m.as_bytes().starts_with(&s.as_bytes()[s.len() - k..]) {
                best = k;
                break;
            }
        }
    }
    best
}

/// The earliest of `markers` in `s` at or after `from` (the longest one on a tie).
pub(crate) fn find_first<'m>(s: &str, from: usize, markers: &[&'m str]) -> Option<(usize, &'m str)> {
    let mut best: Option<(usize, &str)> = None;
    for &m in markers {
        if let Some(i) = s[from..].find(m) {
            let i = from + i;
            if best.is_none_or(|(b, bm)| i < b || (i == b && m.len() > bm.len())) {
                best = Some((i, m));
            }
        }
    }
    best
}

pub(crate) fn skip_ws(s: &str, mut i: usize) -> usize {
    let b = s.as_bytes();
    while i < b.len() && b[i].is_ascii_whitespace() {
        i += 1;
    }
    i
}

/// Whether what follows a marker makes it what it claims to be.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Look {
    Yes,
    No,
    /// The text ends before it can tell.
    Maybe,
}

/// `rest` (after skipping whitespace) starts with `want`, may still, or cannot.
pub(crate) fn looks_like(rest: &str, want: &str, partial: bool) -> Look {
    // The same whitespace as `skip_ws` (ASCII): callers index the text after skipping it.
    let r = rest.trim_start_matches(|c: char| c.is_ascii_whitespace());
    if r.starts_with(want) {
        Look::Yes
    } else if partial && want.starts_with(r) {
        Look::Maybe
    } else {
        Look::No
    }
}

/// What became of a region that looked like a call.
pub(crate) enum Region {
    /// Calls were read; scanning goes on from here.
    Done(usize),
    /// Not a call: the opening marker is content and scanning goes on after it.
    NotCall,
    /// The text so far ends inside it: stop here.
    Stop,
}

/// A plausible function name: no spaces, quotes or markup.
pub(crate) fn is_name(s: &str) -> bool {
    !s.is_empty() && s.len() <= 128 && !s.contains(|c: char| c.is_whitespace() || "<>\"'{}()[],".contains(c))
}

pub(crate) fn tool_names(tools: &[Value]) -> Vec<String> {
    tools
        .iter()
        .filter_map(|t| {
            t.get("function")
                .unwrap_or(t)
                .get("name")?
                .as_str()
                .map(str::to_string)
        })
        .collect()
}
