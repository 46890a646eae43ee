//! The engine: one scheduler thread per loaded model that owns the plugin instance and runs
//! continuous batching. Each step is one plugin `decode` over the next token of every generating
//! sequence plus one chunk of one waiting prompt, so running streams keep going while a new
//! prompt is processed. Requests wait in a bounded queue; each sequence holds a KV slot, and a
//! new request takes the free slot whose cache shares the longest prefix with its prompt.
//!
//! Prompt chunks are aligned to absolute positions (multiples of [`PREFILL_CHUNK`]) and a reused
//! prefix is cut back to a chunk boundary of the previous prompt, so every position is computed
//! by the same rows whether a request runs alone, next to others, or after another request in the
//! same slot: with the plugins' per-sequence rounding, greedy outputs do not depend on load.
//!
//! Tokens a sequence's grammar forces (a schema's keys and punctuation) are taken without sampling
//! and fed with the picked token in one step, so they cost no forward pass of their own.
//!
//! Reuse also follows the plugin's [`Rewind`] rule: a model with recurrent state rewinds only to
//! its snapshots (or only to 0), so the reused prefix is cut back to such a point. A plugin that
//! refuses a rewind anyway costs that request one full prefill (its sequence is reset to 0),
//! never a failed request.

pub mod embed;
pub mod metrics;
mod prepare;
pub mod sequence;
pub mod speculation;

use crate::models::LoadedModel;
use metrics::Metrics;
use sequence::{DecodeOptions, FinishReason, SequenceDecoder};
use speculation::{Speculator, MAX_DRAFT};

use crate::image::RgbImage;
use crate::tokenizer::Tokenizer;
use berth_plugin_api::{BatchView, ImageInput, PluginError, PreparedImage, Rewind};
use std::collections::{HashSet, VecDeque};
use std::sync::atomic::Ordering::Relaxed;
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};
use tokio::sync::mpsc::UnboundedSender;

/// Rows of a prompt fed per step (chunks start at multiples of this position).
pub const PREFILL_CHUNK: usize = 64;

/// Engine sizing.
#[derive(Clone, Debug)]
pub struct EngineConfig {
    /// Sequences decoded at once (KV slots).
    pub slots: usize,
    /// Requests that may wait for a slot before new ones get 429.
    pub queue: usize,
    /// Prompt-lookup speculation for greedy sequences (on by default; see [`speculation::enabled`]).
    pub speculation: bool,
}

/// One generation request for the engine.
pub struct Job {
    /// Request id (for logs).
    pub id: String,
    /// Prompt tokens.
    pub prompt: Vec<u32>,
    /// How to decode.
    pub decode: DecodeOptions,
    /// Where text and the end go; a closed receiver cancels the sequence.
    pub events: UnboundedSender<Event>,
    /// When the HTTP request arrived.
    pub received: Instant,
    /// The images (one entry per slice or tile) whose features fill placeholder rows of the
    /// prompt; empty for a text-only prompt.
    pub images: Vec<JobImage>,
    /// More choices of the same prompt (`n` > 1): each forks this job's sequence once the prompt
    /// is in the cache, so the prompt is computed once.
    pub siblings: Vec<Sibling>,
}

/// Another choice of a job's prompt, decoded on a fork of the job's sequence.
pub struct Sibling {
    /// How to decode this choice (its own seed).
    pub decode: DecodeOptions,
    /// Where this choice's text and end go.
    pub events: UnboundedSender<Event>,
}

/// One slice or tile of an image, ready for the plugin's `encode_images`.
#[derive(Clone, Debug)]
pub struct JobImage {
    /// Dimensions of `pixels`, outermost first.
    pub shape: Vec<u32>,
    /// The pixel values in the model's layout.
    pub pixels: Vec<f32>,
    /// Per patch: 1 real, 0 padding (when the layout pads).
    pub patch_mask: Option<Vec<u8>>,
    /// The patch grid (rows, cols), when the layout has one.
    pub grid: Option<(u32, u32)>,
    /// Prompt positions of the placeholder tokens its features fill, ascending.
    pub positions: Vec<i32>,
    /// Hash of the image's bytes (and the slice's index): placeholder rows are reused from a
    /// slot's cache only when the same bytes come again at the same place.
    pub hash: u64,
}

impl JobImage {
    /// The ABI view of this slice.
    pub fn as_input(&self) -> ImageInput<'_> {
        ImageInput {
            shape: &self.shape,
            pixels: &self.pixels,
            patch_mask: self.patch_mask.as_deref(),
            grid: self.grid,
            positions: &self.positions,
        }
    }
}

/// The prefix-cache key of a prompt: its tokens, except that each placeholder row of an image
/// gets a value derived from the image's hash and the row (never equal to a token id), so a
/// cached image row matches only the same image bytes at the same position.
pub fn prompt_key(prompt: &[u32], images: &[JobImage]) -> Vec<u64> {
    let mut key: Vec<u64> = prompt.iter().map(|&t| u64::from(t)).collect();
    for img in images {
        for (k, &p) in img.positions.iter().enumerate() {
            if let Some(slot) = key.get_mut(p as usize) {
                let mixed = img.hash ^ (k as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15);
                *slot = (1 << 63) | (mixed >> 1);
            }
        }
    }
    key
}

/// Cuts a reusable prefix length back until no image straddles it (an image's slice is encoded
/// whole, so either all its rows are reused or none), then to a chunk boundary and a length the
/// plugin can rewind to.
fn clear_of_images(mut keep: usize, images: &[JobImage], cached: usize, rewind: Rewind) -> usize {
    while let Some(first) = images
        .iter()
        .filter_map(|img| Some((*img.positions.first()? as usize, *img.positions.last()? as usize)))
        .find(|&(first, last)| first < keep && keep <= last)
        .map(|(first, _)| first)
    {
        let cut = first - first % PREFILL_CHUNK;
        keep = if cut >= cached {
            cut
        } else {
            rewind.floor(cut as u32, cached as u32) as usize
        };
    }
    keep
}

/// What the engine tells a request.
#[derive(Debug)]
pub enum Event {
    /// Generated text.
    Text(String),
    /// The log-probabilities of the next generated token (sent before its text, when the
    /// request asked for them; never for a stop token).
    Logprobs(crate::sampling::TokenLogprobs),
    /// The sequence ended.
    Done(Finish),
    /// The sequence failed (plugin error).
    Error(String),
}

/// How a sequence ended, with its counts.
#[derive(Clone, Debug)]
pub struct Finish {
    /// Stop or length.
    pub reason: FinishReason,
    /// Prompt tokens (all of them, cached included).
    pub prompt_tokens: usize,
    /// Prompt tokens reused from the slot's cache.
    pub cached_tokens: usize,
    /// Tokens generated.
    pub completion_tokens: usize,
    /// Time from receipt to the end of the prompt.
    pub prompt_duration: Duration,
    /// Time spent generating.
    pub generation_duration: Duration,
    /// The stop string that ended the output, when one did.
    pub stop_sequence: Option<String>,
}

/// Why a job was not queued.
#[derive(Debug, PartialEq, Eq)]
pub enum SubmitError {
    /// The queue is full (HTTP 429).
    QueueFull,
    /// The engine is shutting down or was unloaded (HTTP 503).
    Closed,
}

