//! A `berth run` session's parameters under Ollama's names: the sampling flags given on the
//! command line and what `/set parameter` sets, laid over the pack's defaults
//! ([`crate::options::PackDefaults`]). Values are checked by the Ollama API's own `options`
//! validation, so both surfaces take and refuse the same values.

use crate::decoding::DecodeOptions;
use crate::options::OllamaOptions;
use anyhow::{anyhow, bail, Result};

/// The kind of value a parameter takes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    Float,
    Int,
    /// One or more strings (`stop`).
    Strings,
}

/// The parameters `/set parameter` takes: Ollama's name, the kind of value, what it does.
const PARAMETERS: [(&str, Kind, &str); 12] = [
    ("temperature", Kind::Float, "sampling temperature; 0 is greedy"),
    ("top_k", Kind::Int, "keep only the k most likely tokens (0: all)"),
    (
        "top_p",
        Kind::Float,
        "keep the tokens whose probabilities sum to p",
    ),
    (
        "min_p",
        Kind::Float,
        "drop tokens below min_p times the most likely one",
    ),
    ("seed", Kind::Int, "seed for reproducible sampling"),
    (
        "repeat_penalty",
        Kind::Float,
        "how strongly to penalise repetitions (1: off)",
    ),
    (
        "repeat_last_n",
        Kind::Int,
        "how far back the repeat penalty looks (-1: all)",
    ),
    (
        "presence_penalty",
        Kind::Float,
        "penalty for tokens already generated",
    ),
    (
        "frequency_penalty",
        Kind::Float,
        "penalty per earlier occurrence of a token",
    ),
    (
        "stop",
        Kind::Strings,
        "stop strings: the answer ends before the first",
    ),
    (
        "num_predict",
        Kind::Int,
        "most tokens per answer (-1: until the context is full)",
    ),
    (
        "num_ctx",
        Kind::Int,
        "context length in tokens (reloads the model)",
    ),
];

/// Ollama parameters Berth does not implement: naming one is a clear message, not "unknown".
const UNIMPLEMENTED: [&str; 14] = [
    "mirostat",
    "mirostat_eta",
    "mirostat_tau",
    "typical_p",
    "tfs_z",
    "penalize_newline",
    "num_gpu",
    "num_thread",
    "num_batch",
    "num_keep",
    "main_gpu",
    "use_mmap",
    "use_mlock",
    "numa",
];

/// Ollama-named parameters (a pack's `defaults`, or what `/set parameter` set): a small table that
/// overlays decode options, each key only where it is set.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct SessionParams(toml::Table);

impl SessionParams {
    /// Parameters from a table of Ollama names (a pack manifest's `defaults`).
    pub fn from_table(table: toml::Table) -> SessionParams {
        SessionParams(table)
    }

    /// Parameters from command-line flags, by Ollama name (`None`: the flag was not given); a bad
    /// value is an error naming the parameter.
    pub fn from_flags(flags: &[(&str, Option<String>)]) -> Result<SessionParams> {
        let mut p = SessionParams::default();
        for (name, value) in flags {
            if let Some(v) = value {
                p.set(name, &[v])?;
            }
        }
        Ok(p)
    }

    /// The parameters as a table of Ollama names (for a pack manifest's `defaults`).
    pub fn table(&self) -> &toml::Table {
        &self.0
    }

    /// Whether none is set.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// These parameters with `over`'s laid on top.
    pub fn merged(&self, over: &SessionParams) -> SessionParams {
        let mut t = self.0.clone();
        t.extend(over.0.iter().map(|(k, v)| (k.clone(), v.clone())));
        SessionParams(t)
    }

    /// Sets `name` from the words typed after it (`/set parameter NAME VALUE...`); an unknown or
    /// unimplemented name, a value of the wrong kind or out of range is an error and changes
    /// nothing.
    pub fn set(&mut self, name: &str, values: &[&str]) -> Result<()> {
        let Some(&(_, kind, _)) = PARAMETERS.iter().find(|(n, _, _)| *n == name) else {
            if UNIMPLEMENTED.contains(&name) {
                bail!("'{name}' is an Ollama parameter Berth does not implement");
            }
            bail!("unknown parameter '{name}'; type /set parameter to list the ones Berth takes");
        };
        let value = match (kind, values) {
            (_, []) => bail!("'{name}' needs a value"),
            (Kind::Strings, v) => toml::Value::Array(
                v.iter()
                    .map(|s| toml::Value::String(unquote(s).to_string()))
                    .collect(),
            ),
            (Kind::Float, [v]) => toml::Value::Float(
                v.parse::<f64>()
                    .ok()
                    .filter(|f| f.is_finite())
                    .ok_or_else(|| anyhow!("'{name}' takes a number, not '{v}'"))?,
            ),
            (Kind::Int, [v]) => toml::Value::Integer(
                v.parse::<i64>()
                    .map_err(|_| anyhow!("'{name}' takes a whole number, not '{v}'"))?,
            ),
            (_, _) => bail!("'{name}' takes one value"),
        };
        let mut next = self.clone();
        next.0.insert(name.to_string(), value);
        // Checked as the Ollama API checks `options` (ranges, stop count).
        next.over(&DecodeOptions::default())?;
        *self = next;
        Ok(())
    }

