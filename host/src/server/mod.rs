//! `berth serve`: configuration, the HTTP router (the OpenAI API: chat completions, completions,
//! Responses, embeddings and models under `/v1` and the root; Anthropic's Messages API
//! `/v1/messages`; the Ollama API `/api/*`; llama-server's `/infill`, `/tokenize` and
//! `/detokenize`; `/health` and `/metrics`), bearer-token auth, request ids, the store watcher
//! and graceful shutdown.

pub mod config;

/// The model registry, which lives in [`crate::state`] (re-exported for existing paths).
pub use crate::state::models;
pub use crate::state::{AppState, RequestId, Shared};

use crate::api::{self, ApiError, Shape};
use crate::engine::metrics::Metrics;
use anyhow::{Context, Result};
use axum::body::HttpBody;
use axum::extract::{DefaultBodyLimit, Request, State};
use axum::http::header::{ACCESS_CONTROL_REQUEST_METHOD, ORIGIN};
use axum::http::{HeaderName, HeaderValue, Method, StatusCode};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::Router;
use models::{Models, ModelsConfig};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;
use tower::ServiceExt;
use tower_http::cors::{AllowHeaders, AllowOrigin, CorsLayer};

/// Everything `berth serve` is configured with (flags, env vars, `berth.toml`).
#[derive(Clone, Debug)]
pub struct ServeConfig {
    /// Address to bind.
    pub host: String,
    /// Port to bind.
    pub port: u16,
    /// Berth home.
    pub home: PathBuf,
    /// Bearer token required on every API route, if set.
    pub api_key: Option<String>,
    /// Origins whose browser pages may call the API (`*`: any); empty: CORS off.
    pub cors_origins: Vec<String>,
    /// Model loading and scheduling.
    pub models: ModelsConfig,
    /// Largest request body in bytes.
    pub max_body: usize,
    /// Logs as JSON lines.
    pub log_json: bool,
    /// Image URLs may name loopback, private and link-local addresses.
    pub allow_private_image_urls: bool,
}

/// The router over a state, behind CORS: pages from loopback and desktop-app origins always
/// ([`default_origin`]), others when `cors_origins` names them.
pub fn router(state: Shared, max_body: usize) -> Router {
    let api = routes(state.clone(), max_body);
    cors(state, api)
}

/// Every route behind auth, request ids and the body limit, without CORS.
fn routes(state: Shared, max_body: usize) -> Router {
    Router::new()
        .route("/", get(running))
        .route("/health", get(health))
        .route("/metrics", get(metrics))
        .merge(openai_routes("/v1"))
        .merge(openai_routes(""))
        .route("/v1/messages", post(api::anthropic::messages))
        .route("/v1/messages/count_tokens", post(api::anthropic::count_tokens))
        .route("/api/chat", post(api::ollama::chat))
        .route("/api/generate", post(api::ollama::generate))
        .route("/api/embed", post(api::embeddings::ollama_embed))
        .route("/api/embeddings", post(api::embeddings::ollama_embeddings))
        .route("/api/tags", get(api::ollama::tags))
        .route("/api/show", post(api::ollama::show))
        .route("/api/ps", get(api::ollama::ps))
        .route("/api/version", get(api::ollama::version))
        .route("/api/delete", axum::routing::delete(api::ollama::delete))
        .route("/api/copy", post(api::ollama::copy))
        .route("/api/pull", post(api::ollama::pull))
        .route("/api/create", post(api::ollama::create))
        .route("/infill", post(api::llama_server::infill))
        .route("/tokenize", post(api::llama_server::tokenize))
        .route("/detokenize", post(api::llama_server::detokenize))
        .method_not_allowed_fallback(method_not_allowed)
        .fallback(not_found)
        .layer(middleware::from_fn_with_state(state.clone(), guard))
        .layer(DefaultBodyLimit::max(max_body))
        .with_state(state)
}

