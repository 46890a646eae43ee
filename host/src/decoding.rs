//! Everything that turns one sequence's logits into tokens and text: the sampler, the optional
//! constraint (its mask computed by [`DecodeState::prepare`], which may run on another thread
//! while the plugin's forward pass does), stop tokens, stop strings (held back from the stream
//! until they can no longer match), `max_tokens` and the context budget.
//!
//! One sequence's loop, written out for one sequence (the engine runs it per row of its batch):
//!
//! ```text
//! let mut st = DecodeState::new(opts, &tokenizer, &stop_tokens, context - prompt_len);
//! (prefill the prompt; meanwhile, on another thread: st.prepare())
//! loop {
//!     st.prepare()?;                      // no-op when the mask is ready
//!     let t = st.pick(&logits_row);       // masked sample
//!     let step = st.accept(t);            // text to stream, finish reason
//!     if step.finished.is_some() { break }
//!     let mut feed = vec![t];
//!     for f in st.forced() {              // tokens the grammar fixes: no sampling needed
//!         let step = st.accept(f);        // (plugin-forced tokens go through accept() too)
//!         feed.push(f);
//!         if step.finished.is_some() { break }
//!     }
//!     (decode `feed`; meanwhile, on another thread: st.prepare())
//! }
//! let tail = st.finish();                 // held-back text
//! ```

use std::collections::HashSet;

use anyhow::Result;

use crate::constraint::{ParamError, SequenceConstraint};
use crate::sampling::{Sampler, SamplingParams, TokenLogprobs};
use crate::tokenizer::{IncrementalDecoder, Tokenizer};

/// Why a sequence ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FinishReason {
    /// A stop token, a stop string, or the end of the grammar.
    Stop,
    /// `max_tokens` or the context length.
    Length,
    /// The parsed message holds tool calls (decided by the caller from the parse).
    ToolCalls,
}

impl FinishReason {
    /// The OpenAI spelling: `stop`, `length`, `tool_calls`.
    pub fn as_str(self) -> &'static str {
        match self {
            FinishReason::Stop => "stop",
            FinishReason::Length => "length",
            FinishReason::ToolCalls => "tool_calls",
        }
    }
}

/// A `stop` field: a string or an array of up to `max` strings (`null` = none; empty strings are
/// dropped). `param` is the name the client used (`stop` for OpenAI, which allows 4;
/// `options.stop` for Ollama); a wrong shape or too many sequences is an error naming it.
pub fn parse_stop(v: Option<&serde_json::Value>, param: &str, max: usize) -> Result<Vec<String>, ParamError> {
    use serde_json::Value;
    let bad = |m: String| ParamError {
        param: param.into(),
        message: m,
    };
    let shape = || bad(format!("'{param}' must be a string or an array of strings"));
    let list = match v {
        None | Some(Value::Null) => Vec::new(),
        Some(Value::String(s)) => vec![s.clone()],
        Some(Value::Array(a)) => a
            .iter()
            .map(|x| x.as_str().map(str::to_owned))
            .collect::<Option<Vec<_>>>()
            .ok_or_else(shape)?,
        Some(_) => return Err(shape()),
    };
    if list.len() > max {
        return Err(bad(format!(
            "'{param}' takes at most {max} sequences; got {}",
            list.len()
        )));
    }
    Ok(list.into_iter().filter(|s| !s.is_empty()).collect())
}

/// What one sequence asks of decoding.
#[derive(Debug, Default)]
pub struct DecodeOptions {
    /// Sampling parameters.
    pub sampling: SamplingParams,
    /// `max_tokens` / `max_completion_tokens` / `num_predict`; `None` = until the context is full.
    pub max_tokens: Option<usize>,
    /// Stop strings (OpenAI allows up to 4): output ends before the first match.
    pub stop: Vec<String>,
    /// The context this request may fill, prompt and reply (Ollama's `num_ctx`, a pack's
    /// default); `None`: the server's. Never more than the model is loaded with.
    pub context: Option<usize>,
    /// The grammar constraint, if the request has one.
    pub constraint: Option<SequenceConstraint>,
    /// Report each generated token's log-probability and this many alternatives (`logprobs` /
    /// `top_logprobs`); `None`: no log-probabilities.
    pub logprobs: Option<usize>,
}

