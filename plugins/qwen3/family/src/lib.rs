//! The Qwen family's weight maps that another plugin shares: Qwen3.5's config and weight map
//! ([`qwen35`]), used by the qwen3 plugin and by MiniCPM-V 4.6's language model.
//!
//! A library crate beside the qwen3 plugin crate rather than inside it: a plugin crate exports
//! the plugin entry points (`berth_plugin_entry_v1`, `berth_plugin_manifest`), so linking it into
//! another plugin defines them twice. A cargo feature cannot gate that export, because a build of
//! the whole workspace unifies features: the qwen3 crate is compiled once, with its entry points,
//! for both plugins.

#![warn(missing_docs)]

pub mod qwen35;