/// The text side the scheduler needs: detokenizing and stop tokens.
#[derive(Clone)]
pub struct TextSide {
    /// The model's tokenizer.
    pub tokenizer: Tokenizer,
    /// Tokens that end generation.
    pub stop_tokens: HashSet<u32>,
}

struct State {
    pending: VecDeque<Job>,
    /// Embedding jobs not yet taken by the scheduler.
    embeds: VecDeque<embed::EmbedJob>,
    /// Image preparations not yet taken by the scheduler.
    prepares: VecDeque<prepare::PrepareJob>,
    active: usize,
    closing: bool,
}

struct Shared {
    state: Mutex<State>,
    wake: Condvar,
    cfg: EngineConfig,
    metrics: Arc<Metrics>,
}

/// A running scheduler; dropping it finishes running and queued work, then stops the thread.
pub struct Engine {
    shared: Arc<Shared>,
    thread: Mutex<Option<JoinHandle<()>>>,
    /// Context length of the model.
    pub context_length: usize,
}

impl Engine {
    /// Starts the scheduler thread for a loaded model.
    pub fn start(
        model: LoadedModel,
        text: TextSide,
        cfg: EngineConfig,
        metrics: Arc<Metrics>,
        name: &str,
    ) -> Engine {
        let context_length = model.description().context_length as usize;
        let shared = Arc::new(Shared {
            state: Mutex::new(State {
                pending: VecDeque::new(),
                embeds: VecDeque::new(),
                prepares: VecDeque::new(),
                active: 0,
                closing: false,
            }),
            wake: Condvar::new(),
            cfg,
            metrics,
        });
        let s2 = shared.clone();
        let thread = std::thread::Builder::new()
            .name(format!("engine {name}"))
            .spawn(move || Scheduler::new(model, text, s2).run())
            .expect("spawn the scheduler thread");
        Engine {
            shared,
            thread: Mutex::new(Some(thread)),
            context_length,
        }
    }

    /// Queues a job; fails when the queue is full or the engine is closing.
    pub fn submit(&self, job: Job) -> Result<(), SubmitError> {
        let mut st = self.shared.state.lock().unwrap_or_else(|e| e.into_inner());
        if st.closing {
            return Err(SubmitError::Closed);
        }
        // Jobs the scheduler has not yet moved into free slots are not waiting: two requests
        // arriving together at an idle `--parallel 1 --queue 1` engine are one running and one
        // queued, not one queued and one refused.
        let free = self.shared.cfg.slots.saturating_sub(st.active);
        if st.pending.len() >= self.shared.cfg.queue + free {
            return Err(SubmitError::QueueFull);
        }
        st.pending.push_back(job);
        self.shared.metrics.queue_depth.fetch_add(1, Relaxed);
        self.shared.wake.notify_one();
        Ok(())
    }

    /// Queues the inputs (token ids, none empty) of one embedding request; they share plugin
    /// `embed` calls with other requests' ([`embed`]). Fails when the queue is full or the
    /// engine is closing.
    pub fn embed(
        &self,
        inputs: Vec<Vec<u32>>,
    ) -> Result<tokio::sync::oneshot::Receiver<Result<embed::Embedded, String>>, SubmitError> {
        let mut st = self.shared.state.lock().unwrap_or_else(|e| e.into_inner());
        if st.closing {
            return Err(SubmitError::Closed);
        }
        if st.pending.len() + st.embeds.len() >= self.shared.cfg.queue {
            return Err(SubmitError::QueueFull);
        }
        let (job, rx) = embed::EmbedJob::new(inputs);
        st.embeds.push_back(job);
        self.shared.wake.notify_one();
        Ok(rx)
    }

    /// Has the model prepare decoded images (its plugin's `prepare_image`), each with its
    /// number among its request's images; waits (blocking) for the answers, one per image in
    /// order. They run on the scheduler's thread between decode steps, as every plugin call does.
    pub fn prepare_images(
        &self,
        images: Vec<(RgbImage, u32)>,
    ) -> Result<Vec<Result<PreparedImage, PluginError>>, SubmitError> {
        let (job, answers) = prepare::PrepareJob::new(images);
        {
            let mut st = self.shared.state.lock().unwrap_or_else(|e| e.into_inner());
            if st.closing {
                return Err(SubmitError::Closed);
            }
            st.prepares.push_back(job);
            self.shared.wake.notify_one();
        }
        answers.recv().map_err(|_| SubmitError::Closed)
    }

    /// Requests queued and sequences running.
    pub fn load(&self) -> (usize, usize) {
        let st = self.shared.state.lock().unwrap_or_else(|e| e.into_inner());
        (st.pending.len(), st.active)
    }

    /// Stops accepting jobs, lets queued and running ones finish, and waits for the thread.
    pub fn drain(&self) {
        {
            let mut st = self.shared.state.lock().unwrap_or_else(|e| e.into_inner());
            st.closing = true;
            self.shared.wake.notify_all();
        }
        if let Some(t) = self.thread.lock().unwrap_or_else(|e| e.into_inner()).take() {
            let _ = t.join();
        }
    }
}

impl Drop for Engine {
    fn drop(&mut self) {
        self.drain();
    }
}

/// A sequence holding a slot.
struct Running {
    job: Job,
    /// The prompt's prefix-cache key ([`prompt_key`]).
    key: Vec<u64>,
    dec: SequenceDecoder,
    /// Prompt tokens already in the cache.
    fed: usize,
    /// The picked token to feed next (generating) or None (still in the prompt).
    next: Option<u32>,
    /// Tokens the grammar forced after `next`, already taken: fed with it in one step.
    forced: Vec<u32>,
    cached_tokens: usize,
    admitted: u64,
    prompt_done: Option<Instant>,
    /// Prompt-lookup speculation record of this sequence.
    spec: Speculator,
    /// Rows to feed back before the next pick (the plugin refused to cut rejected drafts, so the
    /// sequence was reset and what it had accepted is fed again, without logits).
    refill: Vec<u32>,
}

struct Slot {
    /// Keys ([`prompt_key`]; generated tokens as themselves) of the rows in the plugin's cache
    /// for this slot's sequence id.
    cached: Vec<u64>,
    /// Leading cached tokens computed as whole aligned prompt chunks (safe to reuse exactly).
    exact: usize,
    run: Option<Running>,
    last_used: u64,
    /// The plugin's sequence may hold state the host does not know (a reset to 0 failed): it
    /// must be reset before the slot is used again.
    stale: bool,
}

/// How much of a slot's cache (`cached`, of which the first `exact` tokens are whole aligned
/// prompt chunks) a prompt can reuse: the common prefix, no further than the exact part, leaving
/// at least one prompt token to prefill (for logits), cut back to a whole chunk and then to a
/// length the plugin can rewind to (keeping the whole cache needs no rewind).
fn reusable_prefix<T: PartialEq>(cached: &[T], exact: usize, prompt: &[T], rewind: Rewind) -> usize {
    let lcp = cached.iter().zip(prompt).take_while(|(a, b)| a == b).count();
    let keep = lcp.min(exact).min(prompt.len().saturating_sub(1));
    let keep = keep - keep % PREFILL_CHUNK;
    if keep >= cached.len() {
        return cached.len();
    }
    rewind.floor(keep as u32, cached.len() as u32) as usize
}

