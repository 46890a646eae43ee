//! Harmony (gpt-oss) prompts rendered by OpenAI's own `openai-harmony` crate: an OpenAI chat
//! request is mapped onto harmony messages the way OpenAI serves gpt-oss and rendered straight to
//! token ids, which for an o200k pack are the pack's own ids.
//!
//! The crate reads its o200k vocabulary from `$TIKTOKEN_ENCODINGS_BASE/o200k_base.tiktoken` and
//! downloads it when the variable is unset. Berth never lets it download: it writes that file
//! itself from the pack's tokenizer (checked against the crate's sha256) into its cache, and
//! `berth` points the variable there at start-up ([`set_encodings_base`]). A harmony-format pack
//! whose vocabulary is not o200k (a tiny test vocabulary) keeps its Jinja template.

use std::fmt;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::SystemTime;

use base64::Engine as _;
use openai_harmony::chat::{Author, DeveloperContent, Message, Role, SystemContent, ToolDescription};
use openai_harmony::{load_harmony_encoding, HarmonyEncoding, HarmonyEncodingName};
use serde_json::Value;
use sha2::{Digest, Sha256};

use crate::chat::{ChatFormat, Detected};
use crate::tokenizer::Tokenizer;

/// The `Reasoning:` level of the system message (gpt-oss's `low`, `medium`, `high`).
pub use openai_harmony::chat::ReasoningEffort;

/// The variable openai-harmony reads the vocabulary directory from.
pub const ENCODINGS_BASE_VAR: &str = "TIKTOKEN_ENCODINGS_BASE";

/// The vocabulary file openai-harmony loads for gpt-oss.
const VOCAB_FILE: &str = "o200k_base.tiktoken";

/// The sha256 openai-harmony requires of that file.
const O200K_SHA256: &str = "446a9538cb6c348e3516120d7c08b09f57c36495e2acfffe59a5bf8b0cfb1a2d";

/// Ids below this are the file's ordinary tokens; the harmony specials follow.
const O200K_ORDINARY: u32 = 199_998;

/// The special tokens the renderer writes, with the ids openai-harmony gives them.
const SPECIALS: [(&str, u32); 7] = [
    ("<|return|>", 200_002),
    ("<|constrain|>", 200_003),
    ("<|channel|>", 200_005),
    ("<|start|>", 200_006),
    ("<|end|>", 200_007),
    ("<|message|>", 200_008),
    ("<|call|>", 200_012),
];

/// Where Berth keeps its vocabulary files: `$BERTH_CACHE/tiktoken`, by default
/// `~/.cache/berth/tiktoken` (the cache `berth pull` uses).
pub fn encodings_dir() -> PathBuf {
    berth_registry::PullOptions::from_env().cache.join("tiktoken")
}

/// Points openai-harmony at [`encodings_dir`] so it never downloads its vocabulary. Call once at
/// process start, before any thread starts: changing the environment races with other threads
/// reading it.
pub fn set_encodings_base() {
    std::env::set_var(ENCODINGS_BASE_VAR, encodings_dir());
}

/// Parses a reasoning effort gpt-oss knows: `low`, `medium` or `high`.
pub fn parse_effort(s: &str) -> Option<ReasoningEffort> {
    match s {
        "low" => Some(ReasoningEffort::Low),
        "medium" => Some(ReasoningEffort::Medium),
        "high" => Some(ReasoningEffort::High),
        _ => None,
    }
}

/// What a harmony prompt is rendered from: an OpenAI-style chat request.
#[derive(Debug, Clone)]
pub struct HarmonyInput<'a> {
    /// OpenAI message objects (`role`, `content`, `reasoning_content`, `tool_calls`, ...).
    pub messages: &'a [Value],
    /// OpenAI tool definitions (`{"type": "function", "function": {...}}`), if any.
    pub tools: Option<&'a [Value]>,
    /// The system message's `Reasoning:` level.
    pub effort: ReasoningEffort,
    /// The conversation date (`YYYY-MM-DD`); `None` is today, in UTC.
    pub date: Option<String>,
    /// Whether to end with `<|start|>assistant`, the header of the model's turn.
    pub add_generation_prompt: bool,
}

/// A request harmony cannot render: a client error (HTTP 400 naming `param`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HarmonyError {
    /// The request parameter at fault (`messages[2].tool_call_id`).
    pub param: String,
    /// One-line description for the client.
    pub message: String,
}

