//! The Berth host: everything but the model. It finds and loads model-family plugins, keeps the
//! model packs, tokenizes and renders chat templates, samples tokens and runs generation; later
//! layers parse model output, constrain decoding, schedule requests and serve HTTP. The `berth`
//! binary is a thin CLI over this library.

pub mod api;
pub mod bench;
pub mod chat;
pub mod cli;
pub mod constraint;
pub mod decoding;
pub mod embedding;
pub mod engine;
#[doc(hidden)]
pub mod fuzzing;
pub mod harmony;
pub mod image;
pub mod inspect;
pub mod models;
pub mod options;
pub mod pack;
pub mod packs;
pub mod perplexity;
pub mod plugins;
pub mod pull;
pub mod run;
pub mod sampling;
pub mod server;
pub mod state;
pub mod table;
pub mod template;
pub mod tokenizer;
pub mod turn;
