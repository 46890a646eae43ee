//! Visible skips for tests whose input is missing.
//!
//! A test that cannot run because an input is absent calls [`skip_optional`] or
//! [`skip_unless_ci`] and returns. Either prints `SKIPPED: <test>: <why>` to stderr and appends
//! that line to the file named by `$BERTH_SKIP_LOG` (set by `scripts/test`, which prints the count
//! and the lines when the suite ends). Inputs CI always has (the fetched models, `../shared`, npm,
//! a C compiler) go through [`skip_unless_ci`], which fails the test instead when `$CI` is set.

use std::io::Write;
use std::path::PathBuf;

/// The environment variable naming the file skipped checks are appended to.
pub const SKIP_LOG_ENV: &str = "BERTH_SKIP_LOG";

/// Whether this process runs under CI (`$CI` set to anything but empty, `0` or `false`).
pub fn running_under_ci() -> bool {
    std::env::var("CI").is_ok_and(|v| !matches!(v.trim(), "" | "0" | "false" | "FALSE" | "False"))
}

/// Records a skipped check whose input CI does not provide either (e.g. an opt-in llama.cpp
/// logits file): prints `SKIPPED: <test>: <why>` and appends it to `$BERTH_SKIP_LOG`.
pub fn skip_optional(why: &str) {
    record(&format!("SKIPPED: {}: {why}", current_test()));
}

/// Records a skipped check whose input CI always has; under CI (see [`running_under_ci`]) the
/// missing input is a failure, so this panics instead of skipping.
pub fn skip_unless_ci(why: &str) {
    let test = current_test();
    if running_under_ci() {
        panic!("{test}: {why} (CI always provides this input, so it is not skipped under CI)");
    }
    record(&format!("SKIPPED: {test}: {why}"));
}

/// A real model `scripts/fetch-models` caches (`$BERTH_CACHE/models`, else
/// `~/.cache/berth/models`), or `None` after [`skip_unless_ci`] when it has not been fetched.
pub fn fetched_model(file: &str) -> Option<PathBuf> {
    let cache = match std::env::var_os("BERTH_CACHE") {
        Some(c) => PathBuf::from(c),
        None => PathBuf::from(std::env::var_os("HOME").unwrap_or_default()).join(".cache/berth"),
    };
    let path = cache.join("models").join(file);
    if path.is_file() {
        return Some(path);
    }
    skip_unless_ci(&format!(
        "{} not present (scripts/fetch-models fetches it)",
        path.display()
    ));
    None
}

/// The running test's name: the test binary's stem (without cargo's hash) and libtest's thread
/// name, e.g. `real::greedy_tokens_match_llama_cpp`.
fn current_test() -> String {
    let binary = std::env::current_exe()
        .ok()
        .and_then(|p| p.file_stem().map(|s| s.to_string_lossy().into_owned()))
        .map(|s| match s.rsplit_once('-') {
            Some((name, hash)) if hash.chars().all(|c| c.is_ascii_hexdigit()) => name.to_string(),
            _ => s,
        })
        .unwrap_or_else(|| "?".into());
    let thread = std::thread::current();
    format!("{binary}::{}", thread.name().unwrap_or("?"))
}

/// Prints `line` to stderr and appends it to `$BERTH_SKIP_LOG` when that is set.
fn record(line: &str) {
    eprintln!("{line}");
    let Some(path) = std::env::var_os(SKIP_LOG_ENV) else {
        return;
    };
    let opened = std::fs::OpenOptions::new().create(true).append(true).open(&path);
    // One write of the whole line: appends from parallel test processes do not interleave.
    let written = opened.and_then(|mut f| f.write_all(format!("{line}\n").as_bytes()));
    if let Err(e) = written {
        panic!(
            "cannot append to ${SKIP_LOG_ENV} ({}): {e}",
            path.to_string_lossy()
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_test_name_has_the_binary_and_the_test() {
        let name = current_test();
        assert!(
            name.ends_with("::test_skip::tests::the_test_name_has_the_binary_and_the_test"),
            "{name}"
        );
        assert!(name.starts_with("berth_formats::"), "{name}");
    }
}
