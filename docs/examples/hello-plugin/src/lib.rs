//! `hello`: the smallest complete Berth plugin, written as a tutorial.
//!
//! A plugin is a `cdylib` that implements two traits from `berth-plugin-api` and calls
//! `export_plugin!` once:
//!
//! - [`Family`] says what the plugin serves (its manifest), scores model packs (`probe`) and
//!   loads one (`create`);
//! - [`Model`] is one loaded instance: it reports its vocabulary and stop tokens (`describe`) and
//!   turns batches of tokens into logits (`decode`), keeping per-sequence state.
//!
//! The SDK turns both into the versioned C ABI the host loads, and catches panics at the
//! boundary so a bug here becomes an error instead of a crash.
//!
//! The "model" replays a greeting. The pack holds `hello.json`, e.g. `{"greeting": [5, 6, 7]}`;
//! after a token of the greeting it predicts the token that follows it there, after the last one
//! the stop token 0, and after anything else the greeting's first token. Greedy decoding of any
//! prompt therefore yields `5 6 7` and stops.

use berth_plugin_api::{
    BatchView, Family, LoadConfig, LogitsOut, Model, ModelDescription, PluginError, PluginManifest,
};
use std::collections::HashMap;

/// Logits per row: token ids run from 0 to 31.
const VOCAB: u32 = 32;
/// The token that ends generation.
const STOP: i32 = 0;
/// Longest sequence accepted, in tokens.
const CONTEXT: u32 = 256;
/// Most sequences held at once.
const MAX_SEQUENCES: u32 = 8;

/// The family: what this plugin serves and how it loads a model.
pub struct HelloFamily;

impl Family for HelloFamily {
    type Model = HelloModel;

    fn manifest() -> PluginManifest {
        // The SDK fills in the ABI version and panic strategy.
        PluginManifest {
            name: "hello".into(),
            version: env!("CARGO_PKG_VERSION").into(),
            description: "replays the greeting in its pack (tutorial plugin)".into(),
            families: vec!["hello".into()],
            architectures: vec!["hello".into()],
            weight_formats: vec!["hello".into()],
            ..Default::default()
        }
    }

    fn probe(model_config: &serde_json::Value) -> u32 {
        // The host offers every pack to every plugin and picks the highest score; 0 = no.
        match model_config.get("family").and_then(|f| f.as_str()) {
            Some("hello") => 100,
            _ => 0,
        }
    }

    fn create(config: &LoadConfig) -> Result<HelloModel, PluginError> {
        // Everything about the model lives in the pack directory.
        let path = config.pack_dir.join("hello.json");
        let text = std::fs::read_to_string(&path)
            .map_err(|e| PluginError::failed(format!("{}: {e}", path.display())))?;
        let json: serde_json::Value = serde_json::from_str(&text)
            .map_err(|e| PluginError::failed(format!("{}: {e}", path.display())))?;
        let greeting: Vec<i32> = json["greeting"]
            .as_array()
            .ok_or_else(|| PluginError::failed(format!("{}: no \"greeting\" array", path.display())))?
            .iter()
            .map(|t| t.as_i64().unwrap_or(-1) as i32)
            .collect();
        if let Some(bad) = greeting.iter().find(|&&t| t <= STOP || t >= VOCAB as i32) {
            return Err(PluginError::failed(format!(
                "greeting token {bad} must be between 1 and {}",
                VOCAB - 1
            )));
        }
        Ok(HelloModel {
            greeting,
            sequences: HashMap::new(),
        })
    }
}

/// A loaded model: the greeting plus the tokens each sequence holds so far.
pub struct HelloModel {
    greeting: Vec<i32>,
    sequences: HashMap<i32, Vec<i32>>,
}

impl HelloModel {
    /// The token this model predicts after `last`.
    fn next_token(&self, last: i32) -> i32 {
        match self.greeting.iter().position(|&t| t == last) {
            Some(i) => self.greeting.get(i + 1).copied().unwrap_or(STOP),
            None => self.greeting.first().copied().unwrap_or(STOP),
        }
    }

