//! `berth run`: one answer for a prompt, or an interactive chat, streamed to the terminal.

use crate::chat::StreamParser;
use crate::constraint::{ConstraintFactory, RequestConstraints};
use crate::decoding::DecodeOptions;
use crate::generate::{GenerationStats, Session};
use crate::sampling::SamplingParams;
use crate::template::RenderInput;
use crate::turn::images::{self, RequestImage};
use anyhow::{anyhow, bail, Context, Result};
use berth_plugin_api::VisionSpec;
use berth_registry::store::Store;
use std::io::{BufRead, Write};
use std::path::Path;

/// Options of `berth run`.
#[derive(Clone, Debug)]
pub struct RunOptions {
    /// Complete the prompt as raw text, without the chat template.
    pub raw: bool,
    /// Print timings and rates after each answer.
    pub verbose: bool,
    /// Sampling parameters.
    pub sampling: SamplingParams,
    /// Most tokens per answer.
    pub max_tokens: usize,
    /// Ask for thinking on or off; `None` leaves it to the template.
    pub think: Option<bool>,
    /// gpt-oss's reasoning effort (`None`: medium); gpt-oss always reasons, whatever `think` says.
    pub reasoning_effort: Option<crate::harmony::ReasoningEffort>,
    /// A system message to start the conversation with.
    pub system: Option<String>,
    /// Compute threads.
    pub threads: Option<u32>,
    /// Ollama-style `format`: `json` or a JSON schema (inline or a file path).
    pub format: Option<String>,
    /// Image files for the first message (`--image`).
    pub images: Vec<std::path::PathBuf>,
}

/// The file extensions of images found in a prompt.
const IMAGE_EXTENSIONS: [&str; 5] = ["png", "jpg", "jpeg", "webp", "gif"];

/// Reads an image file for a message (at most [`images::MAX_IMAGE_BYTES`]).
fn read_image(path: &Path) -> Result<RequestImage> {
    let len = std::fs::metadata(path)
        .with_context(|| format!("reading image {}", path.display()))?
        .len();
    if len > images::MAX_IMAGE_BYTES as u64 {
        bail!(
            "image {} is too large: {len} bytes, at most {} are accepted",
            path.display(),
            images::MAX_IMAGE_BYTES
        );
    }
    let bytes = std::fs::read(path).with_context(|| format!("reading image {}", path.display()))?;
    Ok(RequestImage {
        place: path.display().to_string(),
        bytes,
    })
}

/// Image files named in a prompt, as `ollama run` finds them: words (optionally quoted) ending
/// in an image extension that name an existing file. Returns the prompt without them and the
/// images, in order.
fn images_in_prompt(text: &str) -> Result<(String, Vec<RequestImage>)> {
    let mut out = text.to_string();
    let mut found = Vec::new();
    for word in text.split_whitespace() {
        let path = word.trim_matches(|c| c == '"' || c == '\'' || c == '`');
        let ext = Path::new(path)
            .extension()
            .and_then(|e| e.to_str())
            .map(str::to_ascii_lowercase);
        if !ext.is_some_and(|e| IMAGE_EXTENSIONS.contains(&e.as_str())) {
            continue;
        }
        let expanded = match (path.strip_prefix("~/"), std::env::var_os("HOME")) {
            (Some(rest), Some(home)) => Path::new(&home).join(rest),
            _ => Path::new(path).to_path_buf(),
        };
        if expanded.is_file() {
            found.push(read_image(&expanded)?);
            out = out.replacen(word, "", 1);
        }
    }
    Ok((out.trim().to_string(), found))
}

