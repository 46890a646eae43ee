//! Resumable, verified downloads into the content-addressed blob cache used by hub pulls.
//!
//! A blob is fetched to `<blobs>/<key>.partial` (and, when it is split into parallel parts,
//! `<blobs>/<key>.partial.<i>-of-<n>` for the parts after the first). A file that is already
//! partly there is continued with `Range: bytes=N-`; a server that answers `200` instead of `206`
//! restarts it from zero (or, for parallel parts, the whole blob falls back to one stream).
//! When every part is complete they are joined, the result is checked against the published
//! digest and renamed to `<blobs>/<key>`, so a file under its final name is always verified. A
//! digest mismatch deletes the partial files and fails naming the file and both digests.
//! Concurrent pulls of one blob (in any process) take turns on `<blobs>/<key>.lock`.

use std::fs;
use std::io::{self, Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use sha2::Digest as _;

use crate::pull::PullError;

/// The digest a hub publishes for a file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Digest {
    /// Lowercase hex sha256 of the contents (Ollama blobs, Hugging Face LFS files).
    Sha256(String),
    /// Lowercase hex git blob id: sha1 of `blob <size>\0` and the contents (small Hugging Face files).
    GitSha1(String),
}

impl Digest {
    /// A sha256 digest from 64 hex digits (any case); `None` for anything else.
    pub fn sha256(hex: &str) -> Option<Digest> {
        is_hex(hex, 64).then(|| Digest::Sha256(hex.to_ascii_lowercase()))
    }

    /// A git blob id from 40 hex digits (any case); `None` for anything else.
    pub fn git_sha1(hex: &str) -> Option<Digest> {
        is_hex(hex, 40).then(|| Digest::GitSha1(hex.to_ascii_lowercase()))
    }

    /// The algorithm's name, as error messages show it.
    pub fn algorithm(&self) -> &'static str {
        match self {
            Digest::Sha256(_) => "sha256",
            Digest::GitSha1(_) => "git-sha1",
        }
    }

    /// The lowercase hex digest.
    pub fn hex(&self) -> &str {
        match self {
            Digest::Sha256(h) | Digest::GitSha1(h) => h,
        }
    }

    /// The blob's file name in the cache: `sha256-<hex>` or `gitsha1-<hex>`.
    pub fn cache_name(&self) -> String {
        match self {
            Digest::Sha256(h) => format!("sha256-{h}"),
            Digest::GitSha1(h) => format!("gitsha1-{h}"),
        }
    }

    /// The digest of a file's contents under this digest's algorithm.
    pub fn of_file(&self, path: &Path) -> io::Result<String> {
        let mut f = fs::File::open(path)?;
        let mut buf = vec![0u8; 1 << 20];
        let mut feed = |update: &mut dyn FnMut(&[u8])| -> io::Result<()> {
            loop {
                let n = f.read(&mut buf)?;
                if n == 0 {
                    return Ok(());
                }
                update(&buf[..n]);
            }
        };
        Ok(match self {
            Digest::Sha256(_) => {
                let mut h = sha2::Sha256::new();
                feed(&mut |b| h.update(b))?;
                hex(&h.finalize())
            }
            Digest::GitSha1(_) => {
                let size = fs::metadata(path)?.len();
                let mut h = sha1::Sha1::new();
                h.update(format!("blob {size}\0").as_bytes());
                feed(&mut |b| h.update(b))?;
                hex(&h.finalize())
            }
        })
    }
}

fn is_hex(s: &str, len: usize) -> bool {
    s.len() == len && s.bytes().all(|b| b.is_ascii_hexdigit())
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// One file to fetch: where from, its size and published digest, and its name for messages.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Blob {
    /// The URL to GET (redirects are followed).
    pub url: String,
    /// The file's name in the repository or its layer kind, for progress and errors.
    pub name: String,
    /// The published size in bytes.
    pub size: u64,
    /// The published digest.
    pub digest: Digest,
}

