//! Ollama's option names (`temperature`, `num_predict`, `stop`, `num_ctx`, ...): the one vocabulary
//! for a request's `options`, a pack's `defaults` (a Modelfile's `PARAMETER` lines, an Ollama
//! registry pull's params) and `berth run`'s `/set parameter`. [`PackDefaults`] is what a loaded
//! pack asks for when a request does not say: its options over Berth's own defaults, its system
//! prompt and the messages it puts before every conversation. Request values always win.

use crate::decoding::DecodeOptions;
use crate::turn::error::ApiError;
use berth_registry::pack::{PackManifest, PackMessage};
use serde::de::{self, Deserializer, Unexpected, Visitor};
use serde::Deserialize;
use serde_json::Value;
use std::fmt;

/// A whole number as the APIs take it: a JSON integer, or a number with no fraction (`10.0`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Int(pub i64);

impl<'de> Deserialize<'de> for Int {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Int, D::Error> {
        struct IntVisitor;
        impl Visitor<'_> for IntVisitor {
            type Value = Int;

            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("an integer")
            }

            fn visit_i64<E: de::Error>(self, v: i64) -> Result<Int, E> {
                Ok(Int(v))
            }

            fn visit_u64<E: de::Error>(self, v: u64) -> Result<Int, E> {
                i64::try_from(v)
                    .map(Int)
                    .map_err(|_| E::invalid_value(Unexpected::Unsigned(v), &self))
            }

            fn visit_f64<E: de::Error>(self, v: f64) -> Result<Int, E> {
                if v.fract() == 0.0 && v.abs() < 9e15 {
                    Ok(Int(v as i64))
                } else {
                    Err(E::invalid_value(Unexpected::Float(v), &self))
                }
            }
        }
        d.deserialize_any(IntVisitor)
    }
}

/// A whole number field within `[lo, hi]` (400 naming `name` outside it).
pub fn int_in(name: &str, v: Option<Int>, lo: i64, hi: i64) -> Result<Option<i64>, ApiError> {
    match v {
        Some(Int(x)) if !(lo..=hi).contains(&x) => Err(ApiError::param(
            name,
            format!("'{name}' must be between {lo} and {hi}; got {x}"),
        )),
        other => Ok(other.map(|Int(x)| x)),
    }
}

/// A number field within `[lo, hi]` (400 naming `name` outside it).
pub fn num_in(name: &str, v: Option<f64>, lo: f64, hi: f64) -> Result<Option<f64>, ApiError> {
    match v {
        Some(x) if !(lo..=hi).contains(&x) => Err(ApiError::param(
            name,
            format!("'{name}' must be between {lo} and {hi}; got {x}"),
        )),
        other => Ok(other),
    }
}

/// Ollama `options`: sampling and stopping, plus load-time settings Berth sets per server (checked
/// so that a bad value is never silently taken). Samplers Berth does not implement (`mirostat`,
/// `typical_p`, `tfs_z`) are a 400 unless set to their "off" value; other keys (runner settings
/// such as `use_mmap`, `numa`, `main_gpu`) are ignored, as Ollama ignores keys it does not use.
#[derive(Debug, Default, Deserialize)]
#[serde(remote = "Self")]
pub struct OllamaOptions {
    /// Context length (the server's applies).
    pub num_ctx: Option<Int>,
    /// Batch size (the server's applies).
    pub num_batch: Option<Int>,
    /// Threads (the server's applies).
    pub num_thread: Option<Int>,
    /// Tokens kept on a context shift (the server's applies).
    pub num_keep: Option<Int>,
    /// Layers on the GPU (the server's applies).
    pub num_gpu: Option<Int>,
    /// 0-100.
    pub temperature: Option<f64>,
    /// 0-1.
    pub top_p: Option<f64>,
    /// -1 (off) to 2^20.
    pub top_k: Option<Int>,
    /// 0-1.
    pub min_p: Option<f64>,
    /// Seed for reproducible sampling.
    pub seed: Option<Int>,
    /// 0-100.
    pub repeat_penalty: Option<f64>,
    /// Tokens the repeat penalty looks back over (-1: all, taken as 0).
    pub repeat_last_n: Option<Int>,
    /// -100 to 100.
    pub presence_penalty: Option<f64>,
    /// -100 to 100.
    pub frequency_penalty: Option<f64>,
    /// Most tokens to generate (-1, -2: until the context is full).
    pub num_predict: Option<Int>,
    /// Up to 16 stop strings.
    pub stop: Option<Value>,
    /// Not implemented: only 0 (off) is taken.
    pub mirostat: Option<Int>,
    /// Only with `mirostat`; checked as a number.
    pub mirostat_tau: Option<f64>,
    /// Only with `mirostat`; checked as a number.
    pub mirostat_eta: Option<f64>,
    /// Not implemented: only 1 (off) is taken.
    pub typical_p: Option<f64>,
    /// Not implemented (and gone from Ollama): only 1 (off) is taken.
    pub tfs_z: Option<f64>,
}

