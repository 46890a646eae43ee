//! Commands for people debugging prompts: `berth show NAME --template` prints the chat template a
//! pack is rendered with, `berth render NAME --messages FILE` the exact prompt a conversation
//! becomes (and, on stderr, the chat format detected and where parsing of the reply starts). A
//! harmony (gpt-oss) pack is rendered by openai-harmony, as `berth serve` renders it.
//! `berth create` and `berth show --modelfile` (and `/api/create`, `/api/show`) share the
//! Modelfile helpers at the end.

use crate::template::{ChatTemplate, RenderInput};
use crate::tokenizer::Tokenizer;
use anyhow::{anyhow, bail, Context, Result};
use berth_registry::modelfile::Modelfile;
use berth_registry::store::{PackEntry, Store};
use serde_json::Value;
use std::path::Path;

/// What `berth render` renders.
#[derive(Debug, Clone, Default)]
pub struct RenderRequest {
    /// The conversation: a JSON list of messages, or a request object with `messages` (and maybe
    /// `tools`, `chat_template_kwargs`).
    pub messages: Value,
    /// A JSON list of tools (overrides the request object's).
    pub tools: Option<Value>,
    /// Whether to end with the header of an assistant turn.
    pub add_generation_prompt: bool,
    /// `chat_template_kwargs` (a JSON object; overrides the request object's).
    pub kwargs: Option<Value>,
}

/// The tokenizer and chat template of a pack (the template is `None` when it has none).
fn open(store: &Store, reference: &str) -> Result<(String, Tokenizer, Option<ChatTemplate>)> {
    let entry = store.get(reference)?;
    let (tokenizer, template) = crate::pack::load_text_side(&entry)?;
    Ok((entry.reference, tokenizer, template))
}

fn no_template(reference: &str) -> anyhow::Error {
    anyhow!("{reference} has no chat template (a base model?); re-import it with `--template FILE`")
}

/// `berth show NAME --template`: the template source.
pub fn template_text(store: &Store, reference: &str) -> Result<String> {
    let (reference, _, template) = open(store, reference)?;
    let template = template.ok_or_else(|| no_template(&reference))?;
    Ok(template.source().to_owned())
}

/// `berth render`: the exact prompt, and the load-time log line for stderr. A harmony pack with
/// the o200k vocabulary is rendered by openai-harmony (the prompt is its tokens' text).
pub fn render(store: &Store, reference: &str, req: &RenderRequest) -> Result<(String, String)> {
    let (reference, tokenizer, template) = open(store, reference)?;
    let detected = crate::chat::detect(template.as_ref().map(|t| t.source()), |t| {
        tokenizer.token_id(t).is_some()
    });
    let input = render_input(req, &tokenizer)?;
    let (prompt, how) = match crate::harmony::for_pack(&reference, &detected, &tokenizer) {
        Some(harmony) => {
            let effort = match input.extra.get("reasoning_effort") {
                None => crate::harmony::ReasoningEffort::Medium,
                Some(v) => v.as_str().and_then(crate::harmony::parse_effort).ok_or_else(|| {
                    anyhow!("reasoning_effort: gpt-oss knows low, medium and high; got {v}")
                })?,
            };
            let tokens = harmony
                .render(&crate::harmony::HarmonyInput {
                    messages: &input.messages,
                    tools: input.tools.as_deref(),
                    effort,
                    date: None,
                    add_generation_prompt: input.add_generation_prompt,
                })
                .with_context(|| format!("rendering {reference} with openai-harmony"))?;
            (tokenizer.decode(&tokens, false), "; rendered by openai-harmony")
        }
        None => {
            let template = template.ok_or_else(|| no_template(&reference))?;
            let prompt = template
                .render(&input)
                .with_context(|| format!("rendering the chat template of {reference}"))?;
            (prompt, "")
        }
    };
    let start = crate::chat::prefill(detected.format, &prompt);
    let note = format!("{detected}{how}; the reply is parsed from {start:?}");
    Ok((prompt, note))
}