/// The OpenAI routes under `prefix`: `/v1`, and the root as well, as llama-server serves them,
/// for clients whose `base_url` is the server's root (llama.cpp's own tests of the `openai`
/// package, editor plugins). Anthropic's `/v1/messages` and Ollama's `/api/*` have no alias.
fn openai_routes(prefix: &str) -> Router<Shared> {
    Router::new()
        .route(&format!("{prefix}/models"), get(api::openai::list_models))
        .route(&format!("{prefix}/models/{{*id}}"), get(api::openai::get_model))
        .route(
            &format!("{prefix}/chat/completions"),
            post(api::openai::chat_completions),
        )
        .route(&format!("{prefix}/completions"), post(api::openai::completions))
        .route(&format!("{prefix}/embeddings"), post(api::embeddings::openai))
        .route(&format!("{prefix}/responses"), post(api::responses::create))
        .route(
            &format!("{prefix}/responses/{{id}}"),
            get(api::responses::retrieve).delete(api::responses::delete),
        )
}

async fn not_found(uri: axum::http::Uri) -> Response {
    Shape::of_path(uri.path()).respond(ApiError::new(StatusCode::NOT_FOUND, "no such route"))
}

/// A known route called with a method it does not serve: 405 in the route's API shape.
async fn method_not_allowed(method: axum::http::Method, uri: axum::http::Uri) -> Response {
    let message = format!("{} does not serve {method}", uri.path());
    Shape::of_path(uri.path()).respond(ApiError::new(StatusCode::METHOD_NOT_ALLOWED, message))
}

/// Whether CORS allows a page from `origin`: one of Ollama's default origins, or one configured
/// (`*` allows any; origins compare case-insensitively, as browsers may send the host in any case).
fn origin_allowed(allowed: &[String], origin: &HeaderValue) -> bool {
    let Ok(o) = origin.to_str() else { return false };
    default_origin(o) || allowed.iter().any(|a| a == "*" || a.eq_ignore_ascii_case(o))
}

/// Whether an origin is allowed without configuration, as Ollama allows it: a page served from
/// this machine (`http(s)://localhost`, `127.0.0.1`, `0.0.0.0` or `[::1]`, any port), or a
/// desktop app's or editor's web view (`app:`, `file:`, `tauri:`, `vscode-webview:`, `vscode-file:`).
fn default_origin(origin: &str) -> bool {
    let o = origin.to_ascii_lowercase();
    let Some((scheme, rest)) = o.split_once("://") else {
        return false;
    };
    match scheme {
        "http" | "https" => {
            let host = match rest.rsplit_once(':') {
                // `[::1]` has colons of its own: a port follows its closing bracket.
                Some((h, port))
                    if !port.is_empty() && port.bytes().all(|b| b.is_ascii_digit()) && !h.ends_with(':') =>
                {
                    h
                }
                _ => rest,
            };
            matches!(host, "localhost" | "127.0.0.1" | "0.0.0.0" | "[::1]")
        }
        "app" | "file" | "tauri" | "vscode-webview" | "vscode-file" => true,
        _ => false,
    }
}

/// A CORS preflight: an `OPTIONS` naming the method the page means to send.
fn is_preflight(req: &Request) -> bool {
    req.method() == Method::OPTIONS && req.headers().contains_key(ACCESS_CONTROL_REQUEST_METHOD)
}

