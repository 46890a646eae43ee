//! The HTTP API shapes: OpenAI (`/v1/...`) and Ollama (`/api/...`) requests and responses over
//! the engine. Handlers are plain async functions; every client mistake becomes a 4xx in the
//! API's own error shape, never a 500.

pub mod anthropic;
pub mod body;
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

/// Typed access to a request's fields; `null` and absence both mean unset.
pub struct Fields<'a> {
    map: &'a Map<String, Value>,
    prefix: &'a str,
}

impl<'a> Fields<'a> {
    /// Fields of a JSON object; `prefix` names it in errors (`options.`).
    pub fn new(map: &'a Map<String, Value>, prefix: &'a str) -> Fields<'a> {
        Fields { map, prefix }
    }

    fn name(&self, key: &str) -> String {
        format!("{}{key}", self.prefix)
    }

    /// The whole object.
    pub fn map(&self) -> &'a Map<String, Value> {
        self.map
    }

    /// The raw value, `None` for absent or null.
    pub fn raw(&self, key: &str) -> Option<&'a Value> {
        self.map.get(key).filter(|v| !v.is_null())
    }

    /// Rejects keys outside `allowed`, as OpenAI does.
    pub fn only(&self, allowed: &[&str]) -> Result<(), ApiError> {
        match self.map.keys().find(|k| !allowed.contains(&k.as_str())) {
            Some(k) => Err(ApiError::param(
                &self.name(k),
                format!("Unrecognized request argument supplied: {k}"),
            )),
            None => Ok(()),
        }
    }

    /// A string.
    pub fn str(&self, key: &str) -> Result<Option<&'a str>, ApiError> {
        match self.raw(key) {
            None => Ok(None),
            Some(Value::String(s)) => Ok(Some(s)),
            Some(v) => Err(self.wrong(key, "a string", v)),
        }
    }

    /// A required string.
    pub fn required_str(&self, key: &str) -> Result<&'a str, ApiError> {
        self.str(key)?
            .ok_or_else(|| ApiError::param(&self.name(key), format!("'{}' is required", self.name(key))))
    }

    /// A boolean.
    pub fn bool(&self, key: &str) -> Result<Option<bool>, ApiError> {
        match self.raw(key) {
            None => Ok(None),
            Some(Value::Bool(b)) => Ok(Some(*b)),
            Some(v) => Err(self.wrong(key, "a boolean", v)),
        }
    }

    /// A number within `[lo, hi]`.
    pub fn num(&self, key: &str, lo: f64, hi: f64) -> Result<Option<f64>, ApiError> {
        match self.raw(key) {
            None => Ok(None),
            Some(Value::Number(n)) => {
                let x = n.as_f64().unwrap_or(f64::NAN);
                if !(lo..=hi).contains(&x) {
                    return Err(ApiError::param(
                        &self.name(key),
                        format!("'{}' must be between {lo} and {hi}; got {x}", self.name(key)),
                    ));
                }
                Ok(Some(x))
            }
            Some(v) => Err(self.wrong(key, "a number", v)),
        }
    }

    /// A whole number within `[lo, hi]`.
    pub fn int(&self, key: &str, lo: i64, hi: i64) -> Result<Option<i64>, ApiError> {
        match self.raw(key) {
            None => Ok(None),
            Some(Value::Number(n)) => {
                let x = n
                    .as_i64()
                    .or_else(|| {
                        n.as_f64()
                            .filter(|f| f.fract() == 0.0 && f.abs() < 9e15)
                            .map(|f| f as i64)
                    })
                    .ok_or_else(|| self.wrong(key, "an integer", &Value::Number(n.clone())))?;
                if !(lo..=hi).contains(&x) {
                    return Err(ApiError::param(
                        &self.name(key),
                        format!("'{}' must be between {lo} and {hi}; got {x}", self.name(key)),
                    ));
                }
                Ok(Some(x))
            }
            Some(v) => Err(self.wrong(key, "an integer", v)),
        }
    }

    /// An object.
    pub fn object(&self, key: &str) -> Result<Option<&'a Map<String, Value>>, ApiError> {
        match self.raw(key) {
            None => Ok(None),
            Some(Value::Object(m)) => Ok(Some(m)),
            Some(v) => Err(self.wrong(key, "an object", v)),
        }
    }

    /// An array.
    pub fn array(&self, key: &str) -> Result<Option<&'a Vec<Value>>, ApiError> {
        match self.raw(key) {
            None => Ok(None),
            Some(Value::Array(a)) => Ok(Some(a)),
            Some(v) => Err(self.wrong(key, "an array", v)),
        }
    }

    fn wrong(&self, key: &str, what: &str, v: &Value) -> ApiError {
        let got = match v {
            Value::Null => "null",
            Value::Bool(_) => "a boolean",
            Value::Number(_) => "a number",
            Value::String(_) => "a string",
            Value::Array(_) => "an array",
            Value::Object(_) => "an object",
        };
        ApiError::param(
            &self.name(key),
            format!("'{}' must be {what}; got {got}", self.name(key)),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn null_is_unset_and_wrong_types_name_the_parameter() {
        let m = parse_object(br#"{"a": null, "t": "hot", "n": 2.0, "stop": ["x", 1]}"#).unwrap();
        let f = Fields::new(&m, "");
        assert_eq!(f.num("a", 0.0, 1.0).unwrap(), None);
        let e = f.num("t", 0.0, 2.0).unwrap_err();
        assert_eq!(
            (e.status, e.param.as_deref()),
            (StatusCode::BAD_REQUEST, Some("t"))
        );
        assert_eq!(f.int("n", 0, 5).unwrap(), Some(2));
        assert!(f.int("n", 3, 5).is_err());
        assert!(f.only(&["a", "t", "n"]).is_err());
        assert!(parse_object(b"[1]").is_err() && parse_object(b"{").is_err());
    }
}
