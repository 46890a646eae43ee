//! `berth pull` from the hubs people use: Hugging Face (`hf.co/OWNER/REPO[:QUANT]`) and Ollama
//! registries (`ollama.com/library/NAME:TAG`, `HOST[:PORT]/NAMESPACE/NAME:TAG`), next to the
//! packs catalog ([`crate::pull`]) for every other name.
//!
//! Every file is fetched by [`crate::download`] (resumable, split into parallel parts, checked
//! against its published digest) into `<cache>/blobs`, then imported through the [`Store`],
//! which builds the pack in its own temporary folder and renames it into place: a pull that
//! fails or is interrupted leaves the store as it was. A pack already in the store is reported
//! as such and not fetched again.

use std::fs;
use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::download::Downloader;
use crate::pack::{sanitize_name, PackRef};
use crate::pull::{load_catalog, Phase, Progress, PullError, PullOptions};
use crate::store::{PackEntry, Store};

/// The Hugging Face endpoint used when `HF_ENDPOINT` is unset.
pub const DEFAULT_HF_ENDPOINT: &str = "https://huggingface.co";
/// The Ollama registry behind `ollama.com/...` names when `BERTH_OLLAMA_REGISTRY` is unset.
pub const DEFAULT_OLLAMA_REGISTRY: &str = "https://registry.ollama.ai";
/// The quant picked from a GGUF repository when none is named (Ollama's choice too).
pub const DEFAULT_QUANT: &str = "Q4_K_M";
/// Host names that mean Hugging Face.
const HF_HOSTS: &[&str] = &["hf.co", "huggingface.co", "www.huggingface.co"];
/// Host names that mean the public Ollama registry.
const OLLAMA_HOSTS: &[&str] = &["ollama.com", "www.ollama.com", "registry.ollama.ai"];

/// Everything a pull needs: the catalog's options plus the hubs' endpoints and the download policy.
#[derive(Debug, Clone)]
pub struct HubOptions {
    /// The packs catalog's PyPI index and the cache root (`<cache>/blobs` holds hub downloads).
    pub catalog: PullOptions,
    /// The Hugging Face endpoint (`HF_ENDPOINT`).
    pub hf_endpoint: String,
    /// The Hugging Face token sent as `Authorization: Bearer` (`HF_TOKEN`).
    pub hf_token: Option<String>,
    /// The registry `ollama.com/...` names are fetched from (`BERTH_OLLAMA_REGISTRY`).
    pub ollama_registry: String,
    /// The most parts one file is split into and fetched concurrently.
    pub parallel_parts: usize,
    /// The smallest part worth its own connection, in bytes.
    pub part_size: u64,
    /// Retries per part after a dropped connection or a server error.
    pub retries: u32,
    /// The pause before the first retry (doubled for each further one).
    pub retry_delay: Duration,
    /// How long a request may wait for the next bytes before it counts as dropped.
    pub read_timeout: Duration,
}

impl HubOptions {
    /// Options from the environment (see [`HubOptions::from_lookup`]).
    pub fn from_env() -> HubOptions {
        HubOptions::from_lookup(|k| std::env::var(k).ok())
    }

