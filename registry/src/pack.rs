//! The pack manifest (`pack.toml`), pack references (`name:tag`) and the architecture-to-family map.

use std::fmt;
use std::path::{Path, PathBuf};
use std::str::FromStr;
use std::time::{SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Serialize};

/// The manifest's file name inside a pack directory.
pub const MANIFEST_FILE: &str = "pack.toml";
/// The tag a reference without one gets.
pub const DEFAULT_TAG: &str = "latest";
/// Plugin families the host knows how to serve.
pub const KNOWN_FAMILIES: &[&str] = &["qwen3", "gemma", "gpt-oss", "lfm2", "minicpm-v", "scripted"];
/// Capabilities a pack may declare (`embedding`: text in, one vector out, as sentence-transformers).
pub const KNOWN_CAPABILITIES: &[&str] = &["completion", "chat", "tools", "thinking", "vision", "embedding"];

/// Why a manifest could not be read or written.
#[derive(Debug, thiserror::Error)]
pub enum PackError {
    /// Reading or writing failed.
    #[error("{path}: {source}")]
    Io {
        /// The manifest path.
        path: PathBuf,
        /// The underlying error.
        source: std::io::Error,
    },
    /// The TOML is malformed or does not match the manifest schema.
    #[error("{path}:{line}:{column}: {message}")]
    Parse {
        /// The manifest path.
        path: PathBuf,
        /// 1-based line of the error (0 when unknown).
        line: usize,
        /// 1-based column of the error (0 when unknown).
        column: usize,
        /// What is wrong.
        message: String,
    },
    /// The manifest could not be serialized.
    #[error("{path}: cannot write manifest: {message}")]
    Serialize {
        /// The manifest path.
        path: PathBuf,
        /// What went wrong.
        message: String,
    },
}

/// A malformed pack reference.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid model reference {input:?}: {reason}")]
pub struct PackRefError {
    /// The text that was parsed.
    pub input: String,
    /// What is wrong with it.
    pub reason: String,
}

/// A reference to a pack: `name` (tag `latest`), `name:tag` or `namespace/name:tag`.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct PackRef {
    /// The name, including an optional `namespace/` prefix.
    pub name: String,
    /// The tag (`latest` when none was given).
    pub tag: String,
    /// Whether the tag was written out (false for a bare `name`).
    pub explicit_tag: bool,
}

fn check_component(input: &str, part: &str, what: &str) -> Result<(), PackRefError> {
    let err = |reason: String| PackRefError {
        input: input.to_string(),
        reason,
    };
    if part.is_empty() {
        return Err(err(format!("empty {what}")));
    }
    if part.len() > 128 {
        return Err(err(format!("{what} longer than 128 characters")));
    }
    if !part.starts_with(|c: char| c.is_ascii_alphanumeric()) {
        return Err(err(format!("{what} {part:?} must start with a letter or digit")));
    }
    if let Some(bad) = part
        .chars()
        .find(|c| !(c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-')))
    {
        return Err(err(format!(
            "{what} {part:?} contains {bad:?} (allowed: letters, digits, '.', '_', '-')"
        )));
    }
    Ok(())
}

impl PackRef {
    /// Parse `name`, `name:tag` or `namespace/name:tag`.
    pub fn parse(input: &str) -> Result<PackRef, PackRefError> {
        let s = input.trim();
        let (name, tag, explicit_tag) = match s.rsplit_once(':') {
            Some((n, t)) => (n, t, true),
            None => (s, DEFAULT_TAG, false),
        };
        let mut parts = name.split('/');
        let first = parts.next().unwrap_or("");
        check_component(input, first, "name")?;
        if let Some(second) = parts.next() {
            check_component(input, second, "name")?;
            if parts.next().is_some() {
                return Err(PackRefError {
                    input: input.to_string(),
                    reason: "at most one namespace/ prefix is allowed".into(),
                });
            }
        }
        check_component(input, tag, "tag")?;
        Ok(PackRef {
            name: name.to_string(),
            tag: tag.to_string(),
            explicit_tag,
        })
    }

    /// Build a reference from a name and tag, validating both.
    pub fn new(name: &str, tag: &str) -> Result<PackRef, PackRefError> {
        PackRef::parse(&format!("{name}:{tag}"))
    }

    /// The pack's directory relative to the store's `packs/` folder (`name/tag`, `ns/name/tag`).
    pub fn rel_dir(&self) -> PathBuf {
        let mut p = PathBuf::new();
        for part in self.name.split('/') {
            p.push(part);
        }
        p.push(&self.tag);
        p
    }
}

impl fmt::Display for PackRef {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}", self.name, self.tag)
    }
}