/// What the scheduler knows of one slot when it picks where a prompt goes.
#[derive(Clone, Copy, Debug, Default)]
struct SlotView {
    /// No sequence holds the slot.
    free: bool,
    /// Rows of the slot's cache the prompt can reuse.
    reusable: usize,
    /// The plugin's sequence must be reset before use.
    stale: bool,
    /// Tick of the slot's last admission.
    last_used: u64,
    /// A running sequence whose cache may be forked.
    donor: bool,
}

/// Where a prompt goes: the free slot sharing the longest reusable prefix (ties: not stale,
/// then least recently used), never `avoid` while another slot is free; and, when `may_fork`
/// and a running sequence holds a longer one, that donor instead, whose prefix is then forked
/// into the free slot whose cache is worth least (stale, else least recently used).
fn choose_slot(views: &[SlotView], avoid: Option<usize>, may_fork: bool) -> (usize, Option<usize>) {
    let free = || (0..views.len()).filter(|&i| views[i].free);
    let best = free()
        .max_by_key(|&i| {
            let v = &views[i];
            (Some(i) != avoid, v.reusable, !v.stale, u64::MAX - v.last_used)
        })
        .expect("a free slot");
    let donor = (0..views.len())
        .filter(|&i| may_fork && !views[i].free && views[i].donor)
        .filter(|&i| views[i].reusable > views[best].reusable)
        .max_by_key(|&i| (views[i].reusable, std::cmp::Reverse(i)));
    let Some(donor) = donor else {
        return (best, None);
    };
    let dst = free()
        .min_by_key(|&i| {
            let v = &views[i];
            (Some(i) == avoid, !v.stale, v.last_used)
        })
        .expect("a free slot");
    (dst, Some(donor))
}

struct Scheduler {
    model: LoadedModel,
    text: TextSide,
    shared: Arc<Shared>,
    slots: Vec<Slot>,
    logits: Vec<f32>,
    tick: u64,
    /// The plugin has no `seq_fork`: prefixes are never forked from running sequences.
    fork_unsupported: bool,
    /// Prompt-lookup speculation is on ([`speculation::enabled`]).
    speculate: bool,
    /// Embedding jobs taken from the queue, run between decode steps.
    embeds: VecDeque<embed::EmbedJob>,
    /// Image preparations taken from the queue, run between decode steps.
    prepares: VecDeque<prepare::PrepareJob>,
}

impl Scheduler {
    fn new(model: LoadedModel, text: TextSide, shared: Arc<Shared>) -> Scheduler {
        let n = shared
            .cfg
            .slots
            .min(model.description().max_sequences as usize)
            .max(1);
        let speculate = speculation::enabled(shared.cfg.speculation, model.description().rewind);
        let slots = (0..n)
            .map(|_| Slot {
                cached: Vec::new(),
                exact: 0,
                run: None,
                last_used: 0,
                stale: false,
            })
            .collect();
        Scheduler {
            model,
            text,
            shared,
            slots,
            logits: Vec::new(),
            tick: 0,
            fork_unsupported: false,
            speculate,
            embeds: VecDeque::new(),
            prepares: VecDeque::new(),
        }
    }

    /// The context a sequence may fill: its request's, never more than the model holds.
    fn context_of(&self, decode: &DecodeOptions) -> usize {
        let held = self.model.description().context_length as usize;
        decode.context.map_or(held, |c| c.min(held))
    }

    fn run(mut self) {
        let mut kv = metrics::KvGauge::new(self.shared.metrics.clone());
        let capacity = self.slots.len() * self.model.description().context_length as usize;
        loop {
            kv.set(self.kv_rows_held(), capacity);
            if !self.admit() {
                return;
            }
            self.drop_cancelled();
            kv.set(self.kv_rows_held(), capacity);
            if !self.prepares.is_empty() {
                self.prepare_images();
            }
            if !self.embeds.is_empty() {
                embed::run_batch(&mut self.model, &mut self.embeds, &self.shared.metrics);
            }
            if self.slots.iter().any(|s| s.run.is_some()) {
                self.step();
            }
        }
    }

    /// KV-cache rows held by running sequences, their whole prompt counted from admission (a
    /// finished slot's cache is reusable, not held).
    fn kv_rows_held(&self) -> usize {
        self.slots
            .iter()
            .filter_map(|s| Some(s.cached.len().max(s.run.as_ref()?.job.prompt.len())))
            .sum()
    }

    /// Moves queued jobs into free slots; waits while there is nothing to do. False: exit.
    fn admit(&mut self) -> bool {
        let shared = self.shared.clone();
        let mut st = shared.state.lock().unwrap_or_else(|e| e.into_inner());
        loop {
            while self.slots.iter().any(|s| s.run.is_none()) {
                let Some(job) = st.pending.pop_front() else { break };
                shared.metrics.queue_depth.fetch_sub(1, Relaxed);
                if job.events.is_closed() {
                    continue;
                }
                self.place(job);
            }
            self.embeds.extend(st.embeds.drain(..));
            self.prepares.extend(st.prepares.drain(..));
            st.active = self.slots.iter().filter(|s| s.run.is_some()).count();
            if st.active > 0 || !self.embeds.is_empty() || !self.prepares.is_empty() {
                return true;
            }
            if st.closing && st.pending.is_empty() {
                return false;
            }
            st = shared
                .wake
                .wait_timeout(st, Duration::from_millis(500))
                .unwrap_or_else(|e| e.into_inner())
                .0;
        }
    }

