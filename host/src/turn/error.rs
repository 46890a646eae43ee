//! The one error type of a request, whatever surface it came in on: a status, a message, the
//! parameter it is about and a machine code. Each surface chooses the wire shape it is answered
//! in (`api::Shape`); `berth run` prints its message.

use axum::http::StatusCode;

/// An error in a request, answered to its client.
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
}

impl ApiError {
    /// A 400 about one parameter.
    pub fn param(param: &str, message: impl Into<String>) -> ApiError {
        ApiError {
            status: StatusCode::BAD_REQUEST,
            message: message.into(),
            param: Some(param.to_string()),
            code: None,
        }
    }

    /// An error with a status and message.
    pub fn new(status: StatusCode, message: impl Into<String>) -> ApiError {
        ApiError {
            status,
            message: message.into(),
            param: None,
            code: None,
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
}

impl std::fmt::Display for ApiError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for ApiError {}

/// A constraint error as a 400 naming the parameter.
impl From<crate::constraint::ParamError> for ApiError {
    fn from(e: crate::constraint::ParamError) -> ApiError {
        ApiError::param(&e.param, e.message)
    }
}