impl fmt::Display for HarmonyError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.param, self.message)
    }
}

impl std::error::Error for HarmonyError {}

fn error(param: impl Into<String>, message: impl Into<String>) -> HarmonyError {
    HarmonyError {
        param: param.into(),
        message: message.into(),
    }
}

/// Today's date in UTC, `YYYY-MM-DD`.
fn today() -> String {
    berth_registry::pack::rfc3339(SystemTime::now())[..10].to_owned()
}

/// The text of a message's `content`: a string, or text parts joined; `None` when absent or null.
fn text(content: Option<&Value>, param: &str) -> Result<Option<String>, HarmonyError> {
    match content {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) => Ok(Some(s.clone())),
        Some(Value::Array(parts)) => {
            let mut out = String::new();
            for part in parts {
                match part.get("type").and_then(Value::as_str) {
                    Some("text") => out.push_str(part.get("text").and_then(Value::as_str).unwrap_or("")),
                    other => {
                        return Err(error(
                            param,
                            format!(
                                "gpt-oss reads text only; a '{}' content part cannot be rendered",
                                other.unwrap_or("untyped")
                            ),
                        ))
                    }
                }
            }
            Ok(Some(out))
        }
        Some(_) => Err(error(param, "content must be a string or an array of parts")),
    }
}

/// A request tool as a harmony function description.
fn tool_description(tool: &Value, i: usize) -> Result<ToolDescription, HarmonyError> {
    let function = tool.get("function").unwrap_or(tool);
    let name = function
        .get("name")
        .and_then(Value::as_str)
        .filter(|n| !n.is_empty())
        .ok_or_else(|| error(format!("tools[{i}].function.name"), "a function needs a name"))?;
    let description = function.get("description").and_then(Value::as_str).unwrap_or("");
    let parameters = function.get("parameters").filter(|p| !p.is_null()).cloned();
    Ok(ToolDescription::new(name, description, parameters))
}

/// A tool call the conversation made and may still be answered.
struct PendingCall {
    id: Option<String>,
    name: String,
}

/// The harmony messages of a request (system and developer messages first), before rendering.
///
/// - `system`: SystemContent's defaults (identity, knowledge cutoff, channels), the effort and date;
/// - `developer`, when there are instructions or tools: the texts of every system/developer
///   message, in order and joined by a blank line, and the tools as the `functions` namespace;
/// - an assistant turn: its reasoning (`reasoning_content`, `reasoning` or `thinking`) on
///   `analysis`; its content on `final`, or on `commentary` as a preamble when the turn calls
///   tools; each call on `commentary` to `functions.NAME` as `<|constrain|>json`;
/// - a tool result: from `functions.NAME` to `assistant` on `commentary`, NAME being the call's
///   whose `tool_call_id` it carries (else its `name` / `tool_name`, else the next unanswered call).
pub fn conversation(input: &HarmonyInput<'_>) -> Result<Vec<Message>, HarmonyError> {
    let date = input.date.clone().unwrap_or_else(today);
    let system = SystemContent::new()
        .with_reasoning_effort(input.effort)
        .with_conversation_start_date(date);
    let mut out = vec![Message::from_role_and_content(Role::System, system)];

    let mut instructions = Vec::new();
    for (i, m) in input.messages.iter().enumerate() {
        if matches!(role(m), "system" | "developer") {
            if let Some(t) = text(m.get("content"), &format!("messages[{i}].content"))? {
                if !t.is_empty() {
                    instructions.push(t);
                }
            }
        }
    }
    let tools = input
        .tools
        .unwrap_or_default()
        .iter()
        .enumerate()
        .map(|(i, t)| tool_description(t, i))
        .collect::<Result<Vec<_>, _>>()?;
    if !instructions.is_empty() || !tools.is_empty() {
        let mut developer = DeveloperContent::new();
        if !instructions.is_empty() {
            developer = developer.with_instructions(instructions.join("\n\n"));
        }
        if !tools.is_empty() {
            developer = developer.with_function_tools(tools);
        }
        out.push(Message::from_role_and_content(Role::Developer, developer));
    }

    let mut pending: Vec<PendingCall> = Vec::new();
    for (i, m) in input.messages.iter().enumerate() {
        let p = format!("messages[{i}]");
        match role(m) {
            "user" => {
                let t = text(m.get("content"), &format!("{p}.content"))?.unwrap_or_default();
                out.push(Message::from_role_and_content(Role::User, t));
            }
            "assistant" => assistant(m, &p, &mut out, &mut pending)?,
            "tool" | "function" => {
                let name = answered_call(m, &mut pending).ok_or_else(|| {
                    error(
                        format!("{p}.tool_call_id"),
                        "a tool result must answer an earlier tool call (its tool_call_id) or name its function",
                    )
                })?;
                let t = text(m.get("content"), &format!("{p}.content"))?.unwrap_or_default();
                let author = Author::new(Role::Tool, format!("functions.{name}"));
                out.push(
                    Message::from_author_and_content(author, t)
                        .with_channel("commentary")
                        .with_recipient("assistant"),
                );
            }
            _ => {}
        }
    }
    Ok(out)
}