    /// Puts a job in the free slot sharing the longest reusable prefix (else the least recently
    /// used one) and cuts that slot's cache back to the reusable part. When a running sequence
    /// holds a longer reusable prefix than every free slot, that prefix is forked into a free slot
    /// instead (the running sequence is not disturbed); a plugin refusing the fork or the copy's
    /// rewind sends the job down the ordinary path. When the plugin refuses the ordinary rewind,
    /// the sequence is reset to 0 and the whole prompt is prefilled; only when even the reset
    /// fails does this job fail (alone).
    fn place(&mut self, mut job: Job) {
        self.tick += 1;
        let rewind = self.model.description().rewind;
        let key = prompt_key(&job.prompt, &job.images);
        let prompt = &key;
        let mut avoid = None;
        let mut may_fork = !self.fork_unsupported;
        let (i, mut keep) = loop {
            let views = self.slot_views(prompt, &job.images, rewind);
            let (i, donor) = choose_slot(&views, avoid, may_fork);
            let Some(src) = donor else {
                break (i, views[i].reusable);
            };
            let shared = views[src].reusable;
            if self.fork_prefix(src, i, shared, &job.id) {
                break (i, shared);
            }
            avoid = Some(i);
            may_fork = false;
        };
        let context_left = self.context_of(&job.decode).saturating_sub(job.prompt.len());
        let dec = SequenceDecoder::new(
            std::mem::take(&mut job.decode),
            &self.text.tokenizer,
            &self.text.stop_tokens,
            context_left,
        );
        let slot = &mut self.slots[i];
        slot.last_used = self.tick;
        if slot.stale || keep < slot.cached.len() {
            let truncated = self
                .model
                .instance()
                .and_then(|m| m.seq_truncate(i as i32, keep as u32));
            if let Err(e) = truncated {
                tracing::debug!(
                    request = %job.id,
                    slot = i,
                    from = slot.cached.len(),
                    to = keep,
                    ?rewind,
                    error = %e.message,
                    "plugin refused the rewind; resetting the sequence to prefill the whole prompt"
                );
                slot.cached.clear();
                slot.exact = 0;
                let reset = if keep == 0 {
                    Err(e)
                } else {
                    keep = 0;
                    self.model.instance().and_then(|m| m.seq_truncate(i as i32, 0))
                };
                if let Err(e) = reset {
                    slot.stale = true;
                    tracing::warn!(request = %job.id, slot = i, error = %e.message, "cannot reset the sequence; failing the request");
                    let _ = job.events.send(Event::Error(format!(
                        "model error: cannot reset sequence {i}: {}",
                        e.message
                    )));
                    return;
                }
            }
            slot.stale = false;
        }
        slot.cached.truncate(keep);
        slot.exact = slot.exact.min(keep);
        // Images whose rows are not reused go to the plugin before any of their rows is decoded.
        let pending: Vec<ImageInput<'_>> = job
            .images
            .iter()
            .filter(|img| img.positions.first().is_some_and(|&p| p as usize >= keep))
            .map(JobImage::as_input)
            .collect();
        if !pending.is_empty() {
            let encoded = self
                .model
                .instance()
                .and_then(|m| m.encode_images(i as i32, &pending));
            if let Err(e) = encoded {
                // The plugin may hold some of them: the next use of the slot truncates first.
                slot.stale = true;
                tracing::warn!(request = %job.id, slot = i, error = %e.message, "encode_images failed");
                let _ = job.events.send(Event::Error(format!(
                    "model error: cannot encode the images: {}",
                    e.message
                )));
                return;
            }
        }
        self.shared.metrics.active_sequences.fetch_add(1, Relaxed);
        self.shared.metrics.cached_tokens.fetch_add(keep as u64, Relaxed);
        tracing::debug!(request = %job.id, slot = i, prompt = prompt.len(), cached = keep, "sequence admitted");
        slot.run = Some(Running {
            job,
            key,
            dec,
            fed: keep,
            next: None,
            forced: Vec::new(),
            cached_tokens: keep,
            admitted: self.tick,
            prompt_done: None,
            spec: Speculator::default(),
            refill: Vec::new(),
        });
    }

    /// The one generating sequence that speculates this step and its drafted tokens, or
    /// `(usize::MAX, [])`. Only a step without a prompt chunk and with one generating sequence
    /// speculates (a busy batch already shares each weight read between its rows), and only a
    /// greedy sequence without a grammar whose drafting is not paused.
    fn pick_drafts(&mut self) -> (usize, Vec<u32>) {
        let none = (usize::MAX, Vec::new());
        if !self.speculate {
            return none;
        }
        let generating = self
            .slots
            .iter()
            .filter(|s| s.run.as_ref().is_some_and(|r| r.next.is_some()))
            .count();
        if generating > SPECULATE_MAX_GENERATING {
            return none;
        }
        let context = self.model.description().context_length as usize;
        for (i, slot) in self.slots.iter_mut().enumerate() {
            let Some(r) = &mut slot.run else { continue };
            let Some(next) = r.next else { continue };
            // A grammar's own speed-up is its forced tokens (they ride with the pick); drafts under
            // it were measured a few percent slower on a short schema (scripts/bench-speculation).
            if !r.forced.is_empty()
                || !r.dec.is_greedy()
                || r.dec.is_constrained()
                || r.dec.finished().is_some()
                || !r.spec.may_draft()
            {
                continue;
            }
            // Room in the context for every drafted row.
            let room = context.saturating_sub(slot.cached.len() + 1);
            let max = MAX_DRAFT.min(room);
            if max == 0 {
                continue;
            }
            let mut history = Vec::with_capacity(slot.cached.len() + 1);
            history.extend_from_slice(&slot.cached);
            history.push(u64::from(next));
            let drafts = speculation::draft(&history, max);
            if !drafts.is_empty() {
                return (i, drafts);
            }
        }
        none
    }

    /// What [`choose_slot`] needs of every slot for a prompt (its key and images).
    fn slot_views(&self, prompt: &[u64], images: &[JobImage], rewind: Rewind) -> Vec<SlotView> {
        self.slots
            .iter()
            .map(|s| {
                let keep = reusable_prefix(&s.cached, s.exact, prompt, rewind);
                SlotView {
                    free: s.run.is_none(),
                    reusable: clear_of_images(keep, images, s.cached.len(), rewind),
                    stale: s.stale,
                    last_used: s.last_used,
                    // A sequence still in a prompt with images may have features waiting in the
                    // plugin, which a fork would copy to rows they do not belong to.
                    donor: s
                        .run
                        .as_ref()
                        .is_some_and(|r| r.next.is_some() || r.job.images.is_empty()),
                }
            })
            .collect()
    }

    /// Copies running slot `src`'s sequence into free slot `dst` and cuts the copy back to
    /// `keep` rows. False when the plugin refused either step; `dst` then records what it
    /// holds (a whole copy of `src` after a refused rewind, an unknown state after a failed fork).
    fn fork_prefix(&mut self, src: usize, dst: usize, keep: usize, id: &str) -> bool {
        let forked = self
            .model
            .instance()
            .and_then(|m| m.seq_fork(src as i32, dst as i32));
        if let Err(e) = forked {
            tracing::debug!(request = %id, src, dst, error = %e.message, "seq_fork refused; prefilling instead");
            if e.kind == berth_plugin_api::ErrorKind::Unsupported {
                self.fork_unsupported = true;
            } else {
                let d = &mut self.slots[dst];
                d.cached.clear();
                d.exact = 0;
                d.stale = true;
            }
            return false;
        }
        let (cached, exact) = (self.slots[src].cached.clone(), self.slots[src].exact);
        let d = &mut self.slots[dst];
        d.cached = cached;
        d.exact = exact;
        d.stale = false;
        if keep < d.cached.len() {
            let truncated = self
                .model
                .instance()
                .and_then(|m| m.seq_truncate(dst as i32, keep as u32));
            if let Err(e) = truncated {
                tracing::debug!(request = %id, src, dst, to = keep, error = %e.message, "plugin refused to rewind the forked prefix; prefilling instead");
                return false;
            }
            let d = &mut self.slots[dst];
            d.cached.truncate(keep);
            d.exact = d.exact.min(keep);
        }
        self.shared.metrics.prefix_forks.fetch_add(1, Relaxed);
        tracing::debug!(request = %id, src, dst, shared = keep, "prefix forked from a running sequence");
        true
    }

    /// Publishes the count of running sequences (`/api/ps`'s `active`, and the free slots
    /// [`Engine::submit`] counts) as soon as one ends, before its client hears of the end: left to
    /// the next [`Self::admit`], a client that had its answer could still read its request as
    /// running, and a request sent just after could be refused a slot that is free.
    fn publish_active(&self) {
        let running = self.slots.iter().filter(|s| s.run.is_some()).count();
        self.shared.state.lock().unwrap_or_else(|e| e.into_inner()).active = running;
    }

