//! `berth serve` and `berth ps` options: flags, then `BERTH_*` environment variables, then an
//! optional `berth.toml` (`--config`, else `$BERTH_HOME/berth.toml`), then defaults.

use super::models::ModelsConfig;
use super::ServeConfig;
use anyhow::{bail, Context, Result};
use serde::Deserialize;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// Default address: loopback only.
pub const DEFAULT_HOST: &str = "127.0.0.1";
/// Default port (Ollama's 11434 plus one, so both can run side by side).
pub const DEFAULT_PORT: u16 = 11435;

/// Flags of `berth serve`.
#[derive(clap::Args, Debug, Clone, Default)]
pub struct ServeArgs {
    /// Address to bind (default 127.0.0.1).
    #[arg(long, env = "BERTH_HOST")]
    pub host: Option<String>,
    /// Port to bind (default 11435; 0 picks a free one and prints it).
    #[arg(long, env = "BERTH_PORT")]
    pub port: Option<u16>,
    /// Require `Authorization: Bearer KEY` (or `x-api-key: KEY`) on every API route.
    #[arg(long, env = "BERTH_API_KEY")]
    pub api_key: Option<String>,
    /// Let browser pages from this origin call the API (CORS); repeatable, `*` for any origin.
    /// Pages from loopback origins (localhost, 127.0.0.1, [::1], any port) and desktop-app
    /// origins (app://, file://, tauri://, vscode-webview://) are always allowed, as Ollama
    /// allows them. BERTH_CORS_ORIGINS takes a comma-separated list.
    #[arg(long = "cors-origin", env = "BERTH_CORS_ORIGINS", value_delimiter = ',')]
    pub cors_origin: Vec<String>,
    /// Sequences decoded at once per model (default 8).
    #[arg(long, env = "BERTH_PARALLEL")]
    pub parallel: Option<usize>,
    /// Requests that may wait per model before 429 (default 64).
    #[arg(long, env = "BERTH_QUEUE")]
    pub queue: Option<usize>,
    /// How long an idle model stays loaded: 5m, 30s, 1h, -1 (forever), 0 (unload at once).
    #[arg(long, env = "BERTH_KEEP_ALIVE")]
    pub keep_alive: Option<String>,
    /// Most models loaded at once; the least recently used is unloaded (default 2).
    #[arg(long, env = "BERTH_MAX_LOADED_MODELS")]
    pub max_loaded_models: Option<usize>,
    /// Context of a request that does not ask for one (`num_ctx`), capped by the model's (default
    /// 8192).
    #[arg(long, env = "BERTH_CONTEXT")]
    pub context: Option<u32>,
    /// Compute threads per model (default: all cores, or BERTH_THREADS).
    #[arg(long, env = "BERTH_THREADS")]
    pub threads: Option<u32>,
    /// Largest request body in bytes (default 32 MiB).
    #[arg(long, env = "BERTH_MAX_BODY")]
    pub max_body: Option<usize>,
    /// Log format: text or json.
    #[arg(long, env = "BERTH_LOG_FORMAT", value_parser = ["text", "json"])]
    pub log_format: Option<String>,
    /// Let image URLs in requests name loopback, private and link-local addresses (refused by
    /// default, so a request cannot make the server fetch from its own network).
    #[arg(long, env = "BERTH_ALLOW_PRIVATE_IMAGE_URLS")]
    pub allow_private_image_urls: bool,
    /// Prompt-lookup speculation for greedy requests: on (the default) or off.
    #[arg(long, env = "BERTH_SPECULATION", value_parser = crate::engine::speculation::parse_setting)]
    pub speculation: Option<bool>,
    /// A berth.toml (default `$BERTH_HOME/berth.toml` when it exists).
    #[arg(long, env = "BERTH_CONFIG")]
    pub config: Option<PathBuf>,
}

