//! One chat turn, whatever asked for it: every API surface maps its wire request into a
//! [`ChatRequest`] ([`request`]), and [`Turn::prepare`] builds, in one place, what the engine and
//! the stream need from it: the prompt rendered (chat template or openai-harmony), its images,
//! the prefill state, whether the model thinks, the constraint per choice and the reply parser.
//! [`reply`] drives the engine's events through the parser into typed deltas, streamed or folded;
//! each surface only encodes those. `berth run` builds the same turn and submits to the same
//! engine.

pub mod error;
pub mod fim;
pub mod images;
pub mod reply;
pub mod request;

pub use error::ApiError;
pub use request::{Call, ChatRequest, Content, ImageRef, ImageSource, Message, Part, Prompt, Role, Thinking};

use crate::chat::{ChatFormat, ParseStart, StreamParser};
use crate::constraint::{RequestConstraints, SequenceConstraint};
use crate::decoding::DecodeOptions;
use crate::engine::{Event, Job, JobImage, Sibling, SubmitError};
use crate::harmony::{HarmonyInput, ReasoningEffort};
use crate::options::PackDefaults;
use crate::state::models::Model;
use crate::template::RenderInput;
use axum::http::StatusCode;
use images::{RequestImage, UrlPolicy};
use serde_json::{Map, Value};
use std::time::Instant;
use tokio::sync::mpsc::{unbounded_channel, UnboundedReceiver};

/// Most choices one request may ask for.
pub const MAX_CHOICES: usize = 16;

/// A turn ready for the engine: the prompt, its images, one decode per choice, and how to parse
/// the reply.
pub struct Turn {
    /// The prompt as rendered text (markers replaced by the images' placeholders).
    pub rendered: String,
    /// The prompt's tokens.
    pub prompt: Vec<u32>,
    /// The images' slices, placed on their placeholder tokens.
    pub images: Vec<JobImage>,
    /// One decode per choice, each with its own constraint and seed.
    pub decodes: Vec<DecodeOptions>,
    /// Where the rendered prompt leaves the reply (in reasoning, in content).
    pub start: ParseStart,
    /// Whether the model thinks first.
    pub thinks: bool,
    /// The chat format replies are parsed in; `None`: the text is passed on as it is.
    pub format: Option<ChatFormat>,
    /// The tools calls are recognised for.
    pub parser_tools: Option<Vec<Value>>,
    /// Whether the request asked for log-probabilities.
    pub logprobs: bool,
    /// How many choices it generates.
    pub choices: usize,
}

impl Turn {
    /// Builds the turn of `req` for `model`: images loaded (URLs fetched under `policy`) and
    /// checked against the model, the prompt rendered and tokenized, the prefill read, the
    /// constraint of each choice built. Every client mistake is a 400 naming its parameter.
    pub async fn prepare(model: &Model, mut req: ChatRequest, policy: UrlPolicy) -> Result<Turn, ApiError> {
        if let Some(bias) = req.logit_bias.take() {
            req.decode.sampling.logit_bias =
                crate::sampling::parse_logit_bias(Some(&bias), model.vocab_size).map_err(ApiError::from)?;
        }
        let refs: Vec<ImageRef> = match &req.prompt {
            Prompt::Chat(messages) => messages.iter().flat_map(|m| m.images().cloned()).collect(),
            Prompt::Raw { images, .. } => images.clone(),
        };
        if let (Some(first), None) = (refs.first(), &model.vision) {
            return Err(ApiError::param(
                &first.place,
                format!("{}: model {} does not take images", first.place, model.reference),
            ));
        }
        let mut loaded = Vec::with_capacity(refs.len());
        for r in &refs {
            loaded.push(images::load(r, policy).await?);
        }
        Turn::build(model, req, &loaded)
    }