/// `api` behind tower-http's [`CorsLayer`] for `st.cors_origins`. Preflights from allowed origins
/// are answered before authentication (browsers send no credentials on them); every other
/// `OPTIONS` skips the layer, because it answers all of them itself, and a page from another
/// origin must get what a request without CORS gets (a 401 without a key).
fn cors(st: Shared, api: Router) -> Router {
    let allowed = st.cors_origins.clone();
    let allow_origin = if allowed.iter().any(|a| a == "*") {
        AllowOrigin::any()
    } else {
        let allowed = allowed.clone();
        AllowOrigin::predicate(move |o, _| origin_allowed(&allowed, o))
    };
    let layer = CorsLayer::new()
        .allow_origin(allow_origin)
        .allow_methods([Method::GET, Method::POST, Method::DELETE, Method::OPTIONS])
        .allow_headers(AllowHeaders::mirror_request())
        .expose_headers([HeaderName::from_static("x-request-id")])
        .max_age(Duration::from_secs(600));
    let with_cors = api
        .clone()
        .layer(layer)
        .layer(middleware::from_fn_with_state(st, preflight_answered));
    Router::new().fallback_service(tower::service_fn(move |req: Request| {
        let cors_applies = req.method() != Method::OPTIONS
            || is_preflight(&req)
                && req
                    .headers()
                    .get(ORIGIN)
                    .is_some_and(|o| origin_allowed(&allowed, o));
        let to = if cors_applies { &with_cors } else { &api };
        to.clone().oneshot(req)
    }))
}

/// A preflight [`CorsLayer`] answered: 204 (it says 200; there is no content), counted in the
/// metrics like any request.
async fn preflight_answered(State(st): State<Shared>, req: Request, next: Next) -> Response {
    if !is_preflight(&req) {
        return next.run(req).await;
    }
    let label = route_label(&req);
    let mut resp = next.run(req).await;
    *resp.status_mut() = StatusCode::NO_CONTENT;
    st.metrics.request(&label, 204);
    resp
}

