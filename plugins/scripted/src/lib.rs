//! The scripted plugin: a model that replays token sequences from its pack's `script.json`, so
//! the host's chat, constraint and streaming paths can be tested without real weights. It is also
//! the smallest complete example of a Berth plugin.
//!
//! At each step the model looks at the sequence so far, picks the first script entry whose
//! `trigger` occurs in it (or the first entry without a trigger), finds how much of that entry's
//! `reply` the sequence already ends with, and puts a peak logit on the next reply token (or on the
//! first stop token once the reply is complete). Greedy decoding therefore replays the reply.
//! A batch containing `panic_token` panics inside `decode`, for testing panic containment;
//! `step_delay_ms` makes every `decode` call take that long (a slow model keeps streams running);
//! while the file `hold_file` names exists, creating the model and every `decode` call wait (a
//! test holds a load or a running sequence open exactly as long as it needs, then deletes it).
//!
//! Rewinds: `rewind` is the rule the model reports (`"anywhere"`, `{"every": N}`, `"start"`),
//! `enforce_rewind` the rule `seq_truncate` applies (default: the reported one; also `"never"`,
//! which refuses even a truncate to 0), so a test can make it refuse rewinds the host believed
//! allowed. When the script names a `truncate_log`, every `seq_truncate` call is appended to it
//! as a JSON line (`{"seq", "from", "len", "ok"}`). `refuse_fork` makes every `seq_fork` fail.
//!
//! Images (ABI 1.3, 1.5): a script with a `vision` spec reports it, prepares images with the
//! spec's scheme (`lfm2_vl` or `minicpmv`, from `berth-plugin-common`, in the spec's layout;
//! the image token's text is the params' `image_token`, else the scheme's usual one) and accepts
//! `encode_images`; every image it receives is appended to `image_log` as a JSON line (`{"seq", "shape", "pixels"
//! (the [`pixel_checksum`]), "patch_mask", "grid", "positions"}`). A placeholder position the
//! sequence already holds is refused, as a real model must (its row was decoded without it).

use berth_plugin_api::abi::{CAP_THINKING, CAP_TOOLS};
use berth_plugin_api::{
    BatchView, Family, ImageInput, LoadConfig, LogitsOut, Model, ModelDescription, PluginError,
    PluginManifest, PreparedImage, Rewind, RgbView, VisionSpec,
};
use berth_plugin_common::vision::preprocess::lfm2_vl::{self, Lfm2VlScheme};
use berth_plugin_common::vision::preprocess::minicpmv::{self, MiniCpmVScheme};
use berth_plugin_common::vision::preprocess::{lay_out, rgb_image};
use serde::Deserialize;
use std::collections::HashMap;
use std::io::Write;
use std::path::PathBuf;

/// One scripted reply, chosen when its trigger occurs in the sequence.
#[derive(Clone, Debug, Deserialize)]
pub struct ScriptEntry {
    /// Token subsequence that selects this entry; empty selects it by default.
    #[serde(default)]
    pub trigger: Vec<i32>,
    /// Tokens to replay.
    pub reply: Vec<i32>,
}

/// The contents of a scripted pack's `script.json`.
#[derive(Clone, Debug, Deserialize)]
pub struct Script {
    /// Logits per row.
    #[serde(default = "default_vocab")]
    pub vocab_size: u32,
    /// Longest sequence accepted.
    #[serde(default = "default_context")]
    pub context_length: u32,
    /// Most sequences at once.
    #[serde(default = "default_max_sequences")]
    pub max_sequences: u32,
    /// Tokens that end generation; the first is emitted after a reply.
    #[serde(default)]
    pub stop_tokens: Vec<i32>,
    /// Special tokens by name, reported in the model info.
    #[serde(default)]
    pub special_tokens: HashMap<String, i32>,
    /// Whether the model reports tool support.
    #[serde(default)]
    pub tools: bool,
    /// Whether the model reports thinking support.
    #[serde(default)]
    pub thinking: bool,
    /// A token that makes `decode` panic (for panic-containment tests).
    #[serde(default)]
    pub panic_token: Option<i32>,
    /// Milliseconds every `decode` call sleeps (0: none).
    #[serde(default)]
    pub step_delay_ms: u64,
    /// While this file exists, model creation and every `decode` call wait (at most ten minutes).
    #[serde(default)]
    pub hold_file: Option<PathBuf>,
    /// Height of the logit peak on the scripted token.
    #[serde(default = "default_peak")]
    pub peak: f32,
    /// The rewind rule the model reports.
    #[serde(default)]
    pub rewind: RewindRule,
    /// The rewind rule `seq_truncate` enforces; `None` enforces the reported one.
    #[serde(default)]
    pub enforce_rewind: Option<RewindRule>,
    /// A file every `seq_truncate` call is appended to, one JSON line each.
    #[serde(default)]
    pub truncate_log: Option<PathBuf>,
    /// `seq_fork` fails (a plugin that cannot copy a sequence).
    #[serde(default)]
    pub refuse_fork: bool,
    /// How the model takes images; `None` takes none.
    #[serde(default)]
    pub vision: Option<VisionSpec>,
    /// A file every image `encode_images` receives is appended to, one JSON line each.
    #[serde(default)]
    pub image_log: Option<PathBuf>,
    /// The replies.
    pub entries: Vec<ScriptEntry>,
}