/// How downloads are made: the client, credentials, the cache folder and the split and retry policy.
#[derive(Debug, Clone)]
pub struct Downloader {
    /// The HTTP client.
    pub client: reqwest::blocking::Client,
    /// An `Authorization` header value sent with every request (not across hosts on redirects).
    pub authorization: Option<String>,
    /// The blob cache folder.
    pub blobs: PathBuf,
    /// The most parts one blob is split into and fetched concurrently.
    pub parallel_parts: usize,
    /// The smallest part worth its own connection, in bytes.
    pub part_size: u64,
    /// How many times a part is retried after a dropped connection or a server error.
    pub retries: u32,
    /// The pause before the first retry (doubled for each further one).
    pub retry_delay: Duration,
}

/// One byte range of a blob and the file holding what has arrived of it.
#[derive(Debug, Clone)]
struct Part {
    start: u64,
    len: u64,
    path: PathBuf,
}

/// Why one part stopped.
enum PartError {
    /// Worth another try: a dropped connection, a 5xx.
    Retry(PullError),
    /// Final: a 4xx, a local I/O error, a server that disagrees about the size.
    Fatal(PullError),
    /// The server ignores `Range`; fetch the blob as one stream instead.
    NoRanges,
    /// Another part failed; this one stopped early.
    Cancelled,
}

/// Reports progress this often while parts are downloading.
const PROGRESS_EVERY: Duration = Duration::from_millis(100);

impl Downloader {
    /// The verified blob's path in the cache (whether or not it is there yet).
    pub fn blob_path(&self, digest: &Digest) -> PathBuf {
        self.blobs.join(digest.cache_name())
    }

    /// Fetches a blob into the cache (or finds it there), verified; returns its path.
    /// `report(completed, total)` is called from this thread as bytes arrive.
    pub fn fetch(&self, blob: &Blob, report: &mut dyn FnMut(u64, u64)) -> Result<PathBuf, PullError> {
        let dest = self.blob_path(&blob.digest);
        if fs::metadata(&dest).is_ok_and(|m| m.is_file() && m.len() == blob.size) {
            report(blob.size, blob.size);
            return Ok(dest);
        }
        fs::create_dir_all(&self.blobs).map_err(io_err(&self.blobs))?;
        let key = blob.digest.cache_name();
        // One pull per blob at a time, across processes; the OS drops the lock if a pull dies.
        let lock_path = self.blobs.join(format!("{key}.lock"));
        let lock = fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(&lock_path)
            .map_err(io_err(&lock_path))?;
        lock.lock().map_err(io_err(&lock_path))?;
        if fs::metadata(&dest).is_ok_and(|m| m.is_file() && m.len() == blob.size) {
            report(blob.size, blob.size);
            return Ok(dest);
        }
        let mut parts = self.layout(&key, blob.size, self.split_count(blob.size));
        remove_stale_partials(&self.blobs, &key, &parts);
        let result = match self.fetch_parts(blob, &parts, report) {
            Err(PartError::NoRanges) => {
                for p in &parts[1..] {
                    let _ = fs::remove_file(&p.path);
                }
                parts = self.layout(&key, blob.size, 1);
                self.fetch_parts(blob, &parts, report)
            }
            other => other,
        };
        match result {
            Ok(()) => {}
            Err(PartError::Retry(e) | PartError::Fatal(e)) => return Err(e),
            Err(PartError::NoRanges | PartError::Cancelled) => {
                return Err(PullError::Http {
                    url: blob.url.clone(),
                    message: "download stopped before it was complete".into(),
                })
            }
        }
        self.finish(blob, &parts, &dest)?;
        Ok(dest)
    }

    /// How many parts a blob of `size` bytes is split into.
    fn split_count(&self, size: u64) -> usize {
        let part = self.part_size.max(1);
        let wanted = size.div_ceil(part).max(1);
        wanted.min(self.parallel_parts.max(1) as u64) as usize
    }

    /// The parts of a blob split `n` ways; the first one's file is `<key>.partial` in every layout.
    fn layout(&self, key: &str, size: u64, n: usize) -> Vec<Part> {
        let chunk = size.div_ceil(n as u64).max(1);
        (0..n)
            .map(|i| {
                let start = (i as u64 * chunk).min(size);
                let end = ((i as u64 + 1) * chunk).min(size);
                let name = if i == 0 {
                    format!("{key}.partial")
                } else {
                    format!("{key}.partial.{i}-of-{n}")
                };
                Part {
                    start,
                    len: end - start,
                    path: self.blobs.join(name),
                }
            })
            .collect()
    }

