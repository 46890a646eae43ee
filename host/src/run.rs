//! `berth run`: one answer for a prompt, or an interactive chat, streamed to the terminal.

use crate::api::images::{self, RequestImage};
use crate::chat::{ParseStart, StreamParser};
use crate::constraint::RequestConstraints;
use crate::decoding::DecodeOptions;
use crate::engine::metrics::Metrics;
use crate::engine::{Event, Finish, Job, JobImage};
use crate::sampling::SamplingParams;
use crate::state::models::{LoadSettings, Model};
use crate::template::RenderInput;
use anyhow::{anyhow, bail, Context, Result};
use berth_registry::store::Store;
use std::io::{BufRead, Write};
use std::path::Path;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::mpsc::unbounded_channel;

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

/// Requests `berth run` may queue on its engine (it sends one at a time).
const RUN_QUEUE: usize = 4;

/// Runs `berth run`: loads the model onto an engine of one slot, the same scheduler `berth serve`
/// runs, and submits each turn to it.
pub fn run(
    store: &Store,
    home: &Path,
    reference: &str,
    prompt: Option<String>,
    opts: RunOptions,
) -> Result<()> {
    let started = Instant::now();
    let settings = LoadSettings {
        threads: opts.threads,
        slots: 1,
        queue: RUN_QUEUE,
        context: None,
        keep_alive: None,
    };
    let metrics = Arc::new(Metrics::default());
    let model = Model::load(store, home, reference, &settings, metrics.clone())?;
    let load_duration = started.elapsed();
    if opts.verbose {
        eprintln!("{}", model.detected);
    }
    if !opts.raw && model.template.is_none() && model.harmony.is_none() {
        bail!(
            "{} has no chat template (a base model?); complete text with `berth run --raw {} PROMPT`, \
             or re-import it with `--template FILE`",
            model.reference,
            model.reference
        );
    }
    let constraints = match &opts.format {
        Some(f) if !opts.raw => Some(format_constraints(&model, f)?),
        _ => None,
    };
    let pending = opts
        .images
        .iter()
        .map(|p| read_image(p))
        .collect::<Result<Vec<_>>>()?;
    let mut chat = Chat {
        think: opts.think,
        history: Vec::new(),
        opts,
        constraints,
        images: Vec::new(),
        pending,
        model,
        metrics,
        load_duration,
        turns: 0,
    };
    if let Some(s) = &chat.opts.system {
        chat.history
            .push(serde_json::json!({"role": "system", "content": s}));
    }
    match prompt {
        Some(p) => chat.turn(&p),
        None => chat.interactive(),
    }
}

struct Chat {
    opts: RunOptions,
    think: Option<bool>,
    history: Vec<serde_json::Value>,
    /// The `--format` request, when one was asked for (the model's factory builds its grammar).
    constraints: Option<RequestConstraints>,
    /// The images of the conversation so far, in order (their markers are in `history`).
    images: Vec<RequestImage>,
    /// `--image` files not yet sent (they go with the first message).
    pending: Vec<RequestImage>,
    /// The model and its engine.
    model: Model,
    /// The engine's counters (read for the draft figures of `--verbose`).
    metrics: Arc<Metrics>,
    /// Time it took to load the model.
    load_duration: Duration,
    /// Turns submitted so far (names the jobs in logs).
    turns: usize,
}

/// Parses `--format` (Ollama's `format`: `json`, or a schema inline or in a file) into a
/// request the model's constraint factory can build.
fn format_constraints(model: &Model, format: &str) -> Result<RequestConstraints> {
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
    if let Err(e) = &model.constraints {
        bail!(
            "--format: constrained decoding is not available for {}: {e}",
            model.reference
        );
    }
    Ok(req)
}

/// One turn's prompt, ready for the engine.
struct Prompt {
    tokens: Vec<u32>,
    /// Image slices with the prompt positions they fill.
    images: Vec<JobImage>,
    /// Where the reply starts for the chat parser.
    start: ParseStart,
}