/// A rewind rule as a script writes it: `"anywhere"`, `{"every": N}`, `"start"` or `"never"`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RewindRule {
    /// Any length.
    #[default]
    Anywhere,
    /// Multiples of N, 0 and the current length.
    Every(u32),
    /// Only 0 and the current length.
    Start,
    /// Only the current length (enforced only; reported as `start`): even a reset fails.
    Never,
}

impl RewindRule {
    /// The rule as the ABI reports it.
    pub fn reported(self) -> Rewind {
        match self {
            RewindRule::Anywhere => Rewind::Anywhere,
            RewindRule::Every(every) => Rewind::Snapshots { every },
            RewindRule::Start | RewindRule::Never => Rewind::OnlyToStart,
        }
    }

    /// Whether a sequence of `current` tokens may be truncated to `len`.
    pub fn allows(self, len: u32, current: u32) -> bool {
        match self {
            RewindRule::Never => len >= current,
            other => other.reported().allows(len, current),
        }
    }
}

/// One `seq_truncate` call as the model saw it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
pub struct TruncateCall {
    /// The sequence.
    pub seq: i32,
    /// Its length before the call.
    pub from: u32,
    /// The length asked for.
    pub len: u32,
    /// Whether the call was accepted.
    pub ok: bool,
}

/// One image as `encode_images` received it (a line of the script's `image_log`).
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct ImageCall {
    /// The sequence.
    pub seq: i32,
    /// The pixel tensor's shape.
    pub shape: Vec<u32>,
    /// [`pixel_checksum`] of the pixel values.
    pub pixels: String,
    /// The patch mask, when one came.
    pub patch_mask: Option<Vec<u8>>,
    /// The patch grid, when one came.
    pub grid: Option<(u32, u32)>,
    /// The placeholder positions.
    pub positions: Vec<i32>,
}

