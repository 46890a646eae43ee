//! Relaxed literal values (Python literals, Gemma 4's `<|"|>` syntax) converted to JSON, and
//! keyword-argument lists read pair by pair so a partial list yields only its finished pairs.

use serde_json::{Map, Number, Value};

/// Which literal syntax a value is written in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Dialect {
    /// Python literals: `'s'`, `"s"`, `True`, `None`, `{'k': v}`, `[..]`, `(..)`; JSON literals too.
    Python,
    /// Gemma 4: `<|"|>s<|"|>` strings, bare keys, `true`/`null`/`none`/`nil`.
    Gemma,
}

/// Why a value could not be read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Stop {
    /// The text ended first; more output may finish it.
    Incomplete,
    /// The text is not a value here.
    Invalid,
}

/// Gemma 4's string delimiter.
pub(crate) use crate::formats::gemma4::G_QUOTE as GEMMA_QUOTE;

/// Keyword arguments read so far.
#[derive(Debug, Default)]
pub(crate) struct Kwargs {
    /// Finished `key = value` pairs, in order.
    pub pairs: Vec<(String, Value)>,
    /// The source text span of each pair's value (for typing it by the tool's schema).
    pub spans: Vec<std::ops::Range<usize>>,
    /// The byte index after the closing bracket, when the list was closed.
    pub closed_at: Option<usize>,
    /// Reading stopped at text that is not an argument list.
    pub invalid: bool,
}

fn skip_ws(s: &str, mut i: usize) -> usize {
    let b = s.as_bytes();
    while i < b.len() && b[i].is_ascii_whitespace() {
        i += 1;
    }
    i
}

/// Read `key sep value (, key sep value)* close` from `i` (just after the opening bracket). A pair
/// counts only once followed by `,` or `close`, or by the end of text when `at_end_complete`.
pub(crate) fn read_kwargs(
    s: &str,
    start: usize,
    sep: u8,
    close: u8,
    d: Dialect,
    at_end_complete: bool,
) -> Kwargs {
    let b = s.as_bytes();
    let mut out = Kwargs::default();
    let mut i = skip_ws(s, start);
    loop {
        if i >= b.len() {
            return out;
        }
        if b[i] == close {
            out.closed_at = Some(i + 1);
            return out;
        }
        let key = match read_key(s, i, sep, d) {
            Ok(k) => k,
            Err(Stop::Incomplete) => return out,
            Err(Stop::Invalid) => {
                out.invalid = true;
                return out;
            }
        };
        let (name, after_key) = key;
        let v = skip_ws(s, after_key);
        let (value, after) = match read_value(s, v, d, at_end_complete) {
            Ok(x) => x,
            Err(Stop::Incomplete) => return out,
            Err(Stop::Invalid) => {
                out.invalid = true;
                return out;
            }
        };
        let j = skip_ws(s, after);
        if j >= b.len() {
            if at_end_complete {
                out.pairs.push((name, value));
                out.spans.push(v..after);
            }
            return out;
        }
        if b[j] == b',' {
            out.pairs.push((name, value));
            out.spans.push(v..after);
            i = skip_ws(s, j + 1);
        } else if b[j] == close {
            out.pairs.push((name, value));
            out.spans.push(v..after);
            out.closed_at = Some(j + 1);
            return out;
        } else {
            out.invalid = true;
            return out;
        }
    }
}

/// A key and its separator; returns the key and the index after the separator.
fn read_key(s: &str, i: usize, sep: u8, d: Dialect) -> Result<(String, usize), Stop> {
    let rest = &s[i..];
    let (key, after) = if d == Dialect::Gemma && rest.starts_with(GEMMA_QUOTE) {
        let body = i + GEMMA_QUOTE.len();
        match s[body..].find(GEMMA_QUOTE) {
            Some(n) => (s[body..body + n].to_string(), body + n + GEMMA_QUOTE.len()),
            None => return Err(Stop::Incomplete),
        }
    } else if rest.starts_with('"') || rest.starts_with('\'') {
        match read_value(s, i, Dialect::Python, false)? {
            (Value::String(k), after) => (k, after),
            _ => return Err(Stop::Invalid),
        }
    } else {
        let stop = |c: char| {
            c == sep as char || c == ',' || c == '}' || c == ')' || c == '\n' || c == '=' || c == ':'
        };
        match rest.find(stop) {
            Some(n) => {
                let k = rest[..n].trim();
                if k.is_empty() || k.contains(|c: char| c.is_whitespace() || c == '(' || c == '<') {
                    return Err(Stop::Invalid);
                }
                (k.to_string(), i + n)
            }
            None => return Err(Stop::Incomplete),
        }
    };
    let j = skip_ws(s, after);
    match s.as_bytes().get(j) {
        None => Err(Stop::Incomplete),
        Some(&c) if c == sep => Ok((key, j + 1)),
        Some(_) => Err(Stop::Invalid),
    }
}