impl FromStr for PackRef {
    type Err = PackRefError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        PackRef::parse(s)
    }
}

/// Turn free text (a model's display name, a file stem) into a valid reference name component.
pub fn sanitize_name(text: &str) -> String {
    let mut out = String::new();
    for c in text.trim().chars() {
        let c = c.to_ascii_lowercase();
        if c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-') {
            out.push(c);
        } else if !out.ends_with('-') {
            out.push('-');
        }
    }
    let trimmed = out.trim_matches(|c: char| !c.is_ascii_alphanumeric());
    let mut s: String = trimmed.chars().take(128).collect();
    if s.is_empty() {
        s = "model".into();
    }
    s
}

/// The weight format of a pack.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(from = "String", into = "String")]
pub enum PackFormat {
    /// A GGUF file.
    Gguf,
    /// Hugging Face safetensors plus `config.json`.
    Safetensors,
    /// Not given (for example a scripted test pack).
    #[default]
    Unspecified,
    /// Any other value, kept verbatim.
    Other(String),
}

impl PackFormat {
    /// The manifest spelling (`gguf`, `safetensors`, `` for unspecified).
    pub fn as_str(&self) -> &str {
        match self {
            PackFormat::Gguf => "gguf",
            PackFormat::Safetensors => "safetensors",
            PackFormat::Unspecified => "",
            PackFormat::Other(s) => s,
        }
    }

    /// Whether no format was given.
    pub fn is_unspecified(&self) -> bool {
        *self == PackFormat::Unspecified
    }
}

impl From<String> for PackFormat {
    fn from(s: String) -> Self {
        match s.as_str() {
            "gguf" => PackFormat::Gguf,
            "safetensors" => PackFormat::Safetensors,
            "" => PackFormat::Unspecified,
            _ => PackFormat::Other(s),
        }
    }
}

impl From<PackFormat> for String {
    fn from(f: PackFormat) -> Self {
        f.as_str().to_string()
    }
}

impl fmt::Display for PackFormat {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// What a file in a pack is for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum FileRole {
    /// Model weights.
    Weights,
    /// Model configuration (`config.json`, `generation_config.json`).
    Config,
    /// Tokenizer files.
    Tokenizer,
    /// Chat template.
    Template,
    /// A file of a sentence-transformers module folder (pooling, dense layer: `2_Dense/...`):
    /// part of the embedding pipeline after the model, never the model's own weights or config.
    Module,
    /// Anything else (also any unrecognised role).
    #[default]
    #[serde(other)]
    Other,
}

/// One file listed in a manifest.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PackFile {
    /// Path relative to the pack directory.
    pub path: String,
    /// What the file is for.
    #[serde(default)]
    pub role: FileRole,
    /// Size in bytes (checked when present).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub size: Option<u64>,
    /// Lowercase hex sha256 of the contents (checked when present).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sha256: Option<String>,
}