    /// [`Turn::prepare`] once the images are loaded (`berth run` reads its files itself). The
    /// pack's system prompt and messages go before a conversation; the context is the request's
    /// (`num_ctx`), else the pack's, else the server's, never more than the model holds; a
    /// conversation that does not fit drops its oldest turns when the request allows it.
    pub fn build(model: &Model, mut req: ChatRequest, loaded: &[RequestImage]) -> Result<Turn, ApiError> {
        let context = request_context(model, &req.decode);
        req.decode.context = Some(context);
        if let Prompt::Chat(messages) = &mut req.prompt {
            with_pack_turns(&model.defaults, messages);
        }
        let extra = req.template_extra();
        let parser_tools = req.constraints.parser_tools().map(<[Value]>::to_vec);
        let (rendered, prompt, images, start, thinks, format) = match &mut req.prompt {
            Prompt::Chat(messages) => {
                // The template shows the tools the parser reads calls of (none with `tool_choice: none`).
                let tools = parser_tools.clone();
                let draw = |messages: &[Message]| {
                    render(model, template_json(messages), tools.clone(), extra.clone())
                };
                let (mut rendered, mut prompt) = draw(messages)?;
                let mut loaded = loaded;
                if req.truncate && prompt.len() >= context {
                    let kept = fit_turns(messages, context, |m| draw(m).map(|(_, p)| p.len()))?;
                    if kept.dropped > 0 {
                        let gone: usize = messages[kept.first..kept.first + kept.dropped]
                            .iter()
                            .map(|m| m.images().count())
                            .sum();
                        messages.drain(kept.first..kept.first + kept.dropped);
                        loaded = &loaded[gone.min(loaded.len())..];
                        (rendered, prompt) = draw(messages)?;
                        tracing::debug!(
                            dropped = kept.dropped,
                            tokens = prompt.len(),
                            context,
                            "oldest turns dropped to fit the context"
                        );
                    }
                }
                let mut slices = Vec::new();
                if !loaded.is_empty() {
                    (rendered, prompt, slices) = images::expand(model, &rendered, loaded, false)?;
                }
                let start = crate::chat::prefill(model.detected.format, &rendered);
                let thinks = thinking(model, start, &extra);
                (
                    rendered,
                    prompt,
                    slices,
                    start,
                    thinks,
                    Some(model.detected.format),
                )
            }
            Prompt::Raw { text, images: refs } => {
                let marked = (0..refs.len()).map(images::marker).collect::<String>() + text;
                let (rendered, prompt, slices) = images::expand(model, &marked, loaded, true)?;
                (
                    rendered,
                    prompt,
                    slices,
                    ParseStart::Content,
                    false,
                    Some(ChatFormat::ContentOnly),
                )
            }
        };
        let format = if req.parse_reply { format } else { None };
        let rc = &req.constraints;
        let logprobs = req.decode.logprobs.is_some();
        let mut first = req.decode;
        first.constraint = constraint_for(model, rc, thinks, start)?;
        let choices = req.n.max(1);
        let decodes = choice_decodes(first, choices, || constraint_for(model, rc, thinks, start))?;
        Ok(Turn {
            rendered,
            prompt,
            images,
            decodes,
            start,
            thinks,
            format,
            parser_tools,
            logprobs,
            choices,
        })
    }

    /// A fresh parser for one choice's reply (`None` when the reply is passed on as it is).
    pub fn parser(&self) -> Option<StreamParser> {
        self.format
            .map(|f| StreamParser::new(f, self.start, self.parser_tools.as_deref()))
    }

    /// A fresh parser for each choice.
    pub fn parsers(&self) -> Vec<Option<StreamParser>> {
        (0..self.choices).map(|_| self.parser()).collect()
    }

    /// Queues the turn on the model's engine: the first choice computes the prompt and the others
    /// fork its sequence. One receiver per choice, in order.
    pub fn submit(&mut self, model: &Model, id: &str) -> Result<Vec<UnboundedReceiver<Event>>, ApiError> {
        let prompt = std::mem::take(&mut self.prompt);
        let images = std::mem::take(&mut self.images);
        let decodes = std::mem::take(&mut self.decodes);
        submit_n(model, id, prompt, images, decodes)
    }
}

