//! The Ollama API: `/api/chat`, `/api/generate` (NDJSON streams), `/api/tags`, `/api/show`,
//! `/api/ps`, `/api/version`, `/api/delete`, `/api/copy`, `/api/pull`.

use super::ApiError;
use crate::server::Shared;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::Response;

fn todo_route() -> ApiError {
    ApiError::new(StatusCode::NOT_IMPLEMENTED, "not implemented yet").for_ollama()
}

/// `POST /api/chat`.
pub async fn chat(State(_st): State<Shared>) -> Result<Response, ApiError> {
    Err(todo_route())
}
/// `POST /api/generate`.
pub async fn generate(State(_st): State<Shared>) -> Result<Response, ApiError> {
    Err(todo_route())
}
/// `GET /api/tags`.
pub async fn tags(State(_st): State<Shared>) -> Result<Response, ApiError> {
    Err(todo_route())
}
/// `POST /api/show`.
pub async fn show(State(_st): State<Shared>) -> Result<Response, ApiError> {
    Err(todo_route())
}
/// `GET /api/ps`.
pub async fn ps(State(_st): State<Shared>) -> Result<Response, ApiError> {
    Err(todo_route())
}
/// `GET /api/version`.
pub async fn version() -> Result<Response, ApiError> {
    Err(todo_route())
}
/// `DELETE /api/delete`.
pub async fn delete(State(_st): State<Shared>) -> Result<Response, ApiError> {
    Err(todo_route())
}
/// `POST /api/copy`.
pub async fn copy(State(_st): State<Shared>) -> Result<Response, ApiError> {
    Err(todo_route())
}
/// `POST /api/pull`.
pub async fn pull(State(_st): State<Shared>) -> Result<Response, ApiError> {
    Err(todo_route())
}