/// Read one value at `i`; returns it and the index after it.
pub(crate) fn read_value(
    s: &str,
    i: usize,
    d: Dialect,
    at_end_complete: bool,
) -> Result<(Value, usize), Stop> {
    let b = s.as_bytes();
    let Some(&c) = b.get(i) else {
        return Err(Stop::Incomplete);
    };
    let rest = &s[i..];
    if d == Dialect::Gemma && rest.starts_with(GEMMA_QUOTE) {
        let body = i + GEMMA_QUOTE.len();
        return match s[body..].find(GEMMA_QUOTE) {
            Some(n) => Ok((
                Value::String(s[body..body + n].to_string()),
                body + n + GEMMA_QUOTE.len(),
            )),
            // An unterminated string takes the rest of the text.
            None if at_end_complete => Ok((Value::String(s[body..].to_string()), s.len())),
            None => Err(Stop::Incomplete),
        };
    }
    if GEMMA_QUOTE.starts_with(rest) && d == Dialect::Gemma {
        return Err(Stop::Incomplete);
    }
    match c {
        b'"' | b'\'' => read_quoted(s, i, c, at_end_complete),
        b'{' => read_container(s, i, b'}', d, true),
        b'[' => read_container(s, i, b']', d, false),
        b'(' if d == Dialect::Python => read_container(s, i, b')', d, false),
        b'-' | b'+' | b'.' | b'0'..=b'9' => read_number(s, i, at_end_complete),
        c if c.is_ascii_alphabetic() || c == b'_' => {
            let n = rest
                .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
                .unwrap_or(rest.len());
            if i + n == s.len() && !at_end_complete {
                return Err(Stop::Incomplete);
            }
            let v = match rest[..n].to_ascii_lowercase().as_str() {
                "true" => Value::Bool(true),
                "false" => Value::Bool(false),
                "none" | "null" | "nil" => Value::Null,
                _ => return Err(Stop::Invalid),
            };
            Ok((v, i + n))
        }
        _ => Err(Stop::Invalid),
    }
}

fn read_container(s: &str, i: usize, close: u8, d: Dialect, map: bool) -> Result<(Value, usize), Stop> {
    if map {
        let sep = b':';
        let kw = read_kwargs(s, i + 1, sep, close, d, false);
        if kw.invalid {
            return Err(Stop::Invalid);
        }
        let Some(end) = kw.closed_at else {
            return Err(Stop::Incomplete);
        };
        let m: Map<String, Value> = kw.pairs.into_iter().collect();
        return Ok((Value::Object(m), end));
    }
    let b = s.as_bytes();
    let mut items = Vec::new();
    let mut j = skip_ws(s, i + 1);
    loop {
        match b.get(j) {
            None => return Err(Stop::Incomplete),
            Some(&c) if c == close => return Ok((Value::Array(items), j + 1)),
            _ => {}
        }
        let (v, after) = read_value(s, j, d, false)?;
        items.push(v);
        j = skip_ws(s, after);
        match b.get(j) {
            None => return Err(Stop::Incomplete),
            Some(b',') => j = skip_ws(s, j + 1),
            Some(&c) if c == close => return Ok((Value::Array(items), j + 1)),
            Some(_) => return Err(Stop::Invalid),
        }
    }
}

/// A quoted string. A quote closes it only when what follows can follow a value (`,)]}:=` or the
/// end), so unescaped inner quotes (`'sed -n '1,9p' f.py'`) stay in the string.
fn read_quoted(s: &str, i: usize, q: u8, at_end_complete: bool) -> Result<(Value, usize), Stop> {
    let b = s.as_bytes();
    let mut out = String::new();
    let mut j = i + 1;
    let mut run = j;
    while j < b.len() {
        let c = b[j];
        if c == b'\\' {
            out.push_str(&s[run..j]);
            let Some(&e) = b.get(j + 1) else {
                return Err(Stop::Incomplete);
            };
            j += 2;
            match e {
                b'n' => out.push('\n'),
                b't' => out.push('\t'),
                b'r' => out.push('\r'),
                b'0' => out.push('\0'),
                b'u' => {
                    let Some(hex) = s.get(j..j + 4) else {
                        return Err(Stop::Incomplete);
                    };
                    match u32::from_str_radix(hex, 16).ok().and_then(char::from_u32) {
                        Some(ch) => out.push(ch),
                        None => out.push_str(hex),
                    }
                    j += 4;
                }
                _ => {
                    // `\\`, `\'`, `\"`, `\/` and anything unknown: the character itself.
                    let ch = s[j - 1..].chars().next().unwrap_or('\\');
                    out.push(ch);
                    j = j - 1 + ch.len_utf8();
                }
            }
            run = j;
            continue;
        }
        if c == q {
            let k = skip_ws(s, j + 1);
            let closes = match b.get(k) {
                None => true,
                Some(n) => b",)]}:=".contains(n),
            };
            if closes {
                if k >= b.len() && !at_end_complete && j + 1 == b.len() {
                    // `'a'` at the very end may yet be `'a' b'`: wait for what follows.
                    return Err(Stop::Incomplete);
                }
                out.push_str(&s[run..j]);
                return Ok((Value::String(out), j + 1));
            }
        }
        j += 1;
    }
    if at_end_complete {
        out.push_str(&s[run..]);
        return Ok((Value::String(out), s.len()));
    }
    Err(Stop::Incomplete)
}