    /// Options from variables looked up by name: `HF_ENDPOINT`, `HF_TOKEN` (else the token file
    /// `huggingface_hub` writes: `HF_TOKEN_PATH`, `$HF_HOME/token`, `~/.cache/huggingface/token`),
    /// `BERTH_OLLAMA_REGISTRY`, `BERTH_PULL_PARTS`, plus the catalog's `BERTH_PYPI_URL` and `BERTH_CACHE`.
    pub fn from_lookup(get: impl Fn(&str) -> Option<String>) -> HubOptions {
        let var = |k: &str| get(k).map(|v| v.trim().to_string()).filter(|v| !v.is_empty());
        let home = var("HOME").map_or_else(|| PathBuf::from("."), PathBuf::from);
        let cache = var("BERTH_CACHE").map_or_else(|| home.join(".cache").join("berth"), PathBuf::from);
        let hf_token = var("HF_TOKEN").or_else(|| {
            let path = var("HF_TOKEN_PATH").map(PathBuf::from).unwrap_or_else(|| {
                var("HF_HOME")
                    .map_or_else(|| home.join(".cache").join("huggingface"), PathBuf::from)
                    .join("token")
            });
            fs::read_to_string(path)
                .ok()
                .map(|t| t.trim().to_string())
                .filter(|t| !t.is_empty())
        });
        HubOptions {
            catalog: PullOptions {
                index: var("BERTH_PYPI_URL")
                    .unwrap_or_else(|| crate::pull::DEFAULT_INDEX.to_string())
                    .trim_end_matches('/')
                    .to_string(),
                cache,
            },
            hf_endpoint: var("HF_ENDPOINT")
                .unwrap_or_else(|| DEFAULT_HF_ENDPOINT.to_string())
                .trim_end_matches('/')
                .to_string(),
            hf_token,
            ollama_registry: var("BERTH_OLLAMA_REGISTRY")
                .unwrap_or_else(|| DEFAULT_OLLAMA_REGISTRY.to_string())
                .trim_end_matches('/')
                .to_string(),
            parallel_parts: var("BERTH_PULL_PARTS")
                .and_then(|v| v.parse().ok())
                .filter(|&n| n > 0)
                .unwrap_or(4),
            part_size: 64 << 20,
            retries: 3,
            retry_delay: Duration::from_millis(500),
            read_timeout: Duration::from_secs(60),
        }
    }

    /// A downloader into `<cache>/blobs` with this policy and an optional `Authorization` value.
    pub(crate) fn downloader(&self, authorization: Option<String>) -> Result<Downloader, PullError> {
        Ok(Downloader {
            client: self.client()?,
            authorization,
            blobs: self.catalog.cache.join("blobs"),
            parallel_parts: self.parallel_parts,
            part_size: self.part_size,
            retries: self.retries,
            retry_delay: self.retry_delay,
        })
    }

    /// The HTTP client: Berth's user agent, redirects followed, `read_timeout` per wait.
    pub(crate) fn client(&self) -> Result<reqwest::blocking::Client, PullError> {
        reqwest::blocking::Client::builder()
            .user_agent(concat!("berth/", env!("CARGO_PKG_VERSION")))
            .connect_timeout(Duration::from_secs(30))
            .timeout(self.read_timeout)
            .build()
            .map_err(|e| PullError::Http {
                url: String::new(),
                message: e.to_string(),
            })
    }
}

/// A name on a hub.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HubRef {
    /// A Hugging Face model repository.
    HuggingFace {
        /// The owner (user or organisation).
        owner: String,
        /// The repository name.
        repo: String,
        /// The quant asked for (`Q4_K_M`), if any.
        quant: Option<String>,
    },
    /// A model in an Ollama (OCI distribution) registry.
    Ollama {
        /// The registry's base URL, `https://registry.ollama.ai`.
        registry: String,
        /// The namespace (`library` for official models).
        namespace: String,
        /// The model name.
        name: String,
        /// The tag.
        tag: String,
    },
}

