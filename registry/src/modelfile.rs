//! Ollama's Modelfile: parsed into what `berth create` and `/api/create` write into a pack, and
//! written back from a pack for `berth show --modelfile` and `/api/show`.
//!
//! The grammar is Ollama's: one instruction a line, its name case-insensitive; `#` starts a
//! comment line; a value is the rest of the line, a `"quoted"` string (`\"` and `\\` escaped), or
//! a `"""triple-quoted"""` one that may span lines. `FROM` names a pack, a `.gguf` file or a
//! safetensors folder. Berth renders Jinja chat templates, so a Go-template `TEMPLATE` is refused;
//! `PARAMETER` takes the Ollama parameters Berth's sampler implements, typed and range-checked.

use std::fmt;

use crate::pack::{PackManifest, PackMessage};

/// A Modelfile mistake, with the 1-based line it is on (0 for a value that came from JSON).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ModelfileError {
    /// The line of the instruction (0: not from a Modelfile's text).
    pub line: usize,
    /// What is wrong.
    pub message: String,
}

impl fmt::Display for ModelfileError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.line == 0 {
            f.write_str(&self.message)
        } else {
            write!(f, "Modelfile line {}: {}", self.line, self.message)
        }
    }
}

impl std::error::Error for ModelfileError {}

/// What a Modelfile (or `/api/create`'s JSON) asks a new pack to be.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Modelfile {
    /// The base: a pack reference, or a path to a `.gguf` file or a safetensors folder.
    pub from: Option<String>,
    /// A Jinja chat template replacing the base's.
    pub template: Option<String>,
    /// The system prompt.
    pub system: Option<String>,
    /// Sampling defaults under Ollama's names, typed (`stop` is an array).
    pub parameters: toml::Table,
    /// Messages put before every conversation.
    pub messages: Vec<PackMessage>,
    /// License texts, in order.
    pub license: Vec<String>,
}

/// The kind of value an implemented parameter takes, with its range.
enum Kind {
    Float(f64, f64),
    Int(i64, i64),
    Text,
}

/// The Ollama parameters Berth implements, with their types and ranges (those of `options`).
const PARAMETERS: &[(&str, Kind)] = &[
    ("temperature", Kind::Float(0.0, 100.0)),
    ("top_k", Kind::Int(-1, 1 << 20)),
    ("top_p", Kind::Float(0.0, 1.0)),
    ("min_p", Kind::Float(0.0, 1.0)),
    ("seed", Kind::Int(i64::MIN, i64::MAX)),
    ("repeat_penalty", Kind::Float(0.0, 100.0)),
    ("repeat_last_n", Kind::Int(-1, 1 << 20)),
    ("presence_penalty", Kind::Float(-100.0, 100.0)),
    ("frequency_penalty", Kind::Float(-100.0, 100.0)),
    ("stop", Kind::Text),
    ("num_predict", Kind::Int(-2, u32::MAX as i64)),
    ("num_ctx", Kind::Int(1, u32::MAX as i64)),
];

/// Ollama parameters Berth does not implement: naming one is an error that says so.
const UNSUPPORTED: &[&str] = &[
    "mirostat",
    "mirostat_eta",
    "mirostat_tau",
    "num_gpu",
    "main_gpu",
    "num_thread",
    "num_batch",
    "num_keep",
    "num_gqa",
    "tfs_z",
    "typical_p",
    "penalize_newline",
    "low_vram",
    "f16_kv",
    "logits_all",
    "vocab_only",
    "use_mmap",
    "use_mlock",
    "numa",
    "rope_frequency_base",
    "rope_frequency_scale",
    "embedding_only",
];

/// The most stop strings a pack may hold (as a request's `options.stop`).
const MAX_STOPS: usize = 16;

/// Whether `name` is a parameter Berth implements.
pub fn is_supported_parameter(name: &str) -> bool {
    PARAMETERS.iter().any(|(n, _)| *n == name)
}

/// Whether `name` is an Ollama parameter Berth knows of and does not implement (`mirostat`, ...).
pub fn is_unsupported_parameter(name: &str) -> bool {
    UNSUPPORTED.contains(&name.to_ascii_lowercase().as_str())
}

/// The parameters Berth implements, in Ollama's names.
pub fn supported_parameters() -> impl Iterator<Item = &'static str> {
    PARAMETERS.iter().map(|(n, _)| *n)
}