impl DecodeOptions {
    /// The sampling and stopping settings alone (no constraint, no log-probabilities): a base a
    /// request's own fields are applied over.
    pub fn settings(&self) -> DecodeOptions {
        DecodeOptions {
            sampling: self.sampling.clone(),
            max_tokens: self.max_tokens,
            stop: self.stop.clone(),
            context: self.context,
            constraint: None,
            logprobs: None,
        }
    }
}

/// The result of accepting one token.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Step {
    /// Text that is safe to emit now (a possible stop-string prefix is held back).
    pub text: String,
    /// Set when the sequence has ended.
    pub finished: Option<FinishReason>,
}

/// Everything that turns logits into tokens and text for one sequence.
pub struct DecodeState {
    sampler: Sampler,
    constraint: Option<SequenceConstraint>,
    /// The mask for the next pick, once [`DecodeState::prepare`] computed it.
    mask: Option<Vec<u32>>,
    stop_tokens: Vec<u32>,
    stop_set: HashSet<u32>,
    stop_strings: Vec<String>,
    budget: usize,
    generated: usize,
    decoder: IncrementalDecoder,
    /// Decoded text not yet emitted (it may be the start of a stop string).
    held: String,
    finished: Option<FinishReason>,
    /// Set when the constraint failed: the sequence ends at the next step.
    constraint_failed: bool,
    /// The stop string that ended the output, once one matched.
    matched_stop: Option<String>,
    /// How many alternatives to report with each token's log-probability, when asked.
    logprobs: Option<usize>,
    /// The log-probabilities of the last picked token, until taken.
    last_logprobs: Option<TokenLogprobs>,
}

impl std::fmt::Debug for DecodeState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DecodeState")
            .field("generated", &self.generated)
            .field("budget", &self.budget)
            .field("finished", &self.finished)
            .field("constraint", &self.constraint)
            .finish()
    }
}

impl DecodeState {
    /// A new sequence. `stop_tokens`: the model's and tokenizer's stop ids; `context_left`: how
    /// many tokens still fit in the context after the prompt. Text keeps special tokens (the chat
    /// parser reads their markup); stop tokens are never part of it.
    pub fn new(
        opts: DecodeOptions,
        tokenizer: &Tokenizer,
        stop_tokens: &HashSet<u32>,
        context_left: usize,
    ) -> Self {
        let mut stops: Vec<u32> = stop_tokens.iter().copied().collect();
        stops.sort_unstable();
        let budget = opts.max_tokens.unwrap_or(usize::MAX).min(context_left);
        DecodeState {
            sampler: Sampler::new(opts.sampling),
            constraint: opts.constraint,
            mask: None,
            stop_set: stop_tokens.clone(),
            stop_tokens: stops,
            stop_strings: opts.stop.into_iter().filter(|s| !s.is_empty()).collect(),
            budget,
            generated: 0,
            decoder: tokenizer.incremental_decoder(false),
            held: String::new(),
            finished: (budget == 0).then_some(FinishReason::Length),
            constraint_failed: false,
            matched_stop: None,
            logprobs: opts.logprobs,
            last_logprobs: None,
        }
    }

    /// Why the sequence ended, once it has.
    pub fn finished(&self) -> Option<FinishReason> {
        self.finished
    }

    /// The stop string (one of `DecodeOptions::stop`) that ended the output, if one did.
    pub fn stop_sequence(&self) -> Option<&str> {
        self.matched_stop.as_deref()
    }

    /// Tokens accepted so far.
    pub fn generated(&self) -> usize {
        self.generated
    }

    /// Whether a constraint is in force.
    pub fn is_constrained(&self) -> bool {
        self.constraint.is_some()
    }