/// Runs `berth run`.
pub fn run(
    store: &Store,
    home: &Path,
    reference: &str,
    prompt: Option<String>,
    opts: RunOptions,
) -> Result<()> {
    let mut session = Session::open(store, home, reference, opts.threads)?;
    if opts.verbose {
        eprintln!("{}", session.chat_format);
    }
    if !opts.raw && session.template.is_none() && session.harmony.is_none() {
        bail!(
            "{} has no chat template (a base model?); complete text with `berth run --raw {} PROMPT`, \
             or re-import it with `--template FILE`",
            session.reference,
            session.reference
        );
    }
    let constraints = match &opts.format {
        Some(f) if !opts.raw => Some(format_constraints(&mut session, f)?),
        _ => None,
    };
    let pending = opts
        .images
        .iter()
        .map(|p| read_image(p))
        .collect::<Result<Vec<_>>>()?;
    let vision = session.vision();
    let mut chat = Chat {
        think: opts.think,
        history: Vec::new(),
        opts,
        constraints,
        vision,
        images: Vec::new(),
        pending,
    };
    if let Some(s) = &chat.opts.system {
        chat.history
            .push(serde_json::json!({"role": "system", "content": s}));
    }
    match prompt {
        Some(p) => chat.turn(&mut session, &p),
        None => chat.interactive(&mut session),
    }
}

struct Chat {
    opts: RunOptions,
    think: Option<bool>,
    history: Vec<serde_json::Value>,
    /// The `--format` constraint's factory and request, when one was asked for.
    constraints: Option<(ConstraintFactory, RequestConstraints)>,
    /// How the model takes images, if it does.
    vision: Option<VisionSpec>,
    /// The images of the conversation so far, in order (their markers are in `history`).
    images: Vec<RequestImage>,
    /// `--image` files not yet sent (they go with the first message).
    pending: Vec<RequestImage>,
}

/// Parses `--format` (Ollama's `format`: `json`, or a schema inline or in a file) and builds the
/// model's constraint factory.
fn format_constraints(
    session: &mut Session,
    format: &str,
) -> Result<(ConstraintFactory, RequestConstraints)> {
    let value = if format == "json" {
        serde_json::Value::String(format.into())
    } else if Path::new(format).is_file() {
        serde_json::from_str(&std::fs::read_to_string(format)?)
            .with_context(|| format!("reading the schema {format}"))?
    } else {
        serde_json::from_str(format).context("--format is neither `json`, a JSON schema nor a schema file")?
    };
    let req = RequestConstraints::from_ollama(None, Some(&value))
        .map_err(|e| anyhow!("--format: {}", e.message))?;
    let vocab = session.model.description().vocab_size as usize;
    let tools = session.tools_enabled();
    let factory = ConstraintFactory::new(&session.tokenizer, &session.chat_format, vocab, tools)?;
    Ok((factory, req))
}