impl Chat {
    /// Renders the prompt for a new user message (or the raw text), generates and prints.
    fn turn(&mut self, text: &str) -> Result<()> {
        let Prompt {
            tokens,
            images,
            start,
        } = self.prepare(text)?;
        if tokens.is_empty() {
            bail!("empty prompt");
        }
        if tokens.len() >= self.model.context_length {
            bail!(
                "prompt is {} tokens; the context holds {}",
                tokens.len(),
                self.model.context_length
            );
        }
        let constraint = match (&self.constraints, &self.model.constraints) {
            (Some(req), Ok(factory)) => factory
                .build(req, self.think.unwrap_or(false), start)
                .map_err(|e| anyhow!("--format: {}", e.message))?,
            _ => None,
        };
        let decode = DecodeOptions {
            sampling: self.opts.sampling.clone(),
            max_tokens: Some(self.opts.max_tokens),
            stop: Vec::new(),
            constraint,
            logprobs: None,
        };
        let drafts_before = self.drafts();
        let (events, mut rx) = unbounded_channel();
        self.turns += 1;
        let job = Job {
            id: format!("run-{}", self.turns),
            prompt: tokens,
            decode,
            events,
            received: Instant::now(),
            images,
            siblings: Vec::new(),
        };
        self.model
            .engine
            .submit(job)
            .map_err(|e| anyhow!("the engine did not take the prompt: {e:?}"))?;
        let mut out = std::io::stdout().lock();
        let mut answer = String::new();
        let mut printer = ReplyPrinter::new(
            (!self.opts.raw).then(|| StreamParser::new(self.model.detected.format, start, None)),
        );
        let finish = loop {
            match rx.blocking_recv() {
                Some(Event::Text(piece)) => {
                    answer.push_str(&piece);
                    printer.piece(&mut out, &piece);
                }
                Some(Event::Logprobs(_)) => {}
                Some(Event::Done(f)) => break f,
                Some(Event::Error(e)) => bail!("{e}"),
                None => bail!("the engine stopped before the answer ended"),
            }
        };
        printer.finish(&mut out);
        let _ = writeln!(out);
        drop(out);
        if !self.opts.raw && self.model.detected.format == crate::chat::ChatFormat::Harmony {
            // Harmony history holds the reply's channels apart (analysis, final), not its markup.
            let reply = crate::chat::parse(self.model.detected.format, start, &answer, None, false);
            self.history.push(reply.to_openai());
        } else if !self.opts.raw {
            self.history
                .push(serde_json::json!({"role": "assistant", "content": answer}));
        }
        if self.opts.verbose {
            let (drafted, accepted) = self.drafts();
            print_stats(
                self.load_duration,
                &finish,
                (drafted - drafts_before.0, accepted - drafts_before.1),
            );
        }
        Ok(())
    }

    /// Tokens drafted and accepted by the engine's speculation so far.
    fn drafts(&self) -> (u64, u64) {
        (
            self.metrics.draft_tokens.load(Relaxed),
            self.metrics.accepted_draft_tokens.load(Relaxed),
        )
    }

    /// The prompt of a new user message (or the raw text): its images attached, the conversation
    /// rendered. (One function, so a shared turn builder can replace it.)
    fn prepare(&mut self, text: &str) -> Result<Prompt> {
        let (text, found) = images_in_prompt(text)?;
        let mut new: Vec<RequestImage> = std::mem::take(&mut self.pending);
        new.extend(found);
        if !new.is_empty() && self.model.vision.is_none() {
            bail!("{} does not take images", self.model.reference);
        }
        // Images go before the text of their message, as Ollama puts them.
        let offset = if self.opts.raw { 0 } else { self.images.len() };
        let markers: String = (0..new.len()).map(|k| images::marker(offset + k)).collect();
        let text = format!("{markers}{text}");
        let model = &self.model;
        let expand = |prompt: &str, all: &[RequestImage], add_special: bool| {
            images::expand_for(
                &model.tokenizer,
                model.vision.as_ref(),
                &model.reference,
                prompt,
                all,
                add_special,
            )
            .map_err(|e| anyhow!("{}", e.message))
        };
        if self.opts.raw {
            let (_, tokens, images) = expand(&text, &new, true)?;
            return Ok(Prompt {
                tokens,
                images,
                start: ParseStart::Content,
            });
        }
        self.images.extend(new);
        self.history
            .push(serde_json::json!({"role": "user", "content": text}));
        let (prompt, tokens) = self.render()?;
        let (prompt, tokens, images) = if self.images.is_empty() {
            (prompt, tokens, Vec::new())
        } else {
            expand(&prompt, &self.images, false)?
        };
        Ok(Prompt {
            tokens,
            images,
            start: crate::chat::prefill(self.model.detected.format, &prompt),
        })
    }