/// The contents of `pack.toml`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PackManifest {
    /// Model name, optionally `namespace/name`.
    pub name: String,
    /// Tag; with the name it forms the reference `name:tag`.
    #[serde(default = "default_tag")]
    pub tag: String,
    /// The plugin family that serves the pack (see [`KNOWN_FAMILIES`]).
    #[serde(default)]
    pub family: String,
    /// GGUF `general.architecture` or the Hugging Face `model_type`.
    #[serde(default)]
    pub architecture: String,
    /// Weight format.
    #[serde(default, skip_serializing_if = "PackFormat::is_unspecified")]
    pub format: PackFormat,
    /// Free-text description.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub description: Option<String>,
    /// Parameter count.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub parameters: Option<u64>,
    /// Headline quantization (`Q4_K_M`, `BF16`, ...).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub quantization: Option<String>,
    /// Maximum context length in tokens.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub context_length: Option<u64>,
    /// Capabilities (see [`KNOWN_CAPABILITIES`]).
    #[serde(default)]
    pub capabilities: Vec<String>,
    /// Creation time, RFC 3339 UTC.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub created: Option<String>,
    /// The files of the pack.
    #[serde(default)]
    pub files: Vec<PackFile>,
    /// Quantize the weights when the pack is loaded (`q8_0`: float projection matrices become
    /// Q8_0, as llama.cpp's `--outtype q8_0`); the files stay as they are.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub quantize: Option<String>,
    /// Default sampling parameters under Ollama's names (temperature, top_p, stop, num_ctx, ...);
    /// a request's own values win over them.
    #[serde(default, skip_serializing_if = "toml::Table::is_empty")]
    pub defaults: toml::Table,
    /// The system prompt used when a request has none (a Modelfile's `SYSTEM`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub system: Option<String>,
    /// Messages put before every conversation (a Modelfile's `MESSAGE` lines).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub messages: Vec<PackMessage>,
    /// The model's license text (a Modelfile's `LICENSE`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub license: Option<String>,
}

/// One message a pack puts before every conversation.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PackMessage {
    /// `system`, `user` or `assistant`.
    pub role: String,
    /// The text.
    pub content: String,
}

fn default_tag() -> String {
    DEFAULT_TAG.to_string()
}

/// 1-based line and column of a byte offset in `text`.
fn line_col(text: &str, offset: usize) -> (usize, usize) {
    let before = &text[..offset.min(text.len())];
    let line = before.matches('\n').count() + 1;
    let column = before.rsplit('\n').next().map_or(0, |l| l.chars().count()) + 1;
    (line, column)
}

impl PackManifest {
    /// A manifest with the given reference and family, everything else empty.
    pub fn new(reference: &PackRef, family: &str) -> PackManifest {
        PackManifest {
            name: reference.name.clone(),
            tag: reference.tag.clone(),
            family: family.to_string(),
            architecture: String::new(),
            format: PackFormat::Unspecified,
            description: None,
            parameters: None,
            quantization: None,
            context_length: None,
            capabilities: Vec::new(),
            created: Some(rfc3339(SystemTime::now())),
            files: Vec::new(),
            quantize: None,
            defaults: toml::Table::new(),
            system: None,
            messages: Vec::new(),
            license: None,
        }
    }

    /// Parse manifest text; `path` is only used in error messages.
    pub fn parse(text: &str, path: &Path) -> Result<PackManifest, PackError> {
        toml::from_str(text).map_err(|e| {
            let (line, column) = e.span().map_or((0, 0), |s| line_col(text, s.start));
            PackError::Parse {
                path: path.to_path_buf(),
                line,
                column,
                message: e.message().replace('\n', " ").trim().to_string(),
            }
        })
    }

    /// Read `<dir>/pack.toml`.
    pub fn load(dir: &Path) -> Result<PackManifest, PackError> {
        let path = dir.join(MANIFEST_FILE);
        let text = std::fs::read_to_string(&path).map_err(|source| PackError::Io {
            path: path.clone(),
            source,
        })?;
        PackManifest::parse(&text, &path)
    }

    /// The manifest as TOML text.
    pub fn to_toml(&self) -> Result<String, toml::ser::Error> {
        toml::to_string(self)
    }