/// Queues a prompt for several choices, one [`DecodeOptions`] each. One receiver per choice.
pub fn submit_n(
    model: &Model,
    id: &str,
    prompt: Vec<u32>,
    images: Vec<JobImage>,
    mut decodes: Vec<DecodeOptions>,
) -> Result<Vec<UnboundedReceiver<Event>>, ApiError> {
    if prompt.is_empty() {
        return Err(ApiError::param("messages", "the prompt is empty"));
    }
    let context = request_context(model, &decodes[0]);
    if prompt.len() >= context {
        let mut e = ApiError::param(
            "messages",
            format!(
                "This model's maximum context length is {context} tokens; the prompt has {}.",
                prompt.len()
            ),
        );
        e.code = Some("context_length_exceeded");
        return Err(e);
    }
    let mut rxs = Vec::new();
    let mut siblings = Vec::new();
    let first = decodes.remove(0);
    let (tx, rx) = unbounded_channel();
    rxs.push(rx);
    for decode in decodes {
        let (events, rx) = unbounded_channel();
        rxs.push(rx);
        siblings.push(Sibling { decode, events });
    }
    let job = Job {
        id: id.to_string(),
        prompt,
        decode: first,
        events: tx,
        received: Instant::now(),
        images,
        siblings,
    };
    match model.engine.submit(job) {
        Ok(()) => Ok(rxs),
        Err(SubmitError::QueueFull) => Err(ApiError::new(
            StatusCode::TOO_MANY_REQUESTS,
            "the server is busy: the request queue is full; retry shortly",
        )),
        Err(SubmitError::Closed) => Err(ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "the model is being unloaded; retry shortly",
        )),
    }
}

/// The context a request may fill: its own (`num_ctx`, or its pack's default), else the
/// server's, never more than the model holds.
pub fn request_context(model: &Model, decode: &DecodeOptions) -> usize {
    decode
        .context
        .unwrap_or(model.default_context)
        .min(model.context_length)
        .max(1)
}

/// The template's view of a conversation, images numbered in order.
pub(crate) fn template_json(messages: &[Message]) -> Vec<Value> {
    let mut k = 0;
    messages
        .iter()
        .map(|m| {
            let v = m.to_template(k, images::marker);
            k += m.images().count();
            v
        })
        .collect()
}

/// Puts the pack's system prompt (when the conversation has none) and its messages before a
/// conversation, as Ollama does with a Modelfile's `SYSTEM` and `MESSAGE` lines.
pub fn with_pack_turns(defaults: &PackDefaults, messages: &mut Vec<Message>) {
    let lead = messages
        .iter()
        .take_while(|m| matches!(m.role, Role::System | Role::Developer))
        .count();
    let pack = defaults.messages.iter().filter_map(|m| {
        let role = match m.role.as_str() {
            "system" => Role::System,
            "user" => Role::User,
            "assistant" => Role::Assistant,
            _ => return None,
        };
        Some(Message::text(role, m.content.clone()))
    });
    let pack: Vec<Message> = pack.collect();
    messages.splice(lead..lead, pack);
    if lead == 0 {
        if let Some(system) = &defaults.system {
            messages.insert(0, Message::text(Role::System, system.clone()));
        }
    }
}

/// Which turns of a conversation are dropped to fit a context: `dropped` messages from `first`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Kept {
    /// The first message that may go (the one after the leading system messages).
    pub first: usize,
    /// How many go.
    pub dropped: usize,
}

/// Ollama's truncation: the leading system messages and the latest message always stay; the
/// oldest turns after the system messages go, the fewest that make the prompt (`tokens` counts
/// a candidate conversation) shorter than `context`. When even the system messages and the
/// latest message do not fit, the request fails naming the context.
pub fn fit_turns(
    messages: &[Message],
    context: usize,
    tokens: impl Fn(&[Message]) -> Result<usize, ApiError>,
) -> Result<Kept, ApiError> {
    let first = messages
        .iter()
        .take_while(|m| matches!(m.role, Role::System | Role::Developer))
        .count();
    let last = messages.len().saturating_sub(1).max(first);
    let fits = |dropped: usize| -> Result<bool, ApiError> {
        let mut candidate = messages[..first].to_vec();
        candidate.extend_from_slice(&messages[first + dropped..]);
        Ok(tokens(&candidate)? < context)
    };
    // The prompt shrinks as turns go: the fewest that fit, by bisection over 0..=last-first.
    let (mut lo, mut hi) = (0, last - first);
    if !fits(hi)? {
        let mut e = ApiError::param(
            "messages",
            format!("the system prompt and the latest message do not fit the context of {context} tokens"),
        );
        e.code = Some("context_length_exceeded");
        return Err(e);
    }
    while lo < hi {
        let mid = (lo + hi) / 2;
        if fits(mid)? {
            hi = mid;
        } else {
            lo = mid + 1;
        }
    }
    // A reply starts after a user turn: do not leave an assistant or tool turn first.
    let mut dropped = lo;
    while first + dropped < last && !matches!(messages[first + dropped].role, Role::User) {
        dropped += 1;
    }
    Ok(Kept { first, dropped })
}

