//! Calls written without the format's markup (hermes_json and qwen_xml): a bare call object, a
//! list of them, several of them, or any of these in a fence, after at most one lead-in line and
//! with nothing after them. This is the only place a Markdown fence is read as a call: a fenced
//! block with prose after it, or more than one line before it, is an example, and content.

use serde_json::Value;

use crate::formats::hermes_json::END_TOOL_CALL;
use crate::json_scan::*;
use crate::scan::*;

/// The longest answer (lead-in included) that may still be a bare call: a stream holds back at
/// most this much text.
pub(crate) const BARE_MAX: usize = 8192;

/// The longest lead-in sentence before a bare call.
pub(crate) const LEAD_MAX: usize = 200;

/// The keys a bare call object may have.
pub(crate) const BARE_KEYS: [&str; 6] = ["name", "arguments", "parameters", "function", "type", "id"];

/// How far a piece of a bare answer got.
pub(crate) enum Scan<T> {
    /// Read whole.
    Done(T),
    /// The text ends inside it and it may still be read whole.
    Open,
    /// It is not one.
    Fails,
}

impl<T> Scan<T> {
    pub(crate) fn map<U>(self, f: impl FnOnce(T) -> U) -> Scan<U> {
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
pub(crate) fn bare_answer(out: &mut Out, text: &str, pos: usize) -> bool {
    if !out.has_tools() || text.len() - pos > BARE_MAX {
        return false;
    }
    match bare_calls(out, &text[pos..]) {
        Scan::Done((lead, calls)) => {
            out.content.push_str(lead);
            out.calls.extend(calls);
            true
        }
        // Cut short, what was held while it might become a bare call never became one: it is
        // content (the lead-in and the unfinished object), as a parse of the same text reads it,
        // so a reply cut by `max_tokens` is never empty.
        Scan::Open if out.cut => {
            out.content.push_str(text[pos..].trim());
            true
        }
        Scan::Open => out.partial,
        Scan::Fails => false,
    }
}

/// The lead-in and the calls of a bare answer.
pub(crate) fn bare_calls<'t>(out: &Out, a: &'t str) -> Scan<(&'t str, Vec<(String, String)>)> {
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
pub(crate) fn fence_open(a: &str, j: usize, partial: bool) -> Scan<usize> {
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
pub(crate) fn bare_list(out: &Out, a: &str, o: usize) -> Scan<(Vec<(String, String)>, usize)> {
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
pub(crate) fn bare_object(out: &Out, a: &str, o: usize) -> Scan<(String, String, usize)> {
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
            // Judged on the text before any escape: what an escape decodes to cannot turn a key
            // that already is no call key's prefix back into one, so the answer never flips back.
            let typed = &a[j + 1..];
            let plain = typed.split('\\').next().unwrap_or(typed);
            return if BARE_KEYS.iter().any(|k| k.starts_with(plain)) {
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

#[cfg(test)]
mod tests {
    use super::{BARE_MAX, LEAD_MAX};
    use crate::format::ChatFormat::*;
    use crate::format::ParseStart as S;
    use crate::parse::parse;
    use crate::testutil::{check_growing, not_bare_calls, openai_message as msg, parse_openai as run, tools};
    use crate::tolerant_forms::bare_forms;

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

    /// The rule for fenced JSON: a ```` ```json ```` (or bare ```` ``` ````) fence is a call only
    /// where it is the whole answer, after at most one lead-in line of plain text of at most
    /// [`LEAD_MAX`] bytes, with nothing but white space after its closer, and holds only call objects naming an
    /// offered tool. Anywhere else (an example the model explains) it is content.
    #[test]
    fn a_fenced_block_is_a_call_only_as_the_whole_answer() {
        let call = "```json\n{\"name\": \"get_time\", \"arguments\": {\"tz\": \"CET\"}}\n```";
        let cet = [("get_time", r#"{"tz": "CET"}"#)];
        let lead_max = "x".repeat(LEAD_MAX);
        let lead_over = "x".repeat(LEAD_MAX + 1);
        let counts: Vec<(String, Option<&str>)> = vec![
            (call.to_string(), None),
            (format!("\n{call}\n\n"), None),
            (
                format!("Let me check the time.\n{call}"),
                Some("Let me check the time."),
            ),
            (
                format!("Let me check the time.\n\n{call}\n"),
                Some("Let me check the time."),
            ),
            (format!("{lead_max}\n{call}"), Some(lead_max.as_str())),
        ];
        let stays_content = [
            // Prose after the fence: an example the model explains.
            format!("{call}\n\nThis returns the time in CET."),
            format!("Here is how you would call it:\n\n{call}\n\nIt returns the time."),
            // Two lines (or a paragraph) before it.
            format!("The get_time tool reads a clock.\nYou would call it like this:\n{call}"),
            // A lead-in past the bound, or one that is not plain text (inline code, markup).
            format!("{lead_over}\n{call}"),
            format!("Use the `get_time` tool, for example:\n\n{call}"),
            format!("Call <get_time> like this:\n{call}"),
            // Two fences, or a fence in the middle of a sentence.
            format!("{call}\n{call}"),
            format!("Call it as {call} and read the answer."),
            // A fence of another language, or of JSON that names no offered tool.
            "```python\nget_time(tz=\"CET\")\n```".to_string(),
            "```json\n{\"name\": \"get_date\", \"arguments\": {}}\n```".to_string(),
        ];
        let t = tools();
        for format in [HermesJson, QwenXml] {
            for (out, content) in &counts {
                assert_eq!(
                    run(format, S::Content, out, true),
                    msg(None, *content, &cet),
                    "{format}: {out:?}"
                );
            }
            for out in &stays_content {
                assert_eq!(
                    run(format, S::Content, out, true),
                    msg(None, Some(out.trim()), &[]),
                    "{format}: {out:?}"
                );
            }
            // Streamed one character at a time, both sides end as the whole text is read, and
            // nothing sent is taken back.
            for out in counts.iter().map(|c| &c.0).chain(&stays_content) {
                let chars: Vec<String> = out.chars().map(String::from).collect();
                let pieces: Vec<&str> = chars.iter().map(String::as_str).collect();
                check_growing(format, S::Content, &pieces, Some(&t));
            }
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
        // An escape in a key that is already no call key's prefix keeps it released (found by
        // fuzzing: `{"nameCET` came out, then `{"nameCET\` was held again and content shrank).
        for text in ["{\"nameCET", "{\"nameCET\\", "{\"nameCET\\~~\": 1"] {
            assert_eq!(partial(text).content.as_deref(), Some(text), "{text:?}");
        }
        assert_eq!(partial("{\"na\\u006").content.as_deref(), Some(""));
        // Without tools nothing is held.
        let plain = parse(HermesJson, S::Content, "{\"name\": \"get_ti", None, true);
        assert_eq!(plain.content.as_deref(), Some("{\"name\": \"get_ti"));
    }
}