fn render_input(req: &RenderRequest, tokenizer: &Tokenizer) -> Result<RenderInput> {
    let (messages, mut tools, mut kwargs, effort) = match &req.messages {
        Value::Array(list) => (list.clone(), None, None, None),
        Value::Object(body) => {
            let Some(Value::Array(list)) = body.get("messages") else {
                bail!("the request object has no `messages` list");
            };
            (
                list.clone(),
                body.get("tools").cloned(),
                body.get("chat_template_kwargs").cloned(),
                body.get("reasoning_effort").filter(|v| !v.is_null()).cloned(),
            )
        }
        _ => bail!("messages: expected a JSON list of messages or a request object with `messages`"),
    };
    if req.tools.is_some() {
        tools = req.tools.clone();
    }
    if req.kwargs.is_some() {
        kwargs = req.kwargs.clone();
    }
    let tools = match tools {
        None | Some(Value::Null) => None,
        Some(Value::Array(list)) => Some(list),
        Some(_) => bail!("tools: expected a JSON list of tools"),
    };
    let token = |id: Option<u32>| id.map(|i| tokenizer.token_to_piece(i)).unwrap_or_default();
    let mut input = RenderInput {
        messages,
        tools,
        add_generation_prompt: req.add_generation_prompt,
        bos_token: token(tokenizer.bos_id()),
        eos_token: token(tokenizer.eos_id()),
        ..RenderInput::default()
    };
    // The request's `reasoning_effort` reaches templates (and harmony) as a variable.
    if let Some(effort) = effort {
        input.extra.insert("reasoning_effort".into(), effort);
    }
    Ok(input.with_request_kwargs(kwargs.as_ref(), None)?)
}

/// Reads a JSON file (`-` = stdin).
pub fn read_json(path: &Path) -> Result<Value> {
    let text = if path == Path::new("-") {
        let mut s = String::new();
        std::io::Read::read_to_string(&mut std::io::stdin(), &mut s)?;
        s
    } else {
        std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?
    };
    serde_json::from_str(&text).with_context(|| format!("{}: not JSON", path.display()))
}

/// The pack's chat template source: its own file, its tokenizer config's or its GGUF's.
pub fn pack_template(entry: &PackEntry) -> Option<String> {
    let m = entry.manifest.as_ref()?;
    let gguf = match m.format {
        berth_registry::pack::PackFormat::Gguf => m
            .weights()
            .next()
            .and_then(|w| berth_registry::gguf::GgufFile::read_header(entry.dir.join(&w.path)).ok()),
        _ => None,
    };
    ChatTemplate::from_pack_or_gguf(&entry.dir, gguf.as_ref())
        .ok()
        .flatten()
        .map(|t| t.source().to_owned())
}

/// `berth show NAME --modelfile` (and `/api/show`'s `modelfile`): the pack as a Modelfile that
/// `berth create` takes, `FROM` the pack itself as Ollama writes it.
pub fn modelfile_text(entry: &PackEntry) -> String {
    render_modelfile(entry, pack_template(entry).as_deref())
}

/// [`modelfile_text`] with the pack's template already read.
pub fn render_modelfile(entry: &PackEntry, template: Option<&str>) -> String {
    let Some(m) = &entry.manifest else {
        return format!("FROM {}\n", entry.reference);
    };
    // A template `create` would refuse is left out: the pack keeps it through FROM anyway.
    let template = template.filter(|t| !t.is_empty() && berth_registry::modelfile::check_template(t).is_ok());
    berth_registry::modelfile::render(&entry.reference, template, m)
}

/// Checks what the store cannot: that a Modelfile's Jinja `TEMPLATE` compiles.
pub fn check_modelfile(mf: &Modelfile) -> Result<(), String> {
    match &mf.template {
        Some(t) => ChatTemplate::new(t.clone())
            .map(|_| ())
            .map_err(|e| format!("TEMPLATE: {e}")),
        None => Ok(()),
    }
}

/// `berth create NAME -f FILE`: parses the Modelfile, resolves `FROM` against its folder and
/// writes the pack, printing Ollama's kind of progress lines.
pub fn create(store: &Store, name: &str, file: &Path) -> Result<()> {
    let text = std::fs::read_to_string(file).with_context(|| format!("reading {}", file.display()))?;
    println!("parsing modelfile");
    let mf = Modelfile::parse(&text).map_err(|e| anyhow!("{}: {e}", file.display()))?;
    check_modelfile(&mf).map_err(|e| anyhow!("{}: {e}", file.display()))?;
    let dir = match file.parent().filter(|p| !p.as_os_str().is_empty()) {
        Some(d) => d.to_path_buf(),
        None => std::env::current_dir()?,
    };
    let from = mf.from.as_deref().unwrap_or_default();
    let base = store.create_base(from, Some(&dir))?;
    let entry = store.create(name, &base, &mf, &mut |s| println!("{s}"))?;
    println!("success");
    if !entry.is_ok() {
        bail!("{}: {}", entry.reference, entry.problems.join("; "));
    }
    Ok(())
}