/// The type of a parameter Berth implements; an error naming any other.
fn parameter_kind(name: &str) -> Result<&'static Kind, String> {
    let lower = name.to_ascii_lowercase();
    if let Some((_, kind)) = PARAMETERS.iter().find(|(n, _)| *n == lower) {
        return Ok(kind);
    }
    if UNSUPPORTED.contains(&lower.as_str()) {
        return Err(format!(
            "parameter {lower} is not supported by Berth (it implements {})",
            implemented_list()
        ));
    }
    Err(format!(
        "unknown parameter {name:?} (Berth implements {})",
        implemented_list()
    ))
}

fn implemented_list() -> String {
    PARAMETERS.iter().map(|(n, _)| *n).collect::<Vec<_>>().join(", ")
}

/// Checks one parameter given as text and adds it to `table` (`stop` accumulates).
pub fn add_parameter(table: &mut toml::Table, name: &str, value: &str) -> Result<(), String> {
    let lower = name.to_ascii_lowercase();
    let kind = parameter_kind(name)?;
    let v = value.trim();
    let typed = match kind {
        Kind::Float(lo, hi) => {
            let x: f64 = v
                .parse()
                .ok()
                .filter(|x: &f64| x.is_finite())
                .ok_or_else(|| format!("parameter {lower}: {v:?} is not a number"))?;
            if !(*lo..=*hi).contains(&x) {
                return Err(format!(
                    "parameter {lower} must be between {lo} and {hi}; got {v}"
                ));
            }
            toml::Value::Float(x)
        }
        Kind::Int(lo, hi) => {
            let x: i64 = v
                .parse()
                .map_err(|_| format!("parameter {lower}: {v:?} is not an integer"))?;
            if !(*lo..=*hi).contains(&x) {
                return Err(format!(
                    "parameter {lower} must be between {lo} and {hi}; got {v}"
                ));
            }
            toml::Value::Integer(x)
        }
        Kind::Text => {
            if value.is_empty() {
                return Err(format!("parameter {lower}: an empty stop string never matches"));
            }
            let entry = table
                .entry(lower.clone())
                .or_insert_with(|| toml::Value::Array(Vec::new()));
            let toml::Value::Array(list) = entry else {
                unreachable!("stop is only ever stored as an array")
            };
            if list.len() >= MAX_STOPS {
                return Err(format!("parameter {lower}: at most {MAX_STOPS} stop strings"));
            }
            list.push(toml::Value::String(value.to_string()));
            return Ok(());
        }
    };
    table.insert(lower, typed);
    Ok(())
}

/// Checks one parameter given as JSON (`/api/create`'s `parameters`) and adds it to `table`.
pub fn add_json_parameter(
    table: &mut toml::Table,
    name: &str,
    value: &serde_json::Value,
) -> Result<(), String> {
    use serde_json::Value;
    match value {
        Value::String(s) => add_parameter(table, name, s),
        Value::Number(n) => add_parameter(table, name, &n.to_string()),
        Value::Array(items) if name.eq_ignore_ascii_case("stop") => {
            for item in items {
                let Value::String(s) = item else {
                    return Err(format!("parameter stop: {item} is not a string"));
                };
                add_parameter(table, name, s)?;
            }
            Ok(())
        }
        Value::Null => Ok(()),
        other => {
            parameter_kind(name)?;
            Err(format!("parameter {name}: {other} is not a number or a string"))
        }
    }
}

/// Refuses a Go template (Ollama's `{{ .Prompt }}`, `{{ if .System }}`): Berth renders Jinja.
pub fn check_template(template: &str) -> Result<(), String> {
    let go_words = [
        "if", "range", "end", "else", "with", "template", "define", "block",
    ];
    let mut rest = template;
    while let Some(i) = rest.find("{{") {
        let action = rest[i + 2..].trim_start_matches('-').trim_start();
        let word: String = action
            .chars()
            .take_while(|c| c.is_ascii_alphanumeric() || *c == '_' || *c == '.' || *c == '$')
            .collect();
        if word.starts_with('.') || word.starts_with('$') || go_words.contains(&word.as_str()) {
            return Err(format!(
                "TEMPLATE looks like a Go template ({{{{ {word} ... }}}}); Berth renders Jinja chat \
                 templates (as in tokenizer_config.json: {{% for message in messages %}}...), so write \
                 the template in Jinja or leave TEMPLATE out to keep the model's own"
            ));
        }
        rest = &rest[i + 2..];
    }
    Ok(())
}

