//! Fuzzes the request bodies of Ollama's chat and generate (`/api/chat`, `/api/generate`): arbitrary bytes as the JSON body, each through the
//! route's serde types and conversion into the typed chat turn, then what the server does with
//! the turn before the model's weights matter (see `common/request.rs`). Nothing may panic, and
//! every refusal is a 4xx.

#![no_main]

use berth::fuzzing::Route;
use libfuzzer_sys::fuzz_target;

#[path = "common/request.rs"]
mod request;

fuzz_target!(|data: &[u8]| request::check(&[Route::OllamaChat, Route::OllamaGenerate], data));