    /// Downloads every part concurrently, reporting the bytes present as they grow.
    fn fetch_parts(
        &self,
        blob: &Blob,
        parts: &[Part],
        report: &mut dyn FnMut(u64, u64),
    ) -> Result<(), PartError> {
        let done = AtomicU64::new(0);
        let cancel = AtomicBool::new(false);
        let ranged = parts.len() > 1;
        std::thread::scope(|scope| {
            let (finished_tx, finished_rx) = std::sync::mpsc::channel::<()>();
            let workers: Vec<_> = parts
                .iter()
                .map(|part| {
                    let (done, cancel, finished) = (&done, &cancel, finished_tx.clone());
                    scope.spawn(move || {
                        let r = self.fetch_part(&blob.url, part, ranged, done, cancel);
                        if r.is_err() {
                            cancel.store(true, Ordering::SeqCst);
                        }
                        let _ = finished.send(());
                        r
                    })
                })
                .collect();
            drop(finished_tx);
            // Report as bytes arrive; wake at once when a part ends.
            let mut running = workers.len();
            while running > 0 {
                report(done.load(Ordering::SeqCst).min(blob.size), blob.size);
                match finished_rx.recv_timeout(PROGRESS_EVERY) {
                    Ok(()) => running -= 1,
                    Err(std::sync::mpsc::RecvTimeoutError::Timeout) => {}
                    // A worker that panicked never sends; `join` below reports it.
                    Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => break,
                }
            }
            report(done.load(Ordering::SeqCst).min(blob.size), blob.size);
            let mut first_err = None;
            for w in workers {
                let r = w.join().unwrap_or_else(|_| {
                    Err(PartError::Fatal(PullError::Http {
                        url: blob.url.clone(),
                        message: "a download thread panicked".into(),
                    }))
                });
                if let Err(e) = r {
                    // The part that failed first explains more than the ones it cancelled.
                    let better = matches!(first_err, None | Some(PartError::Cancelled))
                        || matches!(e, PartError::NoRanges);
                    if better {
                        first_err = Some(e);
                    }
                }
            }
            first_err.map_or(Ok(()), Err)
        })
    }

    /// Fetches one part into its file, resuming what is there and retrying dropped connections.
    fn fetch_part(
        &self,
        url: &str,
        part: &Part,
        ranged: bool,
        done: &AtomicU64,
        cancel: &AtomicBool,
    ) -> Result<(), PartError> {
        let fatal_io = |path: &Path| {
            let path = path.to_path_buf();
            move |source| PartError::Fatal(PullError::Io { path, source })
        };
        let mut file = fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .read(true)
            .write(true)
            .open(&part.path)
            .map_err(fatal_io(&part.path))?;
        let mut have = file.metadata().map_err(fatal_io(&part.path))?.len();
        if have > part.len {
            // A longer file is this part followed by others joined onto it: keep this part's bytes.
            file.set_len(part.len).map_err(fatal_io(&part.path))?;
            have = part.len;
        }
        done.fetch_add(have, Ordering::SeqCst);
        let mut attempt = 0u32;
        loop {
            if have == part.len {
                return Ok(());
            }
            if cancel.load(Ordering::SeqCst) {
                return Err(PartError::Cancelled);
            }
            match self.fetch_range(url, part, ranged, &mut file, &mut have, done, cancel) {
                Ok(()) => continue,
                Err(PartError::Retry(_)) if attempt < self.retries => {
                    let pause = self.retry_delay.saturating_mul(1 << attempt.min(8));
                    attempt += 1;
                    std::thread::sleep(pause);
                }
                Err(e) => return Err(e),
            }
        }
    }