    /// Frees the slots of requests whose client went away.
    fn drop_cancelled(&mut self) {
        for (i, slot) in self.slots.iter_mut().enumerate() {
            if slot.run.as_ref().is_some_and(|r| r.job.events.is_closed()) {
                let r = slot.run.take().expect("checked");
                // Images handed over for rows never decoded may still wait in the plugin.
                if r.next.is_none() && !r.job.images.is_empty() {
                    slot.stale = true;
                }
                tracing::info!(request = %r.job.id, slot = i, "client gone; sequence freed");
                self.shared.metrics.active_sequences.fetch_sub(1, Relaxed);
            }
        }
        self.publish_active();
    }

    /// One batched decode: every generating sequence's next token plus one prompt chunk.
    fn step(&mut self) {
        let Some(batch) = self.build_batch() else { return };
        let Some(step_secs) = self.decode(&batch) else {
            return;
        };
        self.apply(&batch, step_secs);
    }

    /// This step's rows: each generating sequence's next token (with its drafts when it is the
    /// one that speculates), then a chunk of the prompt admitted first, up to the next aligned
    /// boundary. `None` when no sequence has a row to feed.
    fn build_batch(&mut self) -> Option<Batch> {
        let prefill = (0..self.slots.len())
            .filter(|&i| self.slots[i].run.as_ref().is_some_and(|r| r.next.is_none()))
            .min_by_key(|&i| self.slots[i].run.as_ref().map(|r| r.admitted));
        let (spec_slot, drafts) = if prefill.is_none() {
            self.pick_drafts()
        } else {
            (usize::MAX, Vec::new())
        };
        let mut b = Batch::default();
        for (i, slot) in self.slots.iter().enumerate() {
            let Some(next) = slot
                .run
                .as_ref()
                .filter(|r| r.refill.is_empty())
                .and_then(|r| r.next)
            else {
                continue;
            };
            let base = slot.cached.len();
            if i == spec_slot {
                for (k, &t) in std::iter::once(&next).chain(&drafts).enumerate() {
                    b.push(t, base + k, i, true);
                }
                b.parts.push(Part {
                    slot: i,
                    rows: 1 + drafts.len(),
                    kind: PartKind::Drafts,
                });
            } else {
                // Tokens the grammar forced ride with the picked one; only the last needs logits.
                let forced = &slot.run.as_ref().expect("running").forced;
                let n = 1 + forced.len();
                for (k, &t) in std::iter::once(&next).chain(forced).enumerate() {
                    b.push(t, base + k, i, k + 1 == n);
                }
                b.parts.push(Part {
                    slot: i,
                    rows: n,
                    kind: PartKind::Next,
                });
            }
        }
        if let Some(i) = prefill {
            let slot = &self.slots[i];
            let r = slot.run.as_ref().expect("running");
            let start = r.fed;
            let end = ((start / PREFILL_CHUNK + 1) * PREFILL_CHUNK).min(r.job.prompt.len());
            for (k, &t) in r.job.prompt[start..end].iter().enumerate() {
                b.push(t, slot.cached.len() + k, i, start + k + 1 == r.job.prompt.len());
            }
            b.parts.push(Part {
                slot: i,
                rows: end - start,
                kind: PartKind::Prompt,
            });
        } else if let Some(i) =
            (0..self.slots.len()).find(|&i| self.slots[i].run.as_ref().is_some_and(|r| !r.refill.is_empty()))
        {
            // A reset sequence gets what it had accepted back, a chunk a step, without logits.
            let slot = &self.slots[i];
            let refill = &slot.run.as_ref().expect("running").refill;
            let n = refill.len().min(PREFILL_CHUNK);
            for (k, &t) in refill[..n].iter().enumerate() {
                b.push(t, slot.cached.len() + k, i, false);
            }
            b.parts.push(Part {
                slot: i,
                rows: n,
                kind: PartKind::Refill,
            });
        }
        (!b.tokens.is_empty()).then_some(b)
    }

    /// Runs the plugin over a batch into `self.logits` (constraint masks are computed on another
    /// thread meanwhile); returns the seconds it took, or `None` when it failed, after failing
    /// every running sequence.
    fn decode(&mut self, b: &Batch) -> Option<f64> {
        let vocab = self.model.description().vocab_size as usize;
        let rows = b.want.iter().filter(|&&w| w != 0).count();
        self.logits.resize(rows.max(1) * vocab, 0.0);
        let batch = BatchView {
            tokens: &b.tokens,
            positions: &b.positions,
            seq_ids: &b.seqs,
            want_logits: &b.want,
        };
        let t0 = Instant::now();
        let (slots, model, logits_buf) = (&mut self.slots, &mut self.model, &mut self.logits);
        let constrained = slots
            .iter()
            .any(|s| s.run.as_ref().is_some_and(|r| r.dec.is_constrained()));
        let result = if constrained {
            std::thread::scope(|sc| {
                sc.spawn(|| {
                    for s in slots.iter_mut() {
                        if let Some(r) = &mut s.run {
                            let _ = r.dec.prepare();
                        }
                    }
                });
                model.decode(&batch, logits_buf)
            })
        } else {
            model.decode(&batch, logits_buf)
        };
        let m = &self.shared.metrics;
        let step_secs = t0.elapsed().as_secs_f64();
        m.decode_step(b.sequences());
        m.decode_micros
            .fetch_add(t0.elapsed().as_micros() as u64, Relaxed);
        if let Err(e) = result {
            tracing::error!(error = %e.message, "decode failed; failing the running sequences");
            self.fail_running(&e.message);
            return None;
        }
        Some(step_secs)
    }

    /// Fails every running sequence with a model error and empties every slot's cache: the
    /// plugin's sequences are in an unknown state, or its instance was recreated.
    fn fail_running(&mut self, message: &str) {
        // Every running sequence ends here (see [`Self::publish_active`]).
        self.shared.state.lock().unwrap_or_else(|e| e.into_inner()).active = 0;
        let m = &self.shared.metrics;
        for (i, slot) in self.slots.iter_mut().enumerate() {
            let reset = self
                .model
                .instance()
                .and_then(|inst| inst.seq_truncate(i as i32, 0));
            slot.stale = reset.is_err();
            slot.cached.clear();
            slot.exact = 0;
            if let Some(r) = slot.run.take() {
                let _ = r.job.events.send(Event::Error(format!("model error: {message}")));
                m.active_sequences.fetch_sub(1, Relaxed);
            }
        }
    }

    /// Answers the queued image preparations (the plugin's `prepare_image`, between decode
    /// steps). A panic in the plugin poisons its instance, which is recreated without the
    /// running sequences' state: they fail as after a failed decode.
    fn prepare_images(&mut self) {
        let mut poisoned = None;
        for job in std::mem::take(&mut self.prepares) {
            let answers = prepare::answer(&mut self.model, &job);
            if let Some(e) = answers
                .iter()
                .filter_map(|a| a.as_ref().err())
                .find(|e| e.kind == berth_plugin_api::ErrorKind::Poisoned)
            {
                poisoned = Some(e.message.clone());
            }
            job.reply(answers);
        }
        if let Some(message) = poisoned {
            tracing::error!(error = %message, "image preparation poisoned the model; failing the running sequences");
            self.fail_running(&message);
        }
    }

