//! The Berth host: everything but the model. It finds and loads model-family plugins, keeps the
//! model packs, and (in later layers) renders chat templates, parses model output, constrains
//! and samples tokens, schedules requests and serves HTTP. The `berth` binary is a thin CLI over
//! this library.

pub mod cli;
pub mod models;
pub mod packs;
pub mod plugins;
pub mod template;
pub mod tokenizer;