impl Chat {
    /// Renders the prompt for a new user message (or the raw text), generates and prints.
    fn turn(&mut self, session: &mut Session, text: &str) -> Result<()> {
        let mut start = crate::chat::ParseStart::Content;
        let (text, found) = images_in_prompt(text)?;
        let mut new: Vec<RequestImage> = std::mem::take(&mut self.pending);
        new.extend(found);
        if !new.is_empty() && self.vision.is_none() {
            bail!("{} does not take images", session.reference);
        }
        // Images go before the text of their message, as Ollama puts them.
        let offset = if self.opts.raw { 0 } else { self.images.len() };
        let markers: String = (0..new.len()).map(|k| images::marker(offset + k)).collect();
        let text = format!("{markers}{text}");
        let expand = |session: &Session, prompt: &str, all: &[RequestImage], add_special: bool| {
            images::expand_for(
                &session.tokenizer,
                self.vision.as_ref(),
                &session.reference,
                prompt,
                all,
                add_special,
            )
            .map_err(|e| anyhow!("{}", e.message))
        };
        let (tokens, slices) = if self.opts.raw {
            let (_, tokens, slices) = expand(session, &text, &new, true)?;
            (tokens, slices)
        } else {
            self.images.extend(new);
            self.history
                .push(serde_json::json!({"role": "user", "content": text}));
            let (prompt, tokens) = self.render(session)?;
            let (prompt, tokens, slices) = if self.images.is_empty() {
                (prompt, tokens, Vec::new())
            } else {
                expand(session, &prompt, &self.images, false)?
            };
            start = crate::chat::prefill(session.chat_format.format, &prompt);
            (tokens, slices)
        };
        let constraint = match &self.constraints {
            Some((factory, req)) => factory
                .build(req, self.think.unwrap_or(false), start)
                .map_err(|e| anyhow!("--format: {}", e.message))?,
            None => None,
        };
        let decode = DecodeOptions {
            sampling: self.opts.sampling.clone(),
            max_tokens: Some(self.opts.max_tokens),
            stop: Vec::new(),
            constraint,
            logprobs: None,
        };
        let mut out = std::io::stdout().lock();
        let mut answer = String::new();
        let mut printer = ReplyPrinter::new(
            (!self.opts.raw).then(|| StreamParser::new(session.chat_format.format, start, None)),
        );
        let stats = session.generate_with_images(&tokens, &slices, decode, |piece| {
            answer.push_str(piece);
            printer.piece(&mut out, piece);
        })?;
        printer.finish(&mut out);
        let _ = writeln!(out);
        drop(out);
        if !self.opts.raw && session.chat_format.format == crate::chat::ChatFormat::Harmony {
            // Harmony history holds the reply's channels apart (analysis, final), not its markup.
            let reply = crate::chat::parse(session.chat_format.format, start, &answer, None, false);
            self.history.push(reply.to_openai());
        } else if !self.opts.raw {
            self.history
                .push(serde_json::json!({"role": "assistant", "content": answer}));
        }
        if self.opts.verbose {
            print_stats(session, &stats);
        }
        Ok(())
    }

    /// The prompt (text and tokens) of the conversation so far: openai-harmony's rendering for a
    /// harmony pack with the o200k vocabulary, else the chat template's.
    fn render(&self, session: &Session) -> Result<(String, Vec<u32>)> {
        if let Some(harmony) = &session.harmony {
            let tokens = harmony.render(&crate::harmony::HarmonyInput {
                messages: &self.history,
                tools: None,
                effort: self
                    .opts
                    .reasoning_effort
                    .unwrap_or(crate::harmony::ReasoningEffort::Medium),
                date: None,
                add_generation_prompt: true,
            })?;
            return Ok((session.tokenizer.decode(&tokens, false), tokens));
        }
        let mut extra = serde_json::Map::new();
        if let Some(t) = self.think {
            extra.insert("enable_thinking".into(), t.into());
        }
        if let Some(effort) = self.opts.reasoning_effort {
            extra.insert("reasoning_effort".into(), effort_name(effort).into());
        }
        let template = session.template.as_ref().expect("checked at start");
        let prompt = template.render(&RenderInput {
            messages: self.history.clone(),
            tools: None,
            add_generation_prompt: true,
            extra,
            bos_token: token_text(&session.tokenizer, session.tokenizer.bos_id()),
            eos_token: token_text(&session.tokenizer, session.tokenizer.eos_id()),
        })?;
        let tokens = session.tokenizer.encode(&prompt, false);
        Ok((prompt, tokens))
    }

    fn interactive(&mut self, session: &mut Session) -> Result<()> {
        let stdin = std::io::stdin();
        let mut lines = stdin.lock().lines();
        loop {
            eprint!(">>> ");
            let _ = std::io::stderr().flush();
            let Some(line) = lines.next() else {
                eprintln!();
                return Ok(());
            };
            let line = line?;
            let input = line.trim();
            if input.is_empty() {
                continue;
            }
            if let Some(cmd) = input.strip_prefix('/') {
                if self.command(session, cmd)? {
                    return Ok(());
                }
                continue;
            }
            if let Err(e) = self.turn(session, input) {
                eprintln!("error: {e:#}");
            }
        }
    }