    /// Takes a decoded batch's results, part by part: prompt chunks extend their caches, picked
    /// tokens go to their sequences, drafts are verified; then siblings of finished prompts fork.
    fn apply(&mut self, b: &Batch, step_secs: f64) {
        let vocab = self.model.description().vocab_size as usize;
        let mut row = 0;
        let mut k = 0;
        let mut forks = Vec::new();
        for part in &b.parts {
            let tokens = &b.tokens[k..k + part.rows];
            let wanted = b.want[k..k + part.rows].iter().filter(|&&w| w != 0).count();
            k += part.rows;
            let first = row;
            row += wanted;
            let rows = first * vocab..row * vocab;
            match part.kind {
                PartKind::Prompt => {
                    let logits = (wanted > 0).then(|| rows.clone());
                    if let Some(f) = self.apply_prompt(part.slot, part.rows, logits) {
                        forks.push(f);
                    }
                }
                PartKind::Next => self.apply_next(part.slot, tokens, rows, step_secs),
                PartKind::Drafts => self.verify_drafts(part.slot, tokens, rows, step_secs),
                PartKind::Refill => {
                    let slot = &mut self.slots[part.slot];
                    slot.cached.extend(tokens.iter().map(|&t| u64::from(t as u32)));
                    let r = slot.run.as_mut().expect("running");
                    r.refill.drain(..part.rows);
                }
            }
        }
        for f in forks {
            self.fork(f);
        }
    }

    /// Slot `i` fed `n` more prompt rows; `logits` (a range of `self.logits`) holds the last
    /// prompt row's when the prompt is done. Returns the fork of the job's siblings when its
    /// prompt just finished and it has some.
    fn apply_prompt(&mut self, i: usize, n: usize, logits: Option<std::ops::Range<usize>>) -> Option<Fork> {
        let m = &self.shared.metrics;
        let slot = &mut self.slots[i];
        let r = slot.run.as_mut().expect("running");
        slot.cached.extend_from_slice(&r.key[r.fed..r.fed + n]);
        r.fed += n;
        m.prompt_tokens.fetch_add(n as u64, Relaxed);
        // Whole aligned chunks (the prefix a later prompt can reuse exactly).
        if r.fed.is_multiple_of(PREFILL_CHUNK) && slot.exact + n == r.fed {
            slot.exact = r.fed;
        }
        let logits = &self.logits[logits?];
        r.prompt_done = Some(Instant::now());
        m.ttft(r.job.received.elapsed());
        let fork = (!r.job.siblings.is_empty()).then(|| Fork {
            slot: i,
            logits: logits.to_vec(),
            siblings: std::mem::take(&mut r.job.siblings),
            id: r.job.id.clone(),
            prompt: r.job.prompt.clone(),
            images: r.job.images.clone(),
            received: r.job.received,
            key: r.key.clone(),
            cached_tokens: r.cached_tokens,
            cached: slot.cached.clone(),
            exact: slot.exact,
        });
        if let Some(reason) = advance(r, logits, &self.text.stop_tokens, m, true) {
            let r = slot.run.take().expect("running");
            m.active_sequences.fetch_sub(1, Relaxed);
            self.publish_active();
            finish(r, reason, i);
        }
        fork
    }

    /// Slot `i` fed its picked token (`tokens`); `logits` (a range of `self.logits`) holds the
    /// row for its next pick.
    fn apply_next(&mut self, i: usize, tokens: &[i32], logits: std::ops::Range<usize>, step_secs: f64) {
        let m = &self.shared.metrics;
        let slot = &mut self.slots[i];
        let r = slot.run.as_mut().expect("running");
        slot.cached.extend(tokens.iter().map(|&t| u64::from(t as u32)));
        // A step with forced rows costs more than a plain one: it is no measure for speculation.
        if self.speculate && r.forced.is_empty() {
            r.spec.record_plain(step_secs);
        }
        r.forced.clear();
        if let Some(reason) = advance(r, &self.logits[logits], &self.text.stop_tokens, m, true) {
            let r = slot.run.take().expect("running");
            m.active_sequences.fetch_sub(1, Relaxed);
            self.publish_active();
            finish(r, reason, i);
        }
    }

    /// Slot `i` fed its picked token and drafts (`tokens`) with logits for every row (`rows`, a
    /// range of `self.logits`): takes the drafts the model agrees with ([`verify`]) and ends the
    /// sequence when it ended, or failed to cut the rejected rows (then this plugin no longer
    /// speculates).
    fn verify_drafts(&mut self, i: usize, tokens: &[i32], rows: std::ops::Range<usize>, step_secs: f64) {
        let m = &self.shared.metrics;
        let slot = &mut self.slots[i];
        let r = slot.run.as_mut().expect("running");
        slot.cached.extend(tokens.iter().map(|&t| u64::from(t as u32)));
        let drafts: Vec<u32> = tokens[1..].iter().map(|&t| t as u32).collect();
        let Some(end) = verify(
            r,
            &mut slot.cached,
            (i, step_secs),
            &self.logits[rows],
            &drafts,
            &self.text.stop_tokens,
            &mut self.model,
            m,
        ) else {
            return;
        };
        if let Err(e) = &end {
            // This plugin cannot cut rejected drafts: it speculates no more. A refused cut costs
            // a re-prefill, never the request: the sequence is reset and what it had accepted is
            // fed back (images would need encoding again: such a sequence fails instead).
            self.speculate = false;
            let keys = std::mem::take(&mut slot.cached);
            slot.exact = 0;
            let rows: Option<Vec<u32>> = keys.iter().map(|&k| u32::try_from(k).ok()).collect();
            let reset = self
                .model
                .instance()
                .and_then(|inst| inst.seq_truncate(i as i32, 0));
            if let (Some(rows), Ok(())) = (rows, &reset) {
                tracing::warn!(slot = i, error = %e, "refilling the sequence after a refused cut; speculation off for this model");
                slot.run.as_mut().expect("running").refill = rows;
                return;
            }
            slot.stale = reset.is_err();
        }
        let r = slot.run.take().expect("running");
        m.active_sequences.fetch_sub(1, Relaxed);
        self.publish_active();
        match end {
            Ok(reason) => finish(r, reason, i),
            Err(e) => {
                let _ = r.job.events.send(Event::Error(e));
            }
        }
    }

