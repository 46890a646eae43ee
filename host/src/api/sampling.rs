//! The sampling fields the flat-bodied surfaces share. [`SamplingExtensions`] are the fields
//! llama.cpp's server takes beyond each API's own (`top_k`, `min_p`, `seed`, the penalties,
//! `repeat_last_n`): chat completions, completions, Responses and Anthropic Messages all read it
//! from their body, so a field added there reaches all four (Ollama carries the same settings
//! under `options`, with its own names). [`OpenAiSampling`] adds OpenAI's own `temperature`,
//! `top_p` and `stop`.

use super::body::{int_in, num_in, Int, RequestBody};
use super::ApiError;
use crate::decoding::DecodeOptions;
use crate::sampling::SamplingParams;
use serde::Deserialize;
use serde_json::Value;

/// The sampling fields beyond each API's own, as llama.cpp's server names them.
#[derive(Debug, Default, Deserialize)]
#[serde(remote = "Self")]
pub struct SamplingExtensions {
    /// -1 (off) to 2^20.
    pub top_k: Option<Int>,
    /// 0-1.
    pub min_p: Option<f64>,
    /// Seed for reproducible sampling.
    pub seed: Option<Int>,
    /// -2 to 2.
    pub presence_penalty: Option<f64>,
    /// -2 to 2.
    pub frequency_penalty: Option<f64>,
    /// 0-10 (1 is off).
    pub repetition_penalty: Option<f64>,
    /// How many recent tokens `repetition_penalty` looks at: -1 (all) to 2^20; 0 is off.
    pub repeat_last_n: Option<Int>,
}

/// OpenAI's own sampling and stopping fields. The token cap (named differently by each surface)
/// and `logit_bias` (which needs the model) are the request's.
#[derive(Debug, Default, Deserialize)]
#[serde(remote = "Self")]
pub struct OpenAiSampling {
    /// 0-2.
    pub temperature: Option<f64>,
    /// 0-1.
    pub top_p: Option<f64>,
    /// Up to 4 stop strings (a string or a list).
    pub stop: Option<Value>,
}

crate::object_only!(SamplingExtensions, OpenAiSampling);

impl RequestBody for SamplingExtensions {
    fn validate(&self) -> Result<(), ApiError> {
        self.apply(&mut SamplingParams::default())
    }
}

impl RequestBody for OpenAiSampling {
    fn validate(&self) -> Result<(), ApiError> {
        self.decode_options(None, &DecodeOptions::default()).map(|_| ())
    }
}

impl SamplingExtensions {
    /// Sets what these fields ask for; each value out of range is a 400 naming its field.
    pub fn apply(&self, s: &mut SamplingParams) -> Result<(), ApiError> {
        if let Some(k) = int_in("top_k", self.top_k, -1, 1 << 20)? {
            s.top_k = k.max(0) as usize;
        }
        if let Some(p) = num_in("min_p", self.min_p, 0.0, 1.0)? {
            s.min_p = p as f32;
        }
        if let Some(Int(seed)) = self.seed {
            s.seed = Some(seed as u64);
        }
        if let Some(p) = num_in("presence_penalty", self.presence_penalty, -2.0, 2.0)? {
            s.presence_penalty = p as f32;
        }
        if let Some(p) = num_in("frequency_penalty", self.frequency_penalty, -2.0, 2.0)? {
            s.frequency_penalty = p as f32;
        }
        if let Some(p) = num_in("repetition_penalty", self.repetition_penalty, 0.0, 10.0)? {
            s.repeat_penalty = p as f32;
        }
        if let Some(n) = int_in("repeat_last_n", self.repeat_last_n, -1, 1 << 20)? {
            s.repeat_last_n = if n < 0 { usize::MAX } else { n as usize };
        }
        Ok(())
    }
}

impl OpenAiSampling {
    /// The decode options these fields ask for over `base` (the pack's defaults), with a token
    /// cap; each value out of range is a 400 naming its field.
    pub fn decode_options(
        &self,
        max_tokens: Option<usize>,
        base: &DecodeOptions,
    ) -> Result<DecodeOptions, ApiError> {
        let mut s = base.sampling.clone();
        if let Some(t) = num_in("temperature", self.temperature, 0.0, 2.0)? {
            s.temperature = t as f32;
        }
        if let Some(p) = num_in("top_p", self.top_p, 0.0, 1.0)? {
            s.top_p = p as f32;
        }
        let stop = match &self.stop {
            Some(v) => crate::decoding::parse_stop(Some(v), "stop", 4).map_err(ApiError::from)?,
            None => base.stop.clone(),
        };
        Ok(DecodeOptions {
            sampling: s,
            max_tokens: max_tokens.or(base.max_tokens),
            stop,
            ..base.settings()
        })
    }
}

/// The decode options of a body with OpenAI's sampling fields and the extensions over `base` (the
/// pack's defaults), with a token cap (`json`: the whole body).
pub fn openai_decode(
    json: &serde_json::Map<String, Value>,
    max_tokens: Option<usize>,
    base: &DecodeOptions,
) -> Result<DecodeOptions, ApiError> {
    let mut d = super::body::part::<OpenAiSampling>(json)?.decode_options(max_tokens, base)?;
    super::body::part::<SamplingExtensions>(json)?.apply(&mut d.sampling)?;
    Ok(d)
}
