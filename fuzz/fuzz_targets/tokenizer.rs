//! Fuzzes the tokenizer (`berth::tokenizer::Tokenizer`) loaded from real `tokenizer.json` files:
//! byte 0 picks one, the rest (lossy UTF-8) is encoded and decoded. Nothing may panic; ids stay
//! in the vocabulary; the streaming decoder agrees with `decode`; and a byte-level BPE tokenizer
//! gives back exactly the (normalized) text. Arbitrary ids read from the input decode too.
//!
//! The files are read at run time: `BERTH_FUZZ_TOKENIZERS` (paths separated by `:`), else the
//! ones `scripts/fetch-tokenizers` unpacks under `~/.cache/berth/npm/` (qwen3, gptoss, gemma3).

#![no_main]

use std::path::PathBuf;
use std::sync::OnceLock;

use berth::tokenizer::Tokenizer;
use libfuzzer_sys::fuzz_target;
use tokenizers::{DecoderWrapper, NormalizedString, Normalizer};

/// A loaded tokenizer and whether it is byte-level (so every text round-trips).
struct Loaded {
    tokenizer: Tokenizer,
    byte_level: bool,
}

fn tokenizer_paths() -> Vec<PathBuf> {
    if let Ok(list) = std::env::var("BERTH_FUZZ_TOKENIZERS") {
        return list
            .split(':')
            .filter(|p| !p.is_empty())
            .map(PathBuf::from)
            .collect();
    }
    let cache = std::env::var_os("BERTH_CACHE")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache/berth")))
        .unwrap_or_default();
    ["qwen3", "gptoss", "gemma3"]
        .iter()
        .map(|name| cache.join("npm").join(name).join("tokenizer.json"))
        .filter(|p| p.is_file())
        .collect()
}

fn tokenizers() -> &'static [Loaded] {
    static LOADED: OnceLock<Vec<Loaded>> = OnceLock::new();
    LOADED.get_or_init(|| {
        let paths = tokenizer_paths();
        assert!(
            !paths.is_empty(),
            "no tokenizer.json: run scripts/fetch-tokenizers or set BERTH_FUZZ_TOKENIZERS"
        );
        paths
            .iter()
            .map(|path| {
                let tokenizer = Tokenizer::from_tokenizer_json(path)
                    .unwrap_or_else(|e| panic!("{}: {e}", path.display()));
                let byte_level = matches!(tokenizer.hf().get_decoder(), Some(DecoderWrapper::ByteLevel(_)));
                Loaded {
                    tokenizer,
                    byte_level,
                }
            })
            .collect()
    })
}

/// The streaming decoder's text for `ids`.
fn stream_decode(tokenizer: &Tokenizer, ids: &[u32], skip_special: bool) -> String {
    let mut decoder = tokenizer.incremental_decoder(skip_special);
    let mut text: String = ids.iter().map(|&id| decoder.push(id)).collect();
    text.push_str(&decoder.finish());
    text
}

fuzz_target!(init: {
    // Load the (large) files before the first input, outside libFuzzer's per-input timeout.
    tokenizers();
}, |data: &[u8]| {
    let Some((&pick, rest)) = data.split_first() else {
        return;
    };
    let all = tokenizers();
    let Loaded {
        tokenizer,
        byte_level,
    } = &all[pick as usize % all.len()];
    let text = String::from_utf8_lossy(rest);

    let ids = tokenizer.encode(&text, false);
    let vocab = tokenizer.vocab_size();
    assert!(
        ids.iter().all(|&id| (id as usize) < vocab),
        "an id outside the vocabulary"
    );
    let decoded = tokenizer.decode(&ids, false);
    assert_eq!(
        stream_decode(tokenizer, &ids, false),
        decoded,
        "streaming and plain decode differ"
    );
    assert_eq!(stream_decode(tokenizer, &ids, true), tokenizer.decode(&ids, true));
    let _ = tokenizer.encode(&text, true);

    if *byte_level {
        let mut normalized = NormalizedString::from(text.as_ref());
        if let Some(normalizer) = tokenizer.hf().get_normalizer() {
            normalizer.normalize(&mut normalized).expect("normalizing");
        }
        // Added tokens are cut out before the rest is normalized, so a normalizer that joins
        // characters across such a cut (NFC: `>` + U+0338) may differ from whole-text
        // normalization; compare only where normalization changes nothing or no token is cut.
        let unchanged = normalized.get() == text;
        let no_added = !tokenizer
            .special_tokens()
            .keys()
            .any(|t| text.contains(t.as_str()));
        if unchanged || no_added {
            assert_eq!(decoded, normalized.get(), "byte-level BPE did not round-trip");
        }
    }

    // Arbitrary ids (some past the vocabulary) decode without panicking, both ways alike.
    let ids: Vec<u32> = rest
        .chunks(3)
        .map(|c| c.iter().fold(0u32, |acc, &b| acc << 8 | b as u32) % (vocab as u32 + 8))
        .collect();
    assert_eq!(
        stream_decode(tokenizer, &ids, false),
        tokenizer.decode(&ids, false)
    );
    assert_eq!(stream_decode(tokenizer, &ids, true), tokenizer.decode(&ids, true));
});