/// Compares two secrets in time that depends only on their lengths, not on where they differ.
fn same_secret(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// Whether a request carries the API key: `Authorization: Bearer KEY` (OpenAI, Ollama) or
/// `x-api-key: KEY` (Anthropic's clients).
fn has_key(req: &Request, key: &str) -> bool {
    let h = req.headers();
    let bearer = h
        .get("authorization")
        .and_then(|v| v.to_str().ok())
        // The scheme name is case-insensitive (RFC 9110 §11.1): `bearer KEY` is as good.
        .and_then(|v| {
            v.get(..7)
                .filter(|p| p.eq_ignore_ascii_case("bearer "))
                .map(|_| &v[7..])
        })
        .is_some_and(|k| same_secret(k.as_bytes(), key.as_bytes()));
    bearer
        || h.get("x-api-key")
            .is_some_and(|k| same_secret(k.as_bytes(), key.as_bytes()))
}

/// Auth, request ids in logs, and per-route status counts (CORS is [`cors`]'s, outside it).
async fn guard(State(st): State<Shared>, req: Request, next: Next) -> Response {
    let path = req.uri().path().to_string();
    let id = st.request_id();
    // `/` is open as Ollama's is: clients probe it to find the server before they have a key.
    let open = matches!(path.as_str(), "/" | "/health" | "/metrics");
    match (&st.api_key, open) {
        (Some(key), false) if !has_key(&req, key) => {
            st.metrics.request(&route_label(&req), 401);
            let mut e = ApiError::new(
                StatusCode::UNAUTHORIZED,
                "a valid API key is required (Authorization: Bearer ..., or x-api-key)",
            );
            e.code = Some("invalid_api_key");
            let span = request_span(&id, req.method(), &path);
            answered(
                &span,
                Shape::of_path(&path).respond(e),
                std::time::Instant::now(),
                &id,
            )
            .await
        }
        _ => answer(&st, req, next, &path, &id).await,
    }
}

/// Runs an admitted request: its id in the logs and the response, its status in the metrics.
/// The models it gets stay held ([`models::Holds`]) until its response body has been sent or
/// dropped, so their keep-alive starts when the request ends (a stream included).
async fn answer(st: &AppState, req: Request, next: Next, path: &str, id: &str) -> Response {
    let label = route_label(&req);
    let mut req = req;
    req.extensions_mut().insert(RequestId(id.to_string()));
    let span = request_span(id, req.method(), path);
    let started = std::time::Instant::now();
    let holds = models::Holds::default();
    let resp = {
        let _g = span.enter();
        tracing::debug!("received");
        drop(_g);
        holds.scope(next.run(req)).await
    };
    st.metrics.request(&label, resp.status().as_u16());
    let resp = answered(&span, resp, started, id).await;
    // A body of known size is complete: the request has ended. A stream holds its models until
    // it ends or its client goes away (the body is dropped either way).
    if holds.is_empty() || resp.body().size_hint().exact().is_some() {
        return resp;
    }
    resp.map(|b| {
        let held = futures_util::StreamExt::map(b.into_data_stream(), move |chunk| {
            let _ = &holds;
            chunk
        });
        axum::body::Body::from_stream(held)
    })
}

/// The span of one request's log lines: its id (the `x-request-id` the client gets), method
/// and path.
fn request_span(id: &str, method: &axum::http::Method, path: &str) -> tracing::Span {
    tracing::info_span!("request", id = %id, %method, path = %path)
}

/// Longest refusal reason logged (a longer one is cut).
const MAX_REASON: usize = 1000;

/// Logs a request's answer (`answered`, with the reason of an error: its message, parameter and
/// code, never the request body) and gives the response its `x-request-id`.
async fn answered(
    span: &tracing::Span,
    mut resp: Response,
    started: std::time::Instant,
    id: &str,
) -> Response {
    let status = resp.status().as_u16();
    let ms = started.elapsed().as_millis() as u64;
    if status >= 400 {
        let refusal = match resp.extensions().get::<api::Refusal>() {
            Some(r) => r.clone(),
            None => {
                // Not an `ApiError` (an extractor's rejection): its short text body says why.
                let (parts, body) = resp.into_parts();
                let small = body.size_hint().exact().is_some_and(|n| n <= MAX_REASON as u64);
                let (text, body) = if small {
                    match axum::body::to_bytes(body, MAX_REASON).await {
                        Ok(b) => (
                            String::from_utf8_lossy(&b).trim().to_string(),
                            axum::body::Body::from(b),
                        ),
                        Err(_) => (String::new(), axum::body::Body::empty()),
                    }
                } else {
                    (String::new(), body)
                };
                resp = Response::from_parts(parts, body);
                let message = if text.is_empty() {
                    resp.status().canonical_reason().unwrap_or("refused").to_string()
                } else {
                    text
                };
                api::Refusal {
                    message,
                    param: None,
                    code: None,
                }
            }
        };
        let mut reason = refusal.message;
        if reason.len() > MAX_REASON {
            let mut cut = MAX_REASON;
            while !reason.is_char_boundary(cut) {
                cut -= 1;
            }
            reason.truncate(cut);
            reason.push_str("...");
        }
        tracing::info!(parent: span, status, ms, reason = reason.as_str(), param = refusal.param.as_deref(),
            code = refusal.code, "answered");
    } else {
        tracing::info!(parent: span, status, ms, "answered");
    }
    if let Ok(v) = HeaderValue::from_str(id) {
        resp.headers_mut().insert("x-request-id", v);
    }
    resp
}

/// The metrics label of a request: its route pattern (`/v1/responses/{id}`), or `unmatched`
/// for a path no route serves (so odd URLs cannot grow the label set).
fn route_label(req: &Request) -> String {
    match req.extensions().get::<axum::extract::MatchedPath>() {
        Some(m) if m.as_str().starts_with("/v1/models/") => "/v1/models/{id}".into(),
        Some(m) if m.as_str().starts_with("/models/") => "/models/{id}".into(),
        Some(m) => m.as_str().to_string(),
        None => "unmatched".into(),
    }
}

/// `GET /` and `HEAD /`: clients probe it, as they probe Ollama's "Ollama is running".
async fn running() -> &'static str {
    "Berth is running"
}

async fn health(State(st): State<Shared>) -> Response {
    let body = if st.models.is_loading() {
        serde_json::json!({"status": "loading"})
    } else {
        serde_json::json!({"status": "ok"})
    };
    axum::Json(body).into_response()
}