/// `berth.toml`: the same settings as the flags.
#[derive(Deserialize, Debug, Default)]
#[serde(deny_unknown_fields)]
struct FileConfig {
    host: Option<String>,
    port: Option<u16>,
    api_key: Option<String>,
    cors_origins: Option<Vec<String>>,
    parallel: Option<usize>,
    queue: Option<usize>,
    keep_alive: Option<toml::Value>,
    max_loaded_models: Option<usize>,
    context: Option<u32>,
    threads: Option<u32>,
    max_body: Option<usize>,
    log_format: Option<String>,
    allow_private_image_urls: Option<bool>,
    speculation: Option<toml::Value>,
}

pub use crate::state::parse_keep_alive;

/// Checks CORS origins: `*` or `scheme://host[:port]` without a path; trailing slashes dropped.
fn cors_origins(list: Vec<String>) -> Result<Vec<String>> {
    let mut out = Vec::new();
    for o in list {
        let o = o.trim().trim_end_matches('/').to_string();
        if o.is_empty() {
            continue;
        }
        let valid = o == "*"
            || o.split_once("://")
                .is_some_and(|(scheme, rest)| !scheme.is_empty() && !rest.is_empty() && !rest.contains('/'));
        if !valid {
            bail!("--cors-origin '{o}' is not an origin: use scheme://host[:port], or * for any");
        }
        out.push(o);
    }
    Ok(out)
}

/// The full server configuration from flags, env, file and defaults.
pub fn resolve(args: ServeArgs, home: &Path) -> Result<ServeConfig> {
    let path = args
        .config
        .clone()
        .or_else(|| Some(home.join("berth.toml")).filter(|p| p.is_file()));
    let file: FileConfig = match &path {
        Some(p) => {
            let text = std::fs::read_to_string(p).with_context(|| format!("reading {}", p.display()))?;
            toml::from_str(&text).with_context(|| format!("parsing {}", p.display()))?
        }
        None => FileConfig::default(),
    };
    let keep_alive = match (args.keep_alive, file.keep_alive) {
        (Some(s), _) => parse_keep_alive(&s)?,
        (None, Some(toml::Value::String(s))) => parse_keep_alive(&s)?,
        (None, Some(toml::Value::Integer(i))) => parse_keep_alive(&i.to_string())?,
        (None, Some(v)) => bail!("keep_alive in berth.toml must be a string or a number, not {v}"),
        (None, None) => Some(Duration::from_secs(300)),
    };
    let speculation = match (args.speculation, file.speculation) {
        (Some(on), _) => on,
        (None, Some(toml::Value::Boolean(on))) => on,
        (None, Some(toml::Value::String(s))) => {
            crate::engine::speculation::parse_setting(&s).map_err(|e| anyhow::anyhow!("berth.toml: {e}"))?
        }
        (None, Some(v)) => bail!("speculation in berth.toml must be \"on\", \"off\" or a boolean, not {v}"),
        (None, None) => true,
    };
    let log_format = args
        .log_format
        .or(file.log_format)
        .unwrap_or_else(|| "text".into());
    Ok(ServeConfig {
        host: args.host.or(file.host).unwrap_or_else(|| DEFAULT_HOST.into()),
        port: args.port.or(file.port).unwrap_or(DEFAULT_PORT),
        home: home.to_path_buf(),
        api_key: args.api_key.or(file.api_key).filter(|k| !k.is_empty()),
        cors_origins: cors_origins(if args.cors_origin.is_empty() {
            file.cors_origins.unwrap_or_default()
        } else {
            args.cors_origin
        })?,
        max_body: args.max_body.or(file.max_body).unwrap_or(32 << 20),
        log_json: log_format == "json",
        allow_private_image_urls: args.allow_private_image_urls
            || file.allow_private_image_urls == Some(true),
        models: ModelsConfig {
            home: home.to_path_buf(),
            slots: args.parallel.or(file.parallel).unwrap_or(8).max(1),
            queue: args.queue.or(file.queue).unwrap_or(64),
            keep_alive,
            max_loaded: args
                .max_loaded_models
                .or(file.max_loaded_models)
                .unwrap_or(2)
                .max(1),
            context: args.context.or(file.context).unwrap_or(8192).max(16),
            threads: args.threads.or(file.threads),
            speculation,
        },
    })
}