impl HubRef {
    /// The hub reference `reference` names, `None` for a catalog name (no host in front), or an
    /// error for a hub name that is malformed.
    pub fn parse(reference: &str, opts: &HubOptions) -> Option<Result<HubRef, PullError>> {
        let trimmed = reference.trim();
        let (scheme, rest) = match trimmed.split_once("://") {
            Some((s, r)) if s == "http" || s == "https" => (Some(s), r),
            _ => (None, trimmed),
        };
        let (host, path) = rest.split_once('/')?;
        // A host starts with a letter, digit or `[` (IPv6), so `../x` stays a (missing) store name.
        let hostname = host.starts_with(|c: char| c.is_ascii_alphanumeric() || c == '[')
            && host
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '-' | ':' | '[' | ']'));
        let host_like = hostname && (host.contains('.') || host.contains(':') || host == "localhost");
        if !host_like && scheme.is_none() {
            return None;
        }
        let err = |message: String| PullError::Hub {
            reference: reference.to_string(),
            message,
        };
        let host_lower = host.to_ascii_lowercase();
        let (path, tag) = match path.rsplit_once(':') {
            Some((p, t)) => (p, Some(t)),
            None => (path, None),
        };
        let segments: Vec<&str> = path.split('/').collect();
        let bad = segments.iter().copied().chain(tag).find(|s| !is_name_part(s));
        if let Some(bad) = bad {
            return Some(Err(err(format!(
                "{bad:?} is not a valid name part (letters, digits, '.', '_', '-')"
            ))));
        }
        if HF_HOSTS.contains(&host_lower.as_str()) {
            let [owner, repo] = segments.as_slice() else {
                return Some(Err(err("write hf.co/OWNER/REPO[:QUANT]".into())));
            };
            return Some(Ok(HubRef::HuggingFace {
                owner: owner.to_string(),
                repo: repo.to_string(),
                // `:latest` is what a bare name means, as in Ollama's `hf.co` names.
                quant: tag
                    .filter(|t| !t.eq_ignore_ascii_case(crate::pack::DEFAULT_TAG))
                    .map(str::to_string),
            }));
        }
        let (namespace, name) = match segments.as_slice() {
            [name] => ("library", *name),
            [ns, name] => (*ns, *name),
            _ => return Some(Err(err("write HOST/[NAMESPACE/]NAME[:TAG]".into()))),
        };
        let registry = if OLLAMA_HOSTS.contains(&host_lower.as_str()) && scheme.is_none() {
            opts.ollama_registry.clone()
        } else {
            let loopback = ["localhost", "127.0.0.1", "[::1]"]
                .iter()
                .any(|h| host_lower == *h || host_lower.starts_with(&format!("{h}:")));
            let scheme = scheme.unwrap_or(if loopback { "http" } else { "https" });
            format!("{scheme}://{host}")
        };
        Some(Ok(HubRef::Ollama {
            registry,
            namespace: namespace.to_string(),
            name: name.to_string(),
            tag: tag.unwrap_or(crate::pack::DEFAULT_TAG).to_string(),
        }))
    }

    /// The store reference the pull is imported as: `owner/repo:quant` (`latest` without a quant)
    /// for Hugging Face, `name:tag` for Ollama's `library`, `namespace/name:tag` otherwise.
    pub fn local_ref(&self) -> Result<PackRef, PullError> {
        let (name, tag) = match self {
            HubRef::HuggingFace { owner, repo, quant } => (
                format!("{}/{}", sanitize_name(owner), sanitize_name(repo)),
                quant
                    .as_deref()
                    .map_or_else(|| "latest".to_string(), sanitize_name),
            ),
            HubRef::Ollama {
                namespace, name, tag, ..
            } => {
                let name = if namespace == "library" {
                    sanitize_name(name)
                } else {
                    format!("{}/{}", sanitize_name(namespace), sanitize_name(name))
                };
                (name, sanitize_name(tag))
            }
        };
        PackRef::new(&name, &tag).map_err(|e| PullError::Hub {
            reference: self.to_string(),
            message: e.to_string(),
        })
    }
}

impl std::fmt::Display for HubRef {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            HubRef::HuggingFace { owner, repo, quant } => {
                write!(f, "hf.co/{owner}/{repo}")?;
                match quant {
                    Some(q) => write!(f, ":{q}"),
                    None => Ok(()),
                }
            }
            HubRef::Ollama {
                registry,
                namespace,
                name,
                tag,
            } => {
                let host = registry.split_once("://").map_or(registry.as_str(), |(_, h)| h);
                write!(f, "{host}/{namespace}/{name}:{tag}")
            }
        }
    }
}

fn is_name_part(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 128
        && s.starts_with(|c: char| c.is_ascii_alphanumeric())
        && s.chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-'))
}

