//! Fuzzes the request bodies of Anthropic's Messages API (`/v1/messages` and
//! `/v1/messages/count_tokens`): arbitrary bytes as the JSON body, each through the
//! route's serde types and conversion into the typed chat turn, then what the server does with
//! the turn before the model's weights matter (see `common/request.rs`). Nothing may panic, and
//! every refusal is a 4xx.

#![no_main]

use berth::fuzzing::Route;
use libfuzzer_sys::fuzz_target;

#[path = "common/request.rs"]
mod request;

fuzz_target!(|data: &[u8]| request::check(&[Route::AnthropicMessages, Route::AnthropicCountTokens], data));
