//! The models a server holds: loaded on first request, unloaded after their keep-alive, capped
//! with least-recently-used eviction, and kept in step with the store (a pack imported while the
//! server runs becomes servable; a removed one is drained, then unloaded).
//!
//! Keep-alive counts from the end of the last request on a model, never during one: a request
//! runs inside [`Holds::scope`] (the server's middleware sets it up), every model it gets is held
//! in its [`Holds`], and the middleware keeps those until the response body has been sent or
//! dropped (a streamed answer ends, or its client disconnects). Releasing the last hold on a
//! model starts its keep-alive.

use crate::chat::Detected;
use crate::constraint::ConstraintFactory;
use crate::engine::metrics::Metrics;
use crate::engine::{Engine, EngineConfig, TextSide};
use crate::options::PackDefaults;
use crate::pack::{open_pack, OpenedPack};
use crate::template::ChatTemplate;
use crate::tokenizer::Tokenizer;
use anyhow::Result;
use berth_registry::store::{PackEntry, Store};
use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering::Relaxed;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

/// Sequences per plugin call an embedding model is loaded with, at least (see
/// [`crate::engine::embed::EMBED_BATCH_TOKENS`] for the rows).
const EMBED_SEQUENCES: usize = 64;

/// How a server loads models.
#[derive(Clone, Debug)]
pub struct ModelsConfig {
    /// Berth home (store and plugins).
    pub home: PathBuf,
    /// Sequences per model.
    pub slots: usize,
    /// Queue length per model.
    pub queue: usize,
    /// Default keep-alive; `None` keeps models forever.
    pub keep_alive: Option<Duration>,
    /// Most models loaded at once.
    pub max_loaded: usize,
    /// Context length cap per sequence.
    pub context: u32,
    /// Compute threads per model (None: the plugin decides).
    pub threads: Option<u32>,
    /// Prompt-lookup speculation for greedy requests.
    pub speculation: bool,
}

/// How one model is loaded: the plugin's settings and its engine's sizing.
#[derive(Clone, Debug)]
pub struct LoadSettings {
    /// Compute threads (None: the plugin decides).
    pub threads: Option<u32>,
    /// Sequences decoded at once (KV slots).
    pub slots: usize,
    /// Requests that may wait for a slot.
    pub queue: usize,
    /// The context a request gets when neither it (`num_ctx`) nor its pack asks for one (None:
    /// the model's own). Models load with their own context: a request may ask for up to it.
    pub context: Option<u32>,
    /// Keep-alive after the last request; `None` keeps the model forever.
    pub keep_alive: Option<Duration>,
    /// Prompt-lookup speculation for greedy requests.
    pub speculation: bool,
}

/// A loaded model: engine plus everything needed to turn requests into prompts.
pub struct Model {
    /// `name:tag`.
    pub reference: String,
    /// The scheduler.
    pub engine: Engine,
    /// Tokenizer.
    pub tokenizer: Tokenizer,
    /// Chat template, if any.
    pub template: Option<ChatTemplate>,
    /// Chat format detected from the template and vocabulary.
    pub detected: Detected,
    /// openai-harmony's renderer, for a harmony pack with the o200k vocabulary (it renders the
    /// prompts instead of the template).
    pub harmony: Option<crate::harmony::Harmony>,
    /// How the model takes images (its plugin's vision spec); `None` takes none.
    pub vision: Option<berth_plugin_api::VisionSpec>,
    /// How the model embeds text (its plugin's embedding spec); `None`: a generating model.
    pub embedding: Option<berth_plugin_api::EmbeddingSpec>,
    /// Capabilities from the pack (`completion`, `tools`, `thinking`, ...).
    pub capabilities: Vec<String>,
    /// Family of the pack.
    pub family: String,
    /// Architecture of the pack (as its manifest names it).
    pub architecture: String,
    /// Size of the pack on disk.
    pub size: u64,
    /// When it was loaded.
    pub loaded_at: SystemTime,
    /// The most context a sequence can hold (the model's own): the limit of a request's
    /// `num_ctx`.
    pub context_length: usize,
    /// The context a request gets when neither it nor its pack asks (the server's `--context`,
    /// capped by the model's).
    pub default_context: usize,
    /// What the pack asks for when a request does not: sampling, stop strings, `num_ctx`, the
    /// system prompt and messages.
    pub defaults: PackDefaults,
    /// Length of the model's logits row: token ids at or past it do not exist (`logit_bias`).
    pub vocab_size: usize,
    /// Grammars for tools and response formats (the error when they cannot be built).
    pub constraints: Result<ConstraintFactory, String>,
    usage: Mutex<Usage>,
}