/// A 400 for a sampler Berth does not implement, unless the value is its "off" value.
fn refuse_unless_off(field: &str, value: Option<f64>, off: f64) -> Result<(), ApiError> {
    match value {
        Some(v) if v != off => Err(ApiError::param(
            field,
            format!("'{field}' is not supported by Berth (only {off}, which turns it off)"),
        )),
        _ => Ok(()),
    }
}

crate::object_only!(OllamaOptions);

impl OllamaOptions {
    /// The decode options these ask for over Berth's defaults; each value out of range is a 400
    /// naming `options.X`.
    pub fn decode_options(&self) -> Result<DecodeOptions, ApiError> {
        self.over(&DecodeOptions::default(), "options.")
    }

    /// The decode options these ask for over `base` (a pack's defaults): what is set here wins,
    /// the rest is `base`'s. Each value out of range is a 400 naming `{prefix}X`.
    pub fn over(&self, base: &DecodeOptions, prefix: &str) -> Result<DecodeOptions, ApiError> {
        let name = |field: &str| format!("{prefix}{field}");
        let ctx = int_in(&name("num_ctx"), self.num_ctx, 1, u32::MAX as i64)?;
        int_in(&name("num_batch"), self.num_batch, 1, u32::MAX as i64)?;
        int_in(&name("num_thread"), self.num_thread, 0, 4096)?;
        int_in(&name("num_keep"), self.num_keep, -1, u32::MAX as i64)?;
        int_in(&name("num_gpu"), self.num_gpu, -1, 1 << 20)?;
        refuse_unless_off(&name("mirostat"), self.mirostat.map(|Int(m)| m as f64), 0.0)?;
        refuse_unless_off(&name("typical_p"), self.typical_p, 1.0)?;
        refuse_unless_off(&name("tfs_z"), self.tfs_z, 1.0)?;
        let mut s = base.sampling.clone();
        if let Some(t) = num_in(&name("temperature"), self.temperature, 0.0, 100.0)? {
            s.temperature = t as f32;
        }
        if let Some(p) = num_in(&name("top_p"), self.top_p, 0.0, 1.0)? {
            s.top_p = p as f32;
        }
        if let Some(k) = int_in(&name("top_k"), self.top_k, -1, 1 << 20)? {
            s.top_k = k.max(0) as usize;
        }
        if let Some(p) = num_in(&name("min_p"), self.min_p, 0.0, 1.0)? {
            s.min_p = p as f32;
        }
        if let Some(Int(seed)) = self.seed {
            s.seed = Some(seed as u64);
        }
        if let Some(p) = num_in(&name("repeat_penalty"), self.repeat_penalty, 0.0, 100.0)? {
            s.repeat_penalty = p as f32;
        }
        if let Some(n) = int_in(&name("repeat_last_n"), self.repeat_last_n, -1, 1 << 20)? {
            // -1 looks at the whole context, as Ollama's `repeat_last_n: -1` does.
            s.repeat_last_n = if n < 0 { usize::MAX } else { n as usize };
        }
        if let Some(p) = num_in(&name("presence_penalty"), self.presence_penalty, -100.0, 100.0)? {
            s.presence_penalty = p as f32;
        }
        if let Some(p) = num_in(&name("frequency_penalty"), self.frequency_penalty, -100.0, 100.0)? {
            s.frequency_penalty = p as f32;
        }
        let max_tokens = match int_in(&name("num_predict"), self.num_predict, -2, u32::MAX as i64)? {
            // -1 and -2: until the context is full.
            Some(n) => (n >= 0).then_some(n as usize),
            None => base.max_tokens,
        };
        let stop = match &self.stop {
            Some(v) => crate::decoding::parse_stop(Some(v), &name("stop"), 16).map_err(ApiError::from)?,
            None => base.stop.clone(),
        };
        Ok(DecodeOptions {
            sampling: s,
            max_tokens,
            stop,
            context: ctx.map(|c| c as usize).or(base.context),
            constraint: None,
            logprobs: None,
        })
    }
}