    /// Whether tokens are picked by argmax (so drafted tokens can be checked exactly).
    pub fn is_greedy(&self) -> bool {
        self.sampler.params().is_greedy()
    }

    /// Whether the next pick may be `token`: not after the end, and inside the constraint's mask
    /// (computed here when not ready yet); always true without a constraint.
    pub fn allows(&mut self, token: u32) -> bool {
        if self.finished.is_some() || self.constraint_failed {
            return false;
        }
        if self.constraint.is_none() {
            return true;
        }
        let _ = self.prepare();
        self.mask.as_deref().is_some_and(|m| {
            m.get(token as usize / 32)
                .is_some_and(|w| w & (1 << (token % 32)) != 0)
        })
    }

    /// Computes the next token mask; Send, so the engine may run it on another thread while the plugin decodes.
    pub fn prepare(&mut self) -> Result<()> {
        if self.mask.is_some() || self.finished.is_some() || self.constraint_failed {
            return Ok(());
        }
        let Some(c) = self.constraint.as_mut() else {
            return Ok(());
        };
        match c.compute_mask() {
            Ok((mut mask, accepting)) => {
                // Stop tokens are allowed exactly when the grammar accepts.
                for &t in &self.stop_tokens {
                    if let Some(w) = mask.get_mut(t as usize / 32) {
                        if accepting {
                            *w |= 1 << (t % 32);
                        } else {
                            *w &= !(1 << (t % 32));
                        }
                    }
                }
                if mask.iter().all(|&w| w == 0) {
                    self.fail("the grammar allows no token here");
                } else {
                    self.mask = Some(mask);
                }
            }
            Err(e) => self.fail(&format!("{e:#}")),
        }
        Ok(())
    }

    fn fail(&mut self, why: &str) {
        eprintln!("berth: constraint error, ending the sequence: {why}");
        self.constraint_failed = true;
    }

    /// Tokens the grammar forces next (no other continuation is allowed), to be fed to the model
    /// in one batch and passed to [`DecodeState::accept`] without sampling; empty when none are,
    /// and when the request asked for log-probabilities (each token then needs its own row).
    pub fn forced(&mut self) -> Vec<u32> {
        if self.finished.is_some() || self.constraint_failed || self.logprobs.is_some() {
            return Vec::new();
        }
        let Some(c) = self.constraint.as_mut() else {
            return Vec::new();
        };
        let mut forced = c.forced_tokens();
        if let Some(i) = forced.iter().position(|t| self.stop_set.contains(t)) {
            forced.truncate(i);
        }
        forced
    }

    /// Picks the next token from this sequence's logits row (mask applied if any).
    pub fn pick(&mut self, logits: &[f32]) -> u32 {
        if self.constraint.is_some() && self.mask.is_none() {
            let _ = self.prepare();
        }
        if self.constraint_failed {
            return self.stop_tokens.first().copied().unwrap_or(0);
        }
        let mask = self.mask.as_deref();
        match self.logprobs {
            Some(top) => {
                let (token, lp) = self.sampler.sample_with_logprobs(logits, mask, top);
                self.last_logprobs = Some(lp);
                token
            }
            None => self.sampler.sample_masked(logits, mask),
        }
    }

    /// The log-probabilities of the token [`DecodeState::pick`] last returned, when the request
    /// asked for them (once).
    pub fn take_logprobs(&mut self) -> Option<TokenLogprobs> {
        self.last_logprobs.take()
    }

