//! Packs seen together with plugins: which plugin serves each pack, and what is wrong with it.

use crate::plugins::{PluginRecord, PluginSet};
use berth_plugin_api::LoadConfig;
use berth_registry::pack::{PackManifest, KNOWN_FAMILIES};
use berth_registry::store::PackEntry;

/// The JSON a plugin's `probe` receives for a pack.
pub fn probe_config(m: &PackManifest) -> serde_json::Value {
    serde_json::json!({
        "family": m.family,
        "architecture": m.architecture,
        "format": m.format.as_str(),
        "reference": m.reference(),
        "parameters": m.parameters,
        "quantization": m.quantization,
        "context_length": m.context_length,
    })
}

/// What the host tells a plugin when it creates a model from a pack.
pub fn load_config(entry: &PackEntry, m: &PackManifest) -> LoadConfig {
    LoadConfig {
        pack_dir: entry.dir.clone(),
        reference: m.reference(),
        family: m.family.clone(),
        architecture: m.architecture.clone(),
        format: m.format.as_str().to_string(),
        weights: m.weights().map(|f| entry.dir.join(&f.path)).collect(),
        options: match &m.quantize {
            Some(q) => [("quantize".to_string(), serde_json::Value::from(q.as_str()))]
                .into_iter()
                .collect(),
            None => Default::default(),
        },
        ..Default::default()
    }
}

/// A pack with the plugin that would serve it and every problem found.
pub struct PackStatus<'a> {
    /// The registry's view of the pack.
    pub entry: &'a PackEntry,
    /// The plugin chosen for it, if any.
    pub plugin: Option<&'a PluginRecord>,
    /// Registry problems plus plugin-level ones (unknown family).
    pub problems: Vec<String>,
}

impl PackStatus<'_> {
    /// `ok`, `missing` (no plugin serves it) or `broken` (the pack's own files or manifest are bad).
    pub fn plugin_column(&self) -> &'static str {
        if self.entry.manifest.is_none() || !self.entry.problems.is_empty() {
            "broken"
        } else if self.plugin.is_some() {
            "ok"
        } else {
            "missing"
        }
    }
}

/// Joins a pack with the plugin set.
pub fn status<'a>(entry: &'a PackEntry, plugins: &'a PluginSet) -> PackStatus<'a> {
    let mut problems = entry.problems.clone();
    let mut plugin = None;
    if let Some(m) = &entry.manifest {
        let known = KNOWN_FAMILIES.contains(&m.family.as_str()) || plugins.families().contains(&m.family);
        if m.family.is_empty() {
            problems.push("pack.toml names no family".to_string());
        } else if !known {
            problems.push(format!(
                "unknown family '{}' (no installed plugin declares it)",
                m.family
            ));
        }
        plugin = plugins.best_for(&probe_config(m)).map(|(r, _)| r);
    }
    PackStatus {
        entry,
        plugin,
        problems,
    }
}