    /// Write `<dir>/pack.toml` atomically (temporary file, then rename).
    pub fn save(&self, dir: &Path) -> Result<(), PackError> {
        let path = dir.join(MANIFEST_FILE);
        let text = self.to_toml().map_err(|e| PackError::Serialize {
            path: path.clone(),
            message: e.to_string(),
        })?;
        let tmp = dir.join(".pack.toml.tmp");
        let io = |source| PackError::Io {
            path: path.clone(),
            source,
        };
        std::fs::write(&tmp, text).map_err(io)?;
        std::fs::rename(&tmp, &path).map_err(io)
    }

    /// The reference `name:tag`.
    pub fn reference(&self) -> String {
        format!("{}:{}", self.name, self.tag)
    }

    /// Whether the manifest declares a capability.
    pub fn has_capability(&self, cap: &str) -> bool {
        self.capabilities.iter().any(|c| c == cap)
    }

    /// The weights files.
    pub fn weights(&self) -> impl Iterator<Item = &PackFile> {
        self.files.iter().filter(|f| f.role == FileRole::Weights)
    }

    /// Problems in the manifest itself (not its files): bad name or tag, no family, bad paths.
    /// Whether a family is served is the host's call: plugins bring families of their own.
    pub fn problems(&self) -> Vec<String> {
        let mut out = Vec::new();
        if let Some(q) = self.quantize.as_deref().filter(|q| *q != "q8_0") {
            out.push(format!("quantize {q:?} is not offered (q8_0 is)"));
        }
        if let Err(e) = PackRef::new(&self.name, &self.tag) {
            out.push(e.reason);
        }
        if self.family.trim().is_empty() {
            out.push("no family given".into());
        }
        for cap in &self.capabilities {
            if !KNOWN_CAPABILITIES.contains(&cap.as_str()) {
                out.push(format!("unknown capability {cap:?}"));
            }
        }
        for f in &self.files {
            if !is_safe_relative(&f.path) {
                out.push(format!("file path {:?} is not inside the pack", f.path));
            }
            if let Some(h) = &f.sha256 {
                if h.len() != 64 || !h.chars().all(|c| c.is_ascii_hexdigit()) {
                    out.push(format!("{}: sha256 {h:?} is not 64 hex digits", f.path));
                }
            }
        }
        out
    }
}

/// Whether a manifest file path stays inside the pack directory.
pub fn is_safe_relative(path: &str) -> bool {
    let p = Path::new(path);
    !path.is_empty()
        && p.components()
            .all(|c| matches!(c, std::path::Component::Normal(_)))
}

/// The plugin family serving a GGUF architecture or Hugging Face `model_type`.
pub fn family_for_architecture(arch: &str) -> Option<&'static str> {
    let norm: String = arch
        .chars()
        .filter(|c| !matches!(c, '-' | '_'))
        .map(|c| c.to_ascii_lowercase())
        .collect();
    Some(match norm.as_str() {
        "qwen2" | "qwen2moe" | "qwen3" | "qwen3moe" | "qwen35" | "qwen35moe" | "qwen35text"
        | "qwen35moetext" | "qwen3next" => "qwen3",
        "gemma" | "gemma2" | "gemma3" | "gemma3n" | "gemma4" | "gemma3text" | "gemma3ntext"
        | "gemma4text" => "gemma",
        "gptoss" => "gpt-oss",
        "lfm2" | "lfm2moe" | "lfm2vl" => "lfm2",
        "minicpmv" | "minicpmv46" => "minicpm-v",
        _ => return None,
    })
}

/// Format a time as RFC 3339 UTC with second precision (`2026-11-30T10:00:00Z`).
pub fn rfc3339(t: SystemTime) -> String {
    let secs = match t.duration_since(UNIX_EPOCH) {
        Ok(d) => d.as_secs() as i64,
        Err(e) => -(e.duration().as_secs_f64().ceil() as i64),
    };
    let days = secs.div_euclid(86_400);
    let rem = secs.rem_euclid(86_400);
    let (y, m, d) = civil_from_days(days);
    format!(
        "{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}Z",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60
    )
}

