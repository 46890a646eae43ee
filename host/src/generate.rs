//! One model opened for generation (`berth run`): plugin instance, tokenizer and chat template,
//! with a decode loop that reuses the KV cache of the previous turn's common prefix (as far back
//! as the plugin's rewind rule allows; a refused rewind costs a full prefill).

use crate::decoding::{DecodeOptions, DecodeState, FinishReason};
use crate::engine::JobImage;
use crate::models::LoadedModel;
use crate::packs;
use crate::plugins::PluginSet;
use crate::sampling::SamplingParams;
use crate::template::ChatTemplate;
use crate::tokenizer::Tokenizer;
use anyhow::{anyhow, bail, Context, Result};
use berth_plugin_api::{BatchView, LoadConfig};
use berth_registry::gguf::GgufFile;
use berth_registry::pack::{PackFormat, PackManifest};
use berth_registry::store::{PackEntry, Store};
use std::collections::HashSet;
use std::path::Path;
use std::time::{Duration, Instant};

/// Rows fed to the plugin per decode call while processing a prompt.
const PREFILL_CHUNK: usize = 256;

/// The sequence id `berth run` uses (it runs one conversation).
const SEQ: i32 = 0;

/// Timings and counts of one generation, as `ollama run --verbose` reports them.
#[derive(Clone, Debug, Default)]
pub struct GenerationStats {
    /// Prompt tokens the model processed (after prefix reuse).
    pub prompt_tokens: usize,
    /// Prompt tokens reused from the previous turn's cache.
    pub cached_tokens: usize,
    /// Time spent on the prompt.
    pub prompt_duration: Duration,
    /// Tokens generated.
    pub generated_tokens: usize,
    /// Time spent generating.
    pub generation_duration: Duration,
    /// Why generation ended: `stop` or `length`.
    pub finish_reason: &'static str,
    /// Time spent computing constraint masks that did not overlap a forward pass.
    pub mask_duration: Duration,
    /// Tokens drafted by prompt-lookup speculation (`BERTH_SPECULATION=on`).
    pub draft_tokens: usize,
    /// Drafted tokens the model's own picks confirmed.
    pub accepted_draft_tokens: usize,
}

impl GenerationStats {
    /// Prompt tokens per second.
    pub fn prompt_rate(&self) -> f64 {
        self.prompt_tokens as f64 / self.prompt_duration.as_secs_f64().max(1e-9)
    }

    /// Generated tokens per second.
    pub fn generation_rate(&self) -> f64 {
        self.generated_tokens as f64 / self.generation_duration.as_secs_f64().max(1e-9)
    }
}

/// A pack opened for generation.
pub struct Session {
    /// The pack's reference, `name:tag`.
    pub reference: String,
    /// The plugin-backed model.
    pub model: LoadedModel,
    /// The tokenizer (from `tokenizer.json` or the GGUF vocabulary).
    pub tokenizer: Tokenizer,
    /// The chat template, if the pack has one.
    pub template: Option<ChatTemplate>,
    /// Time it took to open the pack and create the model.
    pub load_duration: Duration,
    /// The chat format and reasoning markup detected from the template and vocabulary.
    pub chat_format: crate::chat::Detected,
    /// openai-harmony's renderer, for a harmony pack with the o200k vocabulary (it renders the
    /// prompts instead of the template).
    pub harmony: Option<crate::harmony::Harmony>,
    stop_tokens: HashSet<u32>,
    /// Tokens currently held in the model's cache for [`SEQ`].
    cached: Vec<u32>,
    /// The images whose rows the cache holds: (first position, last position, hash).
    cached_images: Vec<(usize, usize, u64)>,
    /// The plugin's sequence may hold tokens `cached` does not (a step failed): reset it first.
    stale: bool,
    logits: Vec<f32>,
}

impl Session {
    /// Opens a pack from the store with the best plugin on the search path.
    pub fn open(store: &Store, berth_home: &Path, reference: &str, threads: Option<u32>) -> Result<Session> {
        let start = Instant::now();
        let opened = open_pack(store, berth_home, reference, |config, _| {
            config.threads = threads;
            config.max_sequences = Some(1);
        })?;
        let vocab = opened.model.description().vocab_size as usize;
        Ok(Session {
            chat_format: opened.detected,
            harmony: opened.harmony,
            reference: opened.entry.reference,
            model: opened.model,
            tokenizer: opened.tokenizer,
            template: opened.template,
            load_duration: start.elapsed(),
            stop_tokens: opened.stop_tokens,
            cached: Vec::new(),
            cached_images: Vec::new(),
            stale: false,
            logits: vec![0.0; vocab],
        })
    }