/// `berth ps`: the models a running server holds (asks `GET /api/ps`, with the API key if one
/// is given).
pub fn ps(json: bool, api_key: Option<&str>) -> Result<()> {
    let v = ask_server("/api/ps", None, api_key)?;
    if json {
        println!("{}", serde_json::to_string_pretty(&v)?);
        return Ok(());
    }
    println!(
        "{:<32} {:>10} {:>8} {:>8}  UNTIL",
        "NAME", "SIZE", "QUEUED", "ACTIVE"
    );
    for m in v["models"].as_array().into_iter().flatten() {
        println!(
            "{:<32} {:>10} {:>8} {:>8}  {}",
            m["name"].as_str().unwrap_or(""),
            berth_registry::format::human_size(m["size"].as_u64().unwrap_or(0)),
            m["queued"].as_u64().unwrap_or(0),
            m["active"].as_u64().unwrap_or(0),
            m["expires_at"].as_str().unwrap_or("forever"),
        );
    }
    Ok(())
}

/// `berth stop NAME`: unloads a model from a running server, as `ollama stop` does, with an
/// Ollama `keep_alive: 0` request without a prompt (the model is not loaded for it).
pub fn stop(name: &str, api_key: Option<&str>) -> Result<()> {
    let body = serde_json::json!({"model": name, "keep_alive": 0});
    ask_server("/api/generate", Some(body), api_key).with_context(|| format!("stopping '{name}'"))?;
    Ok(())
}

/// Asks the local server (`BERTH_HOST`, `BERTH_PORT`) for `path`: a GET, or a POST of `body`;
/// its JSON answer, or an error that says why (no server, a refused key, the server's message).
fn ask_server(
    path: &str,
    body: Option<serde_json::Value>,
    api_key: Option<&str>,
) -> Result<serde_json::Value> {
    let host = std::env::var("BERTH_HOST").unwrap_or_else(|_| DEFAULT_HOST.into());
    let port = std::env::var("BERTH_PORT")
        .ok()
        .and_then(|p| p.parse().ok())
        .unwrap_or(DEFAULT_PORT);
    // A server bound to every interface is reached on loopback.
    let host = match host.as_str() {
        "0.0.0.0" => DEFAULT_HOST.to_string(),
        "::" | "[::]" => "[::1]".to_string(),
        h if h.contains(':') && !h.starts_with('[') => format!("[{h}]"),
        _ => host,
    };
    let url = format!("http://{host}:{port}{path}");
    // The server is local (or named by BERTH_HOST): a proxy from the environment would only be
    // in the way.
    let client = reqwest::blocking::Client::builder()
        .no_proxy()
        .timeout(Duration::from_secs(10))
        .build()
        .context("building the HTTP client")?;
    let mut req = match body {
        Some(b) => client
            .post(&url)
            .header("content-type", "application/json")
            .body(b.to_string()),
        None => client.get(&url),
    };
    if let Some(k) = api_key.filter(|k| !k.is_empty()) {
        req = req.bearer_auth(k);
    }
    let resp = req.send().map_err(|e| {
        if e.is_connect() {
            anyhow::anyhow!("no berth server at {host}:{port} (start one with `berth serve`)")
        } else {
            anyhow::Error::new(e).context(format!("asking {url}"))
        }
    })?;
    let status = resp.status();
    let body = resp
        .text()
        .with_context(|| format!("reading the answer of {url}"))?;
    if status == reqwest::StatusCode::UNAUTHORIZED {
        bail!(
            "the server refused: {status} ({}); set BERTH_API_KEY (or --api-key) to the server's key",
            error_message(&body)
        );
    }
    if !status.is_success() {
        bail!("the server answered {status}: {}", error_message(&body));
    }
    serde_json::from_str(body.trim()).with_context(|| format!("the server's {path} answer is not JSON"))
}