/// Parse the RFC 3339 subset [`rfc3339`] writes (offsets other than `Z` are honoured too).
pub fn parse_rfc3339(s: &str) -> Option<SystemTime> {
    let s = s.trim();
    let (date, time) = s.split_once(['T', 't', ' '])?;
    let mut dp = date.split('-');
    let y: i64 = dp.next()?.parse().ok()?;
    let m: u32 = dp.next()?.parse().ok()?;
    let d: u32 = dp.next()?.parse().ok()?;
    let (clock, offset_secs) = if let Some(c) = time.strip_suffix(['Z', 'z']) {
        (c, 0i64)
    } else {
        let idx = time.rfind(['+', '-'])?;
        let (c, off) = time.split_at(idx);
        let sign = if off.starts_with('-') { -1 } else { 1 };
        let (oh, om) = off[1..].split_once(':')?;
        let (oh, om) = (oh.parse::<u8>().ok()?, om.parse::<u8>().ok()?);
        if oh > 23 || om > 59 {
            return None;
        }
        (c, sign * (i64::from(oh) * 3600 + i64::from(om) * 60))
    };
    let clock = clock.split('.').next()?;
    let mut tp = clock.split(':');
    let hh: i64 = tp.next()?.parse().ok()?;
    let mm: i64 = tp.next()?.parse().ok()?;
    let ss: i64 = tp.next()?.parse().ok()?;
    // RFC 3339 years have four digits; the bounds also keep the arithmetic below from overflowing.
    if !(0..=9999).contains(&y)
        || !(1..=12).contains(&m)
        || !(1..=31).contains(&d)
        || !(0..=23).contains(&hh)
        || !(0..=59).contains(&mm)
        || !(0..=60).contains(&ss)
    {
        return None;
    }
    let secs = days_from_civil(y, m, d) * 86_400 + hh * 3600 + mm * 60 + ss - offset_secs;
    if secs >= 0 {
        Some(UNIX_EPOCH + std::time::Duration::from_secs(secs as u64))
    } else {
        Some(UNIX_EPOCH - std::time::Duration::from_secs(secs.unsigned_abs()))
    }
}

// Howard Hinnant's days-from-civil algorithms (proleptic Gregorian calendar).
fn civil_from_days(z: i64) -> (i64, u32, u32) {
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    let y = yoe + era * 400 + i64::from(m <= 2);
    (y, m, d)
}

