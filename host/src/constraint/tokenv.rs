//! The llguidance token environment over Berth's tokenizer: every id of the padded vocabulary
//! with its bytes; added, control and padding tokens are "special" (0xFF-prefixed), so free text
//! never produces them and grammars name them by id.

use std::sync::Arc;

use anyhow::{bail, Result};
use toktrie::{TokEnv, TokRxInfo, TokTrie, TokenId, TokenizerEnv};

use crate::tokenizer::Tokenizer;

struct BerthTokEnv {
    trie: TokTrie,
    tokenizer: Tokenizer,
}

impl TokenizerEnv for BerthTokEnv {
    fn tok_trie(&self) -> &TokTrie {
        &self.trie
    }

    fn tokenize_bytes(&self, s: &[u8]) -> Vec<TokenId> {
        self.tokenizer.encode(&String::from_utf8_lossy(s), false)
    }
}

/// Fails when the model has fewer output rows (`padded_vocab`) than the tokenizer has ids.
pub fn check_vocab(tokenizer: &Tokenizer, padded_vocab: usize) -> Result<()> {
    let n = tokenizer.vocab_size();
    if padded_vocab < n {
        bail!("the model's vocabulary ({padded_vocab}) is smaller than its tokenizer's ({n})");
    }
    Ok(())
}

/// The token environment for a tokenizer, over `padded_vocab` ids (the model's output rows).
/// `markers`: tokens the grammars write by id; never end-of-sequence tokens to llguidance, even
/// where the tokenizer lists them as stops (harmony's `<|end|>` closes every analysis message).
pub fn tok_env(tokenizer: &Tokenizer, padded_vocab: usize, markers: &[u32]) -> Result<TokEnv> {
    check_vocab(tokenizer, padded_vocab)?;
    let n = tokenizer.vocab_size();
    let added: std::collections::HashSet<u32> = tokenizer.special_tokens().values().copied().collect();
    let mut words: Vec<Vec<u8>> = Vec::with_capacity(padded_vocab);
    for id in 0..padded_vocab as u32 {
        let bytes = if (id as usize) < n {
            tokenizer.token_bytes(id)
        } else {
            &[]
        };
        let special =
            (id as usize) >= n || added.contains(&id) || tokenizer.is_special(id) || bytes.is_empty();
        if special {
            let mut w = vec![TokTrie::SPECIAL_TOKEN_MARKER];
            if bytes.is_empty() {
                w.extend_from_slice(format!("<[{id}]>").as_bytes());
            } else {
                w.extend_from_slice(bytes);
            }
            words.push(w);
        } else {
            words.push(bytes.to_vec());
        }
    }
    let stop = |id: &u32| !markers.contains(id);
    let stops: Vec<u32> = tokenizer.stop_ids().iter().copied().filter(stop).collect();
    let eot = tokenizer.eot_id().filter(stop);
    let eos = tokenizer
        .eos_id()
        .filter(stop)
        .or(eot)
        .or(stops.first().copied())
        .unwrap_or(0);
    let mut info = TokRxInfo::new(padded_vocab as u32, eos);
    info.tok_bos = tokenizer.bos_id();
    info.tok_end_of_turn = eot;
    let mut trie = TokTrie::from(&info, &words);
    if !stops.is_empty() {
        trie = trie.with_eos_tokens(&stops);
    }
    Ok(Arc::new(BerthTokEnv {
        trie,
        tokenizer: tokenizer.clone(),
    }))
}