fn role(m: &Value) -> &str {
    m.get("role").and_then(Value::as_str).unwrap_or("")
}

/// Appends one assistant turn: analysis, final or preamble, then the calls.
fn assistant(
    m: &Value,
    p: &str,
    out: &mut Vec<Message>,
    pending: &mut Vec<PendingCall>,
) -> Result<(), HarmonyError> {
    let reasoning = ["reasoning_content", "reasoning", "thinking"]
        .iter()
        .find_map(|k| m.get(*k).and_then(Value::as_str).filter(|r| !r.is_empty()));
    if let Some(r) = reasoning {
        out.push(Message::from_role_and_content(Role::Assistant, r).with_channel("analysis"));
    }
    let calls = match m.get("tool_calls") {
        None | Some(Value::Null) => &[][..],
        Some(Value::Array(calls)) => calls.as_slice(),
        Some(_) => return Err(error(format!("{p}.tool_calls"), "must be an array of tool calls")),
    };
    let content = text(m.get("content"), &format!("{p}.content"))?;
    match content {
        Some(c) if !calls.is_empty() && !c.is_empty() => {
            out.push(Message::from_role_and_content(Role::Assistant, c).with_channel("commentary"))
        }
        Some(c) if calls.is_empty() => {
            out.push(Message::from_role_and_content(Role::Assistant, c).with_channel("final"))
        }
        _ => {}
    }
    if !calls.is_empty() {
        pending.clear();
    }
    for (j, call) in calls.iter().enumerate() {
        let function = call.get("function").unwrap_or(call);
        let name = function
            .get("name")
            .and_then(Value::as_str)
            .filter(|n| !n.is_empty())
            .ok_or_else(|| {
                error(
                    format!("{p}.tool_calls[{j}].function.name"),
                    "a tool call needs a name",
                )
            })?;
        // OpenAI sends the arguments as JSON text, Ollama as an object.
        let arguments = match function.get("arguments") {
            None | Some(Value::Null) => "{}".to_owned(),
            Some(Value::String(s)) => s.clone(),
            Some(v) => v.to_string(),
        };
        out.push(
            Message::from_role_and_content(Role::Assistant, arguments)
                .with_channel("commentary")
                .with_recipient(format!("functions.{name}"))
                .with_content_type("<|constrain|>json"),
        );
        pending.push(PendingCall {
            id: call.get("id").and_then(Value::as_str).map(str::to_owned),
            name: name.to_owned(),
        });
    }
    Ok(())
}

/// The function a tool result answers, taken off the unanswered calls.
fn answered_call(m: &Value, pending: &mut Vec<PendingCall>) -> Option<String> {
    let field = |k: &str| m.get(k).and_then(Value::as_str).filter(|s| !s.is_empty());
    let at = if let Some(id) = field("tool_call_id") {
        pending.iter().position(|c| c.id.as_deref() == Some(id))
    } else if let Some(name) = field("name").or_else(|| field("tool_name")) {
        match pending.iter().position(|c| c.name == name) {
            Some(at) => Some(at),
            None => return Some(name.to_owned()),
        }
    } else {
        (!pending.is_empty()).then_some(0)
    };
    at.map(|at| pending.remove(at).name)
}