    /// Handles a `/command`; returns true to quit.
    fn command(&mut self, session: &mut Session, cmd: &str) -> Result<bool> {
        let words: Vec<&str> = cmd.split_whitespace().collect();
        match words.as_slice() {
            ["bye"] | ["exit"] | ["quit"] => return Ok(true),
            ["clear"] => {
                self.history.retain(|m| m["role"] == "system");
                self.images.clear();
                session.clear()?;
                eprintln!("Cleared session context");
            }
            ["set", "think"] | ["set", "think", "on"] => {
                self.think = Some(true);
                eprintln!("Set 'think' mode.");
            }
            ["set", "nothink"] | ["set", "think", "off"] => {
                self.think = Some(false);
                eprintln!("Set 'nothink' mode.");
            }
            ["set", "verbose"] => self.opts.verbose = true,
            ["set", "quiet"] => self.opts.verbose = false,
            ["show", "info"] => show_info(session),
            ["?"] | ["help"] => {
                eprintln!("Available commands:");
                eprintln!("  /set think on|off   Enable or disable thinking");
                eprintln!("  /set verbose|quiet  Show or hide generation statistics");
                eprintln!("  /show info          Show details for this model");
                eprintln!("  /clear              Clear session context");
                eprintln!("  /bye                Exit");
            }
            _ => eprintln!("Unknown command '/{cmd}'. Type /? for help"),
        }
        Ok(false)
    }
}

fn show_info(session: &Session) {
    let d = session.model.description();
    eprintln!("  Model");
    eprintln!("    name              {}", session.reference);
    if let Some(a) = d.extra.get("architecture").and_then(|v| v.as_str()) {
        eprintln!("    architecture      {a}");
    }
    eprintln!("    context length    {}", d.context_length);
    eprintln!("    vocabulary        {}", d.vocab_size);
    eprintln!(
        "    chat template     {}",
        if session.template.is_some() { "yes" } else { "none" }
    );
}

fn print_stats(session: &Session, s: &GenerationStats) {
    let total = session.load_duration + s.prompt_duration + s.generation_duration;
    eprintln!("total duration:       {:?}", total);
    eprintln!("load duration:        {:?}", session.load_duration);
    eprintln!(
        "prompt eval count:    {} token(s) ({} cached)",
        s.prompt_tokens, s.cached_tokens
    );
    eprintln!("prompt eval duration: {:?}", s.prompt_duration);
    eprintln!("prompt eval rate:     {:.2} tokens/s", s.prompt_rate());
    eprintln!("eval count:           {} token(s)", s.generated_tokens);
    eprintln!("eval duration:        {:?}", s.generation_duration);
    eprintln!("eval rate:            {:.2} tokens/s", s.generation_rate());
    if s.draft_tokens > 0 {
        eprintln!(
            "draft acceptance:     {:.1}% ({} of {} drafted token(s))",
            100.0 * s.accepted_draft_tokens as f64 / s.draft_tokens as f64,
            s.accepted_draft_tokens,
            s.draft_tokens
        );
    }
}

/// The name a template reads for a reasoning effort.
fn effort_name(effort: crate::harmony::ReasoningEffort) -> &'static str {
    match effort {
        crate::harmony::ReasoningEffort::Low => "low",
        crate::harmony::ReasoningEffort::Medium => "medium",
        crate::harmony::ReasoningEffort::High => "high",
    }
}

/// The text of a special token, or "" when the model has none.
fn token_text(tokenizer: &crate::tokenizer::Tokenizer, id: Option<u32>) -> String {
    id.map(|i| tokenizer.token_to_piece(i)).unwrap_or_default()
}

/// Prints a reply as it streams, the way `ollama run` does: reasoning between `Thinking...` and
/// `...done thinking.`, then the answer, then any tool calls; chat markup is never shown. Raw
/// mode (no parser) prints the text as generated.
struct ReplyPrinter {
    parser: Option<StreamParser>,
    /// Where the printed reply is: 0 nothing yet, 1 inside the reasoning, 2 past it.
    stage: u8,
}