    /// Forgets the cached conversation.
    pub fn clear(&mut self) -> Result<()> {
        self.model.instance()?.seq_truncate(SEQ, 0)?;
        self.cached.clear();
        self.cached_images.clear();
        self.stale = false;
        Ok(())
    }

    /// Cuts the cached sequence back to `keep` tokens; when the plugin refuses (its rewind rule
    /// does not allow `keep`), resets it to 0 so the whole prompt is prefilled again. Returns the
    /// tokens kept.
    fn rewind(&mut self, keep: usize) -> Result<usize> {
        let inst = self.model.instance()?;
        if let Err(e) = inst.seq_truncate(SEQ, keep as u32) {
            tracing::debug!(
                from = self.cached.len(),
                to = keep,
                error = %e.message,
                "plugin refused the rewind; prefilling the whole prompt"
            );
            self.cached.clear();
            self.stale = true;
            if keep == 0 {
                return Err(e.into());
            }
            inst.seq_truncate(SEQ, 0)?;
            self.stale = false;
            return Ok(0);
        }
        self.cached.truncate(keep);
        self.stale = false;
        Ok(keep)
    }

    /// Feeds `tokens` (after reusing the longest cached prefix) and generates until a stop
    /// token or `max_tokens`, calling `on_text` with each complete piece of text.
    pub fn generate(
        &mut self,
        tokens: &[u32],
        params: &SamplingParams,
        max_tokens: usize,
        on_text: impl FnMut(&str),
    ) -> Result<GenerationStats> {
        let opts = DecodeOptions {
            sampling: params.clone(),
            max_tokens: Some(max_tokens),
            ..DecodeOptions::default()
        };
        self.generate_with(tokens, opts, on_text)
    }

    /// Whether the plugin's model can call tools.
    pub fn tools_enabled(&mut self) -> bool {
        self.model.instance().map(|i| i.tools_enabled()).unwrap_or(false)
    }

    /// The stop tokens: the model's and the tokenizer's.
    pub fn stop_tokens(&self) -> &HashSet<u32> {
        &self.stop_tokens
    }

    /// Like [`Session::generate`], with everything a request can ask of decoding (constraint,
    /// stop strings, penalties). A constraint's next mask is computed on a second thread while
    /// the plugin runs the forward pass, so its cost hides behind the model's; tokens the grammar
    /// forces (a call's fixed `{"name": "get_weather", "arguments": ` prefix) are fed in one
    /// batch instead of one forward pass each.
    pub fn generate_with(
        &mut self,
        tokens: &[u32],
        opts: DecodeOptions,
        on_text: impl FnMut(&str),
    ) -> Result<GenerationStats> {
        self.generate_with_images(tokens, &[], opts, on_text)
    }

    /// How the model takes images (its plugin's vision spec), if it does.
    pub fn vision(&mut self) -> Option<berth_plugin_api::VisionSpec> {
        self.model.instance().ok().and_then(|i| i.vision().cloned())
    }