/// Why a pack cannot be rendered with openai-harmony (it keeps its Jinja template).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Unavailable {
    /// The pack's vocabulary is not o200k (the sha256 of its vocabulary file differs).
    NotO200k(String),
    /// A special token the renderer writes has another id in the pack.
    SpecialToken(&'static str),
    /// `TIKTOKEN_ENCODINGS_BASE` does not name Berth's directory: loading would download.
    EncodingsBase,
    /// Writing or loading the vocabulary failed.
    Load(String),
}

impl fmt::Display for Unavailable {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Unavailable::NotO200k(sha) => {
                write!(
                    f,
                    "the vocabulary is not o200k (its tiktoken file has sha256 {sha})"
                )
            }
            Unavailable::SpecialToken(t) => write!(f, "{t} has another id than in o200k_harmony"),
            Unavailable::EncodingsBase => write!(
                f,
                "{ENCODINGS_BASE_VAR} is not {}; openai-harmony would download its vocabulary",
                encodings_dir().display()
            ),
            Unavailable::Load(e) => write!(f, "loading the o200k vocabulary: {e}"),
        }
    }
}

impl std::error::Error for Unavailable {}

/// The loaded encoding, shared by every o200k pack of the process.
static ENCODING: Mutex<Option<Arc<HarmonyEncoding>>> = Mutex::new(None);

/// The tiktoken vocabulary file a tokenizer's ordinary tokens make: one `base64(bytes) id` line
/// per id below 199998, in id order.
fn tiktoken_file(tokenizer: &Tokenizer) -> Vec<u8> {
    let mut out = Vec::with_capacity(4 << 20);
    let b64 = base64::engine::general_purpose::STANDARD;
    for id in 0..O200K_ORDINARY.min(tokenizer.vocab_size() as u32) {
        out.extend_from_slice(b64.encode(tokenizer.token_bytes(id)).as_bytes());
        out.push(b' ');
        out.extend_from_slice(id.to_string().as_bytes());
        out.push(b'\n');
    }
    out
}

/// Writes `bytes` to `path` unless it already holds them; a temporary file renamed into place,
/// so a concurrent reader never sees half a file.
fn write_atomically(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    if std::fs::read(path).is_ok_and(|old| old == bytes) {
        return Ok(());
    }
    let dir = path.parent().unwrap_or(Path::new("."));
    std::fs::create_dir_all(dir)?;
    let tmp = dir.join(format!(".{VOCAB_FILE}.{}.tmp", std::process::id()));
    let written = std::fs::File::create(&tmp).and_then(|mut f| {
        f.write_all(bytes)?;
        f.sync_all()
    });
    match written.and_then(|()| std::fs::rename(&tmp, path)) {
        Ok(()) => Ok(()),
        Err(e) => {
            let _ = std::fs::remove_file(&tmp);
            Err(e)
        }
    }
}

/// openai-harmony's renderer over a pack whose vocabulary is o200k. Cheap to clone.
#[derive(Clone)]
pub struct Harmony {
    encoding: Arc<HarmonyEncoding>,
}

impl fmt::Debug for Harmony {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Harmony")
            .field("encoding", &self.encoding.name())
            .finish()
    }
}

impl Harmony {
    /// The renderer for a tokenizer whose vocabulary is o200k: writes the vocabulary file into
    /// [`encodings_dir`] (once) and loads openai-harmony's encoding from it.
    pub fn for_tokenizer(tokenizer: &Tokenizer) -> Result<Harmony, Unavailable> {
        let file = tiktoken_file(tokenizer);
        let sha = format!("{:x}", Sha256::digest(&file));
        if sha != O200K_SHA256 {
            return Err(Unavailable::NotO200k(sha));
        }
        if let Some(&(text, _)) = SPECIALS.iter().find(|(t, id)| tokenizer.token_id(t) != Some(*id)) {
            return Err(Unavailable::SpecialToken(text));
        }
        let mut cached = ENCODING.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(encoding) = cached.as_ref() {
            return Ok(Harmony {
                encoding: encoding.clone(),
            });
        }
        let dir = encodings_dir();
        if std::env::var_os(ENCODINGS_BASE_VAR).is_none_or(|v| Path::new(&v) != dir) {
            return Err(Unavailable::EncodingsBase);
        }
        let path = dir.join(VOCAB_FILE);
        write_atomically(&path, &file).map_err(|e| Unavailable::Load(format!("{}: {e}", path.display())))?;
        let encoding = load_harmony_encoding(HarmonyEncodingName::HarmonyGptOss)
            .map_err(|e| Unavailable::Load(format!("{e:#}")))?;
        let encoding = Arc::new(encoding);
        *cached = Some(encoding.clone());
        Ok(Harmony { encoding })
    }

