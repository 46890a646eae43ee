//! Chat templates: the Jinja templates models ship (`chat_template.jinja`, GGUF
//! `tokenizer.chat_template`) rendered with MiniJinja the way Hugging Face transformers renders
//! them: `trim_blocks` and `lstrip_blocks` on, Python string/dict methods (`.strip()`,
//! `.items()`, ...), `raise_exception`, `strftime_now`, and a `tojson` filter that writes JSON
//! like Python's `json.dumps(..., ensure_ascii=False)` with key order preserved.

use std::fmt;
use std::path::Path;

use berth_registry::gguf::GgufFile;
use minijinja::value::{Kwargs, Serde};
use minijinja::{Environment, Error, ErrorKind, Value};

/// The name the template is registered under (shows in MiniJinja's own messages).
const NAME: &str = "chat_template";

/// MiniJinja fuel per render: about one instruction, or 64 bytes of data made, per unit. Real
/// templates spend well under a million on a long conversation; a hostile one (nested loops over
/// huge ranges, string doubling) stops with an error instead of spinning or filling memory.
pub const RENDER_FUEL: u64 = 10_000_000;

/// MiniJinja recursion limit per render (macro calls, includes, nested blocks). Recursive macros
/// that walk a tool's JSON schema stay far below it; runaway recursion fails well before the
/// thread's stack would.
pub const RECURSION_LIMIT: usize = 200;

/// A template failed to compile or render; the message is one line with the template line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TemplateError {
    /// 1-based line in the template source, when known.
    pub line: Option<usize>,
    /// One-line description of what failed.
    pub message: String,
}

impl fmt::Display for TemplateError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.line {
            Some(line) => write!(f, "chat template line {line}: {}", self.message),
            None => write!(f, "chat template: {}", self.message),
        }
    }
}

impl std::error::Error for TemplateError {}

impl TemplateError {
    fn from_minijinja(e: &Error, source: &str) -> TemplateError {
        let mut message = match e.kind() {
            // Messages from `raise_exception` are the template author's own words.
            ErrorKind::InvalidOperation if e.detail().is_some_and(|d| d.starts_with(RAISED)) => {
                e.detail().unwrap_or_default().to_owned()
            }
            kind => match e.detail() {
                Some(detail) => format!("{kind}: {detail}"),
                None => kind.to_string(),
            },
        };
        let line = e.line();
        if let Some(text) = line.and_then(|l| source.lines().nth(l.checked_sub(1)?)) {
            let text = text.trim();
            let shown: String = text.chars().take(80).collect();
            let ellipsis = if shown.len() < text.len() { "..." } else { "" };
            message.push_str(&format!(" (at `{shown}{ellipsis}`)"));
        }
        TemplateError {
            line,
            message: message.split_whitespace().collect::<Vec<_>>().join(" "),
        }
    }
}

/// Prefix of errors raised by the template's `raise_exception`.
const RAISED: &str = "template raised an exception: ";

/// What a chat template is rendered with.
#[derive(Debug, Clone, Default)]
pub struct RenderInput {
    /// The conversation: OpenAI-style message objects (`role`, `content`, `tool_calls`, ...).
    pub messages: Vec<serde_json::Value>,
    /// Tool (function) definitions, when the request offers tools.
    pub tools: Option<Vec<serde_json::Value>>,
    /// Whether to end with the header of an assistant turn.
    pub add_generation_prompt: bool,
    /// Extra template variables (`chat_template_kwargs` such as `enable_thinking`).
    pub extra: serde_json::Map<String, serde_json::Value>,
    /// The BOS token text (`<bos>`), empty when the model has none.
    pub bos_token: String,
    /// The EOS token text.
    pub eos_token: String,
}

/// Template variables the renderer sets itself; a request may not override them.
const RESERVED: [&str; 5] = [
    "messages",
    "tools",
    "add_generation_prompt",
    "bos_token",
    "eos_token",
];

/// A request parameter that cannot reach the template: a client error (HTTP 400 naming `param`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KwargsError {
    /// The request parameter at fault (`chat_template_kwargs`).
    pub param: String,
    /// One-line description for the client.
    pub message: String,
}

impl fmt::Display for KwargsError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.param, self.message)
    }
}

impl std::error::Error for KwargsError {}

impl RenderInput {
    /// Merge a request's `chat_template_kwargs` (a JSON object; absent or `null` = none) and its
    /// `enable_thinking` into [`RenderInput::extra`]. `enable_thinking` wins over the same key in
    /// the kwargs. A non-object, or a key the renderer sets itself (`messages`, `tools`,
    /// `add_generation_prompt`, `bos_token`, `eos_token`), is a [`KwargsError`].
    pub fn with_request_kwargs(
        mut self,
        chat_template_kwargs: Option<&serde_json::Value>,
        enable_thinking: Option<bool>,
    ) -> Result<RenderInput, KwargsError> {
        let error = |message: String| KwargsError {
            param: "chat_template_kwargs".into(),
            message,
        };
        match chat_template_kwargs {
            None | Some(serde_json::Value::Null) => {}
            Some(serde_json::Value::Object(map)) => {
                if let Some(key) = map.keys().find(|k| RESERVED.contains(&k.as_str())) {
                    return Err(error(format!(
                        "'{key}' is set by the server and cannot be overridden"
                    )));
                }
                for (k, v) in map {
                    self.extra.insert(k.clone(), v.clone());
                }
            }
            Some(other) => {
                let kind = match other {
                    serde_json::Value::Bool(_) => "a boolean",
                    serde_json::Value::Number(_) => "a number",
                    serde_json::Value::String(_) => "a string",
                    _ => "an array",
                };
                return Err(error(format!("must be a JSON object, got {kind}")));
            }
        }
        if let Some(on) = enable_thinking {
            self.extra.insert("enable_thinking".into(), on.into());
        }
        Ok(self)
    }

