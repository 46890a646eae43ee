//! Turns one sequence's logits into tokens and text: sampler, stop tokens, stop strings,
//! `max_tokens` and the context budget. The only place the engine touches sampling, so the
//! constraint-aware `decoding::DecodeState` replaces it here with a few lines.

use crate::sampling::{Sampler, SamplingParams};
use crate::tokenizer::{IncrementalDecoder, Tokenizer};
use std::collections::HashSet;

/// Why a sequence ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FinishReason {
    /// A stop token or stop string.
    Stop,
    /// `max_tokens` or the context length.
    Length,
}

impl FinishReason {
    /// The OpenAI spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            FinishReason::Stop => "stop",
            FinishReason::Length => "length",
        }
    }
}

/// What a request asks of decoding.
#[derive(Clone, Debug, Default)]
pub struct DecodeOptions {
    /// Sampling parameters.
    pub sampling: SamplingParams,
    /// Most tokens to generate; `None` = until the context is full.
    pub max_tokens: Option<usize>,
    /// Stop strings: output ends before the first match.
    pub stop: Vec<String>,
}

/// The result of accepting one token.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Step {
    /// Text safe to emit now (a possible stop-string prefix is held back).
    pub text: String,
    /// Set when the sequence has ended.
    pub finished: Option<FinishReason>,
}

/// Per-sequence decoding state.
pub struct SequenceDecoder {
    sampler: Sampler,
    stop_tokens: HashSet<u32>,
    stop: Vec<String>,
    budget: usize,
    generated: usize,
    detok: IncrementalDecoder,
    held: String,
}

impl SequenceDecoder {
    /// A decoder for one sequence with `context_left` positions after its prompt.
    pub fn new(
        opts: DecodeOptions,
        tokenizer: &Tokenizer,
        stop_tokens: &HashSet<u32>,
        context_left: usize,
    ) -> Self {
        let budget = opts.max_tokens.unwrap_or(usize::MAX).min(context_left);
        SequenceDecoder {
            sampler: Sampler::new(opts.sampling),
            stop_tokens: stop_tokens.clone(),
            stop: opts.stop.into_iter().filter(|s| !s.is_empty()).collect(),
            budget,
            generated: 0,
            // Special tokens stay in the text: chat markup (`<tool_call>`, `<think>`) is what the parser reads.
            detok: tokenizer.incremental_decoder(false),
            held: String::new(),
        }
    }

    /// Work to do before the next pick (a constraint mask); runs while the plugin decodes.
    pub fn prepare(&mut self) {}

    /// Whether the budget allows no token at all (`max_tokens: 0`).
    pub fn exhausted(&self) -> bool {
        self.generated >= self.budget
    }

    /// Picks the next token from this sequence's logits row.
    pub fn pick(&mut self, logits: &[f32]) -> u32 {
        self.sampler.sample(logits)
    }

    /// Takes a picked token: stop tokens, detokenizing, stop strings and the budget.
    pub fn accept(&mut self, token: u32) -> Step {
        if self.stop_tokens.contains(&token) {
            return Step {
                text: self.flush(),
                finished: Some(FinishReason::Stop),
            };
        }
        self.generated += 1;
        self.held.push_str(&self.detok.push(token));
        if let Some(at) = self.stop.iter().filter_map(|s| self.held.find(s.as_str())).min() {
            self.held.truncate(at);
            return Step {
                text: std::mem::take(&mut self.held),
                finished: Some(FinishReason::Stop),
            };
        }
        if self.generated >= self.budget {
            return Step {
                text: self.flush(),
                finished: Some(FinishReason::Length),
            };
        }
        // Hold back the longest tail that may still grow into a stop string.
        let keep = self
            .stop
            .iter()
            .map(|s| longest_prefix_suffix(&self.held, s))
            .max()
            .unwrap_or(0);
        let emit = self.held.len() - keep;
        let text = self.held[..emit].to_string();
        self.held.drain(..emit);
        Step { text, finished: None }
    }

    /// Tokens generated so far (stop tokens excluded).
    pub fn generated(&self) -> usize {
        self.generated
    }

    fn flush(&mut self) -> String {
        let mut t = std::mem::take(&mut self.held);
        t.push_str(&self.detok.finish());
        t
    }
}

/// Length of the longest suffix of `text` that is a proper prefix of `stop` (on char bounds).
fn longest_prefix_suffix(text: &str, stop: &str) -> usize {
    (1..stop.len().min(text.len() + 1))
        .rev()
        .find(|&n| {
            stop.is_char_boundary(n) && text.is_char_boundary(text.len() - n) && text.ends_with(&stop[..n])
        })
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::longest_prefix_suffix;

    #[test]
    fn held_back_tail_is_the_longest_stop_prefix() {
        assert_eq!(longest_prefix_suffix("hello wor", "world"), 3);
        assert_eq!(longest_prefix_suffix("hello", "xyz"), 0);
        assert_eq!(longest_prefix_suffix("ab", "abc"), 2);
    }
}
