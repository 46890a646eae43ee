//! Constrained decoding: the request's `tool_choice`, `parallel_tool_calls` and `response_format`
//! become a grammar in the model's own chat markup (see [`grammar`]), and an llguidance matcher
//! turns it into an allowed-token mask before each step. llguidance stays behind the small types
//! here: [`ConstraintFactory`] (once per model) and [`SequenceConstraint`] (once per sequence).

mod tokenv;

use std::fmt;
use std::sync::{Arc, OnceLock};

use anyhow::{bail, Context, Result};
use llguidance::api::TopLevelGrammar;
use llguidance::{Matcher, ParserFactory};

/// Lark grammars in each chat format's own markup (written by `berth-chat`).
pub use berth_chat::grammar;
pub use berth_chat::{Markers, ParamError, RequestConstraints, ResponseFormat, ToolChoice, ToolSpec};

use crate::chat::{Detected, ParseStart};
use crate::tokenizer::Tokenizer;

/// Built once per loaded model (format markers checked to be single tokens); llguidance's view
/// of the vocabulary and its parser factory are built at the first constrained request.
pub struct ConstraintFactory {
    tokenizer: Tokenizer,
    padded_vocab: usize,
    /// llguidance's token trie and its precomputed vocabulary slices: tens of megabytes for a
    /// 150k vocabulary (71 MB for Qwen2.5's, measured with heaptrack), so a model that never
    /// serves a constrained request does not hold them.
    parsers: OnceLock<Result<ParserFactory, String>>,
    detected: Detected,
    markers: Markers,
    tools_enabled: bool,
}

impl fmt::Debug for ConstraintFactory {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ConstraintFactory")
            .field("detected", &self.detected)
            .field("markers", &self.markers)
            .field("tools_enabled", &self.tools_enabled)
            .finish()
    }
}

impl ConstraintFactory {
    /// Resolves the format's markers and the model's full (padded) vocabulary for llguidance;
    /// fails when a marker the format needs is not exactly one token.
    pub fn new(
        tokenizer: &Tokenizer,
        detected: &Detected,
        padded_vocab: usize,
        tools_enabled: bool,
    ) -> Result<Self> {
        let markers = Markers::resolve(detected, |text| tokenizer.encode(text, false))
            .with_context(|| format!("constraints for {detected}"))?;
        tokenv::check_vocab(tokenizer, padded_vocab)?;
        Ok(ConstraintFactory {
            tokenizer: tokenizer.clone(),
            padded_vocab,
            parsers: OnceLock::new(),
            detected: *detected,
            markers,
            tools_enabled,
        })
    }

    /// The format and reasoning markup the grammars are written for.
    pub fn detected(&self) -> Detected {
        self.detected
    }

    /// The Lark grammar a request gets, or `None` when nothing is constrained.
    /// `thinking`: whether the template was rendered with thinking on; `start`: the prefill state.
    pub fn grammar(
        &self,
        req: &RequestConstraints,
        thinking: bool,
        start: ParseStart,
    ) -> Result<Option<String>, ParamError> {
        grammar::for_request(
            &self.detected,
            &self.markers,
            req,
            self.tools_enabled,
            thinking,
            start,
        )
    }

    /// `thinking`: whether the template was rendered with thinking on; `start`: the prefill state.
    pub fn build(
        &self,
        req: &RequestConstraints,
        thinking: bool,
        start: ParseStart,
    ) -> Result<Option<SequenceConstraint>, ParamError> {
        let Some(lark) = self.grammar(req, thinking, start)? else {
            return Ok(None);
        };
        self.compile(&lark).map(Some).map_err(|e| ParamError {
            param: self.culprit(req).into(),
            message: format!("the constraint cannot be built: {e:#}"),
        })
    }

    /// Which parameter made a grammar fail: the response schema if it fails on its own, else the
    /// tools' parameter schemas.
    fn culprit(&self, req: &RequestConstraints) -> &'static str {
        let calls = !req.tools.is_empty() && req.tool_choice != ToolChoice::None;
        match &req.response_format {
            ResponseFormat::JsonSchema(s) if calls => {
                let alone = format!("start: {}\n", grammar::json_rule(s));
                if self.compile(&alone).is_err() {
                    "response_format"
                } else {
                    "tools"
                }
            }
            _ if calls => "tools",
            _ => "response_format",
        }
    }

    /// llguidance's parser factory (the token trie over the vocabulary), built on first use.
    fn parsers(&self) -> Result<&ParserFactory> {
        let built = self.parsers.get_or_init(|| {
            let env = tokenv::tok_env(&self.tokenizer, self.padded_vocab, &self.markers.ids())
                .map_err(|e| format!("{e:#}"))?;
            let mut parsers = ParserFactory::new_simple(&env)
                .map_err(|e| format!("building the llguidance token trie: {e:#}"))?;
            // llguidance logs to stderr at level 1 by default: errors reach us as values instead.
            parsers.quiet();
            Ok(parsers)
        });
        built.as_ref().map_err(|e| anyhow::anyhow!("{e}"))
    }

    /// Compiles a Lark grammar into a fresh matcher.
    pub fn compile(&self, lark: &str) -> Result<SequenceConstraint> {
        let parser = self
            .parsers()?
            .create_parser(TopLevelGrammar::from_lark(lark.to_owned()))?;
        let matcher = Matcher::new(Ok(parser));
        if let Some(e) = matcher.get_error() {
            bail!("{e}");
        }
        Ok(SequenceConstraint {
            matcher,
            lark: Arc::from(lark),
        })
    }
}

/// One sequence's constraint: the grammar's matcher, advanced token by token.
pub struct SequenceConstraint {
    matcher: Matcher,
    lark: Arc<str>,
}

impl fmt::Debug for SequenceConstraint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SequenceConstraint")
            .field("errored", &self.matcher.is_error())
            .finish()
    }
}

impl SequenceConstraint {
    /// The allowed tokens before the next step (bit i of word i/32) and whether the grammar
    /// accepts here (then the model's stop tokens are allowed too).
    pub fn compute_mask(&mut self) -> Result<(Vec<u32>, bool)> {
        let mask = self.matcher.compute_mask().map_err(|e| anyhow::anyhow!("{e}"))?;
        let accepting = self.matcher.is_accepting().unwrap_or(false);
        Ok((mask.as_slice().to_vec(), accepting))
    }

    /// Advances past one token; an error leaves the matcher errored for good.
    pub fn consume(&mut self, token: u32) -> Result<()> {
        self.matcher
            .consume_token(token)
            .map_err(|e| anyhow::anyhow!("{e}"))
    }

    /// The tokens the grammar forces next (one possible continuation only), not yet consumed.
    pub fn forced_tokens(&mut self) -> Vec<u32> {
        self.matcher.compute_ff_tokens()
    }

    /// Whether the grammar accepts the text so far (the sequence may end here).
    pub fn is_accepting(&mut self) -> bool {
        self.matcher.is_accepting().unwrap_or(false)
    }

    /// Whether the grammar cannot continue (complete, or errored).
    pub fn is_stopped(&self) -> bool {
        self.matcher.is_stopped()
    }

    /// The matcher's error, once it has one.
    pub fn error(&self) -> Option<String> {
        self.matcher.get_error()
    }

    /// The Lark grammar this constraint follows (for logs and tests).
    pub fn grammar(&self) -> &str {
        &self.lark
    }
}

#[cfg(test)]
mod harmony_tests;
#[cfg(test)]
pub(crate) mod tests;