    /// The `enable_thinking` the template will see, if it was set to a boolean.
    pub fn enable_thinking(&self) -> Option<bool> {
        self.extra.get("enable_thinking").and_then(|v| v.as_bool())
    }
}

/// A compiled chat template.
pub struct ChatTemplate {
    env: Environment<'static>,
    source: String,
}

impl fmt::Debug for ChatTemplate {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ChatTemplate")
            .field("len", &self.source.len())
            .finish()
    }
}

impl ChatTemplate {
    /// Compile a template from its Jinja source.
    pub fn new(source: impl Into<String>) -> Result<ChatTemplate, TemplateError> {
        let source = source.into();
        let compiled = rewrite_generation_tags(&source);
        let mut env = Environment::new();
        let syntax = minijinja::syntax::SyntaxConfig::builder()
            .trim_blocks(true)
            .lstrip_blocks(true)
            .build()
            .map_err(|e| TemplateError::from_minijinja(&e, ""))?;
        env.set_syntax(syntax);
        env.set_fuel(Some(RENDER_FUEL));
        env.set_recursion_limit(RECURSION_LIMIT);
        env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
        env.add_function("raise_exception", raise_exception);
        env.add_function("strftime_now", strftime_now);
        env.add_filter("tojson", tojson);
        env.add_template_owned(NAME, compiled)
            .map_err(|e| TemplateError::from_minijinja(&e, &source))?;
        Ok(ChatTemplate { env, source })
    }

    /// The pack's `chat_template.jinja`, else the `chat_template` of its `tokenizer_config.json`,
    /// else the GGUF's `tokenizer.chat_template`; `None` when there is none.
    pub fn from_pack_or_gguf(
        pack_dir: &Path,
        gguf: Option<&GgufFile>,
    ) -> Result<Option<ChatTemplate>, TemplateError> {
        let file = pack_dir.join("chat_template.jinja");
        if file.is_file() {
            let text = std::fs::read_to_string(&file).map_err(|e| TemplateError {
                line: None,
                message: format!("reading {}: {e}", file.display()),
            })?;
            return ChatTemplate::new(text).map(Some);
        }
        let config = std::fs::read_to_string(pack_dir.join("tokenizer_config.json"))
            .ok()
            .and_then(|t| serde_json::from_str::<serde_json::Value>(&t).ok());
        if let Some(text) = config.as_ref().and_then(|c| c["chat_template"].as_str()) {
            return ChatTemplate::new(text).map(Some);
        }
        match gguf.and_then(|g| g.get_str("tokenizer.chat_template")) {
            Some(text) => ChatTemplate::new(text).map(Some),
            None => Ok(None),
        }
    }

    /// The template source.
    pub fn source(&self) -> &str {
        &self.source
    }

    /// Render a conversation to the prompt text.
    pub fn render(&self, input: &RenderInput) -> Result<String, TemplateError> {
        let mut ctx = serde_json::Map::new();
        for (k, v) in &input.extra {
            ctx.insert(k.clone(), v.clone());
        }
        let messages: Vec<serde_json::Value> = input.messages.iter().map(prepare_message).collect();
        ctx.insert("messages".into(), messages.into());
        // An empty tool list is left out, as transformers does: templates test `if tools`.
        if let Some(tools) = input.tools.as_ref().filter(|t| !t.is_empty()) {
            ctx.insert("tools".into(), tools.clone().into());
        }
        ctx.insert("add_generation_prompt".into(), input.add_generation_prompt.into());
        ctx.insert("bos_token".into(), input.bos_token.clone().into());
        ctx.insert("eos_token".into(), input.eos_token.clone().into());
        let template = self
            .env
            .get_template(NAME)
            .map_err(|e| TemplateError::from_minijinja(&e, &self.source))?;
        template
            .render(Value::from(Serde(ctx)))
            .map_err(|e| TemplateError::from_minijinja(&e, &self.source))
    }
}