struct Usage {
    /// When the last request on the model started or (once none runs) ended.
    last_used: Instant,
    keep_alive: Option<Duration>,
    /// Requests holding the model now ([`Holds`]): its keep-alive does not count while any does.
    in_flight: usize,
}

impl Model {
    /// Marks a use now; `keep_alive` (when given) replaces the model's keep-alive.
    pub fn touch(&self, keep_alive: Option<Option<Duration>>) {
        let mut u = self.usage();
        u.last_used = Instant::now();
        if let Some(k) = keep_alive {
            u.keep_alive = k;
        }
    }

    fn usage(&self) -> std::sync::MutexGuard<'_, Usage> {
        self.usage.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// When the model will be unloaded if unused (`None`: never); while requests hold it, its
    /// keep-alive from now (the timer starts when the last of them ends).
    pub fn expires_at(&self) -> Option<SystemTime> {
        let u = self.usage();
        let since = if u.in_flight > 0 {
            Instant::now()
        } else {
            u.last_used
        };
        u.keep_alive
            .map(|k| SystemTime::now() + (since + k).saturating_duration_since(Instant::now()))
    }

    /// Whether the keep-alive has run out: no request holds the model, and the last one ended
    /// at least the keep-alive ago.
    fn expired(&self) -> bool {
        let u = self.usage();
        u.in_flight == 0 && u.keep_alive.is_some_and(|k| u.last_used.elapsed() >= k)
    }

    /// Requests holding the model now.
    pub fn in_flight(&self) -> usize {
        self.usage().in_flight
    }

    fn last_used(&self) -> Instant {
        self.usage().last_used
    }

    /// The BOS / EOS token texts for templates.
    pub fn special_texts(&self) -> (String, String) {
        let t = |id: Option<u32>| id.map(|i| self.tokenizer.token_to_piece(i)).unwrap_or_default();
        (t(self.tokenizer.bos_id()), t(self.tokenizer.eos_id()))
    }