/// The decode options of `n` choices: the first as given, each other with its own seed
/// ([`choice_seed`]) and a fresh constraint from `constraint`.
pub fn choice_decodes(
    first: DecodeOptions,
    n: usize,
    constraint: impl Fn() -> Result<Option<SequenceConstraint>, ApiError>,
) -> Result<Vec<DecodeOptions>, ApiError> {
    let mut rest = Vec::new();
    for k in 1..n {
        let mut sampling = first.sampling.clone();
        sampling.seed = choice_seed(first.sampling.seed, k);
        rest.push(DecodeOptions {
            sampling,
            max_tokens: first.max_tokens,
            stop: first.stop.clone(),
            context: first.context,
            constraint: constraint()?,
            logprobs: first.logprobs,
        });
    }
    rest.insert(0, first);
    Ok(rest)
}

/// The seed of choice `k`: the request's seed for the first, a different fixed stream for each
/// other, so a seeded request with `n` > 1 is reproducible and its choices differ.
pub fn choice_seed(seed: Option<u64>, k: usize) -> Option<u64> {
    match (seed, k) {
        (s, 0) => s,
        (Some(s), k) => Some(s.wrapping_add((k as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15))),
        (None, _) => None,
    }
}

/// Whether the rendered prompt leaves the model thinking (the constraint allows reasoning first).
/// gpt-oss always reasons (on its analysis channel): thinking cannot be turned off.
pub fn thinking(model: &Model, start: ParseStart, extra: &Map<String, Value>) -> bool {
    if model.detected.format == ChatFormat::Harmony {
        return true;
    }
    match start {
        ParseStart::Reasoning => true,
        ParseStart::ReasoningClosed => false,
        _ => {
            model.detected.reasoning.is_some()
                && extra.get("enable_thinking").and_then(Value::as_bool) != Some(false)
        }
    }
}

/// The grammar for a request's tools / format, if it needs one.
pub fn constraint_for(
    model: &Model,
    rc: &RequestConstraints,
    thinking: bool,
    start: ParseStart,
) -> Result<Option<SequenceConstraint>, ApiError> {
    if rc.is_unconstrained() {
        return Ok(None);
    }
    match &model.constraints {
        Ok(f) => f.build(rc, thinking, start).map_err(ApiError::from),
        Err(e) => Err(ApiError::param(
            "response_format",
            format!(
                "constrained decoding is not available for {}: {e}",
                model.reference
            ),
        )),
    }
}

/// The reasoning effort of a request to a harmony (gpt-oss) model: `low`, `medium` (the default)
/// or `high`, from `reasoning_effort` or `think`. gpt-oss cannot reason less than `low`, so
/// `none` and `minimal` are refused; a boolean `think` leaves the default, as Ollama does.
pub fn harmony_effort(extra: &Map<String, Value>) -> Result<ReasoningEffort, ApiError> {
    let known = "gpt-oss knows the reasoning efforts low, medium and high";
    match extra.get("reasoning_effort") {
        None | Some(Value::Null) => Ok(ReasoningEffort::Medium),
        Some(Value::String(s)) => crate::harmony::parse_effort(s)
            .ok_or_else(|| ApiError::param("reasoning_effort", format!("'{s}' is not supported: {known}"))),
        Some(_) => Err(ApiError::param(
            "reasoning_effort",
            format!("'reasoning_effort' must be a string: {known}"),
        )),
    }
}