fn read_number(s: &str, i: usize, at_end_complete: bool) -> Result<(Value, usize), Stop> {
    let rest = &s[i..];
    let n = rest
        .find(|c: char| !(c.is_ascii_digit() || "+-.eE_".contains(c)))
        .unwrap_or(rest.len());
    if i + n == s.len() && !at_end_complete {
        return Err(Stop::Incomplete);
    }
    let text: String = rest[..n].chars().filter(|&c| c != '_').collect();
    let text = text.strip_prefix('+').unwrap_or(&text);
    let is_int = !text.contains(['.', 'e', 'E']);
    if is_int {
        // Leading zeros (`month=07`) are read as the integer they spell.
        let (neg, digits) = match text.strip_prefix('-') {
            Some(d) => (true, d),
            None => (false, text),
        };
        let digits = digits.trim_start_matches('0');
        let digits = if digits.is_empty() { "0" } else { digits };
        let t = if neg {
            format!("-{digits}")
        } else {
            digits.to_string()
        };
        if let Ok(v) = t.parse::<i64>() {
            return Ok((Value::Number(v.into()), i + n));
        }
        if let Ok(v) = t.parse::<u64>() {
            return Ok((Value::Number(v.into()), i + n));
        }
    }
    match text.parse::<f64>().ok().and_then(Number::from_f64) {
        Some(num) => Ok((Value::Number(num), i + n)),
        None => Err(Stop::Invalid),
    }
}

/// Python literal text (a repr such as `{'k': True}`) as JSON, if it is one.
pub(crate) fn python_literal(text: &str) -> Option<Value> {
    let t = text.trim();
    match read_value(t, 0, Dialect::Python, true) {
        Ok((v, end)) if skip_ws(t, end) == t.len() => Some(v),
        _ => None,
    }
}

/// JSON text for a finished pair list: `{"k":v,...}` without the closing brace when `open`.
pub(crate) fn args_json(pairs: &[(String, Value)], open: bool) -> String {
    let mut out = String::from("{");
    for (n, (k, v)) in pairs.iter().enumerate() {
        if n > 0 {
            out.push(',');
        }
        out.push_str(&Value::String(k.clone()).to_string());
        out.push(':');
        out.push_str(&v.to_string());
    }
    if !open {
        out.push('}');
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn kw(s: &str, d: Dialect, sep: u8, close: u8) -> Value {
        let k = read_kwargs(s, 0, sep, close, d, true);
        Value::Object(k.pairs.into_iter().collect())
    }

    #[test]
    fn python_kwargs_become_json_values() {
        let v = kw(
            r#"a="x", b='y', c=3, d=-1.5, e=True, f=None, g=[1, 'z'], h={'k': False})"#,
            Dialect::Python,
            b'=',
            b')',
        );
        assert_eq!(
            v,
            json!({"a":"x","b":"y","c":3,"d":-1.5,"e":true,"f":null,"g":[1,"z"],"h":{"k":false}})
        );
    }

    #[test]
    fn python_repairs_leading_zeros_keywords_and_inner_quotes() {
        let v = kw(
            "month=07, from=1, command='sed -n '1,9p' f.py')",
            Dialect::Python,
            b'=',
            b')',
        );
        assert_eq!(v, json!({"month":7,"from":1,"command":"sed -n '1,9p' f.py"}));
    }

    #[test]
    fn gemma_values_use_the_string_delimiter_and_bare_keys() {
        let v = kw(
            r#"location:<|"|>Paris, FR<|"|>,days:3,<|"|>unit<|"|>:nil,opts:{deep:[true,<|"|>a<|"|>]}}"#,
            Dialect::Gemma,
            b':',
            b'}',
        );
        assert_eq!(
            v,
            json!({"location":"Paris, FR","days":3,"unit":null,"opts":{"deep":[true,"a"]}})
        );
    }

    #[test]
    fn partial_kwargs_keep_only_finished_pairs() {
        let k = read_kwargs("a=1, b=2", 0, b'=', b')', Dialect::Python, false);
        assert_eq!(k.pairs.len(), 1);
        assert_eq!(k.closed_at, None);
        let k = read_kwargs("a=1, b='x", 0, b'=', b')', Dialect::Python, true);
        assert_eq!(
            Value::Object(k.pairs.into_iter().collect()),
            json!({"a":1,"b":"x"})
        );
    }

    #[test]
    fn python_reprs_convert_to_json() {
        assert_eq!(
            python_literal("{'k': 'v', 'n': None}"),
            Some(json!({"k":"v","n":null}))
        );
        assert_eq!(python_literal("not a literal"), None);
    }
}