    /// Takes a token (picked or forced): advances constraint, penalties, detokenizer and stop checks.
    pub fn accept(&mut self, token: u32) -> Step {
        self.mask = None;
        if self.finished.is_some() {
            return Step {
                text: String::new(),
                finished: self.finished,
            };
        }
        if self.constraint_failed || self.stop_set.contains(&token) {
            return self.end(FinishReason::Stop);
        }
        if let Some(c) = self.constraint.as_mut() {
            if let Err(e) = c.consume(token) {
                self.fail(&format!("token {token} rejected: {e:#}"));
                return self.end(FinishReason::Stop);
            }
        }
        self.sampler.accept(token);
        self.generated += 1;
        self.held.push_str(&self.decoder.push(token));
        if let Some((at, len)) = self.first_stop_match() {
            self.matched_stop = Some(self.held[at..at + len].to_string());
            self.held.truncate(at);
            let text = std::mem::take(&mut self.held);
            self.finished = Some(FinishReason::Stop);
            return Step {
                text,
                finished: self.finished,
            };
        }
        let mut text = self.take_safe();
        let grammar_done = self
            .constraint
            .as_ref()
            .is_some_and(SequenceConstraint::is_stopped);
        if grammar_done || self.generated >= self.budget {
            text.push_str(&self.finish());
            self.finished = Some(if grammar_done {
                FinishReason::Stop
            } else {
                FinishReason::Length
            });
        }
        Step {
            text,
            finished: self.finished,
        }
    }

    fn end(&mut self, reason: FinishReason) -> Step {
        let text = self.finish();
        self.finished = Some(reason);
        Step {
            text,
            finished: self.finished,
        }
    }

    /// Flushes held-back text at the end.
    pub fn finish(&mut self) -> String {
        self.held.push_str(&self.decoder.finish());
        if let Some((at, len)) = self.first_stop_match() {
            self.matched_stop = Some(self.held[at..at + len].to_string());
            self.held.truncate(at);
        }
        std::mem::take(&mut self.held)
    }

    /// The earliest complete stop-string match in the held text.
    fn first_stop_match(&self) -> Option<(usize, usize)> {
        self.stop_strings
            .iter()
            .filter_map(|s| self.held.find(s.as_str()).map(|at| (at, s.len())))
            .min()
    }