    /// Like [`Session::generate_with`], for a prompt whose placeholder rows take `images`
    /// (slices with their positions, from `api::images::expand_for`). Cached image rows are
    /// reused only for the same image bytes at the same place; the others are encoded before
    /// their rows are fed.
    pub fn generate_with_images(
        &mut self,
        tokens: &[u32],
        images: &[JobImage],
        opts: DecodeOptions,
        mut on_text: impl FnMut(&str),
    ) -> Result<GenerationStats> {
        if tokens.is_empty() {
            bail!("empty prompt");
        }
        let context = self.model.description().context_length as usize;
        if tokens.len() >= context {
            bail!("prompt is {} tokens; the context holds {context}", tokens.len());
        }
        let mut stats = GenerationStats::default();
        let start = Instant::now();
        // Keep the common prefix, but always re-feed at least the last prompt token for logits,
        // and rewind no further than to a point the plugin can rewind to.
        let mut keep = self.cached.iter().zip(tokens).take_while(|(a, b)| a == b).count();
        keep = keep.min(tokens.len() - 1);
        let rule = self.model.description().rewind;
        // No image is cut in two, and a cached image row counts only for the same image.
        let spans: Vec<(usize, usize, u64)> = images
            .iter()
            .filter_map(|img| {
                let first = *img.positions.first()? as usize;
                Some((first, *img.positions.last()? as usize, img.hash))
            })
            .collect();
        while let Some(&(first, ..)) = spans
            .iter()
            .find(|s| s.0 < keep && (keep <= s.1 || !self.cached_images.contains(s)))
        {
            keep = rule.floor(first as u32, self.cached.len() as u32) as usize;
        }
        if self.stale || keep < self.cached.len() {
            keep = rule.floor(keep as u32, self.cached.len() as u32) as usize;
            keep = self.rewind(keep)?;
        }
        self.cached_images.retain(|s| s.1 < keep);
        let pending: Vec<_> = images
            .iter()
            .filter(|img| img.positions.first().is_some_and(|&p| p as usize >= keep))
            .map(JobImage::as_input)
            .collect();
        if !pending.is_empty() {
            if let Err(e) = self.model.instance()?.encode_images(SEQ, &pending) {
                self.stale = true;
                return Err(anyhow!("the model cannot encode the images: {}", e.message));
            }
            self.cached_images
                .extend(spans.iter().filter(|s| s.0 >= keep).copied());
        }
        stats.cached_tokens = keep;
        let rest = &tokens[keep..];
        let mut state = DecodeState::new(opts, &self.tokenizer, &self.stop_tokens, context - tokens.len());
        let constrained = state.is_constrained();
        std::thread::scope(|s| -> Result<()> {
            // The first mask (and the grammar's start-up) overlaps the prompt.
            let first = constrained.then(|| s.spawn(|| state.prepare()));
            for (i, chunk) in rest.chunks(PREFILL_CHUNK).enumerate() {
                let last = (i + 1) * PREFILL_CHUNK >= rest.len();
                self.feed(chunk, last)?;
            }
            if let Some(h) = first {
                h.join().map_err(|_| anyhow!("mask thread panicked"))??;
            }
            Ok(())
        })?;
        stats.prompt_tokens = rest.len();
        stats.prompt_duration = start.elapsed();

        let start = Instant::now();
        let mut spec = crate::engine::speculation::Speculator::default();
        let speculate = !constrained
            && state.is_greedy()
            && crate::engine::speculation::enabled(self.model.description().rewind);
        while state.finished().is_none() {
            let waited = Instant::now();
            state.prepare()?;
            stats.mask_duration += waited.elapsed();
            let token = state.pick(&self.logits);
            let step = state.accept(token);
            if !step.text.is_empty() {
                on_text(&step.text);
            }
            if step.finished.is_some() {
                break;
            }
            if speculate && spec.may_draft() {
                let room = context.saturating_sub(self.cached.len() + 1);
                let history: Vec<u64> = self
                    .cached
                    .iter()
                    .chain(std::iter::once(&token))
                    .map(|&t| u64::from(t))
                    .collect();
                let drafts = crate::engine::speculation::draft(
                    &history,
                    crate::engine::speculation::MAX_DRAFT.min(room),
                );
                if !drafts.is_empty() {
                    let t0 = Instant::now();
                    let accepted = self.speculate(token, &drafts, &mut state, &mut on_text)?;
                    spec.record(drafts.len(), accepted, t0.elapsed().as_secs_f64());
                    continue;
                }
            }
            let plain = Instant::now();
            // Tokens the grammar forces go to the model in one batch with the sampled one.
            let mut batch = vec![token];
            for forced in state.forced() {
                let step = state.accept(forced);
                if !step.text.is_empty() {
                    on_text(&step.text);
                }
                batch.push(forced);
                if step.finished.is_some() {
                    break;
                }
            }
            if state.finished().is_some() {
                break;
            }
            if constrained {
                std::thread::scope(|s| -> Result<()> {
                    let mask = s.spawn(|| state.prepare());
                    let fed = self.feed(&batch, true);
                    mask.join().map_err(|_| anyhow!("mask thread panicked"))??;
                    fed
                })?;
            } else {
                self.feed(&batch, true)?;
                if speculate {
                    spec.record_plain(plain.elapsed().as_secs_f64());
                }
            }
        }
        let tail = state.finish();
        if !tail.is_empty() {
            on_text(&tail);
        }
        stats.draft_tokens = spec.total_drafted as usize;
        stats.accepted_draft_tokens = spec.total_accepted as usize;
        stats.generated_tokens = state.generated();
        stats.finish_reason = state.finished().unwrap_or(FinishReason::Stop).as_str();
        stats.generation_duration = start.elapsed();
        Ok(stats)
    }

