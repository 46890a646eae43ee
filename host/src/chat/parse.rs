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

use super::format::{ChatFormat, ParseStart};
use super::message::{ParsedMessage, ToolCall};
use super::values::{self, Dialect};

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
    match format {
        ChatFormat::HermesJson => {
            if let Some(pos) = think_block(&mut out, text, start, Some(hermes_opens_call)) {
                hermes(&mut out, text, pos);
            }
        }
        ChatFormat::QwenXml => {
            if let Some(pos) = think_block(&mut out, text, start, Some(xml_opens_call)) {
                qwen_xml(&mut out, text, pos);
            }
        }
        ChatFormat::Gemma4 => gemma4(&mut out, text, start),
        ChatFormat::Lfm2Pythonic => {
            if let Some(pos) = think_block(&mut out, text, start, None) {
                lfm2(&mut out, text, pos);
            }
        }
        ChatFormat::Harmony => harmony(&mut out, text, start),
        ChatFormat::MiniCpmXml => {
            if let Some(pos) = think_block(&mut out, text, start, None) {
                minicpm(&mut out, text, pos);
            }
        }
        ChatFormat::ContentOnly => {
            if let Some(pos) = think_block(&mut out, text, start, None) {
                out.content_tail(text, pos, &[]);
            }
        }
    }
    out.finish()
}

/// The parse under construction: raw field text, trimmed at the end.
#[derive(Default)]
struct Out<'a> {
    partial: bool,
    /// The output ended, cut short: nothing more will come.
    cut: bool,
    tools: &'a [Value],
    /// The names of the request's tools.
    names: Vec<String>,
    reasoning: String,
    content: String,
    calls: Vec<(String, String)>,
}

impl Out<'_> {
    fn has_tools(&self) -> bool {
        !self.tools.is_empty()
    }

    /// Whether the request offers a tool of this name (a call of any other is no call).
    fn offers(&self, name: &str) -> bool {
        self.names.iter().any(|n| n == name)
    }

    /// Content from `pos` to the end, less (when partial) a suffix that may begin a marker.
    fn content_tail(&mut self, text: &str, pos: usize, markers: &[&str]) {
        let end = self.safe_end(text, pos, markers);
        self.content.push_str(&text[pos..end]);
    }

    fn safe_end(&self, text: &str, pos: usize, markers: &[&str]) -> usize {
        if self.partial {
            text.len() - held_suffix(&text[pos..], markers)
        } else {
            text.len()
        }
    }

    fn finish(self) -> ParsedMessage {
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
fn held_suffix(s: &str, markers: &[&str]) -> usize {
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
fn find_first<'m>(s: &str, from: usize, markers: &[&'m str]) -> Option<(usize, &'m str)> {
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

fn skip_ws(s: &str, mut i: usize) -> usize {
    let b = s.as_bytes();
    while i < b.len() && b[i].is_ascii_whitespace() {
        i += 1;
    }
    i
}

/// Whether what follows a marker makes it what it claims to be.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Look {
    Yes,
    No,
    /// The text ends before it can tell.
    Maybe,
}