/// What a pull did.
#[derive(Debug, Clone)]
pub enum PullOutcome {
    /// The pack was fetched and imported.
    Pulled(PackEntry),
    /// The pack was already in the store; nothing was fetched.
    AlreadyInstalled(PackEntry),
}

impl PullOutcome {
    /// The pack in the store.
    pub fn entry(&self) -> &PackEntry {
        match self {
            PullOutcome::Pulled(e) | PullOutcome::AlreadyInstalled(e) => e,
        }
    }
}

/// The installed, healthy pack at `r`, if any.
fn installed(store: &Store, r: &PackRef) -> Option<PackEntry> {
    store
        .get(&r.to_string())
        .ok()
        .filter(|e| e.is_ok() && e.manifest.is_some())
}

/// Pulls any reference: a hub name ([`HubRef::parse`]) or a packs-catalog name (`BERTH_CATALOG`).
pub fn pull_reference(
    store: &Store,
    reference: &str,
    opts: &HubOptions,
    progress: &mut dyn FnMut(&Progress),
) -> Result<PullOutcome, PullError> {
    match HubRef::parse(reference, opts) {
        Some(hub) => pull_hub(store, &hub?, opts, progress),
        None => {
            let catalog = load_catalog()?;
            if let Some(entry) = catalog.find(reference) {
                if let Some(found) = PackRef::parse(&entry.name)
                    .ok()
                    .and_then(|r| installed(store, &r))
                {
                    return Ok(PullOutcome::AlreadyInstalled(found));
                }
            }
            crate::pull::pull(store, &catalog, reference, &opts.catalog, progress).map(PullOutcome::Pulled)
        }
    }
}

/// The store name a hub reference is kept under (`hf.co/o/r:Q4_K_M` -> `o/r:q4_k_m`), so a model
/// can be run and served by the name it was pulled with; `None` for a name that is not a hub's.
pub fn local_name(reference: &str) -> Option<String> {
    let opts = HubOptions::from_lookup(|_| None);
    match HubRef::parse(reference, &opts)? {
        Ok(hub) => hub.local_ref().ok().map(|r| r.to_string()),
        Err(_) => None,
    }
}

/// Pulls a hub reference into the store, or reports the pack already there.
pub fn pull_hub(
    store: &Store,
    hub: &HubRef,
    opts: &HubOptions,
    progress: &mut dyn FnMut(&Progress),
) -> Result<PullOutcome, PullError> {
    let local = hub.local_ref()?;
    if let Some(found) = installed(store, &local) {
        return Ok(PullOutcome::AlreadyInstalled(found));
    }
    emit(progress, Phase::Manifest);
    let entry = match hub {
        HubRef::HuggingFace { owner, repo, quant } => crate::hub_hf::pull(
            store,
            &crate::hub_hf::Repo {
                reference: hub.to_string(),
                id: format!("{owner}/{repo}"),
                quant: quant.clone(),
            },
            &local,
            opts,
            progress,
        )?,
        HubRef::Ollama {
            registry,
            namespace,
            name,
            tag,
        } => crate::hub_ollama::pull(
            store,
            &crate::hub_ollama::Model {
                reference: hub.to_string(),
                registry: registry.clone(),
                repository: format!("{namespace}/{name}"),
                tag: tag.clone(),
            },
            &local,
            opts,
            progress,
        )?,
    };
    emit(progress, Phase::Success);
    Ok(PullOutcome::Pulled(entry))
}

/// Reports a phase without byte counts.
pub(crate) fn emit(progress: &mut dyn FnMut(&Progress), phase: Phase) {
    progress(&Progress {
        phase,
        completed: 0,
        total: 0,
    })
}