/// What a pack asks for when a request does not say: its options (the manifest's `defaults`,
/// under Ollama's names) over Berth's own, its system prompt and its messages.
#[derive(Debug, Default)]
pub struct PackDefaults {
    /// Berth's decode options with the pack's values over them: a request's fields apply on top.
    pub decode: DecodeOptions,
    /// The system prompt used when a conversation has none.
    pub system: Option<String>,
    /// Messages put before every conversation (after the system prompt).
    pub messages: Vec<PackMessage>,
    /// Defaults the pack names that Berth cannot take, one line each (logged at load; the rest
    /// still apply).
    pub problems: Vec<String>,
}

impl PackDefaults {
    /// The defaults of a pack's manifest. A value Berth cannot take is left out and said in
    /// `problems`; keys that are not Ollama options are ignored, as Ollama ignores them.
    pub fn from_manifest(m: &PackManifest) -> PackDefaults {
        let mut decode = DecodeOptions::default();
        let mut problems = Vec::new();
        for (key, value) in &m.defaults {
            let one: Value = serde_json::json!({ key.as_str(): toml_to_json(value) });
            let applied = serde_json::from_value::<OllamaOptions>(one)
                .map_err(|e| format!("defaults.{key}: {e}"))
                .and_then(|o| o.over(&decode, "defaults.").map_err(|e| e.message));
            match applied {
                Ok(d) => decode = d,
                Err(e) => problems.push(e),
            }
        }
        PackDefaults {
            decode,
            system: m.system.clone().filter(|s| !s.is_empty()),
            messages: m.messages.clone(),
            problems,
        }
    }
}

/// A TOML value as JSON (dates become their text).
fn toml_to_json(v: &toml::Value) -> Value {
    match v {
        toml::Value::String(s) => Value::String(s.clone()),
        toml::Value::Integer(i) => Value::from(*i),
        toml::Value::Float(f) => serde_json::Number::from_f64(*f).map_or(Value::Null, Value::Number),
        toml::Value::Boolean(b) => Value::Bool(*b),
        toml::Value::Datetime(d) => Value::String(d.to_string()),
        toml::Value::Array(a) => Value::Array(a.iter().map(toml_to_json).collect()),
        toml::Value::Table(t) => Value::Object(t.iter().map(|(k, v)| (k.clone(), toml_to_json(v))).collect()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use berth_registry::pack::PackRef;

    fn manifest(defaults: &str) -> PackManifest {
        let mut m = PackManifest::new(&PackRef::parse("t:latest").unwrap(), "qwen3");
        m.defaults = toml::from_str(defaults).unwrap();
        m
    }

    #[test]
    fn pack_values_replace_berths_and_requests_replace_the_packs() {
        let d = PackDefaults::from_manifest(&manifest(
            "temperature = 0.0\nstop = [\"a\", \"b\"]\nnum_ctx = 2048\nnum_predict = 7\ntop_k = 3",
        ));
        assert!(d.problems.is_empty(), "{:?}", d.problems);
        assert_eq!(d.decode.sampling.temperature, 0.0);
        assert_eq!(d.decode.sampling.top_k, 3);
        assert_eq!(d.decode.stop, ["a", "b"]);
        assert_eq!((d.decode.context, d.decode.max_tokens), (Some(2048), Some(7)));
        // Unset fields stay Berth's.
        assert_eq!(d.decode.sampling.top_p, DecodeOptions::default().sampling.top_p);

        let req: OllamaOptions =
            serde_json::from_value(serde_json::json!({"temperature": 0.5, "stop": ["z"]})).unwrap();
        let r = req.over(&d.decode, "options.").unwrap();
        assert_eq!(
            (r.sampling.temperature, r.stop.clone()),
            (0.5, vec!["z".to_string()])
        );
        assert_eq!(
            (r.sampling.top_k, r.context, r.max_tokens),
            (3, Some(2048), Some(7))
        );
        let unlimited: OllamaOptions =
            serde_json::from_value(serde_json::json!({"num_predict": -1})).unwrap();
        assert_eq!(unlimited.over(&d.decode, "options.").unwrap().max_tokens, None);
    }

    #[test]
    fn a_bad_default_is_left_out_and_said() {
        let d = PackDefaults::from_manifest(&manifest(
            "temperature = 500.0\ntop_k = 5\nmirostat = 2\nnum_keep = 4",
        ));
        assert_eq!(d.decode.sampling.top_k, 5);
        assert_eq!(
            d.decode.sampling.temperature,
            DecodeOptions::default().sampling.temperature
        );
        assert_eq!(d.problems.len(), 2, "{:?}", d.problems);
        assert!(
            d.problems.iter().any(|p| p.contains("defaults.temperature")),
            "{:?}",
            d.problems
        );
        assert!(
            d.problems.iter().any(|p| p.contains("defaults.mirostat")),
            "{:?}",
            d.problems
        );
    }
}
