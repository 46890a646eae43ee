//! Opening a pack: the best plugin on the search path creates the model, and the pack's text
//! side (tokenizer, chat template, detected chat format, stop tokens) comes with it.

use crate::models::LoadedModel;
use crate::packs;
use crate::plugins::PluginSet;
use crate::template::ChatTemplate;
use crate::tokenizer::Tokenizer;
use anyhow::{anyhow, bail, Context, Result};
use berth_plugin_api::LoadConfig;
use berth_registry::gguf::GgufFile;
use berth_registry::pack::{PackFormat, PackManifest};
use berth_registry::store::{PackEntry, Store};
use std::collections::HashSet;
use std::path::Path;

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
            Some(GgufFile::read_header(entry.dir.join(&w.path))?)
        }
        _ => None,
    };
    let tokenizer = Tokenizer::from_pack_dir_or_gguf(&entry.dir, gguf.as_ref())
        .with_context(|| format!("loading the tokenizer of {}", entry.reference))?;
    let template = ChatTemplate::from_pack_or_gguf(&entry.dir, gguf.as_ref())
        .with_context(|| format!("loading the chat template of {}", entry.reference))?;
    Ok((tokenizer, template))
}