/// Fetches files one after another (each split into parallel parts), reporting each as a part.
pub(crate) fn fetch_all(
    downloader: &Downloader,
    blobs: &[crate::download::Blob],
    progress: &mut dyn FnMut(&Progress),
) -> Result<Vec<PathBuf>, PullError> {
    let count = blobs.len();
    let mut paths = Vec::with_capacity(count);
    for (index, blob) in blobs.iter().enumerate() {
        let phase = Phase::Part {
            index,
            count,
            package: blob.name.clone(),
            digest: blob.digest.hex().to_string(),
        };
        let path = downloader.fetch(blob, &mut |completed, total| {
            progress(&Progress {
                phase: phase.clone(),
                completed,
                total,
            })
        })?;
        paths.push(path);
    }
    emit(progress, Phase::Verifying);
    Ok(paths)
}

/// A folder under `<store home>/tmp` (same filesystem as the store, so files hard-link), removed on drop.
pub(crate) struct Scratch {
    /// The folder.
    pub dir: PathBuf,
}

impl Scratch {
    /// Creates a fresh scratch folder for `store`.
    pub fn new(store: &Store) -> Result<Scratch, PullError> {
        static COUNTER: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
        let n = COUNTER.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos());
        let dir = store
            .home()
            .join("tmp")
            .join(format!("pull-{}-{nanos}-{n}", std::process::id()));
        fs::create_dir_all(&dir).map_err(|source| PullError::Io {
            path: dir.clone(),
            source,
        })?;
        Ok(Scratch { dir })
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = fs::remove_dir_all(&self.dir);
    }
}

/// Hard-links `src` to `dst` (copying when linking fails, e.g. across filesystems).
pub(crate) fn link_or_copy(src: &Path, dst: &Path) -> Result<(), PullError> {
    if let Some(parent) = dst.parent() {
        fs::create_dir_all(parent).map_err(|source| PullError::Io {
            path: parent.to_path_buf(),
            source,
        })?;
    }
    if fs::hard_link(src, dst).is_ok() {
        return Ok(());
    }
    fs::copy(src, dst).map(|_| ()).map_err(|source| PullError::Io {
        path: src.to_path_buf(),
        source,
    })
}

/// An HTTP error for a response status, with a hint for the statuses that have one.
pub(crate) fn status_error(url: &str, status: reqwest::StatusCode, hint: &str) -> PullError {
    let mut message = format!("HTTP status {status}");
    if !hint.is_empty() {
        message.push_str(" (");
        message.push_str(hint);
        message.push(')');
    }
    PullError::Http {
        url: url.to_string(),
        message,
    }
}

/// A request error as a one-line [`PullError::Http`].
pub(crate) fn request_error(url: &str, e: &reqwest::Error) -> PullError {
    PullError::Http {
        url: url.to_string(),
        message: crate::download::error_chain(e),
    }
}