/// Renders a conversation with openai-harmony (a harmony pack with the o200k vocabulary) or the
/// model's template; returns (rendered text, tokens).
pub fn render(
    model: &Model,
    messages: Vec<Value>,
    tools: Option<Vec<Value>>,
    extra: Map<String, Value>,
) -> Result<(String, Vec<u32>), ApiError> {
    if model.detected.format == ChatFormat::Harmony {
        let effort = harmony_effort(&extra)?;
        if let Some(harmony) = &model.harmony {
            let tokens = harmony
                .render(&HarmonyInput {
                    messages: &messages,
                    tools: tools.as_deref(),
                    effort,
                    date: None,
                    add_generation_prompt: true,
                })
                .map_err(|e| ApiError::param(&e.param, e.message))?;
            return Ok((model.tokenizer.decode(&tokens, false), tokens));
        }
    }
    let template = model.template.as_ref().ok_or_else(|| {
        ApiError::param(
            "model",
            format!("{} has no chat template; use /v1/completions", model.reference),
        )
    })?;
    let (bos, eos) = model.special_texts();
    let text = template
        .render(&RenderInput {
            messages,
            tools,
            add_generation_prompt: true,
            extra,
            bos_token: bos,
            eos_token: eos,
        })
        .map_err(|e| {
            ApiError::param(
                "messages",
                format!("the chat template rejected the conversation: {e}"),
            )
        })?;
    let tokens = model.tokenizer.encode(&text, false);
    Ok((text, tokens))
}

#[cfg(test)]
mod tests {
    use super::*;
    use berth_registry::pack::PackMessage;

    fn text_of(m: &Message) -> String {
        match &m.content {
            Some(request::Content::Text(t)) => t.clone(),
            _ => String::new(),
        }
    }

    /// Ten tokens a message plus its length in words: a stand-in for rendering.
    fn tokens(ms: &[Message]) -> Result<usize, ApiError> {
        Ok(ms.iter().map(|m| 10 + text_of(m).split(' ').count()).sum())
    }

    fn chat(turns: usize) -> Vec<Message> {
        let mut ms = vec![Message::text(Role::System, "be brief")];
        for i in 0..turns {
            ms.push(Message::text(Role::User, format!("question {i}")));
            ms.push(Message::text(Role::Assistant, format!("answer {i}")));
        }
        ms.push(Message::text(Role::User, "last question"));
        ms
    }

    #[test]
    fn the_oldest_turns_go_first_and_the_system_prompt_and_the_latest_stay() {
        let ms = chat(5);
        // 12 tokens each: the system prompt, 10 turns, the last question: 144 in all.
        assert_eq!(tokens(&ms).unwrap(), 12 * 12);
        let kept = fit_turns(&ms, 61, tokens).unwrap();
        assert_eq!(kept, Kept { first: 1, dropped: 8 });
        let mut left = ms.clone();
        left.drain(kept.first..kept.first + kept.dropped);
        let texts: Vec<String> = left.iter().map(text_of).collect();
        assert_eq!(texts, ["be brief", "question 4", "answer 4", "last question"]);
        assert!(tokens(&left).unwrap() < 61);
        // Nothing goes when it fits.
        assert_eq!(fit_turns(&ms, 145, tokens).unwrap().dropped, 0);
    }

    #[test]
    fn a_kept_conversation_starts_with_a_user_turn() {
        let ms = chat(5);
        // Under 37 tokens: three messages, which would leave "answer 4" first; it goes too.
        let kept = fit_turns(&ms, 37, tokens).unwrap();
        assert!(matches!(ms[kept.first + kept.dropped].role, Role::User));
        assert_eq!(kept.dropped, 10);
    }

    #[test]
    fn a_latest_message_too_long_for_the_context_is_a_400() {
        let e = fit_turns(&chat(3), 20, tokens).unwrap_err();
        assert_eq!(e.code, Some("context_length_exceeded"));
        assert_eq!(e.status, StatusCode::BAD_REQUEST);
    }

    #[test]
    fn the_packs_system_prompt_applies_only_when_the_conversation_has_none() {
        let defaults = PackDefaults {
            system: Some("pack system".into()),
            messages: vec![
                PackMessage {
                    role: "user".into(),
                    content: "pack question".into(),
                },
                PackMessage {
                    role: "assistant".into(),
                    content: "pack answer".into(),
                },
            ],
            ..PackDefaults::default()
        };
        let mut ms = vec![Message::text(Role::User, "hi")];
        with_pack_turns(&defaults, &mut ms);
        let texts: Vec<String> = ms.iter().map(text_of).collect();
        assert_eq!(texts, ["pack system", "pack question", "pack answer", "hi"]);
        let mut ms = vec![
            Message::text(Role::System, "mine"),
            Message::text(Role::User, "hi"),
        ];
        with_pack_turns(&defaults, &mut ms);
        let texts: Vec<String> = ms.iter().map(text_of).collect();
        assert_eq!(texts, ["mine", "pack question", "pack answer", "hi"]);
    }
}