fn days_from_civil(y: i64, m: u32, d: u32) -> i64 {
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y.rem_euclid(400);
    let mp = i64::from((m + 9) % 12);
    let doy = (153 * mp + 2) / 5 + i64::from(d) - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    const SAMPLE: &str = r#"
name = "qwen2.5-coder"
tag = "0.5b"
family = "qwen3"
architecture = "qwen2"
format = "gguf"
description = "A small coder"
parameters = 494032768
quantization = "Q5_0"
context_length = 32768
capabilities = ["completion", "chat", "tools"]
created = "2026-11-30T10:00:00Z"

[[files]]
path = "model.gguf"
role = "weights"
size = 491400064
sha256 = "0000000000000000000000000000000000000000000000000000000000000000"

[[files]]
path = "notes.txt"
role = "readme"

[defaults]
temperature = 0.7
stop = ["<|im_end|>"]
"#;

    #[test]
    fn manifest_parses_and_round_trips() {
        let m = PackManifest::parse(SAMPLE, Path::new("pack.toml")).unwrap();
        assert_eq!(m.reference(), "qwen2.5-coder:0.5b");
        assert_eq!(m.format, PackFormat::Gguf);
        assert_eq!(m.parameters, Some(494_032_768));
        assert_eq!(m.files[0].role, FileRole::Weights);
        assert_eq!(
            m.files[1].role,
            FileRole::Other,
            "unknown roles are kept as other"
        );
        assert_eq!(m.defaults["temperature"].as_float(), Some(0.7));
        assert!(m.has_capability("tools"));
        assert!(m.problems().is_empty(), "{:?}", m.problems());

        let dir = tempfile::tempdir().unwrap();
        m.save(dir.path()).unwrap();
        let back = PackManifest::load(dir.path()).unwrap();
        let mut expected = m.clone();
        expected.files[1].role = FileRole::Other;
        assert_eq!(back, expected);
    }

    #[test]
    fn minimal_manifest_gets_defaults() {
        let m = PackManifest::parse("name = \"t\"\nfamily = \"scripted\"\n", Path::new("p")).unwrap();
        assert_eq!(m.tag, "latest");
        assert_eq!(m.format, PackFormat::Unspecified);
        assert!(m.files.is_empty());
        assert!(m.problems().is_empty());
        assert!(!m.to_toml().unwrap().contains("format"));
    }

    #[test]
    fn system_messages_and_license_round_trip() {
        let mut m = PackManifest::new(&PackRef::parse("a:b").unwrap(), "qwen3");
        m.defaults.insert("temperature".into(), toml::Value::Float(0.0));
        m.system = Some("Be brief.\nAlways.".into());
        m.messages = vec![PackMessage {
            role: "user".into(),
            content: "Hi \"there\"".into(),
        }];
        m.license = Some("MIT".into());
        let back = PackManifest::parse(&m.to_toml().unwrap(), Path::new("p")).unwrap();
        assert_eq!(back, m);
    }

    #[test]
    fn parse_errors_name_path_and_line() {
        let e = PackManifest::parse("name = \"x\"\nfamily = \n", Path::new("/s/pack.toml")).unwrap_err();
        let msg = e.to_string();
        assert!(msg.starts_with("/s/pack.toml:2:"), "{msg}");
        assert!(!msg.contains('\n'), "{msg}");

        let e = PackManifest::parse("tag = \"x\"\n", Path::new("p.toml")).unwrap_err();
        assert!(e.to_string().contains("name"), "{e}");
    }

    #[test]
    fn manifest_problems() {
        let mut m = PackManifest::new(&PackRef::parse("a:b").unwrap(), "");
        assert_eq!(m.problems(), vec!["no family given".to_string()]);
        m.family = "llama".into();
        assert!(
            m.problems().is_empty(),
            "a family of a third-party plugin is not a problem here"
        );
        m.family = "gemma".into();
        m.files.push(PackFile {
            path: "../escape".into(),
            role: FileRole::Weights,
            size: None,
            sha256: Some("xyz".into()),
        });
        m.capabilities.push("flying".into());
        let p = m.problems();
        assert_eq!(p.len(), 3, "{p:?}");
    }

    #[test]
    fn pack_refs() {
        let r = PackRef::parse("qwen").unwrap();
        assert_eq!(
            (r.name.as_str(), r.tag.as_str(), r.explicit_tag),
            ("qwen", "latest", false)
        );
        let r: PackRef = "qwen2.5-coder:0.5b".parse().unwrap();
        assert_eq!(r.to_string(), "qwen2.5-coder:0.5b");
        assert!(r.explicit_tag);
        let r = PackRef::parse("library/qwen_3:Q4-K").unwrap();
        assert_eq!(r.rel_dir(), Path::new("library/qwen_3/Q4-K"));
        for bad in [
            "", ":x", "a:", "a b", "a/b/c", "../x", "a:..", "./a", "a/:t", "x:y:z", "é",
        ] {
            let e = PackRef::parse(bad).unwrap_err();
            assert!(e.to_string().contains("invalid model reference"), "{bad}: {e}");
        }
    }

    #[test]
    fn sanitized_names_are_valid() {
        assert_eq!(
            sanitize_name("Qwen2.5 Coder 0.5B Instruct"),
            "qwen2.5-coder-0.5b-instruct"
        );
        assert_eq!(sanitize_name("  --Gemma 3 (270m)!! "), "gemma-3-270m");
        assert_eq!(sanitize_name("???"), "model");
        for s in ["Qwen2.5 Coder", "..x", "a/b", "日本"] {
            PackRef::new(&sanitize_name(s), "latest").unwrap();
        }
    }

    #[test]
    fn families() {
        for (arch, fam) in [
            ("qwen2", "qwen3"),
            ("qwen2moe", "qwen3"),
            ("qwen3_moe", "qwen3"),
            ("qwen3_5", "qwen3"),
            ("qwen3_5_moe", "qwen3"),
            ("qwen3_5_text", "qwen3"),
            ("qwen3_5_moe_text", "qwen3"),
            ("qwen3_next", "qwen3"),
            ("qwen35", "qwen3"),
            ("gemma3", "gemma"),
            ("gemma3_text", "gemma"),
            ("gemma4_text", "gemma"),
            ("gemma3n", "gemma"),
            ("gpt-oss", "gpt-oss"),
            ("gpt_oss", "gpt-oss"),
            ("lfm2_moe", "lfm2"),
            ("lfm2", "lfm2"),
            ("lfm2_vl", "lfm2"),
            ("minicpm-v", "minicpm-v"),
            ("minicpmv", "minicpm-v"),
            ("minicpmv4_6", "minicpm-v"),
        ] {
            assert_eq!(family_for_architecture(arch), Some(fam), "{arch}");
            assert!(KNOWN_FAMILIES.contains(&fam));
        }
        assert_eq!(family_for_architecture("llama"), None);
        assert!(KNOWN_FAMILIES.contains(&"scripted"));
    }

    #[test]
    fn rfc3339_formats_and_parses() {
        assert_eq!(rfc3339(UNIX_EPOCH), "1970-01-01T00:00:00Z");
        let t = UNIX_EPOCH + Duration::from_secs(1_796_032_800);
        assert_eq!(rfc3339(t), "2026-11-30T10:00:00Z");
        assert_eq!(
            rfc3339(UNIX_EPOCH + Duration::from_secs(951_782_400)),
            "2000-02-29T00:00:00Z"
        );
        assert_eq!(parse_rfc3339("2026-11-30T10:00:00Z"), Some(t));
        assert_eq!(parse_rfc3339("2026-11-30T11:00:00.25+01:00"), Some(t));
        assert_eq!(parse_rfc3339("nonsense"), None);
        let now = SystemTime::now();
        let back = parse_rfc3339(&rfc3339(now)).unwrap();
        assert!(now.duration_since(back).unwrap() < Duration::from_secs(1));
    }

    #[test]
    fn rfc3339_out_of_range_fields_are_rejected_not_overflowed() {
        // Found by fuzzing (scripts/fuzz pack_manifest): a huge offset overflowed the arithmetic.
        assert_eq!(
            parse_rfc3339("4524-12-31T23:5:59+00:4:5:59+00:44444444444444444444"),
            None
        );
        assert_eq!(parse_rfc3339("2026-11-30T10:00:00+99999999999999:00"), None);
        assert_eq!(parse_rfc3339("2026-11-30T10:00:00+24:00"), None);
        assert_eq!(parse_rfc3339("2026-11-30T-9999999999999999:00:00Z"), None);
        assert_eq!(parse_rfc3339("2026-11-30T10:-1:00Z"), None);
        assert_eq!(parse_rfc3339("999999999999999-11-30T10:00:00Z"), None);
        assert_eq!(parse_rfc3339("10000-01-01T00:00:00Z"), None);
        assert!(parse_rfc3339("9999-12-31T23:59:60-23:59").is_some());
        assert!(parse_rfc3339("0000-01-01T00:00:00+23:59").is_some());
    }
}