/// The message of an error body: Ollama's `{"error": "..."}`, OpenAI's
/// `{"error": {"message": "..."}}`, or the text itself (cut short) from something else on the port.
fn error_message(body: &str) -> String {
    let v: serde_json::Value = serde_json::from_str(body).unwrap_or_default();
    let e = &v["error"];
    if let Some(m) = e.as_str().or_else(|| e["message"].as_str()) {
        return m.to_string();
    }
    let text = body.trim();
    match text.char_indices().nth(200) {
        Some((cut, _)) => format!("{}...", &text[..cut]),
        None if text.is_empty() => "no message".to_string(),
        None => text.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keep_alive_takes_durations_seconds_and_negative_for_forever() {
        assert_eq!(parse_keep_alive("5m").unwrap(), Some(Duration::from_secs(300)));
        assert_eq!(parse_keep_alive("30").unwrap(), Some(Duration::from_secs(30)));
        assert_eq!(parse_keep_alive("0").unwrap(), Some(Duration::ZERO));
        assert_eq!(parse_keep_alive("1h").unwrap(), Some(Duration::from_secs(3600)));
        assert_eq!(parse_keep_alive("-1").unwrap(), None);
        assert!(parse_keep_alive("5 parsecs").is_err());
    }

    #[test]
    fn flags_override_the_file_which_overrides_defaults() {
        let home = tempfile::tempdir().unwrap();
        std::fs::write(
            home.path().join("berth.toml"),
            "port = 9000\nparallel = 3\nkeep_alive = \"-1\"\n",
        )
        .unwrap();
        let cfg = resolve(
            ServeArgs {
                port: Some(9001),
                ..Default::default()
            },
            home.path(),
        )
        .unwrap();
        assert_eq!((cfg.host.as_str(), cfg.port), (DEFAULT_HOST, 9001));
        assert_eq!(cfg.models.slots, 3);
        assert_eq!(cfg.models.keep_alive, None);
        std::fs::write(home.path().join("berth.toml"), "prot = 1\n").unwrap();
        assert!(resolve(ServeArgs::default(), home.path()).is_err());
    }

    #[test]
    fn speculation_is_on_unless_a_flag_the_environment_or_the_file_turns_it_off() {
        let home = tempfile::tempdir().unwrap();
        let on = resolve(ServeArgs::default(), home.path()).unwrap();
        assert!(on.models.speculation, "on by default");
        let off = ServeArgs {
            speculation: Some(false),
            ..Default::default()
        };
        assert!(!resolve(off, home.path()).unwrap().models.speculation);
        for (file, want) in [
            ("speculation = \"off\"\n", false),
            ("speculation = false\n", false),
            ("speculation = \"on\"\n", true),
        ] {
            std::fs::write(home.path().join("berth.toml"), file).unwrap();
            assert_eq!(
                resolve(ServeArgs::default(), home.path())
                    .unwrap()
                    .models
                    .speculation,
                want,
                "{file}"
            );
        }
        std::fs::write(home.path().join("berth.toml"), "speculation = \"sometimes\"\n").unwrap();
        assert!(resolve(ServeArgs::default(), home.path()).is_err());
        use crate::engine::speculation::parse_setting;
        assert_eq!(
            (parse_setting("on"), parse_setting("OFF"), parse_setting("1")),
            (Ok(true), Ok(false), Ok(true))
        );
        assert!(parse_setting("maybe").is_err());
    }

    #[test]
    fn error_messages_come_from_either_error_shape_or_the_text() {
        assert_eq!(error_message(r#"{"error":"bad key"}"#), "bad key");
        assert_eq!(error_message(r#"{"error":{"message":"bad key"}}"#), "bad key");
        assert_eq!(error_message("  oops\n"), "oops");
        assert_eq!(error_message(""), "no message");
        assert_eq!(error_message(&"x".repeat(300)), format!("{}...", "x".repeat(200)));
    }
}
