//! `berth run`: one answer for a prompt, or an interactive chat, streamed to the terminal.

pub mod params;
mod repl;
mod session;

use crate::chat::{Delta, ParsedMessage};
use crate::constraint::RequestConstraints;
use crate::engine::metrics::Metrics;
use crate::engine::Finish;
use crate::state::models::{LoadSettings, Model};
use crate::turn::images::{self, RequestImage, UrlPolicy};
use crate::turn::reply::{self, ReplyEvent};
use crate::turn::{ChatRequest, Content, ImageRef, ImageSource, Message, Prompt, Role, Turn};
use anyhow::{anyhow, bail, Context, Result};
use berth_registry::store::Store;
use futures_util::StreamExt;
use params::SessionParams;
use session::PackSession;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Options of `berth run`.
#[derive(Clone, Debug)]
pub struct RunOptions {
    /// Complete the prompt as raw text, without the chat template.
    pub raw: bool,
    /// Print timings and rates after each answer.
    pub verbose: bool,
    /// The sampling flags given (Ollama's names: `--max-tokens` is `num_predict`): over the
    /// pack's defaults, under what `/set parameter` sets.
    pub params: SessionParams,
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
    /// Prompt-lookup speculation for greedy answers (`--speculation`, on by default).
    pub speculation: bool,
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

/// Most tokens per answer when neither `--max-tokens` nor the pack's `num_predict` says.
const DEFAULT_MAX_TOKENS: usize = 1024;

/// Runs `berth run`: loads the model onto an engine of one slot, the same scheduler `berth serve`
/// runs, and submits each turn to it. The pack's defaults apply as on every path (its system
/// prompt and messages before the conversation, its parameters under the flags given).
pub fn run(
    store: &Store,
    home: &Path,
    reference: &str,
    prompt: Option<String>,
    opts: RunOptions,
) -> Result<()> {
    let started = Instant::now();
    let pack_params = session::pack_params(store, reference)?;
    let settings = LoadSettings {
        threads: opts.threads,
        slots: 1,
        queue: RUN_QUEUE,
        context: None,
        keep_alive: None,
        speculation: opts.speculation,
    };
    let metrics = Arc::new(Metrics::default());
    let model = Model::load(store, home, reference, &settings, metrics.clone())?;
    let load_duration = started.elapsed();
    check_generates(&model, opts.raw)?;
    if opts.verbose {
        eprintln!("{}", model.detected);
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
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("starting the runtime")?;
    let mut chat = Chat {
        think: opts.think,
        history: Vec::new(),
        opts,
        constraints,
        pending,
        model,
        metrics,
        load_duration,
        turns: 0,
        runtime,
        store: store.clone(),
        home: home.to_path_buf(),
        settings,
        pack_params,
        user_params: SessionParams::default(),
        stop_on_interrupt: false,
    };
    if let Some(s) = &chat.opts.system {
        chat.history.push(Message::text(Role::System, s.clone()));
    }
    match prompt {
        Some(p) => chat.turn(&p),
        None => chat.interactive(),
    }
}

/// Refuses a model `berth run` cannot chat with (or, raw, complete text with).
fn check_generates(model: &Model, raw: bool) -> Result<()> {
    if model.embedding.is_some() {
        bail!(
            "{} is an embedding model: it embeds text and does not generate; try `berth embed {} TEXT...`",
            model.reference,
            model.reference
        );
    }
    if !raw && model.template.is_none() && model.harmony.is_none() {
        bail!(
            "{} has no chat template (a base model?); complete text with `berth run --raw {} PROMPT`, \
             or re-import it with `--template FILE`",
            model.reference,
            model.reference
        );
    }
    Ok(())
}

struct Chat {
    opts: RunOptions,
    think: Option<bool>,
    /// The conversation so far (images included, as their bytes); a system prompt (`--system`,
    /// `/set system`) comes first. The pack's system prompt and messages are not in it: every
    /// turn puts them before it, as on every path.
    history: Vec<Message>,
    /// The `--format` request, when one was asked for (the model's factory builds its grammar).
    constraints: Option<RequestConstraints>,
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
    /// Drives the reply's events (the engine runs on its own thread).
    runtime: tokio::runtime::Runtime,
    /// The store and home the model came from (`/load`, `/save`).
    store: Store,
    home: PathBuf,
    /// How the model was loaded (`/load` loads with these).
    settings: LoadSettings,
    /// The pack's own parameters as written (its manifest's `defaults`), for `/show parameters`
    /// and `/save`; the loaded model applies them (`Model::defaults`).
    pack_params: SessionParams,
    /// What `/set parameter` set, over the flags and the pack's.
    user_params: SessionParams,
    /// Whether Ctrl-C stops the answer being written (a chat on a terminal) rather than the program.
    stop_on_interrupt: bool,
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

/// How the end of one answer went.
enum Ending {
    /// The engine finished it.
    Finished(Finish),
    /// Ctrl-C stopped it.
    Stopped,
}

impl Chat {
    /// Builds the turn of a new user message (or the raw text), submits it to the engine, and
    /// prints the reply as it streams: the same turn and the same engine as `berth serve`. A
    /// turn that fails leaves the conversation as it was.
    fn turn(&mut self, text: &str) -> Result<()> {
        let prompt = self.prompt(text)?;
        let result = self.answer(prompt);
        if result.is_err() && !self.opts.raw {
            // The message is still the last one (the reply goes in only once it has ended; fitting
            // drops from the front): it is not part of the conversation.
            self.history.pop();
        }
        result
    }

    /// Submits the turn of `prompt` and prints its reply until it ends or Ctrl-C stops it.
    fn answer(&mut self, prompt: Prompt) -> Result<()> {
        let mut turn = self.fitted_turn(prompt)?;
        let model = &self.model;
        self.turns += 1;
        let drafts_before = self.drafts();
        let rx = turn
            .submit(model, &format!("run-{}", self.turns))
            .map_err(|e| anyhow!("{}", e.message))?
            .remove(0);
        let mut events = Box::pin(reply::events(rx, turn.parser()));
        // Ctrl-C stops the answer, not the program. Once taken, the signal stays with the process
        // (a Ctrl-C between answers is ignored); at the prompt the line editor reads it as a key.
        // One listener for the whole answer (polled across the reads below), so no Ctrl-C between
        // two events is missed.
        let mut interrupt = self.stop_on_interrupt.then(|| Box::pin(tokio::signal::ctrl_c()));
        let mut out = std::io::stdout().lock();
        let mut printer = ReplyPrinter::default();
        let ending = loop {
            let next = self.runtime.block_on(async {
                match &mut interrupt {
                    Some(i) => tokio::select! {
                        e = events.next() => Some(e),
                        _ = i => None,
                    },
                    None => Some(events.next().await),
                }
            });
            match next {
                None => break Ending::Stopped,
                Some(Some(ReplyEvent::Grew { deltas, .. })) => printer.show(&mut out, &deltas),
                Some(Some(ReplyEvent::Ended { deltas, end, .. })) => {
                    printer.show(&mut out, &deltas);
                    break Ending::Finished(end.finish);
                }
                Some(Some(ReplyEvent::Failed(e))) => bail!("{e}"),
                Some(None) => bail!("the engine stopped before the answer ended"),
            }
        };
        // Dropping the events closes the job's channel: the engine frees its slot, as it does
        // when a client of `berth serve` disconnects.
        drop(events);
        printer.finish(&mut out);
        let _ = writeln!(out);
        drop(out);
        let m = &printer.message;
        let nothing = m.content.as_deref().unwrap_or_default().is_empty()
            && m.reasoning_content.is_none()
            && m.tool_calls.is_empty();
        if !self.opts.raw {
            if nothing && matches!(ending, Ending::Stopped) {
                // Stopped before a word: the question goes too, as if it was never asked.
                self.history.pop();
            } else {
                // The reply goes back into the conversation as a client sends it: its content,
                // reasoning and calls, never its markup (a stopped answer as far as it was shown).
                self.history.push(printer.message.into_message());
            }
        }
        match ending {
            Ending::Finished(finish) if self.opts.verbose => {
                let (drafted, accepted) = self.drafts();
                print_stats(
                    self.load_duration,
                    &finish,
                    (drafted - drafts_before.0, accepted - drafts_before.1),
                );
            }
            Ending::Finished(_) => {}
            Ending::Stopped => eprintln!("(stopped)"),
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

    /// The prompt of a new user message (added to the conversation) or of the raw text: its
    /// images (files named in it, then `--image` files for the first) before its text.
    fn prompt(&mut self, text: &str) -> Result<Prompt> {
        let (text, found) = images_in_prompt(text)?;
        let mut new: Vec<RequestImage> = std::mem::take(&mut self.pending);
        new.extend(found);
        let refs: Vec<ImageRef> = new
            .into_iter()
            .map(|i| ImageRef {
                place: i.place,
                source: ImageSource::Bytes(i.bytes),
            })
            .collect();
        if self.opts.raw {
            return Ok(Prompt::Raw { text, images: refs });
        }
        self.history.push(Message {
            content: Some(Content::images_then_text(refs, text)),
            ..Message::text(Role::User, "")
        });
        Ok(Prompt::Chat(self.history.clone()))
    }

    /// The turn of `prompt`; a conversation that no longer fits the context (with room for an
    /// answer) loses its oldest exchanges, the system prompt kept, with a notice.
    fn fitted_turn(&mut self, mut prompt: Prompt) -> Result<Turn> {
        let mut dropped = 0;
        loop {
            let req = self.request(prompt, false)?;
            let context = crate::turn::request_context(&self.model, &req.decode);
            let room = answer_room(req.decode.max_tokens, context);
            let turn = self.prepare(req)?;
            if self.opts.raw || turn.prompt.len() + room <= context {
                self.dropped_notice(dropped, context);
                return Ok(turn);
            }
            match drop_oldest_exchange(&mut self.history) {
                0 => {
                    self.dropped_notice(dropped, context);
                    // Nothing of the session's is left to drop: the pack's own messages are cut as
                    // Ollama cuts a long chat, or the turn says why it cannot fit.
                    let req = self.request(Prompt::Chat(self.history.clone()), true)?;
                    return self.prepare(req);
                }
                n => dropped += n,
            }
            prompt = Prompt::Chat(self.history.clone());
        }
    }

    /// Builds the turn of a request (the same [`Turn::prepare`] as every API).
    fn prepare(&self, req: ChatRequest) -> Result<Turn> {
        self.runtime
            .block_on(Turn::prepare(&self.model, req, UrlPolicy::default()))
            .map_err(|e| anyhow!("{}", e.message))
    }

    /// Says how many messages fitting the context dropped, if any.
    fn dropped_notice(&self, dropped: usize, context: usize) {
        if dropped > 0 {
            eprintln!(
                "(the conversation no longer fits the {context}-token context: the oldest \
                 {dropped} message(s) were dropped; the system prompt is kept)"
            );
        }
    }

    /// The typed turn of a prompt: Berth's defaults, then the pack's, then the flags given, then
    /// the session's own (`/set parameter`); `truncate`: the turn may cut the oldest turns to fit.
    fn request(&self, prompt: Prompt, truncate: bool) -> Result<ChatRequest> {
        let mut req = ChatRequest::new(prompt);
        let mut base = self.model.defaults.decode.settings();
        if !self.pack_params.has("num_predict") {
            base.max_tokens = Some(DEFAULT_MAX_TOKENS);
        }
        req.decode = self.opts.params.merged(&self.user_params).over(&base)?;
        req.truncate = truncate;
        if let Some(c) = &self.constraints {
            req.constraints = c.clone();
        }
        req.thinking.enabled = self.think;
        req.thinking.effort = self.opts.reasoning_effort.map(|e| effort_name(e).to_string());
        // Raw text is printed exactly as generated.
        req.parse_reply = !self.opts.raw;
        Ok(req)
    }

    fn interactive(&mut self) -> Result<()> {
        let mut input = repl::Input::open(repl::history_file(&self.home));
        self.stop_on_interrupt = input.is_terminal();
        if input.is_terminal() {
            self.print_conversation();
        }
        loop {
            let text = match input.next()? {
                repl::Entry::Text(t) => t,
                repl::Entry::Interrupted => continue,
                repl::Entry::Eof => return Ok(()),
            };
            let text = text.trim();
            if text.is_empty() {
                continue;
            }
            if let Some(cmd) = text.strip_prefix('/') {
                if self.command(cmd) {
                    return Ok(());
                }
                continue;
            }
            if let Err(e) = self.turn(text) {
                eprintln!("error: {e:#}");
            }
        }
    }

    /// Prints the conversation a pack brings (its messages), as `ollama run` shows them.
    fn print_conversation(&self) {
        for m in &self.model.defaults.messages {
            match m.role.as_str() {
                "user" => println!(">>> {}", m.content),
                "assistant" => println!("{}\n", m.content),
                _ => {}
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
                self.history.retain(|m| m.role == Role::System);
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
            ["set", "verbose"] => {
                self.opts.verbose = true;
                eprintln!("Set 'verbose' mode.");
            }
            ["set", "quiet"] => {
                self.opts.verbose = false;
                eprintln!("Set 'quiet' mode.");
            }
            ["set", "parameter", name, values @ ..] if !values.is_empty() => self.set_parameter(name, values),
            ["set", "parameter", ..] => {
                eprintln!("Available parameters:");
                for l in params::usage() {
                    eprintln!("{l}");
                }
            }
            ["set", "system", ..] => {
                // The text as typed (a `"""` block keeps its lines).
                let text = cmd.trim_start()["set".len()..].trim_start()["system".len()..].trim();
                if text.is_empty() {
                    eprintln!("Usage: /set system TEXT");
                } else {
                    self.set_system(text);
                    eprintln!("Set system message.");
                }
            }
            ["set", ..] => {
                eprintln!("Available commands:");
                eprintln!("  /set parameter NAME VALUE  Set a parameter (/set parameter lists them)");
                eprintln!("  /set system TEXT           Set the system message");
                eprintln!("  /set think on|off          Enable or disable thinking");
                eprintln!("  /set verbose|quiet         Show or hide generation statistics");
            }
            ["show", "info"] => show_info(&self.model),
            ["show", "parameters"] => self.show_parameters(),
            ["show", "system"] => match self.system() {
                Some(s) => println!("{s}\n"),
                None => println!("No system message was specified for this model."),
            },
            ["show", "template"] => match (&self.model.template, &self.model.harmony) {
                (Some(t), _) => println!("{}", t.source()),
                (None, Some(_)) => println!("The openai-harmony format (rendered by OpenAI's renderer)."),
                (None, None) => println!("No prompt template was specified for this model."),
            },
            ["show", "license"] => match self
                .store
                .get(&self.model.reference)
                .ok()
                .and_then(|e| e.manifest?.license)
            {
                Some(l) => println!("{l}"),
                None => println!("No license was specified for this model."),
            },
            ["show", ..] => {
                eprintln!("Available commands:");
                eprintln!("  /show info         Show details for this model");
                eprintln!("  /show license      Show the model's license");
                eprintln!("  /show parameters   Show the parameters in use");
                eprintln!("  /show system       Show the system message");
                eprintln!("  /show template     Show the prompt template");
            }
            ["load", name] => {
                if let Err(e) = self.load(name) {
                    eprintln!("error: {e:#}");
                }
            }
            ["load", ..] => eprintln!("Usage: /load MODEL"),
            ["save", name] => match self.save(name) {
                Ok(entry) => eprintln!("Created new model '{}'", entry.reference),
                Err(e) => eprintln!("error: {e:#}"),
            },
            ["save", ..] => eprintln!("Usage: /save NAME"),
            ["?"] | ["help"] | ["?", ..] | ["help", ..] => {
                eprintln!("Available commands:");
                eprintln!("  /set            Set session variables (parameters, system message, think)");
                eprintln!("  /show           Show model information");
                eprintln!("  /load MODEL     Load a session or model");
                eprintln!("  /save NAME      Save the session as a new model");
                eprintln!("  /clear          Clear session context");
                eprintln!("  /bye            Exit");
                eprintln!("  /?, /help       Help for a command");
                eprintln!();
                eprintln!("Use \"\"\" to begin a multi-line message.");
                eprintln!("Ctrl + c stops an answer; Ctrl + d (or /bye) exits.");
            }
            _ => eprintln!("Unknown command '/{cmd}'. Type /? for help"),
        }
        false
    }

    /// `/set parameter NAME VALUE...` (`num_ctx` is the context of the next turns, up to the
    /// model's own).
    fn set_parameter(&mut self, name: &str, values: &[&str]) {
        match self.user_params.set(name, values) {
            Ok(()) => eprintln!("Set parameter '{name}' to '{}'", values.join(", ")),
            Err(e) => eprintln!("Couldn't set parameter: {e}"),
        }
    }

    /// The system prompt in use: the session's, else the pack's.
    fn system(&self) -> Option<String> {
        match self.history.first() {
            Some(m) if m.role == Role::System => Some(session::text_of(m)),
            _ => self.model.defaults.system.clone(),
        }
    }

    /// Replaces the system message (or puts one first).
    fn set_system(&mut self, text: &str) {
        let message = Message::text(Role::System, text);
        match self.history.first_mut() {
            Some(m) if m.role == Role::System => *m = message,
            _ => self.history.insert(0, message),
        }
    }

    /// `/show parameters`: the pack's, then the session's, as `ollama run` lists them.
    fn show_parameters(&self) {
        println!("Model defined parameters:");
        if self.pack_params.is_empty() {
            println!("  No additional parameters were specified for this model.");
        }
        for l in self.pack_params.lines() {
            println!("  {l}");
        }
        println!();
        if !self.user_params.is_empty() {
            println!("User defined parameters:");
            for l in self.user_params.lines() {
                println!("  {l}");
            }
            println!();
        }
    }

    /// `/load NAME`: another model, or a saved session with its system prompt, messages and
    /// parameters (the session's own parameters and conversation are dropped). On failure the
    /// session goes on.
    fn load(&mut self, name: &str) -> Result<()> {
        let pack_params = session::pack_params(&self.store, name)?;
        eprintln!("Loading model '{name}'");
        let started = Instant::now();
        let model = Model::load(
            &self.store,
            &self.home,
            name,
            &self.settings,
            self.metrics.clone(),
        )?;
        check_generates(&model, self.opts.raw)?;
        let constraints = match &self.opts.format {
            Some(f) if !self.opts.raw => Some(format_constraints(&model, f)?),
            _ => None,
        };
        self.model = model;
        self.load_duration = started.elapsed();
        self.constraints = constraints;
        self.pack_params = pack_params;
        self.user_params = SessionParams::default();
        self.history.clear();
        self.print_conversation();
        Ok(())
    }

    /// `/save NAME`: the session as a new pack (see [`session::save_pack`]): the system prompt in
    /// use, the pack's messages then the conversation, the pack's parameters under the flags
    /// given and `/set parameter`'s.
    fn save(&self, name: &str) -> Result<berth_registry::store::PackEntry> {
        let mut messages = self.model.defaults.messages.clone();
        messages.extend(
            self.history
                .iter()
                .filter(|m| m.role != Role::System)
                .map(session::pack_message),
        );
        let saved = PackSession {
            system: self.system(),
            messages,
            params: self
                .pack_params
                .merged(&self.opts.params)
                .merged(&self.user_params),
        };
        session::save_pack(&self.store, &self.model.reference, name, &saved)
    }
}

/// Tokens kept free for the answer when the conversation is fitted to the context: the answer's
/// limit, at most a quarter of the context.
fn answer_room(max_tokens: Option<usize>, context: usize) -> usize {
    let quarter = context / 4;
    max_tokens.map_or(quarter, |m| m.min(quarter))
}

/// Drops the oldest exchange of the conversation (a user message and what answered it), never
/// a system message nor the last user message; returns how many messages went (0: none could).
fn drop_oldest_exchange(history: &mut Vec<Message>) -> usize {
    let Some(first) = history.iter().position(|m| m.role != Role::System) else {
        return 0;
    };
    let Some(next_user) = history[first + 1..]
        .iter()
        .position(|m| m.role == Role::User)
        .map(|i| first + 1 + i)
    else {
        return 0;
    };
    history.drain(first..next_user);
    next_user - first
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
/// `...done thinking.`, then the answer, then any tool calls; chat markup is never shown (a raw
/// reply is all content, printed as generated).
#[derive(Default)]
struct ReplyPrinter {
    /// Where the printed reply is: 0 nothing yet, 1 inside the reasoning, 2 past it.
    stage: u8,
    /// The reply so far (the fold of its deltas).
    message: ParsedMessage,
}

impl ReplyPrinter {
    /// Prints what a flush of the reply adds (calls wait for the end).
    fn show(&mut self, out: &mut impl Write, deltas: &[Delta]) {
        for d in deltas {
            self.message.apply(d);
            match d {
                Delta::Reasoning(r) if !r.is_empty() => {
                    if self.stage == 0 {
                        let _ = writeln!(out, "Thinking...");
                        self.stage = 1;
                    }
                    let _ = out.write_all(r.as_bytes());
                }
                Delta::Content(c) if !c.is_empty() => {
                    if self.stage == 1 {
                        let _ = write!(out, "\n...done thinking.\n\n");
                    }
                    self.stage = 2;
                    let _ = out.write_all(c.as_bytes());
                }
                _ => {}
            }
        }
        let _ = out.flush();
    }

    /// Prints the tool calls once the reply ends.
    fn finish(&mut self, out: &mut impl Write) {
        for call in &self.message.tool_calls {
            let _ = write!(out, "\n[tool call] {}({})", call.name, call.arguments);
        }
        let _ = out.flush();
    }
}

/// A parsed reply as the assistant message of the conversation.
trait IntoMessage {
    fn into_message(self) -> Message;
}

impl IntoMessage for ParsedMessage {
    fn into_message(self) -> Message {
        Message {
            content: self.content.map(Content::Text),
            reasoning: self.reasoning_content,
            tool_calls: self
                .tool_calls
                .into_iter()
                .map(|c| crate::turn::Call {
                    id: Some(c.id),
                    name: c.name,
                    arguments: c.arguments.into(),
                })
                .collect(),
            ..Message::text(Role::Assistant, "")
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::chat::{ChatFormat, ParseStart, StreamParser};

    fn printed(format: ChatFormat, start: ParseStart, pieces: &[&str], raw: bool) -> String {
        let mut out = Vec::new();
        let mut parser = (!raw).then(|| StreamParser::new(format, start, None));
        let mut p = ReplyPrinter::default();
        for piece in pieces {
            let deltas = match &mut parser {
                Some(parser) => parser.push(piece),
                None => vec![Delta::Content(piece.to_string())],
            };
            p.show(&mut out, &deltas);
        }
        if let Some(parser) = &mut parser {
            p.show(&mut out, &parser.finish().0);
        }
        p.finish(&mut out);
        String::from_utf8(out).unwrap()
    }

    #[test]
    fn fitting_drops_whole_exchanges_from_the_front_and_keeps_the_system_prompt() {
        let m = |role, text: &str| Message::text(role, text);
        let mut history = vec![
            m(Role::System, "terse"),
            m(Role::User, "a"),
            m(Role::Assistant, "A"),
            m(Role::User, "b"),
            m(Role::Assistant, "B"),
            m(Role::User, "c"),
        ];
        assert_eq!(drop_oldest_exchange(&mut history), 2);
        assert_eq!(
            history,
            [
                m(Role::System, "terse"),
                m(Role::User, "b"),
                m(Role::Assistant, "B"),
                m(Role::User, "c")
            ]
        );
        assert_eq!(drop_oldest_exchange(&mut history), 2);
        // The question being asked is never dropped.
        assert_eq!(drop_oldest_exchange(&mut history), 0);
        assert_eq!(history, [m(Role::System, "terse"), m(Role::User, "c")]);
        assert_eq!(
            (
                answer_room(Some(40), 160),
                answer_room(Some(1024), 160),
                answer_room(None, 160)
            ),
            (40, 40, 40)
        );
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

/// What `berth embed` does besides the model and the texts.
#[derive(Clone, Debug, Default)]
pub struct EmbedCliOptions {
    /// A prompt of the model's, by name (`query`, `document`, …).
    pub prompt_name: Option<String>,
    /// Keep the first this many dimensions (renormalised).
    pub dimensions: Option<usize>,
    /// Cut texts longer than the model embeds instead of failing.
    pub truncate: bool,
    /// Print the cosine similarity matrix instead of the vectors.
    pub similarity: bool,
    /// Compute threads (None: the plugin decides).
    pub threads: Option<u32>,
}

/// `berth embed`: loads an embedding model, embeds `texts` (sharing forward passes, as the server
/// does), and prints one JSON line per text (`{"index", "text", "embedding"}`) or, with
/// `similarity`, the matrix of cosine similarities between them.
pub fn embed(
    store: &Store,
    home: &Path,
    reference: &str,
    texts: Vec<String>,
    opts: EmbedCliOptions,
) -> Result<()> {
    if texts.is_empty() {
        bail!("nothing to embed: give texts, or -f FILE with one text a line");
    }
    let settings = LoadSettings {
        threads: opts.threads,
        slots: 16,
        queue: RUN_QUEUE,
        context: None,
        keep_alive: None,
        speculation: false,
    };
    let model = Model::load(store, home, reference, &settings, Arc::new(Metrics::default()))?;
    let eopts = crate::embedding::EmbedOptions {
        prompt_name: opts.prompt_name.clone(),
        truncate: opts.truncate,
        dimensions: opts.dimensions,
        field: "text",
        listed: true,
        ..Default::default()
    };
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let out = runtime
        .block_on(crate::embedding::embed(
            &model,
            crate::embedding::Inputs::Texts(texts.clone()),
            &eopts,
        ))
        .map_err(|e| anyhow!("{}", e.message))?;
    let mut stdout = std::io::stdout().lock();
    if !opts.similarity {
        for (i, (t, v)) in texts.iter().zip(&out.vectors).enumerate() {
            let line = serde_json::json!({"index": i, "text": t, "embedding": v});
            writeln!(stdout, "{line}")?;
        }
        return Ok(());
    }
    let cosine = |a: &[f32], b: &[f32]| {
        let dot: f64 = a.iter().zip(b).map(|(&x, &y)| f64::from(x) * f64::from(y)).sum();
        let na: f64 = a.iter().map(|&x| f64::from(x) * f64::from(x)).sum::<f64>().sqrt();
        let nb: f64 = b.iter().map(|&x| f64::from(x) * f64::from(x)).sum::<f64>().sqrt();
        dot / (na * nb).max(f64::MIN_POSITIVE)
    };
    let label = |i: usize, t: &str| {
        let short: String = t.chars().take(40).collect();
        let more = if t.chars().count() > 40 { "…" } else { "" };
        format!("[{i}] {short}{more}")
    };
    for (i, t) in texts.iter().enumerate() {
        writeln!(stdout, "{}", label(i, t))?;
    }
    write!(stdout, "\n     ")?;
    for j in 0..texts.len() {
        write!(stdout, " {:>6}", format!("[{j}]"))?;
    }
    writeln!(stdout)?;
    for (i, a) in out.vectors.iter().enumerate() {
        write!(stdout, "{:<5}", format!("[{i}]"))?;
        for b in &out.vectors {
            write!(stdout, " {:>6.3}", cosine(a, b))?;
        }
        writeln!(stdout)?;
    }
    Ok(())
}
