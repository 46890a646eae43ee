//! The HTTP API shapes over the engine: OpenAI (`/v1/...`: chat completions, completions,
//! Responses, embeddings, models), Anthropic Messages (`/v1/messages`), Ollama (`/api/...`) and
//! llama-server's own routes (`/infill`, `/tokenize`, `/detokenize`). Handlers are plain async
//! functions; every client mistake becomes a 4xx in the API's own error shape, never a 500.

pub mod anthropic;
pub mod body;
pub mod embeddings;
pub mod llama_server;
pub mod logprobs;
pub mod messages;
pub mod ollama;
pub mod openai;
pub mod pipeline;
pub mod responses;
pub mod sampling;

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde_json::{json, Map, Value};

pub use crate::turn::ApiError;

/// The wire shape an error is answered in: each surface's own.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Shape {
    /// `{"error": {"message", "type", "param", "code"}}` (chat completions, completions, Responses).
    OpenAi,
    /// `{"type": "error", "error": {"type", "message"}}`.
    Anthropic,
    /// `{"error": "..."}`.
    Ollama,
}

impl Shape {
    /// The shape of the surface a path belongs to.
    pub fn of_path(path: &str) -> Shape {
        if path.starts_with("/v1/messages") {
            Shape::Anthropic
        } else if path.starts_with("/api/") {
            Shape::Ollama
        } else {
            Shape::OpenAi
        }
    }

    /// The error type of its body for a status.
    fn kind(self, status: StatusCode) -> &'static str {
        match (self, status.as_u16()) {
            (_, 401) => "authentication_error",
            (Shape::Anthropic, 403) => "permission_error",
            (_, 404) => "not_found_error",
            (Shape::Anthropic, 413) => "request_too_large",
            (_, 429) => "rate_limit_error",
            (Shape::Anthropic, 503 | 529) => "overloaded_error",
            (_, 400..=499) => "invalid_request_error",
            (Shape::Anthropic, _) => "api_error",
            _ => "server_error",
        }
    }

    /// The error answered in this shape.
    pub fn respond(self, e: ApiError) -> Response {
        let body = match self {
            Shape::Ollama => json!({ "error": e.message }),
            Shape::Anthropic => {
                // Anthropic's shape has no `param`: the message names it when it does not already.
                let message = match &e.param {
                    Some(p) if !e.message.contains(p.as_str()) => format!("{p}: {}", e.message),
                    _ => e.message.clone(),
                };
                json!({ "type": "error", "error": { "type": self.kind(e.status), "message": message } })
            }
            Shape::OpenAi => json!({ "error": {
                "message": e.message,
                "type": self.kind(e.status),
                "param": e.param,
                "code": e.code,
            }}),
        };
        let mut r = (e.status, axum::Json(body)).into_response();
        if e.status == StatusCode::SERVICE_UNAVAILABLE || e.status == StatusCode::TOO_MANY_REQUESTS {
            r.headers_mut()
                .insert("retry-after", axum::http::HeaderValue::from_static("1"));
        }
        r.extensions_mut().insert(Refusal {
            message: e.message,
            param: e.param,
            code: e.code,
        });
        r
    }
}

/// OpenAI's shape is the default: chat completions, completions, models and Responses use it.
impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        Shape::OpenAi.respond(self)
    }
}

/// An error answered in Anthropic's shape (the Messages API's handlers return it).
#[derive(Debug)]
pub struct AnthropicError(pub ApiError);

impl<E: Into<ApiError>> From<E> for AnthropicError {
    fn from(e: E) -> AnthropicError {
        AnthropicError(e.into())
    }
}

impl IntoResponse for AnthropicError {
    fn into_response(self) -> Response {
        Shape::Anthropic.respond(self.0)
    }
}

/// An error answered in Ollama's shape (the `/api/*` handlers return it).
#[derive(Debug)]
pub struct OllamaError(pub ApiError);

impl<E: Into<ApiError>> From<E> for OllamaError {
    fn from(e: E) -> OllamaError {
        OllamaError(e.into())
    }
}

impl IntoResponse for OllamaError {
    fn into_response(self) -> Response {
        Shape::Ollama.respond(self.0)
    }
}

/// Why a request was refused, kept on the error response for the server's log line (the client
/// gets the same in the body).
#[derive(Clone, Debug)]
pub struct Refusal {
    /// The error's message.
    pub message: String,
    /// The parameter it names, when there is one.
    pub param: Option<String>,
    /// Its machine code, when there is one.
    pub code: Option<&'static str>,
}

/// Parses a request body as a JSON object (400 for anything else).
pub fn parse_object(body: &[u8]) -> Result<Map<String, Value>, ApiError> {
    match serde_json::from_slice::<Value>(body) {
        Ok(Value::Object(m)) => Ok(m),
        Ok(_) => Err(ApiError::new(
            StatusCode::BAD_REQUEST,
            "the request body must be a JSON object",
        )),
        Err(e) => Err(ApiError::new(
            StatusCode::BAD_REQUEST,
            format!("the request body is not valid JSON: {e}"),
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_body_must_be_a_json_object() {
        assert!(parse_object(br#"{"a": null}"#).is_ok());
        for bad in [&b"[1]"[..], b"{", b"null", b"\"x\""] {
            let e = parse_object(bad).unwrap_err();
            assert_eq!(e.status, StatusCode::BAD_REQUEST);
        }
    }

    async fn answered(shape: Shape, e: ApiError) -> (u16, Value) {
        let r = shape.respond(e);
        let status = r.status().as_u16();
        let bytes = axum::body::to_bytes(r.into_body(), usize::MAX).await.unwrap();
        (status, serde_json::from_slice(&bytes).unwrap())
    }

    #[tokio::test]
    async fn each_surface_answers_an_error_in_its_own_shape() {
        let e = || ApiError::param("temperature", "must be at most 2");
        let (status, v) = answered(Shape::OpenAi, e()).await;
        assert_eq!(status, 400);
        assert_eq!(v["error"]["param"], "temperature");
        assert_eq!(v["error"]["type"], "invalid_request_error");
        let (_, v) = answered(Shape::Anthropic, e()).await;
        assert_eq!(v["type"], "error");
        assert_eq!(v["error"]["message"], "temperature: must be at most 2");
        let (_, v) = answered(Shape::Ollama, e()).await;
        assert_eq!(v, json!({"error": "must be at most 2"}));
        let (status, v) = answered(
            Shape::Anthropic,
            ApiError::new(StatusCode::SERVICE_UNAVAILABLE, "x"),
        )
        .await;
        assert_eq!(
            (status, v["error"]["type"].as_str()),
            (503, Some("overloaded_error"))
        );
        assert_eq!(Shape::of_path("/v1/messages/count_tokens"), Shape::Anthropic);
        assert_eq!(Shape::of_path("/api/chat"), Shape::Ollama);
        assert_eq!(Shape::of_path("/v1/responses"), Shape::OpenAi);
    }
}