/// A message as templates expect it: an assistant call's `function.arguments` (a JSON string in
/// the API) becomes the object it encodes, in the string's key order (a string that is not a JSON
/// object is passed as sent), and text content parts are flattened into one string.
fn prepare_message(m: &serde_json::Value) -> serde_json::Value {
    let mut m = m.clone();
    if let Some(parts) = m.get("content").and_then(|c| c.as_array()) {
        let all_text = parts
            .iter()
            .all(|p| p.get("type").and_then(|t| t.as_str()) == Some("text"));
        if all_text {
            let text: String = parts
                .iter()
                .filter_map(|p| p.get("text").and_then(|t| t.as_str()))
                .collect();
            m["content"] = text.into();
        }
    }
    if let Some(calls) = m.get_mut("tool_calls").and_then(|c| c.as_array_mut()) {
        for call in calls {
            let Some(args) = call.pointer_mut("/function/arguments") else {
                continue;
            };
            if let Some(text) = args.as_str() {
                if let Ok(obj @ serde_json::Value::Object(_)) =
                    serde_json::from_str::<serde_json::Value>(text)
                {
                    *args = obj;
                }
            }
        }
    }
    m
}

/// Turn transformers' `{% generation %}` ... `{% endgeneration %}` (which marks assistant text
/// and renders its body unchanged) into `{% if true %}` ... `{% endif %}`, keeping the
/// whitespace-control markers, so line numbers and output stay the same.
fn rewrite_generation_tags(source: &str) -> String {
    let mut out = String::with_capacity(source.len());
    let mut rest = source;
    while let Some(start) = rest.find("{%") {
        out.push_str(&rest[..start]);
        let tag = &rest[start..];
        // The closing `%}` comes after the opening `{%` (in `{%}` they overlap).
        let Some(end) = tag[2..].find("%}").map(|i| i + 2) else {
            out.push_str(tag);
            return out;
        };
        let inner = &tag[2..end];
        let (open, body) = split_marker_front(inner);
        let (body, close) = split_marker_back(body);
        let replacement = match body.trim() {
            "generation" => Some("if true"),
            "endgeneration" => Some("endif"),
            _ => None,
        };
        match replacement {
            Some(r) => out.push_str(&format!("{{%{open} {r} {close}%}}")),
            None => out.push_str(&tag[..end + 2]),
        }
        rest = &tag[end + 2..];
    }
    out.push_str(rest);
    out
}

fn split_marker_front(s: &str) -> (&str, &str) {
    match s.chars().next() {
        Some(c @ ('-' | '+')) => s.split_at(c.len_utf8()),
        _ => ("", s),
    }
}

fn split_marker_back(s: &str) -> (&str, &str) {
    match s.chars().last() {
        Some(c @ ('-' | '+')) => s.split_at(s.len() - c.len_utf8()),
        _ => (s, ""),
    }
}

fn raise_exception(message: String) -> Result<Value, Error> {
    Err(Error::new(
        ErrorKind::InvalidOperation,
        format!("{RAISED}{message}"),
    ))
}

/// The local time formatted with C `strftime` (what Python's `strftime` wraps).
fn strftime_now(format: String) -> Result<String, Error> {
    let c_format = std::ffi::CString::new(format)
        .map_err(|_| Error::new(ErrorKind::InvalidOperation, "strftime_now: format contains NUL"))?;
    let mut buf = vec![0u8; 512];
    // SAFETY: `time` and `localtime_r` write only to the values passed; `tm` is a plain C struct
    // for which all-zero is valid; `strftime` writes at most `buf.len()` bytes into `buf` and
    // reads the NUL-terminated format and the initialised `tm`.
    let n = unsafe {
        let now = libc::time(std::ptr::null_mut());
        let mut tm: libc::tm = std::mem::zeroed();
        if libc::localtime_r(&now, &mut tm).is_null() {
            return Err(Error::new(
                ErrorKind::InvalidOperation,
                "strftime_now: no local time",
            ));
        }
        libc::strftime(buf.as_mut_ptr().cast(), buf.len(), c_format.as_ptr(), &tm)
    };
    buf.truncate(n);
    Ok(String::from_utf8_lossy(&buf).into_owned())
}

/// `tojson(indent=None, separators=None, sort_keys=False)`: JSON as Python's
/// `json.dumps(..., ensure_ascii=False)` writes it (`", "` and `": "` separators, non-ASCII
/// kept), with key order preserved.
fn tojson(value: Value, kwargs: Kwargs) -> Result<Value, Error> {
    let indent: Option<Value> = kwargs.get("indent")?;
    let separators: Option<Value> = kwargs.get("separators")?;
    let sort_keys: Option<bool> = kwargs.get("sort_keys")?;
    let _: Option<bool> = kwargs.get("ensure_ascii")?;
    kwargs.assert_all_used()?;
    let indent = match indent {
        Some(v) if !(v.is_none() || v.is_undefined()) => Some(match v.as_i64() {
            Some(n) => " ".repeat(n.max(0) as usize),
            None => v.to_string(),
        }),
        _ => None,
    };
    let mut style = PyJsonStyle {
        item_sep: if indent.is_some() { ",".into() } else { ", ".into() },
        key_sep: ": ".into(),
        indent,
        sort_keys: sort_keys.unwrap_or(false),
    };
    if let Some(seps) = separators.filter(|v| !(v.is_none() || v.is_undefined())) {
        let pair: Vec<String> = seps.try_iter()?.map(|v| v.to_string()).collect();
        let [item, key] = <[String; 2]>::try_from(pair).map_err(|_| {
            Error::new(
                ErrorKind::InvalidOperation,
                "tojson: separators must be a pair of strings",
            )
        })?;
        style.item_sep = item;
        style.key_sep = key;
    }
    let json = serde_json::to_value(&value)
        .map_err(|e| Error::new(ErrorKind::InvalidOperation, format!("tojson: {e}")))?;
    let mut out = String::new();
    write_py_json(&mut out, &json, &style, 0);
    Ok(Value::from_safe_string(out))
}