/// FNV-1a (64-bit) over the little-endian bytes of the values, as 16 hex digits: equal only
/// when every bit of every value arrived.
pub fn pixel_checksum(values: &[f32]) -> String {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in values.iter().flat_map(|v| v.to_le_bytes()) {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    format!("{h:016x}")
}

/// Appends one JSON line to `path`, reporting (not failing on) an I/O error.
fn append_line(path: &std::path::Path, value: &impl serde::Serialize) {
    let line = serde_json::to_string(value).expect("a log line serializes");
    let appended = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
        .and_then(|mut f| writeln!(f, "{line}"));
    if let Err(e) = appended {
        eprintln!("scripted: cannot append to {}: {e}", path.display());
    }
}

fn default_vocab() -> u32 {
    512
}
fn default_context() -> u32 {
    4096
}
fn default_max_sequences() -> u32 {
    64
}
fn default_peak() -> f32 {
    20.0
}

/// The family type exported by this plugin.
pub struct ScriptedFamily;

impl Family for ScriptedFamily {
    type Model = ScriptedModel;

    fn manifest() -> PluginManifest {
        PluginManifest {
            name: "scripted".into(),
            version: env!("CARGO_PKG_VERSION").into(),
            description: "replays scripted token sequences (for testing the host)".into(),
            families: vec!["scripted".into()],
            architectures: vec!["scripted".into()],
            weight_formats: vec!["script".into()],
            ..Default::default()
        }
    }

    fn probe(model_config: &serde_json::Value) -> u32 {
        let family = model_config.get("family").and_then(|v| v.as_str());
        if family == Some("scripted") {
            100
        } else {
            0
        }
    }

    fn create(config: &LoadConfig) -> Result<ScriptedModel, PluginError> {
        let path = config
            .weights
            .first()
            .cloned()
            .unwrap_or_else(|| config.pack_dir.join("script.json"));
        let text = std::fs::read_to_string(&path)
            .map_err(|e| PluginError::failed(format!("{}: {e}", path.display())))?;
        let script: Script = serde_json::from_str(&text)
            .map_err(|e| PluginError::failed(format!("{}: {e}", path.display())))?;
        wait_while_held(&script);
        ScriptedModel::new(script)
    }
}

/// Waits while the script's `hold_file` exists (bounded, so a forgotten file cannot hang a run).
fn wait_while_held(script: &Script) {
    let Some(path) = &script.hold_file else { return };
    let t0 = std::time::Instant::now();
    while path.exists() && t0.elapsed() < std::time::Duration::from_secs(600) {
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
}

/// A model instance replaying a [`Script`].
pub struct ScriptedModel {
    script: Script,
    sequences: HashMap<i32, Vec<i32>>,
}

impl ScriptedModel {
    /// Creates a model from a parsed script.
    pub fn new(script: Script) -> Result<Self, PluginError> {
        let vocab = script.vocab_size as i32;
        let all_tokens = script
            .entries
            .iter()
            .flat_map(|e| e.reply.iter().chain(&e.trigger));
        if let Some(bad) = all_tokens
            .chain(&script.stop_tokens)
            .find(|&&t| t < 0 || t >= vocab)
        {
            return Err(PluginError::failed(format!(
                "script token {bad} is outside the vocabulary (size {vocab})"
            )));
        }
        Ok(ScriptedModel {
            script,
            sequences: HashMap::new(),
        })
    }

    /// Appends a truncate call to the script's `truncate_log`, if it names one.
    fn record(&self, call: TruncateCall) {
        if let Some(path) = &self.script.truncate_log {
            append_line(path, &call);
        }
    }

    fn check_seq(&self, seq: i32) -> Result<(), PluginError> {
        if seq < 0 || seq >= self.script.max_sequences as i32 {
            return Err(PluginError::invalid_argument(format!(
                "sequence id {seq} outside 0..{}",
                self.script.max_sequences
            )));
        }
        Ok(())
    }

    /// The token the script wants after `history`.
    fn next_token(&self, history: &[i32]) -> i32 {
        let stop = self.script.stop_tokens.first().copied().unwrap_or(0);
        let entry = self
            .script
            .entries
            .iter()
            .find(|e| !e.trigger.is_empty() && contains(history, &e.trigger))
            .or_else(|| self.script.entries.iter().find(|e| e.trigger.is_empty()));
        let Some(entry) = entry else { return stop };
        let done = (0..=entry.reply.len())
            .rev()
            .find(|&k| history.ends_with(&entry.reply[..k]))
            .unwrap_or(0);
        entry.reply.get(done).copied().unwrap_or(stop)
    }
}

fn contains(haystack: &[i32], needle: &[i32]) -> bool {
    haystack.windows(needle.len()).any(|w| w == needle)
}

impl Model for ScriptedModel {
    fn describe(&self) -> ModelDescription {
        let mut caps = 0;
        if self.script.tools {
            caps |= CAP_TOOLS;
        }
        if self.script.thinking {
            caps |= CAP_THINKING;
        }
        ModelDescription {
            vocab_size: self.script.vocab_size,
            context_length: self.script.context_length,
            max_sequences: self.script.max_sequences,
            capabilities: caps,
            stop_tokens: self.script.stop_tokens.clone(),
            extra: serde_json::json!({
                "architecture": "scripted",
                "special_tokens": self.script.special_tokens,
            }),
            rewind: self.script.rewind.reported(),
        }
    }

    fn decode(&mut self, batch: &BatchView<'_>, logits: &mut LogitsOut<'_>) -> Result<(), PluginError> {
        batch.validate()?;
        wait_while_held(&self.script);
        if self.script.step_delay_ms > 0 {
            std::thread::sleep(std::time::Duration::from_millis(self.script.step_delay_ms));
        }
        if let Some(p) = self.script.panic_token {
            if batch.tokens.contains(&p) {
                panic!("scripted panic: token {p} in batch");
            }
        }
        let mut out_row = 0;
        for i in 0..batch.len() {
            let (seq, token, pos) = (batch.seq_ids[i], batch.tokens[i], batch.positions[i]);
            self.check_seq(seq)?;
            let history = self.sequences.entry(seq).or_default();
            if pos as usize != history.len() {
                return Err(PluginError::invalid_argument(format!(
                    "sequence {seq} holds {} tokens; position {pos} is not next",
                    history.len()
                )));
            }
            if history.len() >= self.script.context_length as usize {
                return Err(PluginError::invalid_argument(format!(
                    "sequence {seq} is full ({} tokens)",
                    self.script.context_length
                )));
            }
            history.push(token);
            if batch.want_logits[i] != 0 {
                let next = self.next_token(&self.sequences[&seq]);
                let row = logits.row_mut(out_row);
                row.fill(0.0);
                row[next as usize] = self.script.peak;
                out_row += 1;
            }
        }
        Ok(())
    }

    fn force_token(&mut self, seq: i32, token: i32) -> Result<(), PluginError> {
        self.check_seq(seq)?;
        self.sequences.entry(seq).or_default().push(token);
        Ok(())
    }

    fn thinking_enabled(&self, requested: Option<bool>) -> bool {
        self.script.thinking && requested.unwrap_or(true)
    }

    fn tools_enabled(&self) -> bool {
        self.script.tools
    }

    fn seq_truncate(&mut self, seq: i32, len: u32) -> Result<(), PluginError> {
        self.check_seq(seq)?;
        let from = self.sequences.get(&seq).map_or(0, |h| h.len() as u32);
        let rule = self.script.enforce_rewind.unwrap_or(self.script.rewind);
        let ok = rule.allows(len, from);
        self.record(TruncateCall { seq, from, len, ok });
        if !ok {
            return Err(PluginError::failed(format!(
                "sequence {seq} holds {from} tokens and cannot rewind to {len} ({rule:?})"
            )));
        }
        if let Some(h) = self.sequences.get_mut(&seq) {
            h.truncate(len as usize);
        }
        Ok(())
    }

    fn seq_fork(&mut self, src: i32, dst: i32) -> Result<(), PluginError> {
        self.check_seq(src)?;
        self.check_seq(dst)?;
        if self.script.refuse_fork {
            return Err(PluginError::failed(format!(
                "refusing to fork sequence {src} (refuse_fork)"
            )));
        }
        let h = self.sequences.get(&src).cloned().unwrap_or_default();
        self.sequences.insert(dst, h);
        Ok(())
    }

    fn vision(&self) -> Option<VisionSpec> {
        self.script.vision.clone()
    }

    fn prepare_image(&self, image: &RgbView<'_>, index: u32) -> Result<PreparedImage, PluginError> {
        let Some(spec) = &self.script.vision else {
            return Err(PluginError::unsupported(
                "prepare_image: this script takes no images",
            ));
        };
        let token = |usual: &str| {
            let given = spec.params.get("image_token").and_then(serde_json::Value::as_str);
            given.unwrap_or(usual).to_string()
        };
        let (img, patch) = (rgb_image(image), spec.patch_size as usize);
        match spec.scheme.as_str() {
            "lfm2_vl" => {
                let scheme = Lfm2VlScheme::from_params(&spec.params, patch, token("<image>"))
                    .map_err(PluginError::failed)?;
                lfm2_vl::prepare(&scheme, &img, spec.layout)
            }
            "minicpmv" => {
                let scheme = MiniCpmVScheme::from_params(&spec.params, patch, token("<unk>"))
                    .map_err(PluginError::failed)?;
                let p = &scheme.params;
                let pre = minicpmv::preprocess(&img, p, &scheme.tokens, index as usize);
                lay_out(pre, spec.layout, patch, 0, |nh, nw| p.slice_tokens(nh, nw))
            }
            other => Err(PluginError::failed(format!(
                "unknown image preprocessing scheme '{other}'"
            ))),
        }
    }

    fn encode_images(&mut self, seq: i32, images: &[ImageInput<'_>]) -> Result<(), PluginError> {
        if self.script.vision.is_none() {
            return Err(PluginError::unsupported(
                "encode_images: this script takes no images",
            ));
        }
        self.check_seq(seq)?;
        let held = self.sequences.get(&seq).map_or(0, Vec::len);
        for img in images {
            if let Some(&p) = img.positions.iter().find(|&&p| (p as usize) < held) {
                return Err(PluginError::invalid_argument(format!(
                    "sequence {seq} already holds position {p} ({held} tokens)"
                )));
            }
        }
        for img in images {
            let call = ImageCall {
                seq,
                shape: img.shape.to_vec(),
                pixels: pixel_checksum(img.pixels),
                patch_mask: img.patch_mask.map(<[u8]>::to_vec),
                grid: img.grid,
                positions: img.positions.to_vec(),
            };
            if let Some(path) = &self.script.image_log {
                append_line(path, &call);
            }
        }
        Ok(())
    }
}

berth_plugin_api::export_plugin!(ScriptedFamily);

#[cfg(test)]
mod tests {
    use super::*;
    use berth_plugin_api::Plugin;

    fn plugin() -> Plugin {
        // SAFETY: the table comes from this crate's own exported entry, valid for the process.
        unsafe { Plugin::from_entry(berth_plugin_entry_v1()) }.expect("valid table")
    }

    fn load_config(dir: &std::path::Path, script: serde_json::Value) -> String {
        std::fs::write(dir.join("script.json"), script.to_string()).unwrap();
        serde_json::to_string(&LoadConfig {
            pack_dir: dir.to_path_buf(),
            family: "scripted".into(),
            ..Default::default()
        })
        .unwrap()
    }

    fn greedy(row: &[f32]) -> i32 {
        let mut best = 0;
        for (i, &v) in row.iter().enumerate() {
            if v > row[best] {
                best = i;
            }
        }
        best as i32
    }

    #[test]
    fn greedy_decoding_replays_the_triggered_reply_then_stops() {
        let dir = tempfile::tempdir().unwrap();
        let cfg = load_config(
            dir.path(),
            serde_json::json!({"vocab_size": 64, "stop_tokens": [2],
                "entries": [{"reply": [10, 11]}, {"trigger": [7, 8], "reply": [30, 31, 32]}]}),
        );
        let mut m = plugin().create(&cfg).unwrap();
        assert_eq!(m.description().vocab_size, 64);
        assert_eq!(m.description().stop_tokens, vec![2]);
        let mut logits = vec![0.0; 64];
        let prompt = [1, 7, 8];
        let batch = BatchView {
            tokens: &prompt,
            positions: &[0, 1, 2],
            seq_ids: &[0, 0, 0],
            want_logits: &[0, 0, 1],
        };
        assert_eq!(m.decode(&batch, &mut logits).unwrap(), 1);
        let mut out = vec![];
        let mut tok = greedy(&logits);
        let mut pos = 3;
        while tok != 2 && out.len() < 10 {
            out.push(tok);
            let b = BatchView {
                tokens: &[tok],
                positions: &[pos],
                seq_ids: &[0],
                want_logits: &[1],
            };
            m.decode(&b, &mut logits).unwrap();
            tok = greedy(&logits);
            pos += 1;
        }
        assert_eq!(out, vec![30, 31, 32]);
    }

    #[test]
    fn decode_rejects_a_position_that_is_not_next() {
        let dir = tempfile::tempdir().unwrap();
        let cfg = load_config(dir.path(), serde_json::json!({"entries": [{"reply": [5]}]}));
        let mut m = plugin().create(&cfg).unwrap();
        let mut logits = vec![0.0; 512];
        let b = BatchView {
            tokens: &[1],
            positions: &[3],
            seq_ids: &[0],
            want_logits: &[1],
        };
        let e = m.decode(&b, &mut logits).unwrap_err();
        assert_eq!(e.kind, berth_plugin_api::ErrorKind::InvalidArgument);
        assert!(m.poisoned().is_none());
    }

    #[test]
    fn a_panic_in_decode_becomes_an_error_and_poisons_the_instance() {
        let dir = tempfile::tempdir().unwrap();
        let cfg = load_config(
            dir.path(),
            serde_json::json!({"panic_token": 99, "entries": [{"reply": [5]}]}),
        );
        let mut m = plugin().create(&cfg).unwrap();
        let mut logits = vec![0.0; 512];
        let b = BatchView {
            tokens: &[99],
            positions: &[0],
            seq_ids: &[0],
            want_logits: &[1],
        };
        let e = m.decode(&b, &mut logits).unwrap_err();
        assert_eq!(e.kind, berth_plugin_api::ErrorKind::Poisoned);
        assert!(e.message.contains("scripted panic"), "{}", e.message);
        assert!(m.poisoned().is_some());
        // Every later call is refused, even a harmless one.
        let ok = BatchView {
            tokens: &[1],
            positions: &[0],
            seq_ids: &[1],
            want_logits: &[1],
        };
        assert_eq!(
            m.decode(&ok, &mut logits).unwrap_err().kind,
            berth_plugin_api::ErrorKind::Poisoned
        );
        // A fresh instance works.
        let mut fresh = plugin().create(&cfg).unwrap();
        assert_eq!(fresh.decode(&ok, &mut logits).unwrap(), 1);
    }

    #[test]
    fn truncate_and_fork_manage_sequence_state() {
        let dir = tempfile::tempdir().unwrap();
        let cfg = load_config(dir.path(), serde_json::json!({"entries": [{"reply": [5, 6]}]}));
        let mut m = plugin().create(&cfg).unwrap();
        let mut logits = vec![0.0; 512];
        let b = BatchView {
            tokens: &[1, 5],
            positions: &[0, 1],
            seq_ids: &[0, 0],
            want_logits: &[0, 1],
        };
        m.decode(&b, &mut logits).unwrap();
        assert_eq!(greedy(&logits), 6);
        m.seq_fork(0, 3).unwrap();
        m.seq_truncate(0, 1).unwrap();
        let b = BatchView {
            tokens: &[1, 6],
            positions: &[1, 2],
            seq_ids: &[0, 3],
            want_logits: &[1, 1],
        };
        let mut two = vec![0.0; 1024];
        assert_eq!(m.decode(&b, &mut two).unwrap(), 2);
        assert_eq!(greedy(&two[..512]), 5);
        assert_eq!(greedy(&two[512..]), 0);
    }

    #[test]
    fn the_rewind_rule_is_reported_enforced_and_recorded() {
        let dir = tempfile::tempdir().unwrap();
        let log = dir.path().join("truncates.jsonl");
        let cfg = load_config(
            dir.path(),
            serde_json::json!({"rewind": {"every": 4}, "truncate_log": log,
                "entries": [{"reply": [5]}]}),
        );
        let mut m = plugin().create(&cfg).unwrap();
        assert_eq!(m.description().rewind, Rewind::Snapshots { every: 4 });
        let mut logits = vec![0.0; 512];
        let b = BatchView {
            tokens: &[1, 2, 3, 4, 5, 6, 7],
            positions: &[0, 1, 2, 3, 4, 5, 6],
            seq_ids: &[0; 7],
            want_logits: &[0, 0, 0, 0, 0, 0, 1],
        };
        m.decode(&b, &mut logits).unwrap();
        m.seq_truncate(0, 7).unwrap();
        assert!(m.seq_truncate(0, 6).is_err(), "6 is no snapshot");
        m.seq_truncate(0, 4).unwrap();
        m.seq_truncate(0, 0).unwrap();
        let lines: Vec<serde_json::Value> = std::fs::read_to_string(&log)
            .unwrap()
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect();
        let oks: Vec<(u64, u64, bool)> = lines
            .iter()
            .map(|l| {
                (
                    l["from"].as_u64().unwrap(),
                    l["len"].as_u64().unwrap(),
                    l["ok"].as_bool().unwrap(),
                )
            })
            .collect();
        assert_eq!(oks, vec![(7, 7, true), (7, 6, false), (7, 4, true), (4, 0, true)]);

        let never = load_config(
            dir.path(),
            serde_json::json!({"enforce_rewind": "never", "entries": [{"reply": [5]}]}),
        );
        let mut m = plugin().create(&never).unwrap();
        assert_eq!(
            m.description().rewind,
            Rewind::Anywhere,
            "reports what `rewind` says"
        );
        m.decode(&b, &mut logits).unwrap();
        assert!(m.seq_truncate(0, 0).is_err());
        m.seq_truncate(0, 7).unwrap();
    }

    #[test]
    fn a_script_with_a_vision_spec_reports_it_and_logs_the_images_it_receives() {
        let dir = tempfile::tempdir().unwrap();
        let log = dir.path().join("images.jsonl");
        let cfg = load_config(
            dir.path(),
            serde_json::json!({"image_log": log, "entries": [{"reply": [5]}],
                "vision": {"scheme": "lfm2_vl", "layout": "patches", "patch_size": 2,
                    "image_token_id": 9, "params": {"max_image_tokens": 4}}}),
        );
        let mut m = plugin().create(&cfg).unwrap();
        assert!(m.supports_images());
        assert_ne!(
            m.description().capabilities & berth_plugin_api::abi::CAP_VISION,
            0
        );
        let spec = m.vision().unwrap();
        assert_eq!((spec.scheme.as_str(), spec.image_token_id), ("lfm2_vl", 9));
        // The spec's scheme prepares images: 2-pixel patches, at most 4 tokens of 2x2 patches.
        let rgb = berth_plugin_api::RgbView {
            width: 6,
            height: 4,
            data: &[90; 6 * 4 * 3],
        };
        let prepared = m.prepare_image(&rgb, 0).unwrap();
        assert_eq!(prepared.slices.len(), 1);
        let tokens = prepared.slices[0].tokens as usize;
        assert!(prepared.placeholder.starts_with("<|image_start|>"));
        assert_eq!(prepared.placeholder.matches("<image>").count(), tokens);
        assert_eq!(prepared.slices[0].shape[1], 12);
        let pixels: Vec<f32> = (0..24).map(|i| i as f32 * 0.25 - 1.0).collect();
        let img = ImageInput {
            shape: &[2, 12],
            pixels: &pixels,
            patch_mask: Some(&[1, 0]),
            grid: Some((1, 2)),
            positions: &[1, 2],
        };
        m.encode_images(0, &[img]).unwrap();
        let line: serde_json::Value =
            serde_json::from_str(std::fs::read_to_string(&log).unwrap().trim()).unwrap();
        assert_eq!(
            line,
            serde_json::json!({"seq": 0, "shape": [2, 12], "pixels": pixel_checksum(&pixels),
                "patch_mask": [1, 0], "grid": [1, 2], "positions": [1, 2]})
        );
        // Once position 1 is decoded, an image for it comes too late.
        let mut logits = vec![0.0; 1024];
        let b = BatchView {
            tokens: &[1, 9],
            positions: &[0, 1],
            seq_ids: &[0, 0],
            want_logits: &[0, 1],
        };
        m.decode(&b, &mut logits).unwrap();
        let late = m.encode_images(0, &[img]).unwrap_err();
        assert_eq!(late.kind, berth_plugin_api::ErrorKind::InvalidArgument, "{late}");
        // A script without a spec takes no images.
        let plain = load_config(dir.path(), serde_json::json!({"entries": [{"reply": [5]}]}));
        let mut m = plugin().create(&plain).unwrap();
        assert!(!m.supports_images() && m.vision().is_none());
        assert_eq!(
            m.encode_images(0, &[img]).unwrap_err().kind,
            berth_plugin_api::ErrorKind::Unsupported
        );
        assert_eq!(
            m.prepare_image(&rgb, 0).unwrap_err().kind,
            berth_plugin_api::ErrorKind::Unsupported
        );
    }

    #[test]
    fn the_pixel_checksum_sees_every_bit() {
        let a = [1.0f32, -2.5, 0.0];
        let mut b = a;
        b[2] = -0.0;
        assert_ne!(pixel_checksum(&a), pixel_checksum(&b));
        assert_eq!(pixel_checksum(&a), pixel_checksum(&[1.0, -2.5, 0.0]));
        assert_eq!(pixel_checksum(&[]).len(), 16);
    }

    #[test]
    fn a_script_token_outside_the_vocabulary_fails_creation() {
        let dir = tempfile::tempdir().unwrap();
        let cfg = load_config(
            dir.path(),
            serde_json::json!({"vocab_size": 8, "entries": [{"reply": [9]}]}),
        );
        let e = plugin().create(&cfg).unwrap_err();
        assert!(e.message.contains("outside the vocabulary"), "{}", e.message);
    }
}