    /// One request for the rest of a part; appends what arrives to its file.
    #[allow(clippy::too_many_arguments)]
    fn fetch_range(
        &self,
        url: &str,
        part: &Part,
        ranged: bool,
        file: &mut fs::File,
        have: &mut u64,
        done: &AtomicU64,
        cancel: &AtomicBool,
    ) -> Result<(), PartError> {
        let from = part.start + *have;
        let to = part.start + part.len - 1;
        let mut req = self.client.get(url);
        if let Some(auth) = &self.authorization {
            req = req.header(reqwest::header::AUTHORIZATION, auth);
        }
        let asked_range = ranged || from > 0;
        if asked_range {
            req = req.header(reqwest::header::RANGE, format!("bytes={from}-{to}"));
        }
        let http = |message: String| PullError::Http {
            url: url.to_string(),
            message,
        };
        let mut resp = req.send().map_err(|e| PartError::Retry(http(error_chain(&e))))?;
        let status = resp.status();
        match status.as_u16() {
            206 => {
                let start = resp
                    .headers()
                    .get(reqwest::header::CONTENT_RANGE)
                    .and_then(|v| v.to_str().ok())
                    .and_then(content_range_start);
                if start != Some(from) {
                    return Err(PartError::Fatal(http(format!(
                        "asked for bytes from {from}, the server sent a range starting at {start:?}"
                    ))));
                }
            }
            200 if asked_range && ranged => return Err(PartError::NoRanges),
            200 => {
                // The whole file from byte 0: start this (only) part over.
                if *have > 0 {
                    file.set_len(0).map_err(|source| {
                        PartError::Fatal(PullError::Io {
                            path: part.path.clone(),
                            source,
                        })
                    })?;
                    done.fetch_sub(*have, Ordering::SeqCst);
                    *have = 0;
                }
            }
            416 => {
                return Err(PartError::Fatal(http(format!(
                    "the server has no bytes from {from} (416); the file is shorter than published"
                ))))
            }
            s if status.is_server_error() || s == 429 || s == 408 => {
                return Err(PartError::Retry(http(format!("HTTP status {status}"))))
            }
            _ => return Err(PartError::Fatal(http(format!("HTTP status {status}")))),
        }
        let io_fatal = |source| {
            PartError::Fatal(PullError::Io {
                path: part.path.clone(),
                source,
            })
        };
        file.seek(SeekFrom::Start(*have)).map_err(io_fatal)?;
        let mut buf = vec![0u8; 1 << 16];
        loop {
            if cancel.load(Ordering::SeqCst) {
                return Err(PartError::Cancelled);
            }
            let n = match resp.read(&mut buf) {
                Ok(n) => n,
                Err(e) => {
                    return Err(PartError::Retry(http(format!(
                        "connection lost after {} of {} bytes: {e}",
                        *have, part.len
                    ))))
                }
            };
            if n == 0 {
                break;
            }
            let room = (part.len - *have) as usize;
            if n > room {
                return Err(PartError::Fatal(http(format!(
                    "the server sent more than the {} bytes published",
                    part.len
                ))));
            }
            file.write_all(&buf[..n]).map_err(io_fatal)?;
            *have += n as u64;
            done.fetch_add(n as u64, Ordering::SeqCst);
        }
        if *have < part.len {
            return Err(PartError::Retry(http(format!(
                "connection closed after {} of {} bytes",
                *have, part.len
            ))));
        }
        Ok(())
    }

    /// Joins the parts, checks size and digest, and renames the result to `dest`.
    fn finish(&self, blob: &Blob, parts: &[Part], dest: &Path) -> Result<(), PullError> {
        let first = &parts[0].path;
        {
            let mut out = fs::OpenOptions::new()
                .append(true)
                .open(first)
                .map_err(io_err(first))?;
            for p in &parts[1..] {
                let mut src = fs::File::open(&p.path).map_err(io_err(&p.path))?;
                io::copy(&mut src, &mut out).map_err(io_err(first))?;
                drop(src);
                fs::remove_file(&p.path).map_err(io_err(&p.path))?;
            }
            out.sync_all().map_err(io_err(first))?;
        }
        let size = fs::metadata(first).map_err(io_err(first))?.len();
        let got = blob.digest.of_file(first).map_err(io_err(first))?;
        if size != blob.size || got != blob.digest.hex() {
            let _ = fs::remove_file(first);
            if size != blob.size {
                return Err(PullError::Size {
                    file: blob.name.clone(),
                    expected: blob.size,
                    got: size,
                });
            }
            return Err(PullError::FileDigest {
                file: blob.name.clone(),
                algorithm: blob.digest.algorithm(),
                expected: blob.digest.hex().to_string(),
                got,
            });
        }
        fs::rename(first, dest).map_err(io_err(dest))
    }
}