/// How [`write_py_json`] lays out JSON (the arguments of Python's `json.dumps`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PyJsonStyle {
    /// Indent unit; `None` writes everything on one line.
    pub indent: Option<String>,
    /// Between items (`", "`, or `","` when indenting).
    pub item_sep: String,
    /// Between a key and its value (`": "`).
    pub key_sep: String,
    /// Whether object keys are sorted (otherwise kept in insertion order).
    pub sort_keys: bool,
}

impl Default for PyJsonStyle {
    fn default() -> Self {
        PyJsonStyle {
            indent: None,
            item_sep: ", ".into(),
            key_sep: ": ".into(),
            sort_keys: false,
        }
    }
}

/// Append `v` as Python's `json.dumps(v, ensure_ascii=False, ...)` would write it.
pub fn write_py_json(out: &mut String, v: &serde_json::Value, style: &PyJsonStyle, depth: usize) {
    use serde_json::Value as J;
    let newline = |out: &mut String, depth: usize| {
        if let Some(ind) = &style.indent {
            out.push('\n');
            for _ in 0..depth {
                out.push_str(ind);
            }
        }
    };
    match v {
        J::Null => out.push_str("null"),
        J::Bool(b) => out.push_str(if *b { "true" } else { "false" }),
        J::Number(n) => out.push_str(&n.to_string()),
        J::String(s) => write_py_str(out, s),
        J::Array(items) if items.is_empty() => out.push_str("[]"),
        J::Array(items) => {
            out.push('[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push_str(&style.item_sep);
                }
                newline(out, depth + 1);
                write_py_json(out, item, style, depth + 1);
            }
            newline(out, depth);
            out.push(']');
        }
        J::Object(map) if map.is_empty() => out.push_str("{}"),
        J::Object(map) => {
            let mut entries: Vec<_> = map.iter().collect();
            if style.sort_keys {
                entries.sort_by(|a, b| a.0.cmp(b.0));
            }
            out.push('{');
            for (i, (k, item)) in entries.into_iter().enumerate() {
                if i > 0 {
                    out.push_str(&style.item_sep);
                }
                newline(out, depth + 1);
                write_py_str(out, k);
                out.push_str(&style.key_sep);
                write_py_json(out, item, style, depth + 1);
            }
            newline(out, depth);
            out.push('}');
        }
    }
}