/// Checks a `MESSAGE` role.
pub fn check_role(role: &str) -> Result<String, String> {
    let lower = role.to_ascii_lowercase();
    match lower.as_str() {
        "system" | "user" | "assistant" => Ok(lower),
        _ => Err(format!(
            "message role {role:?} is not one of system, user, assistant"
        )),
    }
}

/// Splits the first whitespace-separated word off `s`.
fn split_word(s: &str) -> (&str, &str) {
    let s = s.trim_start_matches([' ', '\t']);
    match s.find([' ', '\t', '\n', '\r']) {
        Some(i) => (&s[..i], &s[i..]),
        None => (s, ""),
    }
}

/// Reads a value at the start of `rest` (which may run past the current line for quotes):
/// returns the value and the text after it; `line` counts the newlines consumed.
fn read_value<'a>(rest: &'a str, line: &mut usize) -> Result<(String, &'a str), ModelfileError> {
    let start_line = *line;
    let s = rest.trim_start_matches([' ', '\t']);
    let err = |message: String| ModelfileError {
        line: start_line,
        message,
    };
    if let Some(body) = s.strip_prefix("\"\"\"") {
        let end = body
            .find("\"\"\"")
            .ok_or_else(|| err("unterminated \"\"\" value".into()))?;
        let value = &body[..end];
        *line += value.matches('\n').count();
        return Ok((value.to_string(), &body[end + 3..]));
    }
    if let Some(body) = s.strip_prefix('"') {
        let mut out = String::new();
        let mut chars = body.char_indices();
        while let Some((i, c)) = chars.next() {
            match c {
                '\\' => match chars.next() {
                    Some((_, e @ ('"' | '\\'))) => out.push(e),
                    Some((_, other)) => {
                        out.push('\\');
                        out.push(other);
                    }
                    None => break,
                },
                '"' => return Ok((out, &body[i + 1..])),
                c => {
                    if c == '\n' {
                        *line += 1;
                    }
                    out.push(c)
                }
            }
        }
        return Err(err("unterminated quoted value".into()));
    }
    let end = s.find('\n').unwrap_or(s.len());
    Ok((s[..end].trim().to_string(), &s[end..]))
}

impl Modelfile {
    /// Parses Modelfile text; each error names its line, and a Modelfile without `FROM` is one.
    pub fn parse(text: &str) -> Result<Modelfile, ModelfileError> {
        let mf = Modelfile::parse_partial(text)?;
        if mf.from.is_none() {
            return Err(ModelfileError {
                line: 0,
                message: "the Modelfile has no FROM line".into(),
            });
        }
        Ok(mf)
    }

    /// Parses Modelfile text that may leave `FROM` to its caller (`/api/create`'s `from`).
    pub fn parse_partial(text: &str) -> Result<Modelfile, ModelfileError> {
        let mut mf = Modelfile::default();
        let mut rest = text;
        let mut line = 1usize;
        loop {
            // Skip blank lines and comments.
            let trimmed = rest.trim_start_matches([' ', '\t', '\r']);
            if trimmed.is_empty() {
                break;
            }
            if let Some(after) = trimmed.strip_prefix('\n') {
                line += 1;
                rest = after;
                continue;
            }
            if trimmed.starts_with('#') {
                let end = trimmed.find('\n').unwrap_or(trimmed.len());
                rest = &trimmed[end..];
                continue;
            }
            let here = line;
            let err = |message: String| ModelfileError { line: here, message };
            let (word, after) = split_word(trimmed);
            let instruction = word.to_ascii_uppercase();
            let after = match instruction.as_str() {
                "FROM" | "TEMPLATE" | "SYSTEM" | "LICENSE" | "ADAPTER" => {
                    let (value, after) = read_value(after, &mut line)?;
                    match instruction.as_str() {
                        "FROM" => {
                            if value.is_empty() {
                                return Err(err(
                                    "FROM needs a model: a pack name, a .gguf file or a folder".into()
                                ));
                            }
                            if mf.from.is_some() {
                                return Err(err("a second FROM: a Modelfile has one base".into()));
                            }
                            mf.from = Some(value);
                        }
                        "TEMPLATE" => {
                            check_template(&value).map_err(err)?;
                            mf.template = Some(value);
                        }
                        "SYSTEM" => mf.system = Some(value),
                        "LICENSE" => mf.license.push(value),
                        _ => {
                            return Err(err("ADAPTER: adapters are not supported yet".into()));
                        }
                    }
                    after
                }
                "PARAMETER" => {
                    let (name, after) = split_word(after);
                    if name.is_empty() {
                        return Err(err("PARAMETER needs a name and a value".into()));
                    }
                    let (value, after) = read_value(after, &mut line)?;
                    add_parameter(&mut mf.parameters, name, &value).map_err(err)?;
                    after
                }
                "MESSAGE" => {
                    let (role, after) = split_word(after);
                    let role = check_role(role).map_err(err)?;
                    let (content, after) = read_value(after, &mut line)?;
                    mf.messages.push(PackMessage { role, content });
                    after
                }
                _ => {
                    return Err(err(format!(
                        "unknown instruction {word:?} (a Modelfile has FROM, TEMPLATE, SYSTEM, \
                         PARAMETER, MESSAGE, LICENSE)"
                    )))
                }
            };
            // Nothing may follow a quoted value on its line.
            let end = after.find('\n').unwrap_or(after.len());
            if !after[..end].trim().is_empty() {
                return Err(ModelfileError {
                    line,
                    message: format!("unexpected text after the value: {:?}", after[..end].trim()),
                });
            }
            rest = &after[end..];
        }
        Ok(mf)
    }

