//! A model served by a plugin, recreated after a panic poisons it: the server lives on and the
//! next call gets a fresh instance.

use berth_plugin_api::{
    BatchView, ErrorKind, LoadConfig, ModelDescription, ModelInstance, Plugin, PluginError,
};
use std::sync::Arc;

/// A plugin plus the configuration to (re)create a model instance from it.
pub struct LoadedModel {
    plugin: Arc<Plugin>,
    load_config: String,
    instance: Option<ModelInstance>,
    description: ModelDescription,
    reloads: u32,
}

impl LoadedModel {
    /// Creates the model instance now.
    pub fn load(plugin: Arc<Plugin>, config: &LoadConfig) -> Result<Self, PluginError> {
        let load_config = serde_json::to_string(config).expect("load config serializes");
        let instance = plugin.create(&load_config)?;
        let description = instance.description().clone();
        Ok(LoadedModel {
            plugin,
            load_config,
            instance: Some(instance),
            description,
            reloads: 0,
        })
    }

    /// What the model reported when it was created.
    pub fn description(&self) -> &ModelDescription {
        &self.description
    }

    /// How many times the instance was recreated after a panic.
    pub fn reloads(&self) -> u32 {
        self.reloads
    }

    /// The live instance, recreating it first if a panic poisoned the previous one.
    pub fn instance(&mut self) -> Result<&mut ModelInstance, PluginError> {
        if self.instance.as_ref().is_none_or(|i| i.poisoned().is_some()) {
            // Destroy the poisoned instance before creating its replacement.
            self.instance = None;
            let fresh = self.plugin.create(&self.load_config)?;
            self.description = fresh.description().clone();
            self.instance = Some(fresh);
            self.reloads += 1;
        }
        Ok(self.instance.as_mut().expect("instance was just ensured"))
    }

    /// Runs one batch. A panic inside the plugin fails this call with `ErrorKind::Poisoned`; the
    /// next call runs on a fresh instance (sequence state is lost, as after a restart).
    pub fn decode(&mut self, batch: &BatchView<'_>, logits: &mut [f32]) -> Result<usize, PluginError> {
        let r = self.instance()?.decode(batch, logits);
        if let Err(e) = &r {
            if e.kind == ErrorKind::Poisoned {
                eprintln!(
                    "berth: model instance poisoned; it will be recreated: {}",
                    e.message
                );
            }
        }
        r
    }
}
