//! OpenAI's sampling and stopping fields, one struct for every surface that carries them: chat
//! completions, completions and (as extensions, llama.cpp-style) Responses. A field added here
//! reaches each of them.

use super::body::{int_in, num_in, Int, RequestBody};
use super::ApiError;
use crate::decoding::DecodeOptions;
use crate::sampling::SamplingParams;
use serde::Deserialize;
use serde_json::Value;

/// OpenAI's sampling and stopping fields. The token cap (named differently by each surface) and
/// `logit_bias` (which needs the model) are the request's.
#[derive(Debug, Default, Deserialize)]
#[serde(remote = "Self")]
pub struct OpenAiSampling {
    /// 0-2.
    pub temperature: Option<f64>,
    /// 0-1.
    pub top_p: Option<f64>,
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
    /// 0-10.
    pub repetition_penalty: Option<f64>,
    /// Up to 4 stop strings (a string or a list).
    pub stop: Option<Value>,
}

crate::object_only!(OpenAiSampling);

impl RequestBody for OpenAiSampling {
    fn validate(&self) -> Result<(), ApiError> {
        self.decode_options(None).map(|_| ())
    }
}

impl OpenAiSampling {
    /// The decode options these fields ask for, with a token cap; each value out of range is a
    /// 400 naming its field.
    pub fn decode_options(&self, max_tokens: Option<usize>) -> Result<DecodeOptions, ApiError> {
        let mut s = SamplingParams::default();
        if let Some(t) = num_in("temperature", self.temperature, 0.0, 2.0)? {
            s.temperature = t as f32;
        }
        if let Some(p) = num_in("top_p", self.top_p, 0.0, 1.0)? {
            s.top_p = p as f32;
        }
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
        Ok(DecodeOptions {
            sampling: s,
            max_tokens,
            stop: crate::decoding::parse_stop(self.stop.as_ref(), "stop", 4).map_err(ApiError::from)?,
            constraint: None,
            logprobs: None,
        })
    }
}