    /// Starts the sibling choices of slot `i`'s job, whose prompt just finished: each forks the
    /// sequence into a free slot and picks its first token from the same logits. A sibling that
    /// finds no free slot (or a plugin that cannot fork) is queued as a job of its own.
    fn fork(&mut self, f: Fork) {
        let m = self.shared.metrics.clone();
        let Fork {
            slot: i,
            logits,
            siblings,
            id,
            prompt,
            images,
            received,
            key,
            cached_tokens,
            cached,
            exact,
        } = f;
        let logits = &logits[..];
        for (k, sib) in siblings.into_iter().enumerate() {
            let context_left = self.context_of(&sib.decode).saturating_sub(prompt.len());
            let sib_id = format!("{id}/{}", k + 1);
            // Slot `i` keeps the parent's rows even when the parent already ended.
            let free = (0..self.slots.len()).find(|&j| j != i && self.slots[j].run.is_none());
            let forked = free.filter(|&j| {
                self.model
                    .instance()
                    .and_then(|inst| inst.seq_fork(i as i32, j as i32))
                    .map_err(|e| tracing::debug!(request = %sib_id, error = %e.message, "seq_fork refused"))
                    .is_ok()
            });
            let Some(j) = forked else {
                let job = Job {
                    id: sib_id,
                    prompt: prompt.clone(),
                    decode: sib.decode,
                    events: sib.events,
                    received,
                    images: images.clone(),
                    siblings: Vec::new(),
                };
                let mut st = self.shared.state.lock().unwrap_or_else(|e| e.into_inner());
                st.pending.push_front(job);
                m.queue_depth.fetch_add(1, Relaxed);
                continue;
            };
            self.tick += 1;
            let dec = SequenceDecoder::new(
                sib.decode,
                &self.text.tokenizer,
                &self.text.stop_tokens,
                context_left,
            );
            let slot = &mut self.slots[j];
            slot.cached = cached.clone();
            slot.exact = exact;
            slot.stale = false;
            slot.last_used = self.tick;
            m.active_sequences.fetch_add(1, Relaxed);
            let mut r = Running {
                job: Job {
                    id: sib_id,
                    prompt: prompt.clone(),
                    decode: DecodeOptions::default(),
                    events: sib.events,
                    received,
                    // Their features are in the forked sequence already.
                    images: Vec::new(),
                    siblings: Vec::new(),
                },
                key: key.clone(),
                dec,
                fed: prompt.len(),
                next: None,
                forced: Vec::new(),
                cached_tokens,
                admitted: self.tick,
                prompt_done: Some(Instant::now()),
                spec: Speculator::default(),
                refill: Vec::new(),
            };
            match advance(&mut r, logits, &self.text.stop_tokens, &m, true) {
                Some(reason) => {
                    m.active_sequences.fetch_sub(1, Relaxed);
                    finish(r, reason, j);
                }
                None => slot.run = Some(r),
            }
        }
    }
}

/// One step's rows for the plugin, and which slot each run of them belongs to.
#[derive(Default)]
struct Batch {
    tokens: Vec<i32>,
    positions: Vec<i32>,
    seqs: Vec<i32>,
    want: Vec<u8>,
    /// Each slot's run of rows, in row order.
    parts: Vec<Part>,
}

impl Batch {
    /// How many distinct sequences the batch carries rows of.
    fn sequences(&self) -> usize {
        let mut slots: Vec<usize> = self.parts.iter().map(|p| p.slot).collect();
        slots.sort_unstable();
        slots.dedup();
        slots.len()
    }

    fn push(&mut self, token: u32, position: usize, slot: usize, want: bool) {
        self.tokens.push(token as i32);
        self.positions.push(position as i32);
        self.seqs.push(slot as i32);
        self.want.push(u8::from(want));
    }
}

/// One slot's consecutive rows in a batch.
#[derive(Clone, Copy, Debug)]
struct Part {
    slot: usize,
    rows: usize,
    kind: PartKind,
}

/// What a slot's rows in a batch are.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum PartKind {
    /// A chunk of its prompt (logits only for the prompt's last row).
    Prompt,
    /// Its picked token and the tokens the grammar forced after it (logits for the last).
    Next,
    /// Its picked token and drafted tokens, logits for every row.
    Drafts,
    /// Rows a reset sequence had accepted, fed back without logits.
    Refill,
}

/// A job whose prompt just finished and whose siblings fork its sequence.
struct Fork {
    slot: usize,
    logits: Vec<f32>,
    siblings: Vec<Sibling>,
    id: String,
    prompt: Vec<u32>,
    images: Vec<JobImage>,
    received: Instant,
    key: Vec<u64>,
    cached_tokens: usize,
    cached: Vec<u64>,
    exact: usize,
}

/// Picks a generating sequence's next token from its logits row, sends its log-probabilities
/// and text; with `force`, then takes the tokens the grammar forces after it (sent too, and fed
/// with it on the next step: one forward pass for all of them). Returns why the sequence ended,
/// if it did.
fn advance(
    r: &mut Running,
    logits: &[f32],
    stop_tokens: &HashSet<u32>,
    m: &Metrics,
    force: bool,
) -> Option<FinishReason> {
    if let Some(reason) = r.dec.finished() {
        return Some(reason);
    }
    let tok = r.dec.pick(logits);
    let s = r.dec.accept(tok);
    if s.finished.is_none() {
        // Fed on the next step.
        r.next = Some(tok);
    }
    if !stop_tokens.contains(&tok) {
        m.generated_tokens.fetch_add(1, Relaxed);
        if let Some(lp) = r.dec.take_logprobs() {
            let _ = r.job.events.send(Event::Logprobs(lp));
        }
    }
    if !s.text.is_empty() {
        let _ = r.job.events.send(Event::Text(s.text));
    }
    if s.finished.is_some() || !force {
        return s.finished;
    }
    for t in r.dec.forced() {
        let s = r.dec.accept(t);
        m.generated_tokens.fetch_add(1, Relaxed);
        if !s.text.is_empty() {
            let _ = r.job.events.send(Event::Text(s.text));
        }
        if s.finished.is_some() {
            return s.finished;
        }
        r.forced.push(t);
    }
    None
}

/// Most generating sequences in a step that still lets one of them speculate: one. A lone
/// sequence's step reads every weight for one row, so three more rows cost little; in a batch the
/// rows already share that read and drafts add rows for one sequence only (8 streams measured
/// 0.94x of no speculation with 4 here, scripts/bench-speculation).
const SPECULATE_MAX_GENERATING: usize = 1;

/// Checks a speculative step of slot `i` that took `step_secs`: `rows` holds the logits of its
/// rows `[next, drafts..]`.
/// Each row's token is picked and taken in order (stop strings, grammar, logprobs and budget see
/// every one) while the drafts agree; rows after the last agreeing one are cut from the cache.
/// Returns how the sequence ended, if it did (an error when the cut was refused: `cached` then
/// holds what the sequence accepted, the plugin more).
#[allow(clippy::too_many_arguments)]
fn verify(
    r: &mut Running,
    cached: &mut Vec<u64>,
    (i, step_secs): (usize, f64),
    rows: &[f32],
    drafts: &[u32],
    stop_tokens: &HashSet<u32>,
    model: &mut LoadedModel,
    m: &Metrics,
) -> Option<Result<FinishReason, String>> {
    let vocab = rows.len() / (drafts.len() + 1);
    let fed = drafts.len() + 1;
    let base = cached.len() - fed;
    let mut accepted = 0;
    let mut ended = None;
    for (j, logits) in rows.chunks(vocab).enumerate() {
        // Forced tokens would come between the row and its draft: none while verifying.
        ended = advance(r, logits, stop_tokens, m, false);
        if ended.is_some() {
            break;
        }
        match drafts.get(j) {
            Some(&d) if r.next == Some(d) => accepted += 1,
            _ => break,
        }
    }
    r.spec.record(drafts.len(), accepted, step_secs);
    m.draft_tokens.fetch_add(drafts.len() as u64, Relaxed);
    m.accepted_draft_tokens.fetch_add(accepted as u64, Relaxed);
    let keep = base + 1 + accepted;
    // An ended sequence keeps its rows: the cache records what the plugin holds, and only the
    // prompt's whole chunks are ever reused.
    if ended.is_none() && keep < cached.len() {
        if let Err(e) = model
            .instance()
            .and_then(|inst| inst.seq_truncate(i as i32, keep as u32))
        {
            tracing::warn!(slot = i, error = %e.message, "the plugin refused to cut rejected drafts");
            // What the sequence accepted (the plugin still holds the rejected rows after it).
            cached.truncate(keep);
            return Some(Err(format!(
                "model error: cannot rewind sequence {i}: {}",
                e.message
            )));
        }
        cached.truncate(keep);
    }
    ended.map(Ok)
}