    /// Renders a request to the prompt's token ids. Earlier analysis is dropped or kept as the
    /// crate's `render_conversation_for_completion` does by default (`auto_drop_analysis`).
    pub fn render(&self, input: &HarmonyInput<'_>) -> Result<Vec<u32>, HarmonyError> {
        let messages = conversation(input)?;
        // The crate's `RenderConversationConfig` is not exported; its default (what the Python
        // package passes) is reached through inference.
        let rendered = if input.add_generation_prompt {
            self.encoding.render_conversation_for_completion(
                &messages,
                Role::Assistant,
                Some(&Default::default()),
            )
        } else {
            self.encoding
                .render_conversation(&messages, Some(&Default::default()))
        };
        rendered.map_err(|e| {
            error(
                "messages",
                format!("harmony cannot render the conversation: {e:#}"),
            )
        })
    }
}

/// The harmony renderer of a pack: `Some` when its chat format is harmony and its vocabulary is
/// o200k. Otherwise the pack's Jinja template renders its prompts (the reason is logged).
pub fn for_pack(reference: &str, detected: &Detected, tokenizer: &Tokenizer) -> Option<Harmony> {
    if detected.format != ChatFormat::Harmony {
        return None;
    }
    match Harmony::for_tokenizer(tokenizer) {
        Ok(h) => Some(h),
        Err(e @ Unavailable::NotO200k(_)) => {
            tracing::info!(model = %reference, "{e}: rendering prompts with its chat template");
            None
        }
        Err(e) => {
            tracing::warn!(model = %reference, "openai-harmony unavailable ({e}): rendering prompts with its chat template");
            None
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;
    use std::sync::OnceLock;

    /// Points openai-harmony at Berth's directory once per test process, as `main` does.
    fn init_encodings_base() {
        static INIT: OnceLock<()> = OnceLock::new();
        INIT.get_or_init(set_encodings_base);
    }

    fn gptoss() -> Harmony {
        init_encodings_base();
        let (tokenizer, _) = crate::chat::format::tests::lenml("gptoss");
        Harmony::for_tokenizer(&tokenizer).expect("the gpt-oss tokenizer is o200k")
    }

    fn input(messages: &[Value]) -> HarmonyInput<'_> {
        HarmonyInput {
            messages,
            tools: None,
            effort: ReasoningEffort::Medium,
            date: Some("2026-01-01".into()),
            add_generation_prompt: true,
        }
    }

    /// Each message's header as text: `role:name to=recipient channel content_type`.
    fn headers(messages: &[Message]) -> Vec<String> {
        messages
            .iter()
            .map(|m| {
                let mut h = m.author.role.as_str().to_owned();
                if let Some(n) = &m.author.name {
                    h = format!("{h}:{n}");
                }
                for part in [&m.recipient, &m.channel, &m.content_type].into_iter().flatten() {
                    h.push(' ');
                    h.push_str(part);
                }
                h
            })
            .collect()
    }

    #[test]
    fn recorded_renders_of_openai_harmony_are_reproduced() {
        let harmony = gptoss();
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures/harmony/render");
        let mut names = Vec::new();
        for entry in std::fs::read_dir(&dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display())) {
            let path = entry.unwrap().path();
            let fixture: Value = serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
            let name = path.file_stem().unwrap().to_string_lossy().into_owned();
            let request = &fixture["request"];
            let effort = request["reasoning_effort"].as_str().unwrap_or("medium");
            let messages = request["messages"].as_array().unwrap();
            let tools = request["tools"].as_array().map(Vec::as_slice);
            let ours = harmony
                .render(&HarmonyInput {
                    messages,
                    tools,
                    effort: parse_effort(effort).unwrap(),
                    date: Some(fixture["date"].as_str().unwrap().to_owned()),
                    add_generation_prompt: true,
                })
                .unwrap_or_else(|e| panic!("{name}: {e}"));
            let theirs: Vec<u32> = serde_json::from_value(fixture["tokens"].clone()).unwrap();
            if ours != theirs {
                let at = ours.iter().zip(&theirs).take_while(|(a, b)| a == b).count();
                panic!(
                    "{name}: differs from openai-harmony at token {at} (ours {} tokens, theirs {})\n\
                     ours:   {:?}\ntheirs: {:?}",
                    ours.len(),
                    theirs.len(),
                    &ours[at..(at + 8).min(ours.len())],
                    &theirs[at..(at + 8).min(theirs.len())]
                );
            }
            names.push(name);
        }
        names.sort();
        for needed in [
            "plain_user",
            "system_and_developer",
            "tools_declared",
            "tool_round_trip",
            "reasoning_kept_for_tool_call",
            "effort_low",
            "effort_medium",
            "effort_high",
        ] {
            assert!(
                names.iter().any(|n| n == needed),
                "no fixture {needed}: {names:?}"
            );
        }
    }

    #[test]
    fn the_prompt_ends_with_the_assistant_header_and_names_the_date_and_effort() {
        let (tokenizer, _) = crate::chat::format::tests::lenml("gptoss");
        let harmony = gptoss();
        let messages = [json!({"role": "user", "content": "Hi"})];
        let mut inp = input(&messages);
        inp.effort = ReasoningEffort::High;
        let ids = harmony.render(&inp).unwrap();
        let text = tokenizer.decode(&ids, false);
        assert!(
            text.contains("Current date: 2026-01-01\n\nReasoning: high\n\n"),
            "{text}"
        );
        assert!(
            text.ends_with("<|start|>user<|message|>Hi<|end|><|start|>assistant"),
            "{text}"
        );
        assert_eq!(
            crate::chat::prefill(ChatFormat::Harmony, &text),
            crate::chat::ParseStart::AssistantHeader
        );
        // The pack's own tokenizer reads the same ids from the text.
        assert_eq!(tokenizer.encode(&text, false), ids);
        inp.add_generation_prompt = false;
        let text = tokenizer.decode(&harmony.render(&inp).unwrap(), false);
        assert!(text.ends_with("Hi<|end|>"), "{text}");
        // Without a date the conversation is dated today (UTC).
        inp.date = None;
        let text = tokenizer.decode(&harmony.render(&inp).unwrap(), false);
        assert!(text.contains(&format!("Current date: {}\n", today())), "{text}");
    }

    #[test]
    fn a_vocabulary_that_is_not_o200k_keeps_the_jinja_template() {
        let (qwen, _) = crate::chat::format::tests::lenml("qwen3");
        match Harmony::for_tokenizer(&qwen) {
            Err(Unavailable::NotO200k(sha)) => assert_ne!(sha, O200K_SHA256),
            other => panic!("{other:?}"),
        }
        let detected = Detected {
            format: ChatFormat::Harmony,
            reasoning: None,
        };
        assert!(for_pack("tiny", &detected, &qwen).is_none());
        // A pack of another format never loads the renderer.
        let detected = Detected {
            format: ChatFormat::HermesJson,
            reasoning: None,
        };
        assert!(for_pack("qwen3", &detected, &qwen).is_none());
    }

    #[test]
    fn the_vocabulary_file_is_written_once_and_atomically() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("sub").join(VOCAB_FILE);
        write_atomically(&path, b"a 0\n").unwrap();
        assert_eq!(std::fs::read(&path).unwrap(), b"a 0\n");
        let before = std::fs::metadata(&path).unwrap().modified().unwrap();
        write_atomically(&path, b"a 0\n").unwrap();
        assert_eq!(std::fs::metadata(&path).unwrap().modified().unwrap(), before);
        write_atomically(&path, b"b 1\n").unwrap();
        assert_eq!(std::fs::read(&path).unwrap(), b"b 1\n");
        let names: Vec<_> = std::fs::read_dir(path.parent().unwrap()).unwrap().collect();
        assert_eq!(names.len(), 1, "no temporary file is left behind");
    }

    #[test]
    fn system_and_developer_texts_become_instructions_and_tools_the_functions_namespace() {
        let messages = [
            json!({"role": "system", "content": "Be brief."}),
            json!({"role": "user", "content": [{"type": "text", "text": "Hi "}, {"type": "text", "text": "there"}]}),
            json!({"role": "developer", "content": "Answer in French."}),
        ];
        let tools =
            [json!({"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}})];
        let mut inp = input(&messages);
        inp.tools = Some(&tools);
        let conv = conversation(&inp).unwrap();
        assert_eq!(headers(&conv), ["system", "developer", "user"]);
        let openai_harmony::chat::Content::DeveloperContent(dev) = &conv[1].content[0] else {
            panic!("{:?}", conv[1]);
        };
        assert_eq!(
            dev.instructions.as_deref(),
            Some("Be brief.\n\nAnswer in French.")
        );
        let functions = &dev.tools.as_ref().unwrap()["functions"];
        assert_eq!(functions.tools[0].name, "f");
        assert_eq!(functions.tools[0].description, "");
        let openai_harmony::chat::Content::Text(t) = &conv[2].content[0] else {
            panic!("{:?}", conv[2]);
        };
        assert_eq!(t.text, "Hi there");
        // Nothing to say: no developer message.
        let conv = conversation(&input(&messages[1..2])).unwrap();
        assert_eq!(headers(&conv), ["system", "user"]);
    }

    #[test]
    fn assistant_turns_split_into_analysis_preamble_final_and_calls() {
        let messages = [
            json!({"role": "user", "content": "q"}),
            json!({"role": "assistant", "content": "a", "thinking": "t"}),
            json!({"role": "assistant", "content": "checking", "reasoning": "r", "tool_calls": [
                {"id": "x", "type": "function", "function": {"name": "f", "arguments": "{\"a\":1}"}},
                {"function": {"name": "g", "arguments": {"b": 2}}}
            ]}),
            // Answered by id, then by Ollama's tool_name, then by position.
            json!({"role": "tool", "tool_call_id": "x", "content": "1"}),
            json!({"role": "tool", "tool_name": "g", "content": "2"}),
            json!({"role": "assistant", "content": null, "tool_calls": [
                {"function": {"name": "h", "arguments": null}}
            ]}),
            json!({"role": "tool", "content": "3"}),
        ];
        let conv = conversation(&input(&messages)).unwrap();
        assert_eq!(
            headers(&conv),
            [
                "system",
                "user",
                "assistant analysis",
                "assistant final",
                "assistant analysis",
                "assistant commentary",
                "assistant functions.f commentary <|constrain|>json",
                "assistant functions.g commentary <|constrain|>json",
                "tool:functions.f assistant commentary",
                "tool:functions.g assistant commentary",
                "assistant functions.h commentary <|constrain|>json",
                "tool:functions.h assistant commentary",
            ]
        );
        let body = |m: &Message| match &m.content[0] {
            openai_harmony::chat::Content::Text(t) => t.text.clone(),
            other => panic!("{other:?}"),
        };
        assert_eq!(body(&conv[2]), "t");
        assert_eq!(body(&conv[7]), "{\"b\":2}");
        assert_eq!(body(&conv[10]), "{}");
    }

    #[test]
    fn unrenderable_requests_name_the_parameter() {
        let cases = [
            (
                json!({"role": "tool", "tool_call_id": "nope", "content": "x"}),
                "messages[1].tool_call_id",
            ),
            (
                json!({"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}),
                "messages[1].content",
            ),
            (
                json!({"role": "assistant", "tool_calls": [{"function": {"arguments": "{}"}}]}),
                "messages[1].tool_calls[0].function.name",
            ),
        ];
        for (bad, param) in cases {
            let messages = [json!({"role": "user", "content": "q"}), bad];
            let err = conversation(&input(&messages)).unwrap_err();
            assert_eq!(err.param, param, "{err}");
        }
        let tools = [json!({"type": "function", "function": {"description": "no name"}})];
        let messages = [json!({"role": "user", "content": "q"})];
        let mut inp = input(&messages);
        inp.tools = Some(&tools);
        assert_eq!(conversation(&inp).unwrap_err().param, "tools[0].function.name");
    }

    #[test]
    fn efforts_are_the_three_gpt_oss_knows() {
        assert_eq!(parse_effort("low"), Some(ReasoningEffort::Low));
        assert_eq!(parse_effort("medium"), Some(ReasoningEffort::Medium));
        assert_eq!(parse_effort("high"), Some(ReasoningEffort::High));
        for bad in ["none", "minimal", "extreme", "High", ""] {
            assert_eq!(parse_effort(bad), None, "{bad}");
        }
    }
}