async fn metrics(State(st): State<Shared>) -> Response {
    (
        [("content-type", "text/plain; version=0.0.4")],
        st.metrics.render(),
    )
        .into_response()
}

/// Runs the server until SIGTERM or Ctrl-C; running streams finish first.
pub fn serve(cfg: ServeConfig) -> Result<()> {
    init_logs(cfg.log_json);
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .context("starting the async runtime")?;
    rt.block_on(async move {
        let metrics = Arc::new(Metrics::default());
        let models = Arc::new(Models::new(cfg.models.clone(), metrics.clone()));
        let mut state = AppState::new(
            models.clone(),
            metrics,
            cfg.api_key.clone(),
            cfg.cors_origins.clone(),
        );
        state.image_urls = crate::turn::images::UrlPolicy {
            allow_private: cfg.allow_private_image_urls,
        };
        let state = Arc::new(state);
        let addr = format!("{}:{}", cfg.host, cfg.port);
        let listener = tokio::net::TcpListener::bind(&addr)
            .await
            .with_context(|| format!("binding {addr}"))?;
        let local = listener.local_addr()?;
        tracing::info!(address = %local, home = %cfg.home.display(), "berth serve listening");
        // Printed for scripts and tests that bind port 0.
        println!("berth serve listening on http://{local}");
        let watcher = {
            let models = models.clone();
            tokio::spawn(async move {
                loop {
                    tokio::time::sleep(Duration::from_millis(500)).await;
                    let m = models.clone();
                    let _ = tokio::task::spawn_blocking(move || m.tick()).await;
                }
            })
        };
        axum::serve(listener, router(state, cfg.max_body))
            .with_graceful_shutdown(shutdown_signal())
            .await
            .context("serving")?;
        watcher.abort();
        tracing::info!("shutting down: waiting for running requests");
        let m = models.clone();
        let _ = tokio::task::spawn_blocking(move || m.shutdown()).await;
        Ok(())
    })
}

async fn shutdown_signal() {
    let ctrl_c = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    #[cfg(unix)]
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    #[cfg(not(unix))]
    let term = std::future::pending::<()>();
    tokio::select! {
        _ = ctrl_c => {},
        _ = term => {},
    }
    tracing::info!("signal received: finishing running streams");
}

fn init_logs(json: bool) {
    let filter = tracing_subscriber::EnvFilter::try_from_env("BERTH_LOG")
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let b = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .with_writer(std::io::stderr);
    let _ = if json { b.json().try_init() } else { b.try_init() };
}

#[cfg(test)]
mod tests {
    use super::{default_origin, same_secret};

    #[test]
    fn loopback_and_app_origins_are_allowed_by_default_as_ollama_allows_them() {
        for o in [
            "http://localhost",
            "http://localhost:3000",
            "https://127.0.0.1:8443",
            "http://0.0.0.0:80",
            "http://[::1]:5173",
            "http://[::1]",
            "HTTP://LocalHost:1",
            "app://obsidian.md",
            "tauri://localhost",
            "vscode-webview://abc123",
            "file://",
        ] {
            assert!(default_origin(o), "{o}");
        }
        for o in [
            "http://localhost.evil.example",
            "http://evil.example",
            "http://127.0.0.2",
            "http://localhost:",
            "http://localhost:80a",
            "https://[::2]:1",
            "null",
            "chrome-extension://abc",
        ] {
            assert!(!default_origin(o), "{o}");
        }
    }
    use crate::state::random_u64;

    #[test]
    fn secrets_compare_whole_and_process_prefixes_differ() {
        assert!(same_secret(b"key-123", b"key-123"));
        assert!(!same_secret(b"key-123", b"key-124"));
        assert!(!same_secret(b"key-123", b"key-1234"));
        assert!(!same_secret(b"", b"x"));
        assert_ne!(random_u64(), random_u64());
    }
}