/// Sends a finished sequence's end and counts.
fn finish(r: Running, reason: FinishReason, slot: usize) {
    let prompt_done = r.prompt_done.unwrap_or_else(Instant::now);
    let fin = Finish {
        reason,
        prompt_tokens: r.job.prompt.len(),
        cached_tokens: r.cached_tokens,
        completion_tokens: r.dec.generated(),
        prompt_duration: prompt_done.duration_since(r.job.received),
        generation_duration: prompt_done.elapsed(),
        stop_sequence: r.dec.stop_sequence().map(str::to_string),
    };
    tracing::info!(
        request = %r.job.id,
        slot,
        prompt = fin.prompt_tokens,
        cached = fin.cached_tokens,
        generated = fin.completion_tokens,
        reason = reason.as_str(),
        "sequence finished"
    );
    let _ = r.job.events.send(Event::Done(fin));
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tokens(n: usize) -> Vec<u32> {
        (0..n as u32).collect()
    }

    #[test]
    fn reuse_stops_at_whole_exact_chunks_and_leaves_a_token_to_prefill() {
        let cached = tokens(200);
        let mut prompt = tokens(150);
        prompt.push(9999);
        assert_eq!(reusable_prefix(&cached, 192, &prompt, Rewind::Anywhere), 128);
        assert_eq!(reusable_prefix(&cached, 100, &prompt, Rewind::Anywhere), 64);
        assert_eq!(reusable_prefix(&cached, 192, &tokens(64), Rewind::Anywhere), 0);
        // The whole cache (all exact chunks) needs no rewind, whatever the rule.
        let cached = tokens(128);
        for rule in [
            Rewind::Anywhere,
            Rewind::Snapshots { every: 100 },
            Rewind::OnlyToStart,
        ] {
            assert_eq!(reusable_prefix(&cached, 128, &tokens(140), rule), 128, "{rule:?}");
        }
    }

    fn image(hash: u64, positions: std::ops::Range<i32>) -> JobImage {
        JobImage {
            shape: vec![1],
            pixels: vec![0.0],
            patch_mask: None,
            grid: None,
            positions: positions.collect(),
            hash,
        }
    }

    #[test]
    fn image_rows_match_only_the_same_image_bytes() {
        let prompt = tokens(200);
        let a = prompt_key(&prompt, &[image(7, 70..140)]);
        let b = prompt_key(&prompt, &[image(8, 70..140)]);
        assert_eq!(a, prompt_key(&prompt, &[image(7, 70..140)]));
        assert_eq!(a[..70], b[..70]);
        assert!(a[70..140].iter().zip(&b[70..140]).all(|(x, y)| x != y));
        assert!(a[70..140].iter().all(|&k| k >= 1 << 32));
        assert_eq!(reusable_prefix(&a, 192, &b, Rewind::Anywhere), 64);
        assert_eq!(reusable_prefix(&a, 192, &a, Rewind::Anywhere), 192);
    }

    #[test]
    fn reuse_never_cuts_through_an_image() {
        let imgs = [image(1, 100..150)];
        assert_eq!(clear_of_images(128, &imgs, 200, Rewind::Anywhere), 64);
        assert_eq!(clear_of_images(192, &imgs, 200, Rewind::Anywhere), 192);
        assert_eq!(clear_of_images(64, &imgs, 200, Rewind::Anywhere), 64);
        assert_eq!(clear_of_images(128, &imgs, 200, Rewind::OnlyToStart), 0);
    }

    fn free(reusable: usize, last_used: u64) -> SlotView {
        SlotView {
            free: true,
            reusable,
            last_used,
            ..SlotView::default()
        }
    }

    fn busy(reusable: usize) -> SlotView {
        SlotView {
            reusable,
            donor: true,
            ..SlotView::default()
        }
    }

    #[test]
    fn a_running_sequence_with_a_longer_prefix_is_forked_into_the_least_used_free_slot() {
        // Slot 1 runs with 512 reusable rows; the free slots hold less.
        let views = [free(64, 5), busy(512), free(0, 2), free(0, 9)];
        assert_eq!(choose_slot(&views, None, true), (2, Some(1)));
        // A stale free slot is overwritten first.
        let mut stale = views;
        stale[3].stale = true;
        assert_eq!(choose_slot(&stale, None, true), (3, Some(1)));
        // The longest prefix among several running sequences.
        let views = [busy(128), free(0, 1), busy(576)];
        assert_eq!(choose_slot(&views, None, true), (1, Some(2)));
    }

    #[test]
    fn a_free_slot_holding_as_much_is_used_as_is_and_forking_can_be_off() {
        let views = [free(512, 5), busy(512), free(0, 2)];
        assert_eq!(choose_slot(&views, None, true), (0, None));
        let views = [free(64, 5), busy(512), free(0, 2)];
        assert_eq!(choose_slot(&views, None, false), (0, None));
        // A sequence still taking a prompt with images does not donate.
        let mut views = [free(64, 5), busy(512), free(0, 2)];
        views[1].donor = false;
        assert_eq!(choose_slot(&views, None, true), (0, None));
    }

    #[test]
    fn after_a_refused_fork_the_slot_it_spoiled_is_avoided_while_another_is_free() {
        // Slot 2 now holds a whole copy of slot 1 (its rewind was refused).
        let views = [free(0, 5), busy(512), free(512, 6)];
        assert_eq!(choose_slot(&views, Some(2), false), (0, None));
        // It is still used when it is the only free slot.
        let views = [busy(64), busy(512), free(512, 6)];
        assert_eq!(choose_slot(&views, Some(2), false), (2, None));
    }

    #[test]
    fn reuse_follows_the_plugins_rewind_rule() {
        let cached = tokens(300);
        let prompt = tokens(290);
        assert_eq!(reusable_prefix(&cached, 256, &prompt, Rewind::Anywhere), 256);
        let snap = |every| Rewind::Snapshots { every };
        assert_eq!(reusable_prefix(&cached, 256, &prompt, snap(16)), 256);
        assert_eq!(reusable_prefix(&cached, 256, &prompt, snap(96)), 192);
        assert_eq!(reusable_prefix(&cached, 256, &prompt, snap(1000)), 0);
        assert_eq!(reusable_prefix(&cached, 256, &prompt, Rewind::OnlyToStart), 0);
    }
}