impl ReplyPrinter {
    fn new(parser: Option<StreamParser>) -> ReplyPrinter {
        ReplyPrinter { parser, stage: 0 }
    }

    /// Prints what a newly generated piece of text adds.
    fn piece(&mut self, out: &mut impl Write, piece: &str) {
        let delta = match &mut self.parser {
            None => {
                let _ = out.write_all(piece.as_bytes());
                let _ = out.flush();
                return;
            }
            Some(p) => crate::chat::openai_delta(&p.push(piece)),
        };
        if let Some(d) = delta {
            self.show(out, &d);
        }
    }

    /// Prints the rest once generation ends, and the tool calls.
    fn finish(&mut self, out: &mut impl Write) {
        let Some(p) = &mut self.parser else { return };
        let (delta, msg) = p.finish();
        if let Some(d) = crate::chat::openai_delta(&delta) {
            self.show(out, &d);
        }
        for call in &msg.tool_calls {
            let _ = write!(out, "\n[tool call] {}({})", call.name, call.arguments);
        }
        let _ = out.flush();
    }

    fn show(&mut self, out: &mut impl Write, d: &serde_json::Value) {
        if let Some(r) = d["reasoning_content"].as_str().filter(|r| !r.is_empty()) {
            if self.stage == 0 {
                let _ = writeln!(out, "Thinking...");
                self.stage = 1;
            }
            let _ = out.write_all(r.as_bytes());
        }
        if let Some(c) = d["content"].as_str().filter(|c| !c.is_empty()) {
            if self.stage == 1 {
                let _ = write!(out, "\n...done thinking.\n\n");
            }
            self.stage = 2;
            let _ = out.write_all(c.as_bytes());
        }
        let _ = out.flush();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::chat::{ChatFormat, ParseStart};

    fn printed(format: ChatFormat, start: ParseStart, pieces: &[&str], raw: bool) -> String {
        let mut out = Vec::new();
        let mut p = ReplyPrinter::new((!raw).then(|| StreamParser::new(format, start, None)));
        for piece in pieces {
            p.piece(&mut out, piece);
        }
        p.finish(&mut out);
        String::from_utf8(out).unwrap()
    }

    #[test]
    fn image_files_named_in_a_prompt_are_attached_and_taken_out() {
        let dir = tempfile::tempdir().unwrap();
        let img = dir.path().join("cat.PNG");
        std::fs::write(&img, b"png bytes").unwrap();
        let prompt = format!("describe '{}' and ./missing.png please", img.display());
        let (text, found) = super::images_in_prompt(&prompt).unwrap();
        assert_eq!(text, "describe  and ./missing.png please");
        assert_eq!(found.len(), 1);
        assert_eq!(found[0].bytes, b"png bytes");
        assert_eq!(found[0].place, img.display().to_string());
        let (text, found) = super::images_in_prompt("no images here.txt").unwrap();
        assert_eq!((text.as_str(), found.len()), ("no images here.txt", 0));
    }

    #[test]
    fn harmony_reply_prints_thinking_then_the_answer_without_markup() {
        let pieces = [
            "<|channel|>",
            "analysis",
            "<|message|>",
            "Easy.",
            "<|end|>",
            "<|start|>",
            "assistant",
            "<|channel|>",
            "final",
            "<|message|>",
            "Paris",
            ".",
        ];
        let start = crate::chat::prefill(ChatFormat::Harmony, "<|start|>assistant");
        assert_eq!(
            printed(ChatFormat::Harmony, start, &pieces, false),
            "Thinking...\nEasy.\n...done thinking.\n\nParis."
        );
        assert_eq!(
            printed(ChatFormat::Harmony, start, &pieces, true),
            pieces.concat()
        );
    }

    #[test]
    fn a_reply_without_reasoning_prints_only_its_content() {
        let pieces = ["The capital", " is Paris."];
        assert_eq!(
            printed(ChatFormat::ContentOnly, ParseStart::Content, &pieces, false),
            "The capital is Paris."
        );
    }
}