    /// The prompt (text and tokens) of the conversation so far: openai-harmony's rendering for a
    /// harmony pack with the o200k vocabulary, else the chat template's.
    fn render(&self) -> Result<(String, Vec<u32>)> {
        let model = &self.model;
        if let Some(harmony) = &model.harmony {
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
            return Ok((model.tokenizer.decode(&tokens, false), tokens));
        }
        let mut extra = serde_json::Map::new();
        if let Some(t) = self.think {
            extra.insert("enable_thinking".into(), t.into());
        }
        if let Some(effort) = self.opts.reasoning_effort {
            extra.insert("reasoning_effort".into(), effort_name(effort).into());
        }
        let template = model.template.as_ref().expect("checked at start");
        let (bos_token, eos_token) = model.special_texts();
        let prompt = template.render(&RenderInput {
            messages: self.history.clone(),
            tools: None,
            add_generation_prompt: true,
            extra,
            bos_token,
            eos_token,
        })?;
        let tokens = model.tokenizer.encode(&prompt, false);
        Ok((prompt, tokens))
    }

    fn interactive(&mut self) -> Result<()> {
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
                if self.command(cmd) {
                    return Ok(());
                }
                continue;
            }
            if let Err(e) = self.turn(input) {
                eprintln!("error: {e:#}");
            }
        }
    }

    /// Handles a `/command`; returns true to quit.
    fn command(&mut self, cmd: &str) -> bool {
        let words: Vec<&str> = cmd.split_whitespace().collect();
        match words.as_slice() {
            ["bye"] | ["exit"] | ["quit"] => return true,
            ["clear"] => {
                // Only the conversation is forgotten: the engine's prefix cache keeps what a
                // later prompt can still reuse.
                self.history.retain(|m| m["role"] == "system");
                self.images.clear();
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
            ["show", "info"] => show_info(&self.model),
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
        false
    }
}

fn show_info(model: &Model) {
    eprintln!("  Model");
    eprintln!("    name              {}", model.reference);
    if !model.architecture.is_empty() {
        eprintln!("    architecture      {}", model.architecture);
    }
    eprintln!("    context length    {}", model.context_length);
    eprintln!("    vocabulary        {}", model.vocab_size);
    eprintln!(
        "    chat template     {}",
        if model.template.is_some() { "yes" } else { "none" }
    );
}

/// Tokens per second, 0 for no time.
fn rate(tokens: usize, d: Duration) -> f64 {
    tokens as f64 / d.as_secs_f64().max(1e-9)
}

/// Prints a turn's figures as `ollama run --verbose` does; `(drafted, accepted)` are the turn's
/// speculation counts.
fn print_stats(load: Duration, f: &Finish, (drafted, accepted): (u64, u64)) {
    let processed = f.prompt_tokens - f.cached_tokens;
    eprintln!(
        "total duration:       {:?}",
        load + f.prompt_duration + f.generation_duration
    );
    eprintln!("load duration:        {load:?}");
    eprintln!(
        "prompt eval count:    {processed} token(s) ({} cached)",
        f.cached_tokens
    );
    eprintln!("prompt eval duration: {:?}", f.prompt_duration);
    eprintln!(
        "prompt eval rate:     {:.2} tokens/s",
        rate(processed, f.prompt_duration)
    );
    eprintln!("eval count:           {} token(s)", f.completion_tokens);
    eprintln!("eval duration:        {:?}", f.generation_duration);
    eprintln!(
        "eval rate:            {:.2} tokens/s",
        rate(f.completion_tokens, f.generation_duration)
    );
    if drafted > 0 {
        eprintln!(
            "draft acceptance:     {:.1}% ({accepted} of {drafted} drafted token(s))",
            100.0 * accepted as f64 / drafted as f64,
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
            Some(p) => p.push(piece),
        };
        if let Some(d) = delta {
            self.show(out, &d);
        }
    }

    /// Prints the rest once generation ends, and the tool calls.
    fn finish(&mut self, out: &mut impl Write) {
        let Some(p) = &mut self.parser else { return };
        let (delta, msg) = p.finish();
        if let Some(d) = delta {
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
    use crate::chat::ChatFormat;

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
