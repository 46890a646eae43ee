//! A `berth run` session's parameters under Ollama's names: the sampling flags given on the
//! command line and what `/set parameter` sets, laid over the pack's defaults
//! ([`crate::options::PackDefaults`]). Values are checked by the Ollama API's own `options`
//! validation, so both surfaces take and refuse the same values.

use crate::decoding::DecodeOptions;
use crate::options::OllamaOptions;
use anyhow::{anyhow, bail, Result};
use berth_registry::modelfile;

/// The `/set parameter` help: each parameter Berth implements (the registry's list, which also
/// checks Modelfiles) with its value and what it does.
const HELP: [(&str, &str, &str); 12] = [
    ("temperature", "<float>", "sampling temperature; 0 is greedy"),
    ("top_k", "<int>", "keep only the k most likely tokens (0: all)"),
    ("top_p", "<float>", "keep the tokens whose probabilities sum to p"),
    (
        "min_p",
        "<float>",
        "drop tokens below min_p times the most likely one",
    ),
    ("seed", "<int>", "seed for reproducible sampling"),
    (
        "repeat_penalty",
        "<float>",
        "how strongly to penalise repetitions (1: off)",
    ),
    (
        "repeat_last_n",
        "<int>",
        "how far back the repeat penalty looks (-1: all)",
    ),
    (
        "presence_penalty",
        "<float>",
        "penalty for tokens already generated",
    ),
    (
        "frequency_penalty",
        "<float>",
        "penalty per earlier occurrence of a token",
    ),
    (
        "stop",
        "<string> ...",
        "stop strings: the answer ends before the first",
    ),
    (
        "num_predict",
        "<int>",
        "most tokens per answer (-1: until the context is full)",
    ),
    (
        "num_ctx",
        "<int>",
        "context length in tokens (up to the model's own)",
    ),
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
        if !modelfile::is_supported_parameter(name) {
            if modelfile::is_unsupported_parameter(name) {
                bail!("'{name}' is an Ollama parameter Berth does not implement");
            }
            bail!("unknown parameter '{name}'; type /set parameter to list the ones Berth takes");
        }
        match values {
            [] => bail!("'{name}' needs a value"),
            [_, _, ..] if name != "stop" => bail!("'{name}' takes one value"),
            _ => {}
        }
        // Typed and range-checked as a Modelfile's PARAMETER line; the values replace the
        // parameter's (all of `stop`'s strings at once).
        let mut one = toml::Table::new();
        for v in values {
            modelfile::add_parameter(&mut one, name, unquote(v)).map_err(|e| anyhow!(e))?;
        }
        let value = one
            .remove(name)
            .ok_or_else(|| anyhow!("'{name}' needs a value"))?;
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
        modelfile::parameters_text(&self.0)
            .lines()
            .map(str::to_string)
            .collect()
    }
}

/// A value typed between double quotes, without them (`"<|im_end|>"`).
fn unquote(s: &str) -> &str {
    s.strip_prefix('"').and_then(|s| s.strip_suffix('"')).unwrap_or(s)
}

/// The `/set parameter` help: each parameter with what it does.
pub fn usage() -> Vec<String> {
    HELP.iter()
        .map(|(name, value, what)| format!("  /set parameter {:<30} {what}", format!("{name} {value}")))
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
        assert!(e.contains("is not a number"), "{e}");
        let e = p.set("top_p", &["1.5"]).unwrap_err().to_string();
        assert!(e.contains("top_p"), "{e}");
        let e = p.set("seed", &["1", "2"]).unwrap_err().to_string();
        assert!(e.contains("one value"), "{e}");
        assert_eq!(p, before);
    }

    #[test]
    fn the_help_lists_what_the_registry_takes() {
        let help: Vec<&str> = HELP.iter().map(|(n, _, _)| *n).collect();
        assert_eq!(help, modelfile::supported_parameters().collect::<Vec<_>>());
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