    /// The parameters as Ollama `options` (keys Berth does not read are left to that type).
    fn options(&self) -> Result<OllamaOptions> {
        let json = serde_json::to_value(&self.0)?;
        serde_json::from_value(json).map_err(|e| anyhow!("parameters: {e}"))
    }

    /// The sampling and stopping settings of `base` with the set parameters over them (`num_ctx`
    /// becomes the request's context); no constraint, no log-probabilities.
    pub fn over(&self, base: &DecodeOptions) -> Result<DecodeOptions> {
        self.options()?
            .over(base, "")
            .map_err(|e| anyhow!("{}", e.message))
    }

    /// Whether `name` is set.
    pub fn has(&self, name: &str) -> bool {
        self.0.contains_key(name)
    }

    /// The parameters as `/show parameters` prints them, one a line (a stop string a line), as
    /// Ollama lists a model's parameters.
    pub fn lines(&self) -> Vec<String> {
        let mut out = Vec::new();
        for (k, v) in &self.0 {
            match v {
                toml::Value::Array(items) => {
                    for i in items {
                        out.push(format!("{k:<30} {}", show_value(i)));
                    }
                }
                v => out.push(format!("{k:<30} {}", show_value(v))),
            }
        }
        out
    }
}

/// A value as `/show parameters` prints it: strings quoted, numbers as written.
fn show_value(v: &toml::Value) -> String {
    match v {
        toml::Value::String(s) => format!("{s:?}"),
        // `0`, not TOML's `0.0`, as the value was typed.
        toml::Value::Float(f) => format!("{f}"),
        v => v.to_string(),
    }
}

/// A value typed between double quotes, without them (`"<|im_end|>"`).
fn unquote(s: &str) -> &str {
    s.strip_prefix('"').and_then(|s| s.strip_suffix('"')).unwrap_or(s)
}

/// The `/set parameter` help: each parameter with what it does.
pub fn usage() -> Vec<String> {
    PARAMETERS
        .iter()
        .map(|(name, kind, what)| {
            let value = match kind {
                Kind::Float => "<float>",
                Kind::Int => "<int>",
                Kind::Strings => "<string> ...",
            };
            format!("  /set parameter {:<30} {what}", format!("{name} {value}"))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sampling::SamplingParams;

    fn decode() -> DecodeOptions {
        DecodeOptions {
            sampling: SamplingParams::default(),
            max_tokens: Some(1024),
            ..DecodeOptions::default()
        }
    }

    #[test]
    fn set_parameters_overlay_only_what_they_set() {
        let mut p = SessionParams::default();
        p.set("temperature", &["0"]).unwrap();
        p.set("stop", &["\"<|im_end|>\"", "User:"]).unwrap();
        p.set("num_predict", &["-1"]).unwrap();
        let d = p.over(&decode()).unwrap();
        assert_eq!(d.sampling.temperature, 0.0);
        assert_eq!(d.sampling.top_k, SamplingParams::default().top_k);
        assert_eq!(d.stop, ["<|im_end|>", "User:"]);
        assert_eq!(d.max_tokens, None, "-1 runs until the context is full");
        assert_eq!(
            p.lines(),
            // In the table's (name) order.
            [
                format!("{:<30} -1", "num_predict"),
                format!("{:<30} \"<|im_end|>\"", "stop"),
                format!("{:<30} \"User:\"", "stop"),
                format!("{:<30} 0", "temperature"),
            ]
        );
    }

    #[test]
    fn unknown_unimplemented_and_bad_values_are_clear_and_change_nothing() {
        let mut p = SessionParams::default();
        p.set("top_k", &["5"]).unwrap();
        let before = p.clone();
        let e = p.set("mirostat", &["2"]).unwrap_err().to_string();
        assert!(e.contains("does not implement"), "{e}");
        let e = p.set("warmth", &["2"]).unwrap_err().to_string();
        assert!(e.contains("unknown parameter 'warmth'"), "{e}");
        let e = p.set("temperature", &["hot"]).unwrap_err().to_string();
        assert!(e.contains("takes a number"), "{e}");
        let e = p.set("top_p", &["1.5"]).unwrap_err().to_string();
        assert!(e.contains("top_p"), "{e}");
        let e = p.set("seed", &["1", "2"]).unwrap_err().to_string();
        assert!(e.contains("one value"), "{e}");
        assert_eq!(p, before);
    }

    #[test]
    fn later_parameters_win_and_num_ctx_is_the_context() {
        let mut pack = toml::Table::new();
        pack.insert("temperature".into(), toml::Value::Float(0.7));
        pack.insert("num_ctx".into(), toml::Value::Integer(2048));
        let pack = SessionParams::from_table(pack);
        let mut user = SessionParams::default();
        user.set("temperature", &["0.2"]).unwrap();
        let both = pack.merged(&user);
        let d = both.over(&decode()).unwrap();
        assert_eq!(d.sampling.temperature, 0.2);
        assert_eq!(d.context, Some(2048));
        assert!(both.has("num_ctx") && !user.has("num_ctx"));
        let flags = SessionParams::from_flags(&[("top_k", Some("3".into())), ("seed", None)]).unwrap();
        assert_eq!(flags.lines(), [format!("{:<30} 3", "top_k")]);
        let e = SessionParams::from_flags(&[("temperature", Some("-1".into()))]).unwrap_err();
        assert!(e.to_string().contains("temperature"), "{e}");
    }
}