/// Deletes `<key>.partial*` files that are not part of the current layout.
fn remove_stale_partials(dir: &Path, key: &str, parts: &[Part]) {
    let prefix = format!("{key}.partial");
    let Ok(entries) = fs::read_dir(dir) else {
        return;
    };
    for e in entries.flatten() {
        let name = e.file_name();
        let name = name.to_string_lossy();
        if name.starts_with(&prefix) && !parts.iter().any(|p| p.path == e.path()) {
            let _ = fs::remove_file(e.path());
        }
    }
}

/// The first byte of a `Content-Range: bytes START-END/TOTAL` header.
fn content_range_start(value: &str) -> Option<u64> {
    let range = value.trim().strip_prefix("bytes")?.trim_start();
    range.split('-').next()?.trim().parse().ok()
}

/// An error's message with its causes (reqwest's own omits them).
pub fn error_chain(e: &(dyn std::error::Error + 'static)) -> String {
    let mut message = e.to_string();
    let mut src = e.source();
    while let Some(s) = src {
        let part = s.to_string();
        if !message.contains(&part) {
            message.push_str(": ");
            message.push_str(&part);
        }
        src = s.source();
    }
    message
}

fn io_err(path: &Path) -> impl FnOnce(io::Error) -> PullError + '_ {
    move |source| PullError::Io {
        path: path.to_path_buf(),
        source,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn digests_name_their_cache_files_and_hash_like_git() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("f");
        fs::write(&p, b"hello\n").unwrap();
        // `git hash-object` of "hello\n".
        let git = Digest::git_sha1("CE013625030BA8DBA906F756967F9E9CA394464A").unwrap();
        assert_eq!(git.of_file(&p).unwrap(), git.hex());
        assert_eq!(
            git.cache_name(),
            "gitsha1-ce013625030ba8dba906f756967f9e9ca394464a"
        );
        let sha = Digest::sha256("5891b5b522d5df086d0ff0b110fbd9d21bb4fc7163af34d08286a2e846f6be03").unwrap();
        assert_eq!(sha.of_file(&p).unwrap(), sha.hex());
        assert!(Digest::sha256("abc").is_none() && Digest::git_sha1(&"z".repeat(40)).is_none());
    }

    #[test]
    fn content_range_headers_give_their_start() {
        assert_eq!(content_range_start("bytes 100-199/1000"), Some(100));
        assert_eq!(content_range_start("bytes */1000"), None);
        assert_eq!(content_range_start("items 1-2/3"), None);
    }

    #[test]
    fn layouts_cover_the_blob_and_keep_the_first_file_name() {
        let d = Downloader {
            client: reqwest::blocking::Client::new(),
            authorization: None,
            blobs: PathBuf::from("/b"),
            parallel_parts: 4,
            part_size: 10,
            retries: 0,
            retry_delay: Duration::ZERO,
        };
        assert_eq!(d.split_count(5), 1);
        assert_eq!(d.split_count(25), 3);
        assert_eq!(d.split_count(1000), 4);
        let parts = d.layout("k", 25, 3);
        let spans: Vec<(u64, u64)> = parts.iter().map(|p| (p.start, p.len)).collect();
        assert_eq!(spans, [(0, 9), (9, 9), (18, 7)]);
        assert_eq!(parts[0].path, PathBuf::from("/b/k.partial"));
        assert_eq!(parts[2].path, PathBuf::from("/b/k.partial.2-of-3"));
        assert_eq!(d.layout("k", 25, 1)[0].path, parts[0].path);
        assert_eq!(d.layout("k", 0, 1)[0].len, 0);
    }
}