    /// One speculative step: feeds `[token, drafts..]` with logits for every row and takes the
    /// drafts while each equals the greedy pick of the row before it; returns how many it took. The row after the last
    /// accepted draft is left in `self.logits` for the next pick (the same token again: greedy);
    /// rows after it are cut from the cache (kept when the sequence ended: the cache then holds
    /// exactly what the plugin has).
    fn speculate(
        &mut self,
        token: u32,
        drafts: &[u32],
        state: &mut DecodeState,
        on_text: &mut impl FnMut(&str),
    ) -> Result<usize> {
        let vocab = self.model.description().vocab_size as usize;
        let base = self.cached.len();
        let mut rows = vec![token];
        rows.extend_from_slice(drafts);
        self.logits.resize(rows.len() * vocab, 0.0);
        let fed = self.feed_rows(&rows, true);
        let mut accepted = 0;
        if fed.is_ok() {
            for (j, &d) in drafts.iter().enumerate() {
                if state.pick(&self.logits[j * vocab..(j + 1) * vocab]) != d {
                    break;
                }
                accepted += 1;
                let step = state.accept(d);
                if !step.text.is_empty() {
                    on_text(&step.text);
                }
                if step.finished.is_some() {
                    break;
                }
            }
            self.logits
                .copy_within(accepted * vocab..(accepted + 1) * vocab, 0);
        }
        self.logits.truncate(vocab);
        fed?;
        let keep = base + 1 + accepted;
        if state.finished().is_none() && keep < self.cached.len() {
            if let Err(e) = self.model.instance()?.seq_truncate(SEQ, keep as u32) {
                self.cached.clear();
                self.cached_images.clear();
                self.stale = true;
                bail!("the model cannot cut rejected drafts: {}", e.message);
            }
            self.cached.truncate(keep);
        }
        Ok(accepted)
    }

    /// Feeds tokens at the end of the cached sequence; the last row's logits land in
    /// `self.logits` when `want_last` is set.
    fn feed(&mut self, tokens: &[u32], want_last: bool) -> Result<()> {
        self.feed_with(tokens, want_last, false)
    }

    /// Feeds tokens at the end of the cached sequence with logits for every row (into
    /// `self.logits`, which must hold them), when `all` is set.
    fn feed_rows(&mut self, tokens: &[u32], all: bool) -> Result<()> {
        self.feed_with(tokens, true, all)
    }

    fn feed_with(&mut self, tokens: &[u32], want_last: bool, want_all: bool) -> Result<()> {
        let start = self.cached.len() as i32;
        let ids: Vec<i32> = tokens.iter().map(|&t| t as i32).collect();
        let positions: Vec<i32> = (0..ids.len() as i32).map(|i| start + i).collect();
        let seq_ids = vec![SEQ; ids.len()];
        let mut want = vec![u8::from(want_all); ids.len()];
        if want_last {
            *want.last_mut().expect("non-empty chunk") = 1;
        }
        let batch = BatchView {
            tokens: &ids,
            positions: &positions,
            seq_ids: &seq_ids,
            want_logits: &want,
        };
        if let Err(e) = self.model.decode(&batch, &mut self.logits) {
            // A failed (or poisoned) step leaves the cache in an unknown state: start over.
            self.cached.clear();
            self.cached_images.clear();
            self.stale = true;
            return Err(e.into());
        }
        self.cached.extend_from_slice(tokens);
        Ok(())
    }
}

