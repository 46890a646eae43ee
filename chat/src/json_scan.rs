//! Reading JSON call objects out of text that may be cut short: bracket matching that skips
//! strings, and `{"name": .., "arguments": ..}` read by its top-level keys.

use serde_json::Value;

use crate::scan::*;

/// What a JSON call object yielded.
pub(crate) struct CallObject {
    pub(crate) name: Option<String>,
    /// The arguments as JSON text (partial when the object is).
    pub(crate) args: Option<String>,
    /// The index after the object's closing brace.
    pub(crate) end: Option<usize>,
}

/// Read `{"name": .., "arguments": ..}` at `o`, trusting only its top-level keys.
pub(crate) fn scan_call_object(s: &str, o: usize, at_end_complete: bool) -> CallObject {
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
pub(crate) fn json_end(s: &str, i: usize, at_end_complete: bool) -> Option<usize> {
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