    /// Writes these values over a base pack's manifest: a given system prompt, message list or
    /// license replaces the base's; parameters replace the base's of the same name.
    pub fn apply(&self, manifest: &mut PackManifest) {
        for (k, v) in &self.parameters {
            manifest.defaults.insert(k.clone(), v.clone());
        }
        if let Some(s) = &self.system {
            manifest.system = Some(s.clone());
        }
        if !self.messages.is_empty() {
            manifest.messages = self.messages.clone();
        }
        if !self.license.is_empty() {
            manifest.license = Some(self.license.join("\n\n"));
        }
    }
}

/// A value as a Modelfile writes it: bare when it is one plain word, else quoted.
fn quote(value: &str) -> String {
    let plain = !value.is_empty()
        && !value.starts_with('#')
        && value.chars().all(|c| !c.is_whitespace() && c != '"' && c != '\\');
    if plain {
        value.to_string()
    } else {
        quoted(value)
    }
}

/// A value always in quotes: `"..."`, or `"""..."""` when it spans lines.
fn quoted(value: &str) -> String {
    if value.contains('\n') && !value.contains("\"\"\"") && !value.ends_with('"') {
        format!("\"\"\"{value}\"\"\"")
    } else {
        format!("\"{}\"", value.replace('\\', "\\\\").replace('"', "\\\""))
    }
}

/// A long value (template, system prompt, message): triple-quoted when it can be.
fn block(value: &str) -> String {
    if !value.contains("\"\"\"") && !value.ends_with('"') {
        format!("\"\"\"{value}\"\"\"")
    } else {
        format!("\"{}\"", value.replace('\\', "\\\\").replace('"', "\\\""))
    }
}

/// A number as Ollama prints it (`0`, not `0.0`).
fn number(x: f64) -> String {
    if x.fract() == 0.0 && x.abs() < 1e15 {
        format!("{}", x as i64)
    } else {
        format!("{x}")
    }
}

/// A defaults value as text, one per array element; strings JSON-quoted when `json_quote`.
fn values(v: &toml::Value, json_quote: bool) -> Vec<String> {
    match v {
        toml::Value::Array(items) => items.iter().flat_map(|i| values(i, json_quote)).collect(),
        toml::Value::String(s) if json_quote => vec![serde_json::Value::String(s.clone()).to_string()],
        toml::Value::String(s) => vec![quoted(s)],
        toml::Value::Float(x) => vec![number(*x)],
        toml::Value::Integer(i) => vec![i.to_string()],
        toml::Value::Boolean(b) => vec![b.to_string()],
        other => vec![other.to_string()],
    }
}

/// A pack's defaults in `/api/show`'s `parameters` text: `name value` a line, the name padded to
/// 30 columns as Ollama pads it, strings quoted, one line per `stop` string.
pub fn parameters_text(defaults: &toml::Table) -> String {
    let mut lines = Vec::new();
    for (k, v) in defaults {
        for text in values(v, true) {
            lines.push(format!("{k:<30} {text}"));
        }
    }
    lines.join("\n")
}