/// A pack opened for generation: the model created by the best plugin plus its text side.
pub struct OpenedPack {
    /// The store's entry for the pack.
    pub entry: PackEntry,
    /// The pack's manifest.
    pub manifest: PackManifest,
    /// The name of the plugin that created the model.
    pub plugin: String,
    /// The plugin-backed model.
    pub model: LoadedModel,
    /// The tokenizer (from `tokenizer.json` or the GGUF vocabulary).
    pub tokenizer: Tokenizer,
    /// The chat template, if the pack has one.
    pub template: Option<ChatTemplate>,
    /// Tokens that end a reply: the plugin's stop tokens and the tokenizer's.
    pub stop_tokens: HashSet<u32>,
    /// The chat format and reasoning markup detected from the template and vocabulary.
    pub detected: crate::chat::Detected,
    /// openai-harmony's renderer, for a harmony pack with the o200k vocabulary.
    pub harmony: Option<crate::harmony::Harmony>,
}

/// Opens a pack from the store with the best plugin on the search path (discovered afresh, so
/// plugin files installed since the last call are found); `tune` adjusts the load config
/// (threads, sequences, context) before the plugin creates the model.
pub fn open_pack(
    store: &Store,
    berth_home: &Path,
    reference: &str,
    tune: impl FnOnce(&mut LoadConfig, &PackManifest),
) -> Result<OpenedPack> {
    let entry = store.get(reference)?;
    let m = entry
        .manifest
        .as_ref()
        .ok_or_else(|| anyhow!("{}: {}", entry.reference, entry.problems.join("; ")))?;
    if !entry.problems.is_empty() {
        bail!("{} is broken: {}", entry.reference, entry.problems.join("; "));
    }
    let plugins = PluginSet::discover_default(berth_home);
    let (record, plugin) = plugins.best_for(&packs::probe_config(m)).ok_or_else(|| {
        anyhow!(
            "no installed plugin serves {} (family '{}', architecture '{}'); see `berth plugins`",
            entry.reference,
            m.family,
            m.architecture
        )
    })?;
    let mut config = packs::load_config(&entry, m);
    tune(&mut config, m);
    let model = LoadedModel::load(plugin, &config)
        .with_context(|| format!("plugin '{}' could not load {}", record.name(), entry.reference))?;
    let (tokenizer, template) = load_text_side(&entry)?;
    let mut stop_tokens: HashSet<u32> = model
        .description()
        .stop_tokens
        .iter()
        .map(|&t| t as u32)
        .collect();
    stop_tokens.extend(tokenizer.stop_ids().iter().copied());
    let detected = crate::chat::detect(template.as_ref().map(|t| t.source()), |tok| {
        tokenizer.token_id(tok).is_some()
    });
    detected
        .format
        .drop_never_stops(&mut stop_tokens, |t| tokenizer.token_id(t));
    let harmony = crate::harmony::for_pack(&entry.reference, &detected, &tokenizer);
    let plugin = record.name().to_string();
    let manifest = m.clone();
    Ok(OpenedPack {
        entry,
        manifest,
        plugin,
        model,
        tokenizer,
        template,
        stop_tokens,
        detected,
        harmony,
    })
}

/// The tokenizer and chat template of a pack: `tokenizer.json` / `chat_template.jinja` from the
/// pack when present, else from the GGUF.
pub fn load_text_side(entry: &PackEntry) -> Result<(Tokenizer, Option<ChatTemplate>)> {
    let m = entry
        .manifest
        .as_ref()
        .ok_or_else(|| anyhow!("{} has no manifest", entry.reference))?;
    let gguf = match m.format {
        PackFormat::Gguf => {
            let w = m
                .weights()
                .next()
                .ok_or_else(|| anyhow!("{} lists no weights", entry.reference))?;
            Some(GgufFile::open(entry.dir.join(&w.path))?)
        }
        _ => None,
    };
    let tokenizer = Tokenizer::from_pack_dir_or_gguf(&entry.dir, gguf.as_ref())
        .with_context(|| format!("loading the tokenizer of {}", entry.reference))?;
    let template = ChatTemplate::from_pack_or_gguf(&entry.dir, gguf.as_ref())
        .with_context(|| format!("loading the chat template of {}", entry.reference))?;
    Ok((tokenizer, template))
}