    /// The state of sequence `seq`, or an error for an id the host should not use.
    fn sequence(&mut self, seq: i32) -> Result<&mut Vec<i32>, PluginError> {
        if seq < 0 || seq >= MAX_SEQUENCES as i32 {
            return Err(PluginError::invalid_argument(format!(
                "sequence id {seq} out of range"
            )));
        }
        Ok(self.sequences.entry(seq).or_default())
    }
}

impl Model for HelloModel {
    fn describe(&self) -> ModelDescription {
        ModelDescription {
            vocab_size: VOCAB,
            context_length: CONTEXT,
            max_sequences: MAX_SEQUENCES,
            capabilities: 0,
            stop_tokens: vec![STOP],
            extra: serde_json::json!({ "architecture": "hello" }),
            // Fields added by later ABI minors (e.g. `rewind`) keep their defaults.
            ..Default::default()
        }
    }

    fn decode(&mut self, batch: &BatchView<'_>, logits: &mut LogitsOut<'_>) -> Result<(), PluginError> {
        // Rows arrive in order; each appends one token to its sequence. Rows that want logits get
        // one output row each, in batch order.
        let mut out_row = 0;
        for i in 0..batch.len() {
            let (seq, token, pos) = (batch.seq_ids[i], batch.tokens[i], batch.positions[i]);
            let history = self.sequence(seq)?;
            if pos as usize != history.len() || history.len() >= CONTEXT as usize {
                return Err(PluginError::invalid_argument(format!(
                    "sequence {seq}: position {pos} is not the next one"
                )));
            }
            history.push(token);
            if batch.want_logits[i] != 0 {
                let next = self.next_token(token);
                let row = logits.row_mut(out_row);
                row.fill(0.0);
                row[next as usize] = 10.0;
                out_row += 1;
            }
        }
        Ok(())
    }

    fn force_token(&mut self, seq: i32, token: i32) -> Result<(), PluginError> {
        // A token the host chose itself (e.g. from a grammar): record it, compute nothing.
        self.sequence(seq)?.push(token);
        Ok(())
    }

    fn seq_truncate(&mut self, seq: i32, len: u32) -> Result<(), PluginError> {
        // The host rewinds a sequence to reuse a shared prefix or to drop a rejected draft.
        self.sequence(seq)?.truncate(len as usize);
        Ok(())
    }

    fn seq_fork(&mut self, src: i32, dst: i32) -> Result<(), PluginError> {
        // Optional (the default says "unsupported"): copy a prefix to a new sequence.
        let copy = self.sequence(src)?.clone();
        *self.sequence(dst)? = copy;
        Ok(())
    }
}

// Defines the two symbols the host looks for: `berth_plugin_entry_v1` and `berth_plugin_manifest`.
berth_plugin_api::export_plugin!(HelloFamily);

#[cfg(test)]
mod tests {
    use super::*;
    use berth_plugin_api::Plugin;

    #[test]
    fn greedy_decoding_replays_the_greeting_then_stops() {
        let dir = std::env::temp_dir().join(format!("hello-plugin-test-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("hello.json"), r#"{"greeting": [5, 6, 7]}"#).unwrap();
        let config = serde_json::to_string(&LoadConfig {
            pack_dir: dir.clone(),
            family: "hello".into(),
            ..Default::default()
        })
        .unwrap();

        // Go through the C ABI exactly as the host does.
        // SAFETY: the table comes from this crate's own entry point and lives for the process.
        let plugin = unsafe { Plugin::from_entry(berth_plugin_entry_v1()) }.unwrap();
        assert_eq!(plugin.probe(r#"{"family": "hello"}"#), 100);
        let mut model = plugin.create(&config).unwrap();
        assert_eq!(model.description().stop_tokens, vec![STOP]);

        let mut logits = vec![0.0; VOCAB as usize];
        let (mut token, mut pos, mut out) = (20, 0, vec![]);
        loop {
            let batch = BatchView {
                tokens: &[token],
                positions: &[pos],
                seq_ids: &[0],
                want_logits: &[1],
            };
            model.decode(&batch, &mut logits).unwrap();
            token = (0..VOCAB as usize)
                .max_by(|&a, &b| logits[a].total_cmp(&logits[b]))
                .unwrap() as i32;
            if token == STOP {
                break;
            }
            out.push(token);
            pos += 1;
        }
        assert_eq!(out, vec![5, 6, 7]);
        std::fs::remove_dir_all(dir).unwrap();
    }
}