/// A pack as a Modelfile that `berth create` accepts: `FROM from`, then the template (when
/// given), system prompt, parameters, messages and license. A default Berth does not implement
/// (an Ollama-registry pull may carry `num_keep`) is written as a comment.
pub fn render(from: &str, template: Option<&str>, manifest: &PackManifest) -> String {
    let mut out = String::new();
    out.push_str(&format!(
        "# Modelfile of {}, written by Berth\n",
        manifest.reference()
    ));
    out.push_str(&format!("FROM {}\n", quote(from)));
    if let Some(t) = template {
        out.push_str(&format!("TEMPLATE {}\n", block(t)));
    }
    if let Some(s) = &manifest.system {
        out.push_str(&format!("SYSTEM {}\n", block(s)));
    }
    for (k, v) in &manifest.defaults {
        let comment = if is_supported_parameter(k) {
            ""
        } else {
            "# (not supported by Berth) "
        };
        for text in values(v, false) {
            out.push_str(&format!("{comment}PARAMETER {k} {text}\n"));
        }
    }
    for m in &manifest.messages {
        out.push_str(&format!("MESSAGE {} {}\n", m.role, quote(&m.content)));
    }
    if let Some(l) = &manifest.license {
        out.push_str(&format!("LICENSE {}\n", block(l)));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pack::PackRef;

    fn err(text: &str) -> ModelfileError {
        Modelfile::parse(text).unwrap_err()
    }

    #[test]
    fn instructions_comments_and_quoting_parse() {
        let text = r#"# a comment
from qwen2.5-coder:0.5b

SYSTEM """You are terse.
Answer in one line."""
PARAMETER temperature 0
parameter stop "<|im_end|>"
PARAMETER stop """
"""
PARAMETER top_k 20
MESSAGE user "Say \"hi\""
MESSAGE assistant hi
LICENSE MIT
LICENSE """Apache
2.0"""
TEMPLATE "{% for m in messages %}{{ m.content }}{% endfor %}"
"#;
        let mf = Modelfile::parse(text).unwrap();
        assert_eq!(mf.from.as_deref(), Some("qwen2.5-coder:0.5b"));
        assert_eq!(mf.system.as_deref(), Some("You are terse.\nAnswer in one line."));
        assert_eq!(mf.parameters["temperature"].as_float(), Some(0.0));
        assert_eq!(mf.parameters["top_k"].as_integer(), Some(20));
        let stops: Vec<&str> = mf.parameters["stop"]
            .as_array()
            .unwrap()
            .iter()
            .map(|s| s.as_str().unwrap())
            .collect();
        assert_eq!(stops, ["<|im_end|>", "\n"]);
        assert_eq!(mf.messages.len(), 2);
        assert_eq!(mf.messages[0].content, "Say \"hi\"");
        assert_eq!(mf.messages[1].role, "assistant");
        assert_eq!(mf.license, ["MIT", "Apache\n2.0"]);
        assert!(mf.template.unwrap().starts_with("{% for"));
    }

    #[test]
    fn errors_name_their_line() {
        let e = err("FROM x\n\nPARAMETER mirostat 1\n");
        assert_eq!(e.line, 3);
        assert!(e.to_string().starts_with("Modelfile line 3: "), "{e}");
        assert!(e.message.contains("mirostat is not supported"), "{e}");
        for name in ["num_gpu", "tfs_z", "typical_p", "num_keep", "penalize_newline"] {
            let e = err(&format!("FROM x\nPARAMETER {name} 1\n"));
            assert!(
                e.message.contains(name) && e.message.contains("not supported"),
                "{e}"
            );
        }
        let e = err("FROM x\nPARAMETER temperature hot\n");
        assert_eq!(e.line, 2);
        assert!(e.message.contains("not a number"), "{e}");
        let e = err("FROM x\nPARAMETER top_p 1.5\n");
        assert!(e.message.contains("between 0 and 1"), "{e}");
        let e = err("FROM x\nPARAMETER top_k 2.5\n");
        assert!(e.message.contains("not an integer"), "{e}");
        let e = err("FROM x\nPARAMETER bogus 1\n");
        assert!(e.message.contains("unknown parameter"), "{e}");
        let e = err("FROM x\nSYSTEM \"\"\"a\nb\"\"\"\nADAPTER ./lora.gguf\n");
        assert_eq!(e.line, 4);
        assert!(e.message.contains("adapters are not supported yet"), "{e}");
        let e = err("FROM x\nSYSTEM \"\"\"never\nends\n");
        assert_eq!(e.line, 2);
        assert!(e.message.contains("unterminated"), "{e}");
        let e = err("FROM x\nMESSAGE tool hi\n");
        assert!(e.message.contains("role"), "{e}");
        let e = err("FROM x\nSYSTEM \"a\" b\n");
        assert!(e.message.contains("after the value"), "{e}");
        let e = err("FROM x\nQUANTIZE q4\n");
        assert!(e.message.contains("unknown instruction"), "{e}");
        assert!(err("SYSTEM hi\n").message.contains("no FROM"));
        assert!(err("FROM a\nFROM b\n").message.contains("second FROM"));
    }

    #[test]
    fn go_templates_are_refused_and_jinja_accepted() {
        for go in [
            "{{ .Prompt }}",
            "{{ if .System }}<|system|>{{ .System }}{{ end }}",
            "{{- range .Messages }}{{ .Content }}{{ end }}",
        ] {
            let e = err(&format!("FROM x\nTEMPLATE \"\"\"{go}\"\"\"\n"));
            assert!(
                e.message.contains("Go template") && e.message.contains("Jinja"),
                "{e}"
            );
        }
        for jinja in [
            "{% for message in messages %}{{ message['content'] }}{% endfor %}",
            "{{ bos_token }}{{ messages[0].content }}",
            "{%- if add_generation_prompt %}<|im_start|>assistant\n{%- endif %}",
        ] {
            assert_eq!(check_template(jinja), Ok(()), "{jinja}");
        }
    }

    #[test]
    fn json_parameters_are_typed_as_text_ones() {
        let mut t = toml::Table::new();
        add_json_parameter(&mut t, "temperature", &serde_json::json!(0.2)).unwrap();
        add_json_parameter(&mut t, "num_ctx", &serde_json::json!(4096)).unwrap();
        add_json_parameter(&mut t, "stop", &serde_json::json!(["a", "b"])).unwrap();
        add_json_parameter(&mut t, "stop", &serde_json::json!("c")).unwrap();
        assert_eq!(t["temperature"].as_float(), Some(0.2));
        assert_eq!(t["num_ctx"].as_integer(), Some(4096));
        assert_eq!(t["stop"].as_array().unwrap().len(), 3);
        assert!(add_json_parameter(&mut t, "num_ctx", &serde_json::json!(true)).is_err());
        assert!(add_json_parameter(&mut t, "mirostat", &serde_json::json!(2))
            .unwrap_err()
            .contains("mirostat"));
        assert!(add_json_parameter(&mut t, "temperature", &serde_json::json!(-1)).is_err());
    }

    #[test]
    fn rendered_modelfiles_parse_back_to_the_same_values() {
        let mut m = PackManifest::new(&PackRef::parse("mine:v1").unwrap(), "qwen3");
        let mf = Modelfile::parse(
            "FROM base\nSYSTEM \"\"\"Be \"brief\".\nVery.\"\"\"\nPARAMETER temperature 0.5\n\
             PARAMETER stop \"<|im_end|>\"\nPARAMETER stop \"say \\\"x\\\"\"\nPARAMETER seed 7\n\
             MESSAGE user \"\"\"hi\nthere\"\"\"\nMESSAGE assistant ok\nLICENSE MIT\n",
        )
        .unwrap();
        mf.apply(&mut m);
        m.defaults.insert("num_keep".into(), toml::Value::Integer(24));
        let text = render("mine:v1", Some("{{ messages[0].content }}\n"), &m);
        assert!(
            text.contains("# (not supported by Berth) PARAMETER num_keep 24"),
            "{text}"
        );
        let back = Modelfile::parse(&text).unwrap();
        let mut again = PackManifest::new(&PackRef::parse("mine:v1").unwrap(), "qwen3");
        back.apply(&mut again);
        again.defaults.insert("num_keep".into(), toml::Value::Integer(24));
        assert_eq!(
            (&again.defaults, &again.system, &again.messages, &again.license),
            (&m.defaults, &m.system, &m.messages, &m.license)
        );
        assert_eq!(back.template.as_deref(), Some("{{ messages[0].content }}\n"));
        assert_eq!(back.from.as_deref(), Some("mine:v1"));
    }

    #[test]
    fn parameters_text_is_ollamas() {
        let mf = Modelfile::parse("FROM x\nPARAMETER temperature 0\nPARAMETER stop \"<|im_end|>\"\nPARAMETER stop \"<|endoftext|>\"\n").unwrap();
        let text = parameters_text(&mf.parameters);
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines.len(), 3, "{text}");
        assert_eq!(
            lines[0].split_whitespace().collect::<Vec<_>>(),
            ["stop", "\"<|im_end|>\""]
        );
        assert_eq!(
            lines[2].split_whitespace().collect::<Vec<_>>(),
            ["temperature", "0"]
        );
        assert_eq!(
            lines[0].find('"'),
            Some(31),
            "names padded to 30 columns as Ollama's"
        );
    }
}