    /// Loads a pack with the best plugin on the search path (discovered afresh, so plugin files
    /// installed since the last load are found) and starts its engine.
    pub fn load(
        store: &Store,
        home: &Path,
        reference: &str,
        settings: &LoadSettings,
        metrics: Arc<Metrics>,
    ) -> Result<Model> {
        let start = Instant::now();
        let opened = open_pack(store, home, reference, |config, m| {
            config.threads = settings.threads;
            // An embedding model holds no sequence between calls: more sequences per call only
            // make its shared forward passes larger (the engine's batches of many short texts).
            let embeds = m.has_capability("embedding");
            let slots = if embeds {
                settings.slots.max(EMBED_SEQUENCES)
            } else {
                settings.slots
            };
            config.max_sequences = Some(slots as u32);
        })?;
        let OpenedPack {
            entry,
            manifest: m,
            plugin,
            model,
            tokenizer,
            template,
            stop_tokens,
            detected,
            harmony,
        } = opened;
        let context_length = model.description().context_length as usize;
        let defaults = PackDefaults::from_manifest(&m);
        for problem in &defaults.problems {
            tracing::warn!(model = %entry.reference, problem = %problem, "pack default not applied");
        }
        let default_context = settings
            .context
            .map_or(context_length, |c| (c as usize).min(context_length));
        let mut model = model;
        let tools_enabled = model.instance().map(|i| i.tools_enabled()).unwrap_or(false);
        let vision = model.instance().ok().and_then(|i| i.vision().cloned());
        if let Some(why) = model
            .instance()
            .ok()
            .and_then(|i| i.vision_refused().map(str::to_string))
        {
            tracing::warn!(model = %entry.reference, plugin = %plugin, reason = %why, "model takes no images");
        }
        let embedding = model.instance().ok().and_then(|i| i.embedding().cloned());
        let mut capabilities = m.capabilities.clone();
        if vision.is_some() && !capabilities.iter().any(|c| c == "vision") {
            capabilities.push("vision".into());
        }
        if embedding.is_some() {
            // An embedding model generates nothing, whatever its tokenizer's template says.
            capabilities.retain(|c| c != "completion" && c != "chat" && c != "tools" && c != "thinking");
            if !capabilities.iter().any(|c| c == "embedding") {
                capabilities.push("embedding".into());
            }
        }
        let vocab = model.description().vocab_size as usize;
        // An embedding model generates nothing: no grammars to build for it.
        let constraints = if embedding.is_some() {
            Err("an embedding model does not generate".to_string())
        } else {
            ConstraintFactory::new(&tokenizer, &detected, vocab, tools_enabled).map_err(|e| format!("{e:#}"))
        };
        if let (Err(e), None) = (&constraints, &embedding) {
            tracing::warn!(model = %entry.reference, error = %e, "constrained decoding unavailable");
        }
        // What the load did with the pack's cache of packed weights (common-runtime plugins).
        let pack_cache = model
            .description()
            .extra
            .get("pack_cache")
            .map_or_else(String::new, |v| v.to_string());
        let engine = Engine::start(
            model,
            TextSide {
                tokenizer: tokenizer.clone(),
                stop_tokens,
            },
            EngineConfig {
                slots: settings.slots,
                queue: settings.queue,
                speculation: settings.speculation,
            },
            metrics,
            reference,
        );
        tracing::info!(model = %entry.reference, plugin = %plugin, seconds = start.elapsed().as_secs_f64(), pack_cache = %pack_cache, "model loaded");
        Ok(Model {
            reference: entry.reference.clone(),
            engine,
            tokenizer,
            template,
            detected,
            harmony,
            vision,
            embedding,
            capabilities,
            family: m.family.clone(),
            architecture: m.architecture.clone(),
            size: entry.size,
            loaded_at: SystemTime::now(),
            context_length,
            default_context,
            defaults,
            vocab_size: vocab,
            constraints,
            usage: Mutex::new(Usage {
                last_used: Instant::now(),
                keep_alive: settings.keep_alive,
                in_flight: 0,
            }),
        })
    }
}

/// One request's hold on a model: while it lives, the model's keep-alive does not count; dropping
/// the last hold on a model starts it.
struct Hold(Arc<Model>);

impl Hold {
    fn new(model: Arc<Model>) -> Hold {
        model.usage().in_flight += 1;
        Hold(model)
    }
}

impl Drop for Hold {
    fn drop(&mut self) {
        let mut u = self.0.usage();
        u.in_flight -= 1;
        u.last_used = Instant::now();
    }
}

tokio::task_local! {
    /// The holds of the request whose handler runs on this task.
    static HOLDS: Holds;
}

/// The models one request holds ([`Models::get`] adds each model it hands out while the request
/// runs inside [`Holds::scope`]); they are released when the last clone of this is dropped.
#[derive(Clone, Default)]
pub struct Holds(Arc<Mutex<Vec<Hold>>>);

impl Holds {
    /// Runs a request's handler so that every model it gets is held by `self`.
    pub async fn scope<F: std::future::Future>(&self, handler: F) -> F::Output {
        HOLDS.scope(self.clone(), handler).await
    }

    /// Whether the request holds any model.
    pub fn is_empty(&self) -> bool {
        self.0.lock().unwrap_or_else(|e| e.into_inner()).is_empty()
    }

    /// Holds `model` for the request running on this task, if it runs inside [`Holds::scope`].
    fn hold(model: &Arc<Model>) {
        let _ = HOLDS.try_with(|h| {
            h.0.lock()
                .unwrap_or_else(|e| e.into_inner())
                .push(Hold::new(model.clone()))
        });
    }
}

/// Why a model is not available for a request.
#[derive(Debug)]
pub enum ModelError {
    /// No such pack (404).
    NotFound,
    /// It could not be loaded (the message says why).
    Failed(String),
}

/// A pack the store lists, as the APIs show it.
#[derive(Clone, Debug)]
pub struct PackInfo {
    /// The store's view.
    pub entry: PackEntry,
}