    /// Emits the held text except a tail that could still start a stop string.
    fn take_safe(&mut self) -> String {
        let mut keep_from = self.held.len();
        for s in &self.stop_strings {
            // The longest suffix of `held` that is a proper prefix of `s`.
            let max = s.len().saturating_sub(1).min(self.held.len());
            for n in (1..=max).rev() {
                let start = self.held.len() - n;
                if self.held.is_char_boundary(start) && s.starts_with(&self.held[start..]) {
                    keep_from = keep_from.min(start);
                    break;
                }
            }
        }
        let rest = self.held.split_off(keep_from);
        std::mem::replace(&mut self.held, rest)
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// A byte-level tokenizer over a tiny vocabulary, from a GGUF-free tokenizer.json.
    pub(crate) fn tiny_tokenizer() -> Tokenizer {
        crate::constraint::tests::toy_tokenizer()
    }

    fn state(tok: &Tokenizer, max: Option<usize>, stop: &[&str], ctx: usize) -> DecodeState {
        let stops: HashSet<u32> = tok.stop_ids().iter().copied().collect();
        DecodeState::new(
            DecodeOptions {
                sampling: SamplingParams::greedy(),
                max_tokens: max,
                stop: stop.iter().map(|s| s.to_string()).collect(),
                context: None,
                constraint: None,
                logprobs: None,
            },
            tok,
            &stops,
            ctx,
        )
    }

    fn feed(st: &mut DecodeState, tok: &Tokenizer, text: &str) -> (String, Option<FinishReason>) {
        let mut out = String::new();
        for id in tok.encode(text, false) {
            let step = st.accept(id);
            out.push_str(&step.text);
            if step.finished.is_some() {
                return (out, step.finished);
            }
        }
        out.push_str(&st.finish());
        (out, None)
    }

    #[test]
    fn stop_strings_are_held_back_then_cut() {
        let tok = tiny_tokenizer();
        let mut st = state(&tok, None, &["END"], 1000);
        let mut streamed = Vec::new();
        for id in tok.encode("abc EN", false) {
            streamed.push(st.accept(id).text);
        }
        assert_eq!(streamed.concat(), "abc ", "the possible 'EN' prefix is held back");
        let (rest, fin) = feed(&mut st, &tok, "D more");
        assert_eq!((rest.as_str(), fin), ("", Some(FinishReason::Stop)));
        assert_eq!(st.stop_sequence(), Some("END"), "the matched stop string is kept");

        let mut st = state(&tok, None, &["STOP", "END"], 1000);
        let (out, fin) = feed(&mut st, &tok, "x END y STOP");
        assert_eq!((out.as_str(), fin), ("x ", Some(FinishReason::Stop)));
        assert_eq!(
            st.stop_sequence(),
            Some("END"),
            "the earliest match is the one reported"
        );

        let mut st = state(&tok, None, &["END"], 1000);
        let (out, fin) = feed(&mut st, &tok, "abc ENx");
        assert_eq!(
            (out.as_str(), fin),
            ("abc ENx", None),
            "a failed prefix is released"
        );
        assert_eq!(st.stop_sequence(), None);
    }

    #[test]
    fn max_tokens_and_context_end_with_length() {
        let tok = tiny_tokenizer();
        let mut st = state(&tok, Some(3), &[], 1000);
        let (out, fin) = feed(&mut st, &tok, "abcdef");
        assert_eq!((out.len(), fin), (3, Some(FinishReason::Length)));
        let mut st = state(&tok, Some(10), &[], 2);
        assert_eq!(feed(&mut st, &tok, "abcdef").1, Some(FinishReason::Length));
        assert_eq!(
            state(&tok, Some(0), &[], 10).finished(),
            Some(FinishReason::Length)
        );
    }

    #[test]
    fn a_stop_token_ends_without_text() {
        let tok = tiny_tokenizer();
        let mut st = state(&tok, None, &[], 1000);
        let stop = tok.stop_ids()[0];
        assert_eq!(st.accept(5).finished, None);
        let step = st.accept(stop);
        assert_eq!(step.finished, Some(FinishReason::Stop));
        assert_eq!(st.generated(), 1);
    }

    #[test]
    fn stop_parameter_forms() {
        use serde_json::json;
        assert_eq!(parse_stop(None, "stop", 4).unwrap(), Vec::<String>::new());
        assert_eq!(
            parse_stop(Some(&json!(null)), "stop", 4).unwrap(),
            Vec::<String>::new()
        );
        assert_eq!(parse_stop(Some(&json!("x")), "stop", 4).unwrap(), vec!["x"]);
        assert_eq!(
            parse_stop(Some(&json!(["a", "b"])), "stop", 4).unwrap(),
            vec!["a", "b"]
        );
        assert_eq!(parse_stop(Some(&json!(["", "b"])), "stop", 4).unwrap(), vec!["b"]);
        let four = json!(["a", "b", "c", "d"]);
        assert_eq!(parse_stop(Some(&four), "stop", 4).unwrap().len(), 4);
        for bad in [json!(3), json!([1]), json!(["a", "b", "c", "d", "e"])] {
            let e = parse_stop(Some(&bad), "stop", 4).unwrap_err();
            assert_eq!(e.param, "stop");
            assert!(e.message.contains("'stop'"), "{}", e.message);
        }
        // Ollama's options allow more, and errors name the option as the client spelled it.
        let five = json!(["a", "b", "c", "d", "e"]);
        assert_eq!(parse_stop(Some(&five), "options.stop", 16).unwrap().len(), 5);
        let e = parse_stop(Some(&json!({"a": 1})), "options.stop", 16).unwrap_err();
        assert_eq!(e.param, "options.stop");
        assert!(e.message.contains("'options.stop'"), "{}", e.message);
    }

    #[test]
    fn decode_state_is_send() {
        fn send<T: Send>() {}
        send::<DecodeState>();
        send::<SequenceConstraint>();
        fn shared<T: Send + Sync>() {}
        shared::<crate::constraint::ConstraintFactory>();
    }
}