/// Percent-encodes a repository path for a URL, keeping `/` between its segments.
pub(crate) fn encode_path(path: &str) -> String {
    let mut out = String::new();
    for b in path.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~' | b'/') {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn opts() -> HubOptions {
        HubOptions::from_lookup(|k| match k {
            "HOME" => Some("/h".into()),
            "BERTH_OLLAMA_REGISTRY" => Some("http://127.0.0.1:1/".into()),
            _ => None,
        })
    }

    fn parse(s: &str) -> Option<HubRef> {
        HubRef::parse(s, &opts()).map(|r| r.unwrap())
    }

    #[test]
    fn hub_names_parse_and_catalog_names_do_not() {
        assert_eq!(parse("qwen2.5-coder:0.5b"), None);
        assert_eq!(parse("ns/name:tag"), None);
        // Traversal and path-like names are not hub names: the store refuses them as it always did.
        for not_hub in ["../../etc/passwd", "./x/y", "/etc/passwd", "a b.c/x"] {
            assert!(HubRef::parse(not_hub, &opts()).is_none(), "{not_hub}");
        }
        assert_eq!(
            parse("hf.co/Qwen/Qwen2.5-0.5B-Instruct-GGUF:Q4_K_M"),
            Some(HubRef::HuggingFace {
                owner: "Qwen".into(),
                repo: "Qwen2.5-0.5B-Instruct-GGUF".into(),
                quant: Some("Q4_K_M".into()),
            })
        );
        assert_eq!(parse("hf.co/a/b:latest"), parse("hf.co/a/b"));
        assert_eq!(
            parse("huggingface.co/a/b"),
            Some(HubRef::HuggingFace {
                owner: "a".into(),
                repo: "b".into(),
                quant: None
            })
        );
        assert_eq!(
            parse("ollama.com/library/qwen3:0.6b"),
            Some(HubRef::Ollama {
                registry: "http://127.0.0.1:1".into(),
                namespace: "library".into(),
                name: "qwen3".into(),
                tag: "0.6b".into(),
            })
        );
        assert_eq!(
            parse("localhost:5000/me/tiny"),
            Some(HubRef::Ollama {
                registry: "http://localhost:5000".into(),
                namespace: "me".into(),
                name: "tiny".into(),
                tag: "latest".into(),
            })
        );
        let Some(HubRef::Ollama { registry, .. }) = parse("registry.example.com/x:1") else {
            panic!()
        };
        assert_eq!(registry, "https://registry.example.com");
        for bad in [
            "hf.co/onlyowner",
            "hf.co/a/b/c",
            "hf.co/a/b:bad tag",
            "ollama.com/a/b/c:1",
        ] {
            assert!(
                matches!(HubRef::parse(bad, &opts()), Some(Err(PullError::Hub { .. }))),
                "{bad}"
            );
        }
    }

    #[test]
    fn local_references_follow_the_store_rules() {
        let r = parse("hf.co/Qwen/Qwen2.5-0.5B-Instruct-GGUF:Q4_K_M").unwrap();
        assert_eq!(
            r.local_ref().unwrap().to_string(),
            "qwen/qwen2.5-0.5b-instruct-gguf:q4_k_m"
        );
        assert_eq!(
            parse("hf.co/a/b").unwrap().local_ref().unwrap().to_string(),
            "a/b:latest"
        );
        assert_eq!(
            parse("ollama.com/library/qwen3:0.6b")
                .unwrap()
                .local_ref()
                .unwrap()
                .to_string(),
            "qwen3:0.6b"
        );
        assert_eq!(
            parse("127.0.0.1:9/me/tiny:Q8")
                .unwrap()
                .local_ref()
                .unwrap()
                .to_string(),
            "me/tiny:q8"
        );
        assert_eq!(
            parse("127.0.0.1:9/me/tiny:Q8").unwrap().to_string(),
            "127.0.0.1:9/me/tiny:Q8"
        );
    }

    #[test]
    fn options_come_from_the_environment_names() {
        let o = HubOptions::from_lookup(|k| match k {
            "HF_ENDPOINT" => Some("http://mirror.local/".into()),
            "HF_TOKEN" => Some(" hf_x ".into()),
            "BERTH_CACHE" => Some("/c".into()),
            "BERTH_PULL_PARTS" => Some("8".into()),
            _ => None,
        });
        assert_eq!(o.hf_endpoint, "http://mirror.local");
        assert_eq!(o.hf_token.as_deref(), Some("hf_x"));
        assert_eq!(o.catalog.cache, PathBuf::from("/c"));
        assert_eq!(o.ollama_registry, DEFAULT_OLLAMA_REGISTRY);
        assert_eq!(o.parallel_parts, 8);
        let dir = tempfile::tempdir().unwrap();
        fs::write(dir.path().join("token"), "hf_file\n").unwrap();
        let home = dir.path().to_string_lossy().into_owned();
        let o = HubOptions::from_lookup(|k| (k == "HF_HOME").then(|| home.clone()));
        assert_eq!(o.hf_token.as_deref(), Some("hf_file"));
        assert_eq!(o.hf_endpoint, DEFAULT_HF_ENDPOINT);
    }

    #[test]
    fn repository_paths_are_percent_encoded_by_segment() {
        assert_eq!(encode_path("dir/a b+c.gguf"), "dir/a%20b%2Bc.gguf");
    }
}