/// All models of a server.
pub struct Models {
    cfg: ModelsConfig,
    store: Store,
    metrics: Arc<Metrics>,
    loaded: Mutex<HashMap<String, Arc<Model>>>,
    loading: Mutex<HashSet<String>>,
    /// Woken whenever a load ends (loaded or failed): requests for a model another request is
    /// loading wait on it, as Ollama's do, instead of being refused.
    load_ended: tokio::sync::Notify,
    catalog: Mutex<Vec<PackEntry>>,
}

impl Models {
    /// A manager over the store in `cfg.home`.
    pub fn new(cfg: ModelsConfig, metrics: Arc<Metrics>) -> Models {
        let store = Store::new(cfg.home.clone());
        let catalog = store.list();
        Models {
            cfg,
            store,
            metrics,
            loaded: Mutex::new(HashMap::new()),
            loading: Mutex::new(HashSet::new()),
            load_ended: tokio::sync::Notify::new(),
            catalog: Mutex::new(catalog),
        }
    }

    /// Packs in the store (as of the last scan).
    pub fn catalog(&self) -> Vec<PackEntry> {
        self.catalog.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// The store.
    pub fn store(&self) -> &Store {
        &self.store
    }

    /// Loaded models.
    pub fn loaded(&self) -> Vec<Arc<Model>> {
        let mut v: Vec<_> = self
            .loaded
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .values()
            .cloned()
            .collect();
        v.sort_by(|a, b| a.reference.cmp(&b.reference));
        v
    }

    /// Whether some model is loading now.
    pub fn is_loading(&self) -> bool {
        !self.loading.lock().unwrap_or_else(|e| e.into_inner()).is_empty()
    }

    /// The canonical reference of `name` in the store (a bare name means its only or `latest` tag).
    pub fn resolve(&self, name: &str) -> Option<String> {
        if let Some(m) = self.loaded.lock().unwrap_or_else(|e| e.into_inner()).get(name) {
            return Some(m.reference.clone());
        }
        self.store
            .get(name)
            .ok()
            .filter(|e| e.manifest.is_some())
            .map(|e| e.reference)
    }

    /// The loaded model for `name`, loading it first (on a blocking thread) when needed; while
    /// another request loads it, this one waits for that load to end.
    pub async fn get(
        self: &Arc<Self>,
        name: &str,
        keep_alive: Option<Option<Duration>>,
    ) -> Result<Arc<Model>, ModelError> {
        let reference = self.resolve(name).ok_or(ModelError::NotFound)?;
        loop {
            // Registered before the checks, so a load that ends between them still wakes us.
            let ended = self.load_ended.notified();
            tokio::pin!(ended);
            ended.as_mut().enable();
            if let Some(m) = self
                .loaded
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .get(&reference)
            {
                m.touch(keep_alive);
                Holds::hold(m);
                return Ok(m.clone());
            }
            if self
                .loading
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .insert(reference.clone())
            {
                break;
            }
            // Counted while it waits, also when its client leaves meanwhile.
            struct Waiting<'a>(&'a std::sync::atomic::AtomicI64);
            impl Drop for Waiting<'_> {
                fn drop(&mut self) {
                    self.0.fetch_sub(1, Relaxed);
                }
            }
            self.metrics.load_waiters.fetch_add(1, Relaxed);
            let _waiting = Waiting(&self.metrics.load_waiters);
            ended.await;
        }
        // Ends the load for the waiters whatever happens below, also when this request is
        // dropped while it loads (they retry: a failed load is tried again by the first of them).
        struct LoadEnded<'a>(&'a Models, &'a str);
        impl Drop for LoadEnded<'_> {
            fn drop(&mut self) {
                self.0
                    .loading
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .remove(self.1);
                self.0.load_ended.notify_waiters();
            }
        }
        let _ended = LoadEnded(self, &reference);
        let me = self.clone();
        let r2 = reference.clone();
        let res = tokio::task::spawn_blocking(move || {
            let loaded = me.load(&r2);
            // A load reads the weights into buffers it frees once they are packed.
            release_freed_memory();
            loaded
        })
        .await;
        let model = match res {
            Ok(Ok(m)) => Arc::new(m),
            Ok(Err(e)) => return Err(ModelError::Failed(format!("{e:#}"))),
            Err(e) => return Err(ModelError::Failed(format!("loading {reference} panicked: {e}"))),
        };
        model.touch(keep_alive);
        Holds::hold(&model);
        let evicted = {
            let mut loaded = self.loaded.lock().unwrap_or_else(|e| e.into_inner());
            loaded.insert(reference.clone(), model.clone());
            let mut evicted = Vec::new();
            while loaded.len() > self.cfg.max_loaded.max(1) {
                // Idle models go first (an evicted model still finishes its running requests).
                let lru = loaded
                    .values()
                    .filter(|m| m.reference != reference)
                    .min_by_key(|m| (m.in_flight() > 0, m.last_used()))
                    .map(|m| m.reference.clone());
                match lru.and_then(|r| loaded.remove(&r)) {
                    Some(m) => evicted.push(m),
                    None => break,
                }
            }
            evicted
        };
        self.metrics.loaded_models.fetch_add(1, Relaxed);
        for m in evicted {
            tracing::info!(model = %m.reference, "evicting the least recently used model");
            self.unload_in_background(m);
        }
        Ok(model)
    }

    fn load(&self, reference: &str) -> Result<Model> {
        let settings = LoadSettings {
            threads: self.cfg.threads,
            slots: self.cfg.slots,
            queue: self.cfg.queue,
            context: Some(self.cfg.context),
            keep_alive: self.cfg.keep_alive,
            speculation: self.cfg.speculation,
        };
        Model::load(
            &self.store,
            &self.cfg.home,
            reference,
            &settings,
            self.metrics.clone(),
        )
    }

    /// Unloads a model now (after its running requests finish). False if it was not loaded.
    pub fn unload(&self, reference: &str) -> bool {
        let m = self
            .loaded
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(reference);
        match m {
            Some(m) => {
                self.unload_in_background(m);
                true
            }
            None => false,
        }
    }

    fn unload_in_background(&self, m: Arc<Model>) {
        let metrics = self.metrics.clone();
        std::thread::spawn(move || {
            // Draining ends the scheduler thread, which owns the plugin instance: its weights
            // are freed when this returns.
            m.engine.drain();
            let reference = m.reference.clone();
            drop(m);
            release_freed_memory();
            metrics.loaded_models.fetch_sub(1, Relaxed);
            tracing::info!(model = %reference, "model unloaded");
        });
    }

    /// One housekeeping pass: rescan the store, drop removed packs, unload expired models.
    pub fn tick(&self) {
        let list = self.store.list();
        let present: HashSet<String> = list.iter().map(|e| e.reference.clone()).collect();
        {
            let mut c = self.catalog.lock().unwrap_or_else(|e| e.into_inner());
            let before: HashSet<String> = c.iter().map(|e| e.reference.clone()).collect();
            for added in present.difference(&before) {
                tracing::info!(model = %added, "pack appeared in the store");
            }
            for removed in before.difference(&present) {
                tracing::info!(model = %removed, "pack left the store");
            }
            *c = list;
        }
        let gone: Vec<Arc<Model>> = {
            let mut loaded = self.loaded.lock().unwrap_or_else(|e| e.into_inner());
            let drop: Vec<String> = loaded
                .values()
                .filter(|m| !present.contains(&m.reference) || (m.expired() && m.engine.load() == (0, 0)))
                .map(|m| m.reference.clone())
                .collect();
            drop.iter().filter_map(|r| loaded.remove(r)).collect()
        };
        for m in gone {
            tracing::info!(model = %m.reference, "unloading (removed from the store or keep-alive expired)");
            self.unload_in_background(m);
        }
    }

    /// Unloads everything, waiting for running requests.
    pub fn shutdown(&self) {
        let all: Vec<Arc<Model>> = self
            .loaded
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .drain()
            .map(|(_, m)| m)
            .collect();
        for m in all {
            m.engine.drain();
        }
    }
}

/// Hands memory freed by an unloaded model (or by a load, its buffers) back to the system. glibc's allocator keeps freed
/// pages in its arenas (each thread that allocated gets one, and the load and scheduler threads
/// allocated the weights), so without this a server kept most of an unloaded model's memory
/// (after Qwen2.5 0.5B: 334 MB of 600 MB anonymous); `malloc_trim` returns every arena's free
/// pages. Other allocators return large blocks themselves.
pub fn release_freed_memory() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: `malloc_trim` only releases free memory held by glibc's allocator; it takes no
    // pointers and may be called from any thread at any time.
    unsafe {
        libc::malloc_trim(0);
    }
}