fn write_py_str(out: &mut String, s: &str) {
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            '\u{8}' => out.push_str("\\b"),
            '\u{c}' => out.push_str("\\f"),
            c if (c as u32) < 0x20 => out.push_str(&format!("\\u{:04x}", c as u32)),
            c => out.push(c),
        }
    }
    out.push('"');
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    const FIXTURES: &str = "/work/shared/fixtures";

    fn fixtures_dir() -> std::path::PathBuf {
        // CI lays shared/ beside the clone; sessions have it at /work/shared.
        let beside = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../shared/fixtures");
        if beside.is_dir() {
            beside
        } else {
            std::path::PathBuf::from(FIXTURES)
        }
    }

    fn fixture(rel: &str) -> ChatTemplate {
        let path = fixtures_dir().join(rel);
        let source = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        ChatTemplate::new(source).unwrap_or_else(|e| panic!("{rel}: {e}"))
    }

    fn user(text: &str) -> serde_json::Value {
        json!({"role": "user", "content": text})
    }

    fn input(messages: Vec<serde_json::Value>) -> RenderInput {
        RenderInput {
            messages,
            add_generation_prompt: true,
            bos_token: "<bos>".into(),
            eos_token: "<eos>".into(),
            ..RenderInput::default()
        }
    }

    #[test]
    fn qwen25_coder_default_system_prompt() {
        let t = fixture("templates/Qwen2.5-Coder-0.5B-Instruct.jinja");
        let out = t.render(&input(vec![user("Hi")])).unwrap();
        assert_eq!(
            out,
            "<|im_start|>system\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant.\
             <|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"
        );
        let sys = json!({"role": "system", "content": "Be brief."});
        let out = t.render(&input(vec![sys, user("Hi")])).unwrap();
        assert_eq!(
            out,
            "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"
        );
    }

    #[test]
    fn qwen25_coder_with_tools_and_tool_calls() {
        let t = fixture("templates/Qwen2.5-Coder-0.5B-Instruct.jinja");
        let tool = json!({"type": "function", "function": {"name": "get_weather",
            "description": "Weather in a city", "parameters": {"type": "object",
            "properties": {"city": {"type": "string", "description": "Zürich"}}, "required": ["city"]}}});
        let mut inp = input(vec![
            user("Weather?"),
            json!({"role": "assistant", "content": "", "tool_calls": [
                {"type": "function", "function": {"name": "get_weather", "arguments": {"city": "Zürich"}}}]}),
            json!({"role": "tool", "content": "sunny"}),
        ]);
        inp.tools = Some(vec![tool]);
        let out = t.render(&inp).unwrap();
        // Key order kept, Python separators, non-ASCII kept.
        assert!(out.contains(
            r#"{"type": "function", "function": {"name": "get_weather", "description": "Weather in a city", "#
        ));
        assert!(
            out.contains(r#"{"name": "get_weather", "arguments": {"city": "Zürich"}}"#),
            "{out}"
        );
        assert!(out.contains("<tool_response>\nsunny\n</tool_response>"), "{out}");
        assert!(out.ends_with("<|im_start|>assistant\n"));
    }

    #[test]
    fn gemma3_renders_bos_and_turns() {
        let t = fixture("gemma3-270m/chat_template.jinja");
        let out = t.render(&input(vec![user("Hi")])).unwrap();
        assert_eq!(
            out,
            "<bos><start_of_turn>user\nHi<end_of_turn>\n<start_of_turn>model\n"
        );
        // The template's own raise_exception becomes a one-line error with the line.
        let err = t.render(&input(vec![user("a"), user("b")])).unwrap_err();
        assert!(err.line.is_some(), "{err}");
        let text = err.to_string();
        assert!(text.contains("Conversation roles must alternate"), "{text}");
        assert!(!text.contains('\n'), "{text}");
    }

    #[test]
    fn every_fixture_template_renders_a_user_message() {
        let dir = fixtures_dir().join("templates");
        let mut failures = Vec::new();
        let mut count = 0;
        for entry in std::fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            if path.extension().and_then(|e| e.to_str()) != Some("jinja") {
                continue;
            }
            count += 1;
            let source = std::fs::read_to_string(&path).unwrap();
            let name = path.file_name().unwrap().to_string_lossy().into_owned();
            match ChatTemplate::new(source).and_then(|t| t.render(&input(vec![user("Hello there")]))) {
                Ok(out) if out.contains("Hello there") => {}
                Ok(out) => failures.push(format!("{name}: output lacks the message: {out:?}")),
                Err(e) => failures.push(format!("{name}: {e}")),
            }
        }
        assert!(count >= 10, "found only {count} templates in {}", dir.display());
        assert!(failures.is_empty(), "{}", failures.join("\n"));
    }

    /// Tools as clients send them (openai-agents and pydantic-ai mark every tool `strict`) reach
    /// each fixture template as the template expects them: the name, description and every
    /// parameter shown, and no `strict`.
    #[test]
    fn every_fixture_template_gets_tools_without_transport_keys() {
        let sent = json!([{"type": "function", "function": {"name": "get_weather", "strict": true,
            "description": "Weather in a city", "parameters": {"type": "object", "additionalProperties": false,
            "properties": {"city": {"type": "string", "description": "The city"}}, "required": ["city"]}}}]);
        let rc = crate::constraint::RequestConstraints::from_openai(Some(&sent), None, None, None).unwrap();
        let dir = fixtures_dir().join("templates");
        let mut failures = Vec::new();
        for entry in std::fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            let source = std::fs::read_to_string(&path).unwrap();
            if path.extension().and_then(|e| e.to_str()) != Some("jinja") || !source.contains("tools") {
                continue;
            }
            let name = path.file_name().unwrap().to_string_lossy().into_owned();
            let mut inp = input(vec![user("Weather in Paris?")]);
            inp.tools = rc.parser_tools().map(<[serde_json::Value]>::to_vec);
            match ChatTemplate::new(source).and_then(|t| t.render(&inp)) {
                Ok(out) => {
                    for shown in ["get_weather", "Weather in a city", "city"] {
                        if !out.contains(shown) {
                            failures.push(format!("{name}: {shown:?} missing"));
                        }
                    }
                    if out.contains("strict") {
                        failures.push(format!("{name}: shows `strict`"));
                    }
                }
                Err(e) => failures.push(format!("{name}: {e}")),
            }
        }
        assert!(failures.is_empty(), "{}", failures.join("\n"));
    }

    #[test]
    fn generation_tags_render_their_body() {
        let t = ChatTemplate::new("a\n{%- generation -%}\n  b  \n{%- endgeneration %}\nc").unwrap();
        assert_eq!(t.render(&input(vec![])).unwrap(), "abc");
        assert_eq!(
            rewrite_generation_tags("{% generation %}x{%+ endgeneration -%}"),
            "{% if true %}x{%+ endif -%}"
        );
        assert_eq!(
            rewrite_generation_tags("{{ '{%' }} {% if x %}"),
            "{{ '{%' }} {% if x %}"
        );
    }

    #[test]
    fn tojson_matches_python_json_dumps() {
        let t = ChatTemplate::new("{{ x | tojson }}|{{ x | tojson(indent=2) }}|{{ y | tojson }}").unwrap();
        let mut inp = input(vec![]);
        inp.extra
            .insert("x".into(), json!({"b": [1, 2.5, null], "a": "é\"<>&\n"}));
        inp.extra.insert("y".into(), json!([]));
        let out = t.render(&inp).unwrap();
        assert_eq!(
            out,
            "{\"b\": [1, 2.5, null], \"a\": \"é\\\"<>&\\n\"}|{\n  \"b\": [\n    1,\n    2.5,\n    null\n  ],\n  \
             \"a\": \"é\\\"<>&\\n\"\n}|[]"
        );
        let compact = ChatTemplate::new("{{ y | tojson }}{{ x | tojson(separators=(',', ':')) }}").unwrap();
        assert_eq!(
            compact.render(&inp).unwrap(),
            "[]{\"b\":[1,2.5,null],\"a\":\"é\\\"<>&\\n\"}"
        );
        let sorted = ChatTemplate::new("{{ x | tojson(sort_keys=true) }}").unwrap();
        assert_eq!(
            sorted.render(&inp).unwrap(),
            "{\"a\": \"é\\\"<>&\\n\", \"b\": [1, 2.5, null]}"
        );
    }

    #[test]
    fn python_methods_and_globals() {
        let src = "{{ '  hi  '.strip() }}|{{ 'abc'.startswith('a') }}|{{ 'a,b'.split(',') | length }}|\
                   {% for k, v in d.items() %}{{ k }}={{ v }};{% endfor %}|{{ d.get('z', 'none') }}|\
                   {{ enable_thinking }}|{{ strftime_now('%Y') | length }}|{{ eos_token }}\n";
        let t = ChatTemplate::new(src).unwrap();
        let mut inp = input(vec![]);
        inp.extra.insert("d".into(), json!({"x": 1, "y": 2}));
        inp.extra.insert("enable_thinking".into(), json!(false));
        assert_eq!(t.render(&inp).unwrap(), "hi|True|2|x=1;y=2;|none|False|4|<eos>");
    }

    #[test]
    fn errors_name_the_line() {
        let err = ChatTemplate::new("ok\n{% if %}\n").unwrap_err();
        assert_eq!(err.line, Some(2), "{err}");
        assert!(
            err.to_string().starts_with("chat template line 2: syntax error"),
            "{err}"
        );
        let t = ChatTemplate::new("line1\n{{ raise_exception('bad input') }}").unwrap();
        let err = t.render(&input(vec![])).unwrap_err();
        assert_eq!(err.line, Some(2));
        assert!(err.to_string().contains("bad input"), "{err}");
        let t = ChatTemplate::new("a\nb\n{{ messages[0].content.nope() }}").unwrap();
        let err = t.render(&input(vec![user("x")])).unwrap_err();
        assert_eq!(err.line, Some(3), "{err}");
    }

    #[test]
    fn pack_template_wins_over_nothing() {
        let dir = tempfile::tempdir().unwrap();
        assert!(ChatTemplate::from_pack_or_gguf(dir.path(), None)
            .unwrap()
            .is_none());
        std::fs::write(
            dir.path().join("tokenizer_config.json"),
            r#"{"chat_template": "cfg"}"#,
        )
        .unwrap();
        let t = ChatTemplate::from_pack_or_gguf(dir.path(), None)
            .unwrap()
            .unwrap();
        assert_eq!(t.source(), "cfg");
        std::fs::write(dir.path().join("chat_template.jinja"), "file").unwrap();
        let t = ChatTemplate::from_pack_or_gguf(dir.path(), None)
            .unwrap()
            .unwrap();
        assert_eq!(t.render(&input(vec![])).unwrap(), "file");
    }

    #[test]
    fn gguf_template_is_used() {
        let out =
            std::process::Command::new(Path::new(env!("CARGO_MANIFEST_DIR")).join("../scripts/fetch-models"))
                .arg("qwen2.5-coder-0.5b")
                .output()
                .unwrap();
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        let path = String::from_utf8(out.stdout).unwrap();
        let file = GgufFile::open(path.trim()).unwrap();
        let dir = tempfile::tempdir().unwrap();
        let t = ChatTemplate::from_pack_or_gguf(dir.path(), Some(&file))
            .unwrap()
            .unwrap();
        let out = t.render(&input(vec![user("Hi")])).unwrap();
        assert!(
            out.ends_with("<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"),
            "{out}"
        );
    }

    #[test]
    fn assistant_call_arguments_reach_the_template_as_objects_in_key_order() {
        let t = ChatTemplate::new(
            "{% for m in messages %}{% for c in m.tool_calls %}{% if c.function.arguments is mapping %}{% for k, v in c.function.arguments|items %}{{ k }}={{ v }};{% endfor %}{% endif %}{{ c.function.arguments|tojson }}{% endfor %}{% endfor %}",
        )
        .unwrap();
        let input = RenderInput {
            messages: vec![
                serde_json::json!({"role": "assistant", "content": null, "tool_calls": [
                    {"type": "function", "function": {"name": "f", "arguments": "{\"zeta\": 1, \"alpha\": \"x\"}"}},
                    {"type": "function", "function": {"name": "g", "arguments": "not json"}}
                ]}),
            ],
            ..Default::default()
        };
        let out = t.render(&input).unwrap();
        assert!(
            out.starts_with("zeta=1;alpha=x;{\"zeta\": 1, \"alpha\": \"x\"}"),
            "{out}"
        );
        assert!(
            out.ends_with("\"not json\""),
            "a non-object string is passed as sent: {out}"
        );
    }

    #[test]
    fn empty_tools_are_left_out_and_text_parts_are_flattened() {
        let t =
            ChatTemplate::new("{% if tools %}T{% endif %}{% for m in messages %}{{ m.content }}{% endfor %}")
                .unwrap();
        let input = RenderInput {
            messages: vec![serde_json::json!({"role": "user", "content": [
                {"type": "text", "text": "Hello, "}, {"type": "text", "text": "world"}
            ]})],
            tools: Some(vec![]),
            ..Default::default()
        };
        assert_eq!(t.render(&input).unwrap(), "Hello, world");
    }

    #[test]
    fn request_kwargs_and_enable_thinking_reach_the_template() {
        let t = ChatTemplate::new(
            "{{ enable_thinking }}|{{ custom }}|{% if enable_thinking is defined and not enable_thinking %}off{% endif %}",
        )
        .unwrap();
        let kwargs = json!({"custom": "x", "enable_thinking": true});
        let inp = input(vec![]).with_request_kwargs(Some(&kwargs), None).unwrap();
        assert_eq!(inp.enable_thinking(), Some(true));
        assert_eq!(t.render(&inp).unwrap(), "True|x|");
        // The request's own `enable_thinking` wins over the kwargs'.
        let inp = input(vec![])
            .with_request_kwargs(Some(&kwargs), Some(false))
            .unwrap();
        assert_eq!(t.render(&inp).unwrap(), "False|x|off");
        // Absent and null kwargs change nothing.
        let inp = input(vec![])
            .with_request_kwargs(Some(&json!(null)), None)
            .unwrap();
        assert!(inp.extra.is_empty());
        assert_eq!(inp.enable_thinking(), None);
    }

    #[test]
    fn request_kwargs_turn_qwen3_thinking_off() {
        let t = fixture("templates/Qwen-Qwen3-0.6B.jinja");
        let inp = input(vec![user("Hi")])
            .with_request_kwargs(Some(&json!({"enable_thinking": false})), None)
            .unwrap();
        assert!(t
            .render(&inp)
            .unwrap()
            .ends_with("<|im_start|>assistant\n<think>\n\n</think>\n\n"));
        let inp = input(vec![user("Hi")])
            .with_request_kwargs(None, Some(true))
            .unwrap();
        assert!(t.render(&inp).unwrap().ends_with("<|im_start|>assistant\n"));
    }

    #[test]
    fn bad_request_kwargs_are_client_errors_naming_the_param() {
        for bad in [json!("enable_thinking=false"), json!([1]), json!(3), json!(true)] {
            let err = input(vec![]).with_request_kwargs(Some(&bad), None).unwrap_err();
            assert_eq!(err.param, "chat_template_kwargs");
            assert!(err.message.starts_with("must be a JSON object"), "{err}");
        }
        let err = input(vec![])
            .with_request_kwargs(Some(&json!({"messages": []})), None)
            .unwrap_err();
        assert_eq!(
            err.to_string(),
            "chat_template_kwargs: 'messages' is set by the server and cannot be overridden"
        );
    }

    /// Renders every case of a fixture written by `scripts/gen-template-fixtures` and compares
    /// with transformers' output byte for byte.
    fn check_transformers_fixture(file: &str) -> serde_json::Value {
        let path = Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../tests/fixtures/templates")
            .join(file);
        let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        let fixture: serde_json::Value = serde_json::from_str(&text).unwrap();
        let t = ChatTemplate::new(fixture["template"].as_str().unwrap()).unwrap();
        let cases = fixture["cases"].as_array().unwrap();
        assert!(!cases.is_empty());
        for case in cases {
            let name = case["name"].as_str().unwrap();
            let inp = RenderInput {
                messages: case["messages"].as_array().unwrap().clone(),
                tools: case["tools"].as_array().cloned(),
                add_generation_prompt: case["add_generation_prompt"].as_bool().unwrap(),
                bos_token: fixture["bos_token"].as_str().unwrap().into(),
                eos_token: fixture["eos_token"].as_str().unwrap().into(),
                ..RenderInput::default()
            }
            .with_request_kwargs(case.get("kwargs"), None)
            .unwrap();
            let out = t.render(&inp).unwrap_or_else(|e| panic!("{name}: {e}"));
            let want = case["prompt"].as_str().unwrap();
            if out != want {
                let at = out.bytes().zip(want.bytes()).take_while(|(a, b)| a == b).count();
                panic!(
                    "{file} {name}: differs from transformers at byte {at}\nours:   {:?}\ntheirs: {:?}",
                    &out[at.saturating_sub(40).min(out.len())..],
                    &want[at.saturating_sub(40).min(want.len())..]
                );
            }
        }
        fixture
    }

    #[test]
    fn qwen25_coder_renders_byte_identical_to_transformers() {
        let fixture = check_transformers_fixture("qwen2.5-coder-0.5b.json");
        let names: Vec<&str> = fixture["cases"]
            .as_array()
            .unwrap()
            .iter()
            .map(|c| c["name"].as_str().unwrap())
            .collect();
        for needed in ["plain_chat", "tools", "tool_call_round_trip"] {
            assert!(names.contains(&needed), "fixture lacks {needed}: {names:?}");
        }
        // The fixture's template is the one the GGUF carries.
        let template = fixture["template"].as_str().unwrap();
        let shared = fixtures_dir().join("templates/Qwen2.5-Coder-0.5B-Instruct.jinja");
        if let Ok(text) = std::fs::read_to_string(&shared) {
            assert_eq!(text.trim_end(), template.trim_end(), "{}", shared.display());
        }
    }

    #[test]
    fn qwen3_thinking_kwargs_render_byte_identical_to_transformers() {
        let fixture = check_transformers_fixture("qwen3.json");
        let kwargs: Vec<&serde_json::Value> = fixture["cases"]
            .as_array()
            .unwrap()
            .iter()
            .filter_map(|c| c.get("kwargs"))
            .collect();
        assert!(kwargs.contains(&&json!({"enable_thinking": false})), "{kwargs:?}");
    }

    #[test]
    fn unclosed_and_overlapping_tags_are_errors_not_panics() {
        // Found by fuzzing (scripts/fuzz template): `{%}` made the generation-tag rewrite slice
        // backwards, and text before an unclosed `{%` was written twice.
        assert_eq!(rewrite_generation_tags("a {%} b"), "a {%} b");
        assert_eq!(rewrite_generation_tags("a {% b"), "a {% b");
        assert_eq!(
            rewrite_generation_tags("{%}{% generation %}"),
            "{%}{% generation %}"
        );
        assert!(ChatTemplate::new("{%}").is_err());
        let t = ChatTemplate::new("Hi {{ '{%' }}").unwrap();
        assert_eq!(t.render(&input(vec![])).unwrap(), "Hi {%");
    }

    fn render_source(source: &str) -> Result<String, TemplateError> {
        ChatTemplate::new(source)?.render(&input(vec![user("Hi")]))
    }

    #[test]
    fn runaway_loops_run_out_of_fuel() {
        // 10^15 iterations: without fuel this would spin for days.
        let e = render_source(
            "{% for a in range(100000) %}{% for b in range(100000) %}{% for c in range(100000) %}\
             {{ a }}{% endfor %}{% endfor %}{% endfor %}",
        )
        .unwrap_err();
        assert!(e.message.contains("fuel"), "{e}");
    }

    #[test]
    fn runaway_memory_runs_out_of_fuel() {
        // Doubling a string 40 times would ask for a terabyte.
        let e = render_source(
            "{% set ns = namespace(s='xxxxxxxxxxxxxxxx') %}{% for i in range(40) %}\
             {% set ns.s = ns.s ~ ns.s %}{% endfor %}{{ ns.s | length }}",
        )
        .unwrap_err();
        assert!(e.message.contains("fuel"), "{e}");
        let e = render_source("{{ ('x' * 1000000) * 100000 }}").unwrap_err();
        assert!(e.message.contains("fuel"), "{e}");
    }

    #[test]
    fn runaway_recursion_is_an_error() {
        let e = render_source("{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}").unwrap_err();
        assert!(e.message.contains("recursion"), "{e}");
        let e = render_source("{% for m in messages recursive %}{{ loop([m]) }}{% endfor %}").unwrap_err();
        assert!(e.message.contains("recursion"), "{e}");
    }

    #[test]
    fn long_conversations_with_tools_fit_in_the_fuel() {
        let tool = json!({"type": "function", "function": {"name": "get_weather",
            "description": "Weather in a city", "parameters": {"type": "object",
            "properties": {"city": {"type": "string", "description": "the city"},
                           "days": {"type": "integer"}}, "required": ["city"]}}});
        let mut messages = vec![json!({"role": "system", "content": "Be brief."})];
        for i in 0..500 {
            messages.push(user(&format!("question {i} {}", "lorem ipsum ".repeat(200))));
            messages.push(
                json!({"role": "assistant", "content": "", "tool_calls": [{"id": format!("c{i}"),
                "type": "function", "function": {"name": "get_weather",
                "arguments": "{\"city\": \"Paris\", \"days\": 3}"}}]}),
            );
            messages.push(json!({"role": "tool", "tool_call_id": format!("c{i}"), "content": "sunny"}));
            messages.push(json!({"role": "assistant", "content": "answer ".repeat(100)}));
        }
        let mut inp = input(messages);
        inp.tools = Some(vec![tool; 20]);
        for rel in [
            "templates/Qwen2.5-Coder-0.5B-Instruct.jinja",
            "templates/Qwen3.5-4B.jinja",
            "templates/gemma4-small.jinja",
            "templates/LFM2.5-Instruct.jinja",
        ] {
            let path = fixtures_dir().join(rel);
            let Ok(source) = std::fs::read_to_string(&path) else {
                continue;
            };
            let out = ChatTemplate::new(source).unwrap().render(&inp);
            assert!(
                out.as_ref().is_ok_and(|o| o.len() > 1_000_000),
                "{rel}: {:?}",
                out.map(|o| o.len())
            );
        }
    }
}
