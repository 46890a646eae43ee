//! The HTTP API shapes: OpenAI (`/v1/...`) and Ollama (`/api/...`) requests and responses over
//! the engine. Handlers are plain async functions; every client mistake becomes a 4xx in the
//! API's own error shape, never a 500.

pub mod anthropic;
pub mod body;
pub mod images;
pub mod logprobs;
pub mod messages;
pub mod ollama;
pub mod openai;
pub mod pipeline;
pub mod responses;

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde_json::{json, Map, Value};

/// An error answered to the client.
#[derive(Debug, Clone)]
pub struct ApiError {
    /// HTTP status.
    pub status: StatusCode,
    /// Human-readable message.
    pub message: String,
    /// The offending parameter, when there is one.
    pub param: Option<String>,
    /// A short machine code (`model_not_found`, ...).
    pub code: Option<&'static str>,
    /// Answer in Ollama's shape `{"error": "..."}` instead of OpenAI's.
    pub ollama: bool,
    /// Answer in Anthropic's shape `{"type": "error", "error": {"type", "message"}}`.
    pub anthropic: bool,
}

impl ApiError {
    /// A 400 about one parameter.
    pub fn param(param: &str, message: impl Into<String>) -> ApiError {
        ApiError {
            status: StatusCode::BAD_REQUEST,
            message: message.into(),
            param: Some(param.to_string()),
            code: None,
            ollama: false,
            anthropic: false,
        }
    }

    /// An error with a status and message.
    pub fn new(status: StatusCode, message: impl Into<String>) -> ApiError {
        ApiError {
            status,
            message: message.into(),
            param: None,
            code: None,
            ollama: false,
            anthropic: false,
        }
    }

    /// A 404 for a model the store does not have.
    pub fn model_not_found(model: &str) -> ApiError {
        ApiError {
            code: Some("model_not_found"),
            param: Some("model".into()),
            ..ApiError::new(
                StatusCode::NOT_FOUND,
                format!("The model '{model}' does not exist or you do not have access to it."),
            )
        }
    }

    /// The same error in Ollama's shape.
    pub fn for_ollama(mut self) -> ApiError {
        self.ollama = true;
        self
    }

    /// The same error in Anthropic's shape.
    pub fn for_anthropic(mut self) -> ApiError {
        self.anthropic = true;
        self
    }

    /// Anthropic's error type for the status.
    fn anthropic_kind(&self) -> &'static str {
        match self.status.as_u16() {
            401 => "authentication_error",
            403 => "permission_error",
            404 => "not_found_error",
            413 => "request_too_large",
            429 => "rate_limit_error",
            503 | 529 => "overloaded_error",
            400..=499 => "invalid_request_error",
            _ => "api_error",
        }
    }

    fn kind(&self) -> &'static str {
        match self.status.as_u16() {
            401 => "authentication_error",
            404 => "not_found_error",
            429 => "rate_limit_error",
            400..=499 => "invalid_request_error",
            _ => "server_error",
        }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let refusal = Refusal {
            message: self.message.clone(),
            param: self.param.clone(),
            code: self.code,
        };
        let body = if self.ollama {
            json!({ "error": self.message })
        } else if self.anthropic {
            // Anthropic's shape has no `param`: the message names it when it does not already.
            let message = match &self.param {
                Some(p) if !self.message.contains(p.as_str()) => format!("{p}: {}", self.message),
                _ => self.message.clone(),
            };
            json!({ "type": "error", "error": { "type": self.anthropic_kind(), "message": message } })
        } else {
            json!({ "error": {
                "message": self.message,
                "type": self.kind(),
                "param": self.param,
                "code": self.code,
            }})
        };
        let mut r = (self.status, axum::Json(body)).into_response();
        if self.status == StatusCode::SERVICE_UNAVAILABLE || self.status == StatusCode::TOO_MANY_REQUESTS {
            r.headers_mut()
                .insert("retry-after", axum::http::HeaderValue::from_static("1"));
        }
        r.extensions_mut().insert(refusal);
        r
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