/// `rest` (after skipping whitespace) starts with `want`, may still, or cannot.
fn looks_like(rest: &str, want: &str, partial: bool) -> Look {
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

fn hermes_opens_call(rest: &str, partial: bool) -> Look {
    looks_like(rest, "{", partial)
}

fn xml_opens_call(rest: &str, partial: bool) -> Look {
    match looks_like(rest, "<function=", partial) {
        Look::No => looks_like(rest, "{", partial),
        l => l,
    }
}

const THINK: &str = "<think>";
const END_THINK: &str = "</think>";
const TOOL_CALL: &str = "<tool_call>";
const END_TOOL_CALL: &str = "</tool_call>";

/// A `<think>` block at the start (opened by the model or by the prompt). Returns where the
/// answer starts, or `None` when the text so far ends inside the reasoning. With tools, a
/// `<tool_call>` that really opens a call also ends the reasoning (models call from inside it).
fn think_block(
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

/// What became of a region that looked like a call.
enum Region {
    /// Calls were read; scanning goes on from here.
    Done(usize),
    /// Not a call: the opening marker is content and scanning goes on after it.
    NotCall,
    /// The text so far ends inside it: stop here.
    Stop,
}

/// Openers of a hermes call, with the wrappers models use instead of `<tool_call>`.
const HERMES_OPENERS: &[&str] = &[
    TOOL_CALL,
    "<function_call>",
    "<tools>",
    "<response>",
    "<json>",
    "<xml>",
    "<JSON>",
    "```json",
    "```xml",
    "<function=",
    "<function name=\"",
];

fn hermes(out: &mut Out, text: &str, mut pos: usize) {
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

fn closer_of(op: &str) -> &'static str {
    match op {
        TOOL_CALL => END_TOOL_CALL,
        "<function_call>" => "</function_call>",
        "<tools>" => "</tools>",
        "<response>" => "</response>",
        "<json>" => "</json>",
        "<xml>" => "</xml>",
        "<JSON>" => "</JSON>",
        "```json" | "```xml" => "```",
        _ => "</function>",
    }
}

/// A plausible function name: no spaces, quotes or markup.
fn is_name(s: &str) -> bool {
    !s.is_empty() && s.len() <= 128 && !s.contains(|c: char| c.is_whitespace() || "<>\"'{}()[],".contains(c))
}

/// One wrapper of JSON call objects (or `<function=NAME>{args}</function>`).
fn hermes_region(out: &mut Out, text: &str, i: usize, op: &str) -> Region {
    let closer = closer_of(op);
    let mut body = i + op.len();
    let mut fixed_name = None;
    if op == "<function=" || op == "<function name=\"" {
        let stop = if op == "<function=" { ">" } else { "\"" };
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
        if op != "<function=" {
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
    } else if !closed && out.partial {
        Region::Stop
    } else if let (Some(name), true) = (fixed_name, closed) {
        // `<function=NAME></function>`: a call without arguments.
        out.calls.push((name, "{}".into()));
        Region::Done(next)
    } else {
        Region::NotCall
    }
}

/// What a JSON call object yielded.
struct CallObject {
    name: Option<String>,
    /// The arguments as JSON text (partial when the object is).
    args: Option<String>,
    /// The index after the object's closing brace.
    end: Option<usize>,
}

/// Read `{"name": .., "arguments": ..}` at `o`, trusting only its top-level keys.
fn scan_call_object(s: &str, o: usize, at_end_complete: bool) -> CallObject {
    let b = s.as_bytes();
    let mut obj = CallObject {
        name: None,
        args: None,
        end: None,
    };
    let mut i = o + 1;
    loop {
        i = skip_ws(s, i);
        match b.get(i) {
            None => return obj,
            Some(b'}') => {
                obj.end = Some(i + 1);
                return obj;
            }
            Some(b'"') => {}
            Some(_) => break,
        }
        let Some(ke) = json_end(s, i, false) else {
            return obj;
        };
        let key: String = serde_json::from_str(&s[i..ke]).unwrap_or_default();
        let c = skip_ws(s, ke);
        match b.get(c) {
            None => return obj,
            Some(b':') => {}
            Some(_) => break,
        }
        let v = skip_ws(s, c + 1);
        if v >= s.len() {
            return obj;
        }
        let ve = json_end(s, v, at_end_complete);
        match key.as_str() {
            "name" => {
                if let Some(Value::String(n)) = ve.and_then(|e| serde_json::from_str(&s[v..e]).ok()) {
                    if obj.name.is_none() && is_name(&n) {
                        obj.name = Some(n);
                    }
                }
            }
            "arguments" | "parameters" if obj.args.is_none() => {
                obj.args = match (b[v], ve) {
                    (b'{' | b'[', Some(e)) => Some(s[v..e].to_string()),
                    (b'{' | b'[', None) => Some(s[v..].trim_end().to_string()),
                    // Arguments sent as a JSON string holding JSON: decode it once.
                    (b'"', Some(e)) => match serde_json::from_str::<Value>(&s[v..e]) {
                        Ok(Value::String(inner)) => Some(inner),
                        _ => Some(s[v..e].to_string()),
                    },
                    (_, Some(_)) => Some("{}".into()),
                    (_, None) => None,
                };
            }
            _ => {}
        }
        let Some(e) = ve else {
            return obj;
        };
        i = skip_ws(s, e);
        match b.get(i) {
            None => return obj,
            Some(b',') => i += 1,
            Some(b'}') => {
                obj.end = Some(i + 1);
                return obj;
            }
            Some(_) => break,
        }
    }
    // Stray text inside the object: find its end by brace matching.
    obj.end = json_end(s, o, false);
    obj
}

/// The index after the JSON value at `i`, by bracket matching that skips strings; `None` when
/// the text ends first (a bare scalar at the end counts when `at_end_complete`).
fn json_end(s: &str, i: usize, at_end_complete: bool) -> Option<usize> {
    let b = s.as_bytes();
    match b.get(i)? {
        b'"' => {
            let mut j = i + 1;
            while j < b.len() {
                match b[j] {
                    b'\\' => j += 2,
                    b'"' => return Some(j + 1),
                    _ => j += 1,
                }
            }
            None
        }
        b'{' | b'[' => {
            let mut depth = 0usize;
            let mut j = i;
            while j < b.len() {
                match b[j] {
                    b'"' => {
                        j = json_end(s, j, false)?;
                        continue;
                    }
                    b'{' | b'[' => depth += 1,
                    b'}' | b']' => {
                        depth -= 1;
                        if depth == 0 {
                            return Some(j + 1);
                        }
                    }
                    _ => {}
                }
                j += 1;
            }
            None
        }
        _ => {
            let n = s[i..].find(|c: char| c == ',' || c == '}' || c == ']' || c.is_whitespace());
            match n {
                Some(n) => Some(i + n),
                None if at_end_complete => Some(s.len()),
                None => None,
            }
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Bare calls: what small models write instead of their template's markup

/// The longest answer (lead-in included) that may still be a bare call: a stream holds back at
/// most this much text.
const BARE_MAX: usize = 8192;
/// The longest lead-in sentence before a bare call.
const LEAD_MAX: usize = 200;
/// The keys a bare call object may have.
const BARE_KEYS: [&str; 6] = ["name", "arguments", "parameters", "function", "type", "id"];

/// How far a piece of a bare answer got.
enum Scan<T> {
    /// Read whole.
    Done(T),
    /// The text ends inside it and it may still be read whole.
    Open,
    /// It is not one.
    Fails,
}

impl<T> Scan<T> {
    fn map<U>(self, f: impl FnOnce(T) -> U) -> Scan<U> {
        match self {
            Scan::Done(t) => Scan::Done(f(t)),
            Scan::Open => Scan::Open,
            Scan::Fails => Scan::Fails,
        }
    }
}

/// Reads an answer (from `pos`) that is only calls written without the format's markup: a call
/// object `{"name": .., "arguments": ..}` naming a tool of the request, a list of them, several
/// of them, or any of these in a ```` ```json ```` or ```` ``` ```` fence, after at most one short
/// lead-in line (which is content). Returns whether the answer is dealt with: read as calls, or
/// (partial) held back whole while it may still become such calls; `false` leaves it to the
/// format's own reading. Only with tools, and only within [`BARE_MAX`] bytes, so a stream holds
/// back a bounded amount and its final message agrees with every partial one.
fn bare_answer(out: &mut Out, text: &str, pos: usize) -> bool {
    if !out.has_tools() || text.len() - pos > BARE_MAX {
        return false;
    }
    match bare_calls(out, &text[pos..]) {
        Scan::Done((lead, calls)) => {
            out.content.push_str(lead);
            out.calls.extend(calls);
            true
        }
        // Cut short, a lead-in line is content; a call begun and cut is no call, as a marker cut
        // short is none.
        Scan::Open if out.cut => match text[pos..].find(['{', '[', '`']) {
            Some(body) => {
                out.content.push_str(text[pos..pos + body].trim());
                true
            }
            None => false,
        },
        Scan::Open => out.partial,
        Scan::Fails => false,
    }
}

/// The lead-in and the calls of a bare answer.
fn bare_calls<'t>(out: &Out, a: &'t str) -> Scan<(&'t str, Vec<(String, String)>)> {
    let b = a.as_bytes();
    let open = || if out.partial { Scan::Open } else { Scan::Fails };
    let start = skip_ws(a, 0);
    // The lead-in: one line of plain text up to the first `{`, `[` or fence.
    let mut j = start;
    while j < b.len() && !matches!(b[j], b'{' | b'[' | b'`') {
        match b[j] {
            b'<' => return Scan::Fails,
            b'\n' => {
                j = skip_ws(a, j);
                if j < b.len() && !matches!(b[j], b'{' | b'[' | b'`') {
                    return Scan::Fails;
                }
                break;
            }
            _ => j += 1,
        }
        if j - start > LEAD_MAX {
            return Scan::Fails;
        }
    }
    if j >= b.len() {
        return open();
    }
    let lead = a[start..j].trim_end();
    let mut calls = Vec::new();
    let fenced = b[j] == b'`';
    if fenced {
        match fence_open(a, j, out.partial) {
            Scan::Done(body) => j = body,
            Scan::Open => return Scan::Open,
            Scan::Fails => return Scan::Fails,
        }
    }
    loop {
        j = skip_ws(a, j);
        let Some(&c) = b.get(j) else {
            // The end: whole after at least one call (a fence left open counts: nothing follows).
            return if calls.is_empty() || out.partial {
                open()
            } else {
                Scan::Done((lead, calls))
            };
        };
        let read = match c {
            b'{' => bare_object(out, a, j).map(|(name, args, end)| (vec![(name, args)], end)),
            b'[' => bare_list(out, a, j),
            b'`' if fenced && !calls.is_empty() => {
                let rest = &a[j..];
                if rest.starts_with("```") {
                    let after = skip_ws(a, j + 3);
                    return if after < b.len() {
                        Scan::Fails
                    } else if out.partial {
                        Scan::Open
                    } else {
                        Scan::Done((lead, calls))
                    };
                }
                return if "```".starts_with(rest) {
                    open()
                } else {
                    Scan::Fails
                };
            }
            // The closer of a `<tool_call>` the model did not open.
            b'<' if !fenced && !calls.is_empty() => {
                let rest = &a[j..];
                if rest.starts_with(END_TOOL_CALL) {
                    let after = skip_ws(a, j + END_TOOL_CALL.len());
                    return if after < b.len() {
                        Scan::Fails
                    } else if out.partial {
                        Scan::Open
                    } else {
                        Scan::Done((lead, calls))
                    };
                }
                return if END_TOOL_CALL.starts_with(rest) {
                    open()
                } else {
                    Scan::Fails
                };
            }
            _ => return Scan::Fails,
        };
        match read {
            Scan::Done((more, end)) => {
                calls.extend(more);
                j = end;
            }
            Scan::Open => return open(),
            Scan::Fails => return Scan::Fails,
        }
    }
}

/// A fence opener at `j` (```` ``` ````, ```` ```json ````): where its body starts.
fn fence_open(a: &str, j: usize, partial: bool) -> Scan<usize> {
    let rest = &a[j..];
    if !rest.starts_with("```") {
        return if partial && "```".starts_with(rest) {
            Scan::Open
        } else {
            Scan::Fails
        };
    }
    let lang_at = j + 3;
    let lang_len = a[lang_at..]
        .find(|c: char| !c.is_ascii_alphanumeric())
        .unwrap_or(a.len() - lang_at);
    let lang = &a[lang_at..lang_at + lang_len];
    let known = ["", "json", "JSON"];
    if lang_at + lang_len == a.len() {
        // The language word may go on.
        return if partial && known.iter().any(|k| k.starts_with(lang)) {
            Scan::Open
        } else if known.contains(&lang) && !partial {
            Scan::Done(a.len())
        } else {
            Scan::Fails
        };
    }
    if known.contains(&lang) {
        Scan::Done(lang_at + lang_len)
    } else {
        Scan::Fails
    }
}

/// `[obj, obj, ..]` at `o`: its calls and the index after it.
fn bare_list(out: &Out, a: &str, o: usize) -> Scan<(Vec<(String, String)>, usize)> {
    let b = a.as_bytes();
    let mut calls = Vec::new();
    let mut j = o + 1;
    loop {
        j = skip_ws(a, j);
        match b.get(j) {
            None => return Scan::Open,
            Some(b'{') => {}
            Some(_) => return Scan::Fails,
        }
        match bare_object(out, a, j) {
            Scan::Done((name, args, end)) => {
                calls.push((name, args));
                j = skip_ws(a, end);
            }
            Scan::Open => return Scan::Open,
            Scan::Fails => return Scan::Fails,
        }
        match b.get(j) {
            None => return Scan::Open,
            Some(b',') => j += 1,
            Some(b']') => return Scan::Done((calls, j + 1)),
            Some(_) => return Scan::Fails,
        }
    }
}

/// A call object at `o`, read strictly: JSON, only [`BARE_KEYS`], a `name` the request offers
/// (or a nested `function` object with one) and `arguments` (or `parameters`) that are an object
/// or a string holding one. Returns the name, the arguments text and the index after the object.
fn bare_object(out: &Out, a: &str, o: usize) -> Scan<(String, String, usize)> {
    let b = a.as_bytes();
    let mut name: Option<String> = None;
    let mut args: Option<String> = None;
    let mut j = o + 1;
    let mut first = true;
    loop {
        j = skip_ws(a, j);
        match b.get(j) {
            None => return Scan::Open,
            Some(b'}') if first => return Scan::Fails,
            Some(b'"') => {}
            Some(_) => return Scan::Fails,
        }
        first = false;
        let Some(key_end) = json_end(a, j, false) else {
            let typed = &a[j + 1..];
            return if typed.contains('\\') || BARE_KEYS.iter().any(|k| k.starts_with(typed)) {
                Scan::Open
            } else {
                Scan::Fails
            };
        };
        let Ok(key) = serde_json::from_str::<String>(&a[j..key_end]) else {
            return Scan::Fails;
        };
        if !BARE_KEYS.contains(&key.as_str()) {
            return Scan::Fails;
        }
        j = skip_ws(a, key_end);
        match b.get(j) {
            None => return Scan::Open,
            Some(b':') => j = skip_ws(a, j + 1),
            Some(_) => return Scan::Fails,
        }
        let Some(&first_byte) = b.get(j) else {
            return Scan::Open;
        };
        let Some(value_end) = json_end(a, j, false) else {
            // Unfinished: may it still become what this key needs?
            let fits = match key.as_str() {
                "name" => first_byte == b'"',
                "arguments" | "parameters" => matches!(first_byte, b'{' | b'"'),
                "function" => first_byte == b'{' && !matches!(bare_object(out, a, j), Scan::Fails),
                _ => true,
            };
            return if fits { Scan::Open } else { Scan::Fails };
        };
        let Ok(value) = serde_json::from_str::<Value>(&a[j..value_end]) else {
            return Scan::Fails;
        };
        match (key.as_str(), value) {
            ("name", Value::String(n)) if name.is_none() && out.offers(&n) => name = Some(n),
            ("arguments" | "parameters", Value::Object(_)) if args.is_none() => {
                args = Some(a[j..value_end].to_string());
            }
            ("arguments" | "parameters", Value::String(s)) if args.is_none() => {
                if !matches!(serde_json::from_str::<Value>(&s), Ok(Value::Object(_))) {
                    return Scan::Fails;
                }
                args = Some(s);
            }
            ("function", Value::Object(_)) if name.is_none() && args.is_none() => {
                match bare_object(out, a, j) {
                    Scan::Done((n, x, _)) => {
                        name = Some(n);
                        args = Some(x);
                    }
                    _ => return Scan::Fails,
                }
            }
            ("type" | "id", _) => {}
            _ => return Scan::Fails,
        }
        j = skip_ws(a, value_end);
        match b.get(j) {
            None => return Scan::Open,
            Some(b',') => j += 1,
            Some(b'}') => {
                return match (name, args) {
                    (Some(n), Some(x)) => Scan::Done((n, x, j + 1)),
                    _ => Scan::Fails,
                };
            }
            Some(_) => return Scan::Fails,
        }
    }
}

// ---------------------------------------------------------------------------------------------
// qwen_xml

const FUNCTION_EQ: &str = "<function=";
const PARAMETER_EQ: &str = "<parameter=";
const END_PARAMETER: &str = "</parameter>";
const END_FUNCTION: &str = "</function>";

fn tool_names(tools: &[Value]) -> Vec<String> {
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

/// Wrappers of JSON calls that Qwen models write instead of `<tool_call>`.
const QWEN_JSON_WRAPPERS: [&str; 2] = ["<function_call>", "<tools>"];

fn qwen_xml(out: &mut Out, text: &str, mut pos: usize) {
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
fn xml_call(out: &mut Out, text: &str, f: usize) -> Region {
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
/// call (only whitespace and `</tool_call>` or the end after it).
fn xml_value_end(text: &str, vs: usize, partial: bool) -> Option<(usize, usize)> {
    let close = text[vs..].find(END_PARAMETER).map(|n| vs + n);
    let next = text[vs..].find(PARAMETER_EQ).map(|n| vs + n);
    match (close, next) {
        (Some(c), n) if n.is_none_or(|n| c < n) => return Some((c, c + END_PARAMETER.len())),
        (_, Some(n)) => return Some((n, n)),
        _ => {}
    }
    let mut from = vs;
    while let Some(n) = text[from..].find(END_FUNCTION) {
        let e = from + n;
        let after = text[e + END_FUNCTION.len()..].trim_start();
        if after.starts_with(END_TOOL_CALL) || (!partial && after.is_empty()) {
            return Some((e, e));
        }
        from = e + END_FUNCTION.len();
    }
    (!partial).then_some((text.len(), text.len()))
}

/// The JSON schema `type` names of a tool's parameter, if the request declares it.
fn param_types(tools: &[Value], func: &str, param: &str) -> Option<Vec<String>> {
    let tool = tools
        .iter()
        .find(|t| t.get("function").unwrap_or(t).get("name").and_then(Value::as_str) == Some(func))?;
    let schema = tool
        .get("function")
        .unwrap_or(tool)
        .get("parameters")?
        .get("properties")?
        .get(param)?;
    let names = |v: &Value| -> Vec<String> {
        match v {
            Value::String(s) => vec![s.to_ascii_lowercase()],
            Value::Array(a) => a
                .iter()
                .filter_map(Value::as_str)
                .map(str::to_ascii_lowercase)
                .collect(),
            _ => Vec::new(),
        }
    };
    let mut types = schema.get("type").map(names).unwrap_or_default();
    for alt in ["anyOf", "oneOf"] {
        for s in schema.get(alt).and_then(Value::as_array).into_iter().flatten() {
            types.extend(s.get("type").map(names).unwrap_or_default());
        }
    }
    if schema.get("nullable") == Some(&Value::Bool(true)) {
        types.push("null".into());
    }
    Some(types)
}

/// An XML parameter's text typed by the tool's schema (a parameter not in it stays a string).
fn typed_value(tools: &[Value], func: &str, param: &str, raw: &str) -> Value {
    let Some(types) = param_types(tools, func, param) else {
        return Value::String(raw.to_string());
    };
    let is = |pred: &dyn Fn(&str) -> bool| types.iter().any(|t| pred(t));
    let stringy = is(&|t| t == "string" || t == "str" || t == "text");
    let t = raw.trim();
    if (t.eq_ignore_ascii_case("null") || t.eq_ignore_ascii_case("none"))
        && (!stringy || is(&|t| t == "null"))
    {
        return Value::Null;
    }
    if stringy || types.is_empty() {
        return Value::String(raw.to_string());
    }
    if is(&|t| t.starts_with("int") || t.starts_with("uint") || ["long", "short", "unsigned"].contains(&t)) {
        if let Ok(v) = t.parse::<i64>() {
            return v.into();
        }
    }
    if is(&|t| t.starts_with("int") || t.starts_with("num") || t.starts_with("float") || t == "double") {
        if let Ok(v) = t.parse::<f64>() {
            if v.fract() == 0.0 && v.abs() < 9.0e15 {
                return (v as i64).into();
            }
            if let Some(n) = serde_json::Number::from_f64(v) {
                return Value::Number(n);
            }
        }
    }
    if is(&|t| t.starts_with("bool")) {
        return Value::Bool(t.eq_ignore_ascii_case("true"));
    }
    if is(&|t| t == "object" || t == "array" || t.starts_with("dict") || t.starts_with("list")) {
        match serde_json::from_str::<Value>(t) {
            Ok(Value::String(s)) => return values::python_literal(&s).unwrap_or(Value::String(s)),
            Ok(v) => return v,
            Err(_) => {
                if let Some(v) = values::python_literal(t) {
                    return v;
                }
            }
        }
    }
    Value::String(raw.to_string())
}

/// Keyword arguments read from relaxed syntax (Gemma 4, LFM2's Python calls) typed by the tool's
/// schema: a string written bare (`zip:017`) stays the text as written for a `"type": "string"`
/// parameter, and a quoted value for a non-string parameter is read as that type.
fn schema_typed_pairs(tools: &[Value], func: &str, text: &str, kw: &values::Kwargs) -> Vec<(String, Value)> {
    kw.pairs
        .iter()
        .zip(&kw.spans)
        .map(|((key, value), span)| {
            let Some(types) = param_types(tools, func, key) else {
                return (key.clone(), value.clone());
            };
            let stringy = types.iter().any(|t| t == "string" || t == "str" || t == "text");
            let typed = match value {
                Value::String(s) if !stringy && !types.is_empty() => typed_value(tools, func, key, s),
                Value::Null if types.iter().any(|t| t == "null") => Value::Null,
                Value::Number(_) | Value::Bool(_) | Value::Null if stringy => {
                    Value::String(text[span.clone()].trim().to_string())
                }
                _ => value.clone(),
            };
            (key.clone(), typed)
        })
        .collect()
}

// ---------------------------------------------------------------------------------------------
// minicpm_xml

const M_FUNCTION: &str = "<function name=\"";
const M_PARAM: &str = "<param name=\"";
const M_END_PARAM: &str = "</param>";
const M_CDATA: &str = "<![CDATA[";
const M_END_CDATA: &str = "]]>";

/// MiniCPM5: calls are `<function name="N"><param name="K">V</param></function>` anywhere in the
/// answer; text around them is content.
fn minicpm(out: &mut Out, text: &str, mut pos: usize) {
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
fn minicpm_call(out: &mut Out, text: &str, f: usize) -> Region {
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
fn minicpm_value(text: &str, vs: usize, partial: bool) -> Option<(String, usize)> {
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

// ---------------------------------------------------------------------------------------------
// gemma4

const G_CHANNEL: &str = "<|channel>";
const G_END_CHANNEL: &str = "<channel|>";
const G_TOOL_CALL: &str = "<|tool_call>";
const G_END_TOOL_CALL: &str = "<tool_call|>";
const G_TURN_MODEL: &str = "<|turn>model\n";
const G_STOPS: [&str; 3] = ["<turn|>", "<eos>", "<|tool_response>"];
const G_THOUGHT: &str = "thought";

fn gemma4(out: &mut Out, text: &str, start: ParseStart) {
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
fn gemma_thought(out: &mut Out, text: &str, from: usize) -> Option<usize> {
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
fn gemma_call(out: &mut Out, text: &str, i: usize) -> Region {
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

// ---------------------------------------------------------------------------------------------
// lfm2_pythonic

const L_START: &str = "<|tool_call_start|>";
const L_END: &str = "<|tool_call_end|>";

fn lfm2(out: &mut Out, text: &str, mut pos: usize) {
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
/// drop it. `None` while a possible echo (text opening with `[`) is still unresolved.
fn strip_echo(text: &str, from: usize, partial: bool) -> Option<usize> {
    let rest = &text[from..];
    if !rest.trim_start().starts_with('[') {
        return Some(from);
    }
    let limit = rest.find(L_START).unwrap_or(rest.len());
    match rest[..limit].rfind(L_END) {
        Some(e) => Some(from + e + L_END.len()),
        None if partial => None,
        None => Some(from),
    }
}

/// A Python (or JSON) list of calls after `<|tool_call_start|>`.
fn lfm2_calls(out: &mut Out, text: &str, b: usize) -> Region {
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

// ---------------------------------------------------------------------------------------------
// harmony

const H_START: &str = "<|start|>";
const H_CHANNEL: &str = "<|channel|>";
const H_MESSAGE: &str = "<|message|>";
const H_CONSTRAIN: &str = "<|constrain|>";
/// What ends a message body: the end tokens, or a new header the model opened without one.
const H_ENDS: [&str; 6] = [
    "<|end|>",
    "<|call|>",
    "<|return|>",
    H_START,
    H_CHANNEL,
    "<|endoftext|>",
];
/// What ends a header before its `<|message|>`: the header is broken (no body was opened).
/// `<|channel|>` is not among them: gpt-oss-20b writes a stray `<|channel|>commentary` before
/// its real channel, and the last channel of a header wins.
const H_HEADER_ENDS: [&str; 5] = ["<|end|>", "<|call|>", "<|return|>", H_START, "<|endoftext|>"];
/// What may open a header; outside text ends at these and at [`H_ENDS`].
const H_OPENS: [&str; 3] = [H_START, H_CHANNEL, H_MESSAGE];

/// One harmony message: its recipient and channel, where its body starts, and where the body
/// ends and parsing resumes when the header already fixed that (a broken header's text).
struct HarmonyMessage<'t> {
    recipient: &'t str,
    channel: &'t str,
    body: usize,
    end: Option<(usize, usize)>,
}

/// What reading a header found.
enum HarmonyHeader<'t> {
    /// A message to take in.
    Message(HarmonyMessage<'t>),
    /// A header with nothing to show (cut short, or empty); parsing resumes at the offset.
    Skip(usize),
    /// The header is not finished yet (partial output): show nothing more.
    Hold,
}

/// A harmony header word (`to=functions.x`, `json`) ends at whitespace or a special token.
fn header_word_end(s: &str, i: usize) -> usize {
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
fn harmony_header<'t>(out: &Out, text: &'t str, pos: usize) -> HarmonyHeader<'t> {
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
            if h[r..].starts_with("assistant") {
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
fn harmony(out: &mut Out, text: &str, start: ParseStart) {
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
                channel: "analysis",
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
            let field = if channel == "analysis" {
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
fn push_piece(field: &mut String, piece: &str) {
    if piece.is_empty() {
        return;
    }
    if !field.trim().is_empty() {
        field.push('\n');
    }
    field.push_str(piece);
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use serde_json::json;

    /// Tools used by the tests: a string `zip` that reads like a number, an integer `days`.
    pub(crate) fn tools() -> Vec<Value> {
        vec![
            json!({"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object", "properties": {
                "location": {"type": "string"}, "days": {"type": "integer"}, "zip": {"type": "string"},
                "date": {"type": "string"}, "metric": {"type": "boolean"}, "opts": {"type": "object"}, "ratio": {"type": "number"}}}}}),
            json!({"type": "function", "function": {"name": "get_time", "parameters": {"type": "object", "properties": {"tz": {"type": "string"}}}}}),
        ]
    }

    fn run(format: ChatFormat, start: ParseStart, text: &str, with_tools: bool) -> Value {
        let t = tools();
        parse(format, start, text, with_tools.then_some(&t[..]), false).to_openai()
    }

    fn msg(reasoning: Option<&str>, content: Option<&str>, calls: &[(&str, &str)]) -> Value {
        let m = ParsedMessage {
            reasoning_content: reasoning.map(str::to_string),
            content: content.map(str::to_string),
            tool_calls: calls
                .iter()
                .enumerate()
                .map(|(i, (n, a))| ToolCall {
                    id: format!("call_{i}"),
                    name: n.to_string(),
                    arguments: a.to_string(),
                })
                .collect(),
        };
        m.to_openai()
    }

    use ChatFormat::*;
    use ParseStart as S;

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
    fn hermes_arguments_as_a_json_string_are_decoded() {
        let out = r#"<tool_call>{"name": "get_time", "arguments": "{\"tz\": \"CET\"}"}</tool_call>"#;
        assert_eq!(
            run(HermesJson, S::Content, out, true),
            msg(None, None, &[("get_time", r#"{"tz": "CET"}"#)])
        );
    }

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
    fn hermes_call_inside_unclosed_think_ends_the_reasoning() {
        let out = "I should call it.\n<tool_call>\n{\"name\": \"get_time\", \"arguments\": {}}\n</tool_call>";
        assert_eq!(
            run(HermesJson, S::Reasoning, out, true),
            msg(Some("I should call it."), None, &[("get_time", "{}")])
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
    fn qwen_xml_call_inside_reasoning_ends_it() {
        let out = "Need weather.\n<tool_call>\n<function=get_time>\n<parameter=tz>\nCET\n</parameter>\n</function>\n</tool_call>";
        assert_eq!(
            run(QwenXml, S::Reasoning, out, true),
            msg(Some("Need weather."), None, &[("get_time", r#"{"tz":"CET"}"#)])
        );
    }

    use crate::chat::tolerant_forms::bare_forms;

    /// Outputs that only look like calls: with tools they stay content, byte for byte.
    pub(crate) fn not_bare_calls() -> Vec<&'static str> {
        vec![
            r#"{"name": "reverse_string", "arguments": {"s": "abc"}}"#,
            "```json\n{\"name\": \"reverse_string\", \"arguments\": {\"s\": \"abc\"}}\n```",
            "<tool_call>\n{\"name\": \"reverse_string\", \"arguments\": {\"s\": \"abc\"}}\n</tool_call>",
            r#"{"city": "Lima", "unit": "celsius"}"#,
            r#"{"name": "get_weather"}"#,
            r#"{"name": "get_weather", "arguments": 3}"#,
            r#"{"name": "get_weather", "arguments": {"location": "Lima"}, "note": "x"}"#,
            r#"[{"name": "get_time", "arguments": {}}, 3]"#,
            "Here is an example: {\"name\": \"get_weather\", \"arguments\": {\"location\": \"Lima\"}} which you can send.",
            "First line.\nSecond line {\"name\": \"get_weather\", \"arguments\": {}}",
            "```python\nprint({\"name\": \"get_weather\", \"arguments\": {}})\n```",
            "[1, 2, 3]",
            "The capital of France is Paris.",
        ]
    }

    #[test]
    fn bare_calls_are_read_in_hermes_and_qwen_xml() {
        for format in [HermesJson, QwenXml] {
            for (out, content, calls) in bare_forms() {
                assert_eq!(
                    run(format, S::Content, out, true),
                    msg(None, content, &calls),
                    "{format}: {out}"
                );
                // Without tools the same text is content, byte for byte.
                assert_eq!(
                    run(format, S::Content, out, false),
                    msg(None, Some(out), &[]),
                    "{format}: {out}"
                );
            }
            // After reasoning, too.
            let out = "<think>\nLima.\n</think>\n\n{\"name\": \"get_weather\", \"arguments\": {\"location\": \"Lima\"}}";
            assert_eq!(
                run(format, S::Content, out, true),
                msg(Some("Lima."), None, &[("get_weather", r#"{"location": "Lima"}"#)]),
                "{format}"
            );
        }
    }

    #[test]
    fn json_that_is_no_call_of_an_offered_tool_stays_content() {
        for format in [HermesJson, QwenXml] {
            for out in not_bare_calls() {
                assert_eq!(
                    run(format, S::Content, out, true),
                    msg(None, Some(out), &[]),
                    "{format}: {out}"
                );
            }
        }
        // A call of a tool not offered inside the format's own markup is content too.
        let out = "<tool_call>\n<function=reverse_string>\n<parameter=s>\nabc\n</parameter>\n</function>\n</tool_call>";
        assert_eq!(run(QwenXml, S::Content, out, true), msg(None, Some(out), &[]));
    }

    #[test]
    fn a_bare_call_is_held_while_it_may_be_one_and_released_when_it_cannot() {
        let t = tools();
        let partial = |text: &str| parse(HermesJson, S::Content, text, Some(&t), true);
        // Every prefix of a bare call (one without markup) shows nothing.
        for (out, _, _) in bare_forms().into_iter().filter(|f| !f.0.starts_with('<')) {
            for cut in (0..out.len()).filter(|&c| out.is_char_boundary(c)) {
                let m = partial(&out[..cut]);
                assert!(m.tool_calls.is_empty(), "{out:?} cut {cut}: {m:?}");
                assert_eq!(m.content.as_deref(), Some(""), "{out:?} cut {cut}");
            }
        }
        // Once it cannot be a call, what was held comes out.
        assert_eq!(partial("{\"city\"").content.as_deref(), Some("{\"city\""));
        assert_eq!(
            partial("{\"name\": \"reverse\"").content.as_deref(),
            Some("{\"name\": \"reverse\"")
        );
        assert_eq!(
            partial("Hello there.\nHow").content.as_deref(),
            Some("Hello there.\nHow")
        );
        assert_eq!(partial("```python\n").content.as_deref(), Some("```python"));
        // A lead-in is held up to its bound; a long answer flows.
        let long = "word ".repeat(LEAD_MAX / 5 + 1);
        assert_eq!(partial(&long).content.as_deref(), Some(long.trim_end()));
        // The hold is bounded: past BARE_MAX an unfinished object is content.
        let big = format!(
            "{{\"name\": \"get_time\", \"arguments\": {{\"tz\": \"{}",
            "x".repeat(BARE_MAX)
        );
        assert!(partial(&big)
            .content
            .as_deref()
            .is_some_and(|c| c.len() > BARE_MAX));
        // Without tools nothing is held.
        let plain = parse(HermesJson, S::Content, "{\"name\": \"get_ti", None, true);
        assert_eq!(plain.content.as_deref(), Some("{\"name\": \"get_ti"));
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

    /// A corpus of outputs for every format: (format, start, text).
    pub(crate) fn corpus() -> Vec<(ChatFormat, ParseStart, &'static str)> {
        vec![
            (HermesJson, S::Content, "<think>\nIt is Paris.\n</think>\n\nLet me check.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"location\": \"Paris\", \"days\": -12}}\n</tool_call>\n<tool_call>\n{\"name\": \"get_time\", \"arguments\": \"{\\\"tz\\\": 1}\"}"),
            (HermesJson, S::Content, "Use <tool_call> like </tool_call> then ```json\n{\"name\": \"get_time\", \"arguments\": {}}\n``` and <function=get_time>{\"tz\": \"x\"}</function> bye <"),
            (HermesJson, S::Reasoning, "hm <tool_call> no\n</think>\n\nok <tool_call>{\"arguments\": {\"a\": [1, {\"b\": \"}\"}]}, \"name\": \"get_time\"} stray}</tool_call> end"),
            (QwenXml, S::Reasoning, "Need it.\n<tool_call>\n<function=get_weather>\n<parameter=location>\nNew York\n</parameter>\n<parameter=days>\n12\n</parameter>\n<parameter=zip>\n017\n</parameter>\n</function>\n</tool_call>\n<tool_call>\n<function=get_time>\n<parameter=tz>\na</function>b\n</parameter>\n</function>\n</tool_call>"),
            (QwenXml, S::ReasoningClosed, "#include <functional>\nText <function=get_time>\n<parameter=tz>\nCET\n<parameter=x>\n1.5\n</function>\nafter"),
            (Gemma4, S::Content, "<|channel>thought\nUser wants weather.<channel|>Sure.<|tool_call>call:get_weather{location:<|\"|>Paris<|\"|>,days:31,opts:{a:[true,null]}}<tool_call|><|tool_call>call:get_time{tz:<|\"|>CET<|\"|>}<turn|>"),
            (Gemma4, S::ReasoningClosed, "thought\nHello <|channel>other<channel|>there<|channel>thought\n<channel|><|tool_call>call:get_time{<|\"|>tz<|\"|>:nil,n:-0.5}<eos>"),
            (Lfm2Pythonic, S::Content, "<think>plan</think>Ok <|tool_call_start|>[get_weather(location=\"Paris\", days=07, metric=True), get_time(tz='sed -n '1,9p' f.py')]<|tool_call_end|>[get_time(tz='CET')]<|tool_call_end|>Done."),
            (Lfm2Pythonic, S::Content, "A <|tool_call_start|>[{\"name\": \"get_time\", \"arguments\": {\"tz\": \"CET\"}}]<|tool_call_end|> B <|tool_call_start|>[]<|tool_call_end|> C [not echo"),
            (Harmony, S::AssistantHeader, "<|channel|>analysis<|message|>Need weather.<|end|><|start|>assistant<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>{\"location\":\"SF\"}<|call|><|start|>assistant<|channel|>final<|message|>It is sunny.<|return|>"),
            (Harmony, S::AssistantHeader, "<|channel|>commentary<|channel|>analysis<|message|>hm<|end|><|start|>assistant to=browser.search<|channel|>analysis<|message|>{}<|call|><|start|>assistant<|channel|>commentary<|message|>Looking.<|end|>plain <|start|>assistant to=functions.get_time<|channel|>commentary json<|message|>{\"tz\": 12"),
            (Harmony, S::AssistantHeader, " to=functions.get_time<|channel|>commentary json<|message|>{\"tz\":\"CET\"}<|call|><|channel|>final Hello there.<|end|><|message|>bare<|end|><|start|>assistant<|channel|>analysis<|end|><|start|>assistant<|channel|>commentary to=functions.get_weather <|constrain|>json {\"location\": \"Paris\"}<|call|>text<|start|>assistant<|channel|>commentary to=functions.get_wea"),
            (ContentOnly, S::Content, "<think>hm</think>Hi <tool_call> there é\n"),
            (HermesJson, S::Content, "Sure, I'll check.\n\n```json\n[{\"name\": \"get_weather\", \"arguments\": {\"location\": \"Lima\"}},\n {\"type\": \"function\", \"function\": {\"name\": \"get_time\", \"parameters\": \"{\\\"tz\\\": \\\"CET\\\"}\"}}]\n```\n"),
            (QwenXml, S::Reasoning, "hm\n</think>\n\n{\"name\": \"get_time\", \"arguments\": {\"tz\": \"é\"}}\n{\"name\": \"get_weather\", \"arguments\": {}}</tool_call>"),
            (HermesJson, S::Content, "{\"name\": \"get_weather\", \"arguments\": {\"location\": \"Lima\"}} is the call. <tool_call>{\"name\": \"reverse\", \"arguments\": {}}</tool_call> ```json\n{\"name\": \"get_time\", \"arguments\": {}}\n```"),
            (MiniCpmXml, S::Reasoning, "plan\n</think>\n\nOk <function name=\"get_weather\"><param name=\"location\"><![CDATA[a\n<b>]]></param><param name=\"days\">07</param></function>\n<function name=\"get_time\"><param name=\"tz\">CET<param name=\"x\">1</function> after <function name=\"get_time\"><param name=\"tz\">]]></param>"),
        ]
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

    /// Every field of `a` is a prefix of the same field of `b`.
    pub(crate) fn assert_grows(a: &ParsedMessage, b: &ParsedMessage, what: &str) {
        let s = |o: &Option<String>| o.clone().unwrap_or_default();
        assert!(
            s(&b.reasoning_content).starts_with(&s(&a.reasoning_content)),
            "reasoning shrank: {what}\n{a:?}\n{b:?}"
        );
        assert!(
            s(&b.content).starts_with(&s(&a.content)),
            "content shrank: {what}\n{a:?}\n{b:?}"
        );
        assert!(
            b.tool_calls.len() >= a.tool_calls.len(),
            "calls vanished: {what}\n{a:?}\n{b:?}"
        );
        for (x, y) in a.tool_calls.iter().zip(&b.tool_calls) {
            assert_eq!((&x.id, &x.name), (&y.id, &y.name), "call changed: {what}");
            assert!(
                y.arguments.starts_with(&x.arguments),
                "arguments shrank: {what}\n{a:?}\n{b:?}"
            );
        }
    }
}
