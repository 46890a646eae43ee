//! The state the HTTP layers share, below both `server` (routing, auth, lifecycle) and `api`
//! (the request handlers): the model registry, the handlers' [`AppState`], request ids, the
//! stored `/v1/responses` answers and keep-alive parsing. It imports neither layer.

pub mod models;
pub mod responses;

use crate::engine::metrics::Metrics;
use anyhow::{bail, Context, Result};
use models::Models;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Arc;
use std::time::Duration;

/// Shared state of the handlers.
pub struct AppState {
    /// The models.
    pub models: Arc<Models>,
    /// Counters for `/metrics`.
    pub metrics: Arc<Metrics>,
    /// Bearer token, if required.
    pub api_key: Option<String>,
    /// Origins allowed to call from a browser (`*`: any); empty: CORS off.
    pub cors_origins: Vec<String>,
    /// Stored `/v1/responses` answers, for `previous_response_id` and retrieval.
    pub responses: responses::ResponseStore,
    /// Which addresses image URLs in requests may reach.
    pub image_urls: crate::turn::images::UrlPolicy,
    next_id: AtomicU64,
    /// Random per process (48 bits used), the first part of every request id.
    id_prefix: u64,
}

impl AppState {
    /// A fresh request id: this process's random prefix and a counter, so ids (and the
    /// completion ids made from them) do not repeat across restarts.
    pub fn request_id(&self) -> String {
        format!(
            "req-{:012x}{:x}",
            self.id_prefix,
            self.next_id.fetch_add(1, Relaxed)
        )
    }
}

/// Shared state as handlers take it.
pub type Shared = Arc<AppState>;

impl AppState {
    /// A fresh state over the models, with no stored responses and a random request-id prefix.
    pub fn new(
        models: Arc<Models>,
        metrics: Arc<Metrics>,
        api_key: Option<String>,
        cors_origins: Vec<String>,
    ) -> AppState {
        AppState {
            models,
            metrics,
            api_key,
            cors_origins,
            responses: responses::ResponseStore::default(),
            image_urls: crate::turn::images::UrlPolicy::default(),
            next_id: AtomicU64::new(1),
            id_prefix: random_u64() & 0xffff_ffff_ffff,
        }
    }
}

/// The request id, as handlers see it.
#[derive(Clone, Debug)]
pub struct RequestId(pub String);

/// A random number from the standard library's per-process hash keys (no RNG dependency).
pub(crate) fn random_u64() -> u64 {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u128(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos()),
    );
    h.finish()
}

/// Parses a keep-alive: a duration (`30s`, `5m`, `1h`, bare seconds), negative = forever.
pub fn parse_keep_alive(s: &str) -> Result<Option<Duration>> {
    let s = s.trim();
    let (num, unit) = match s.find(|c: char| c.is_ascii_alphabetic()) {
        Some(i) => (&s[..i], &s[i..]),
        None => (s, "s"),
    };
    let x: f64 = num
        .trim()
        .parse()
        .with_context(|| format!("bad keep-alive '{s}'"))?;
    if x < 0.0 {
        return Ok(None);
    }
    let secs = match unit {
        "ms" => x / 1000.0,
        "s" => x,
        "m" => x * 60.0,
        "h" => x * 3600.0,
        _ => bail!("bad keep-alive unit in '{s}' (ms, s, m, h)"),
    };
    Duration::try_from_secs_f64(secs)
        .map(Some)
        .map_err(|_| anyhow::anyhow!("keep-alive '{s}' is too long"))
}
