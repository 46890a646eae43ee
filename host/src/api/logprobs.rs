//! Per-token log-probabilities in each API's shape: OpenAI chat (`logprobs.content`), the legacy
//! completions object (`tokens` / `token_logprobs` / `top_logprobs` / `text_offset`) and Ollama's
//! list. The numbers come from [`TokenLogprobs`]: a log-softmax over the row the sampler picked
//! from (after penalties, `logit_bias` and the constraint mask; before temperature and
//! truncation).

use super::body::{int_in, Int};
use super::ApiError;
use crate::sampling::TokenLogprobs;
use crate::tokenizer::Tokenizer;
use serde_json::{json, Map, Value};

/// Most alternatives a request may ask for per token (OpenAI's limit).
pub const MAX_TOP_LOGPROBS: i64 = 20;

/// The logprob reported for a token the distribution excludes (JSON has no -infinity).
const FLOOR: f32 = -9999.0;

fn finite(lp: f32) -> f32 {
    if lp.is_finite() {
        lp.max(FLOOR)
    } else {
        FLOOR
    }
}

/// `logprobs` / `top_logprobs` of a chat request (OpenAI or Ollama names): `None` when off,
/// else how many alternatives to report. `top_logprobs` without `logprobs: true` is a 400.
pub fn request(logprobs: Option<bool>, top_logprobs: Option<Int>) -> Result<Option<usize>, ApiError> {
    let on = logprobs.unwrap_or(false);
    let top = int_in("top_logprobs", top_logprobs, 0, MAX_TOP_LOGPROBS)?;
    match (on, top) {
        (false, Some(n)) if n > 0 => Err(ApiError::param(
            "top_logprobs",
            "'top_logprobs' needs 'logprobs' set to true",
        )),
        (false, _) => Ok(None),
        (true, n) => Ok(Some(n.unwrap_or(0) as usize)),
    }
}

/// One token as OpenAI names it: its text, logprob and UTF-8 bytes.
fn token_object(tok: &Tokenizer, id: u32, logprob: f32) -> Map<String, Value> {
    let bytes = tok.token_bytes(id);
    let mut m = Map::new();
    m.insert("token".into(), String::from_utf8_lossy(bytes).into_owned().into());
    m.insert("logprob".into(), json!(finite(logprob)));
    m.insert("bytes".into(), json!(bytes));
    m
}

/// OpenAI chat's `logprobs.content` entries (also Ollama's `logprobs` list, the same shape).
pub fn content(tok: &Tokenizer, lps: &[TokenLogprobs]) -> Vec<Value> {
    lps.iter()
        .map(|lp| {
            let mut m = token_object(tok, lp.token, lp.logprob);
            let top: Vec<Value> = lp
                .top
                .iter()
                .map(|&(id, l)| Value::Object(token_object(tok, id, l)))
                .collect();
            m.insert("top_logprobs".into(), top.into());
            Value::Object(m)
        })
        .collect()
}

/// OpenAI chat's `choices[i].logprobs`.
pub fn chat_choice(tok: &Tokenizer, lps: &[TokenLogprobs]) -> Value {
    json!({"content": content(tok, lps), "refusal": null})
}

/// The legacy completions `logprobs` object; `offset` is the text length before these tokens.
pub fn legacy(tok: &Tokenizer, lps: &[TokenLogprobs], mut offset: usize) -> Value {
    let mut tokens = Vec::new();
    let mut logprobs = Vec::new();
    let mut tops = Vec::new();
    let mut offsets = Vec::new();
    for lp in lps {
        let text = String::from_utf8_lossy(tok.token_bytes(lp.token)).into_owned();
        offsets.push(offset);
        offset += text.len();
        tokens.push(Value::String(text));
        logprobs.push(json!(finite(lp.logprob)));
        let mut top = Map::new();
        for &(id, l) in &lp.top {
            let t = String::from_utf8_lossy(tok.token_bytes(id)).into_owned();
            top.entry(t).or_insert(json!(finite(l)));
        }
        tops.push(Value::Object(top));
    }
    json!({"tokens": tokens, "token_logprobs": logprobs, "top_logprobs": tops, "text_offset": offsets})
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The two fields as a typed body holds them.
    #[derive(serde::Deserialize)]
    #[serde(remote = "Self")]
    struct LogprobParams {
        logprobs: Option<bool>,
        top_logprobs: Option<Int>,
    }

    crate::object_only!(LogprobParams);

    #[test]
    fn request_fields_follow_openai() {
        let on = |b: &str| {
            let f: LogprobParams = crate::api::body::typed(&serde_json::from_str(b).unwrap(), "")?;
            request(f.logprobs, f.top_logprobs)
        };
        assert_eq!(on("{}").unwrap(), None);
        assert_eq!(on(r#"{"logprobs": true}"#).unwrap(), Some(0));
        assert_eq!(on(r#"{"logprobs": true, "top_logprobs": 5}"#).unwrap(), Some(5));
        assert_eq!(on(r#"{"logprobs": false, "top_logprobs": 0}"#).unwrap(), None);
        for bad in [
            r#"{"top_logprobs": 3}"#,
            r#"{"logprobs": true, "top_logprobs": 21}"#,
            r#"{"logprobs": true, "top_logprobs": -1}"#,
            r#"{"logprobs": "yes"}"#,
        ] {
            let e = on(bad).unwrap_err();
            assert_eq!(e.status.as_u16(), 400, "{bad}");
            assert!(e.param.is_some(), "{bad}");
        }
    }

    #[test]
    fn shapes_carry_token_text_bytes_and_alternatives() {
        let tok = crate::decoding::tests::tiny_tokenizer();
        let a = tok.encode("a", false)[0];
        let b = tok.encode("b", false)[0];
        let lps = [TokenLogprobs {
            token: a,
            logprob: -0.5,
            top: vec![(a, -0.5), (b, f32::NEG_INFINITY)],
        }];
        let c = content(&tok, &lps);
        assert_eq!(c[0]["token"], "a");
        assert_eq!(c[0]["bytes"], json!([b'a']));
        assert_eq!(c[0]["logprob"], json!(-0.5));
        assert_eq!(c[0]["top_logprobs"][1]["logprob"], json!(FLOOR));
        let l = legacy(&tok, &lps, 3);
        assert_eq!(l["tokens"], json!(["a"]));
        assert_eq!(l["text_offset"], json!([3]));
        assert_eq!(l["top_logprobs"][0]["b"], json!(FLOOR));
    }
}
