//! Entry points for the cargo-fuzz targets in `fuzz/` (not an API): each runs a request body
//! through the same steps the server takes before it needs a loaded model, so a fuzz target
//! reaches code that is private to the handlers without changing it.

use crate::api::pipeline::{check_fields, GenerationBody};
use crate::api::{anthropic, ollama, openai, responses};
use crate::decoding::DecodeOptions;
use crate::state::responses::ResponseStore;
use crate::turn::images::{self, UrlPolicy};
use crate::turn::{ApiError, ChatRequest, ImageSource, Prompt};
use futures_util::FutureExt;
use serde_json::{Map, Value};

/// The request bodies a fuzz target can feed, one per generating route.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Route {
    /// `POST /v1/chat/completions`.
    ChatCompletions,
    /// `POST /v1/completions`.
    Completions,
    /// `POST /v1/responses`.
    Responses,
    /// `POST /v1/messages`.
    AnthropicMessages,
    /// `POST /v1/messages/count_tokens`.
    AnthropicCountTokens,
    /// `POST /api/chat`.
    OllamaChat,
    /// `POST /api/generate`.
    OllamaGenerate,
}

/// The typed turn a route's handler builds from `body` before it looks the model up: the body
/// parsed into the route's serde type and validated, then converted over Berth's own defaults
/// (no pack's). Responses' item references and `previous_response_id` look in an empty store.
pub fn request_turn(route: Route, body: &[u8]) -> Result<ChatRequest, ApiError> {
    match route {
        Route::ChatCompletions => generation::<openai::ChatCompletionRequest>(body),
        Route::Completions => generation::<openai::CompletionRequest>(body),
        Route::AnthropicMessages => generation::<anthropic::MessagesRequest>(body),
        Route::AnthropicCountTokens => generation::<anthropic::CountRequest>(body),
        Route::OllamaChat => generation::<ollama::ChatRequest>(body),
        Route::OllamaGenerate => generation::<ollama::GenerateRequest>(body),
        Route::Responses => responses::check_turn(body, &ResponseStore::default()).map(|(turn, _)| turn),
    }
}

/// [`crate::api::pipeline::prepare`] without the model.
fn generation<T: GenerationBody>(body: &[u8]) -> Result<ChatRequest, ApiError> {
    let (mut request, json) = check_fields::<T>(body)?;
    request.turn(&json, &DecodeOptions::default())
}

/// The messages a chat turn's template is rendered with (no pack system prompt), as
/// [`crate::turn::Turn::build`] passes them, and the template's extra variables; `None` for a
/// raw prompt.
pub fn template_input(req: &ChatRequest) -> Option<(Vec<Value>, Map<String, Value>)> {
    match &req.prompt {
        Prompt::Chat(messages) => Some((crate::turn::template_json(messages), req.template_extra())),
        Prompt::Raw { .. } => None,
    }
}

/// The bytes of each inline (base64 or raw) image of a turn, as [`crate::turn::Turn::prepare`]
/// loads them; URL images are skipped (fuzzing fetches nothing).
pub fn inline_images(req: &ChatRequest) -> Vec<Result<Vec<u8>, ApiError>> {
    let refs: Vec<_> = match &req.prompt {
        Prompt::Chat(messages) => messages.iter().flat_map(|m| m.images().cloned()).collect(),
        Prompt::Raw { images, .. } => images.clone(),
    };
    refs.iter()
        .filter(|r| !matches!(r.source, ImageSource::Url(_)))
        .map(|r| {
            // An inline image never waits: the future is ready on its first poll.
            images::load(r, UrlPolicy::default())
                .now_or_never()
                .expect("an inline image loads without waiting")
                .map(|image| image.bytes)
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::turn::Role;
    use axum::http::StatusCode;

    const ROUTES: [(Route, &str); 7] = [
        (
            Route::ChatCompletions,
            r#"{"model": "m", "messages": [{"role": "user", "content": "hi"}]}"#,
        ),
        (Route::Completions, r#"{"model": "m", "prompt": "hi"}"#),
        (Route::Responses, r#"{"model": "m", "input": "hi"}"#),
        (
            Route::AnthropicMessages,
            r#"{"model": "m", "max_tokens": 8, "messages": [{"role": "user", "content": "hi"}]}"#,
        ),
        (
            Route::AnthropicCountTokens,
            r#"{"model": "m", "messages": [{"role": "user", "content": "hi"}]}"#,
        ),
        (
            Route::OllamaChat,
            r#"{"model": "m", "messages": [{"role": "user", "content": "hi"}]}"#,
        ),
        (Route::OllamaGenerate, r#"{"model": "m", "prompt": "hi"}"#),
    ];

    #[test]
    fn each_route_turns_a_good_body_into_its_turn_and_refuses_a_bad_one_with_a_400() {
        for (route, body) in ROUTES {
            let turn =
                request_turn(route, body.as_bytes()).unwrap_or_else(|e| panic!("{route:?}: {}", e.message));
            match template_input(&turn) {
                Some((messages, _)) => {
                    let last = messages.last().expect("a message");
                    assert_eq!(last["role"], Role::User.as_str(), "{route:?}");
                    // A string, or (Anthropic's) one text block.
                    let text = last["content"].as_str().or(last["content"][0]["text"].as_str());
                    assert_eq!(text, Some("hi"), "{route:?}");
                }
                None => assert_eq!(route, Route::Completions),
            }
            let e = request_turn(route, b"{\"model\": 1}").expect_err("a number for a model");
            assert_eq!(e.status, StatusCode::BAD_REQUEST, "{route:?}");
        }
    }

    #[test]
    fn inline_images_are_loaded_and_bad_base64_is_a_400() {
        let good = r#"{"model": "m", "prompt": "hi", "images": ["iVBORw0KGgo="]}"#;
        let turn = request_turn(Route::OllamaGenerate, good.as_bytes()).unwrap();
        let loaded = inline_images(&turn);
        assert_eq!(loaded.len(), 1);
        assert_eq!(loaded[0].as_ref().unwrap(), b"\x89PNG\r\n\x1a\n");
        let bad = r#"{"model": "m", "prompt": "hi", "images": ["not base64!"]}"#;
        let turn = request_turn(Route::OllamaGenerate, bad.as_bytes()).unwrap();
        let e = inline_images(&turn).remove(0).unwrap_err();
        assert_eq!(
            (e.status, e.param.as_deref()),
            (StatusCode::BAD_REQUEST, Some("images[0]"))
        );
    }
}
