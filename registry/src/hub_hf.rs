//! Pulling from Hugging Face: list the repository's files
//! (`{endpoint}/api/models/{repo}/tree/{revision}?recursive=true`, following `Link: rel="next"`),
//! pick the GGUF for the quant (or a safetensors model with its config and tokenizer), fetch each
//! from `{endpoint}/{repo}/resolve/{revision}/{path}` checked against the listed digest (the LFS
//! sha256, else the git blob id), and import. A sentence-transformers repository (`modules.json`)
//! also brings the files of the module folders it names. `HF_TOKEN` goes out as
//! `Authorization: Bearer`.

use std::path::PathBuf;

use crate::download::{Blob, Digest};
use crate::hub::{
    encode_path, fetch_all, link_or_copy, request_error, status_error, HubOptions, Scratch, DEFAULT_QUANT,
};
use crate::pack::{is_safe_relative, PackRef};
use crate::pull::{Phase, Progress, PullError};
use crate::sentence_transformers::{
    module_folders, parse_modules, MODULES_FILE, SENTENCE_BERT_CONFIG, SENTENCE_TRANSFORMERS_CONFIG,
};
use crate::store::{ImportOptions, PackEntry, Store};

/// The revision pulled.
const REVISION: &str = "main";

/// A repository to pull from.
#[derive(Debug, Clone)]
pub(crate) struct Repo {
    /// The reference as the user wrote it, for errors.
    pub reference: String,
    /// `owner/repo`.
    pub id: String,
    /// The quant asked for.
    pub quant: Option<String>,
}

/// One file the repository tree lists.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct RepoFile {
    /// Path inside the repository.
    pub path: String,
    /// Size in bytes.
    pub size: u64,
    /// The digest to check it against.
    pub digest: Digest,
}

/// Files that go with safetensors weights (at the top of the repository).
const SAFETENSORS_COMPANIONS: &[&str] = &[
    "config.json",
    "generation_config.json",
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "added_tokens.json",
    "vocab.json",
    "merges.txt",
    "tokenizer.model",
    "chat_template.jinja",
    "chat_template.json",
    "preprocessor_config.json",
    "processor_config.json",
    MODULES_FILE,
    SENTENCE_BERT_CONFIG,
    SENTENCE_TRANSFORMERS_CONFIG,
];

/// Parses one page of tree entries: files with a size and an LFS sha256 or git blob id.
pub(crate) fn parse_tree(json: &serde_json::Value) -> Result<Vec<RepoFile>, String> {
    let entries = json
        .as_array()
        .ok_or_else(|| "the tree listing is not a JSON array".to_string())?;
    let mut files = Vec::new();
    for e in entries {
        if e.get("type").and_then(|t| t.as_str()) != Some("file") {
            continue;
        }
        let path = e
            .get("path")
            .and_then(|p| p.as_str())
            .ok_or("a tree entry has no path")?;
        let lfs = e.get("lfs").filter(|l| l.is_object());
        let digest = match lfs {
            Some(l) => l
                .get("oid")
                .or_else(|| l.get("sha256"))
                .and_then(|o| o.as_str())
                .and_then(Digest::sha256),
            None => e.get("oid").and_then(|o| o.as_str()).and_then(Digest::git_sha1),
        }
        .ok_or_else(|| format!("{path}: no usable digest in the listing"))?;
        let size = lfs
            .and_then(|l| l.get("size"))
            .or_else(|| e.get("size"))
            .and_then(|s| s.as_u64())
            .ok_or_else(|| format!("{path}: no size in the listing"))?;
        files.push(RepoFile {
            path: path.to_string(),
            size,
            digest,
        });
    }
    Ok(files)
}

/// The `rel="next"` URL of a `Link` header.
fn next_link(value: &str) -> Option<String> {
    value.split(',').find_map(|link| {
        let (url, params) = link.split_once(';')?;
        params
            .split(';')
            .any(|p| matches!(p.trim(), "rel=\"next\"" | "rel=next"))
            .then(|| {
                url.trim()
                    .trim_start_matches('<')
                    .trim_end_matches('>')
                    .to_string()
            })
    })
}

/// Lists every file of the repository at [`REVISION`].
fn list_files(
    client: &reqwest::blocking::Client,
    repo: &Repo,
    opts: &HubOptions,
) -> Result<Vec<RepoFile>, PullError> {
    let mut url = format!(
        "{}/api/models/{}/tree/{REVISION}?recursive=true",
        opts.hf_endpoint, repo.id
    );
    let mut files = Vec::new();
    for _ in 0..10_000 {
        let mut req = client.get(&url);
        if let Some(token) = &opts.hf_token {
            req = req.bearer_auth(token);
        }
        let resp = req.send().map_err(|e| request_error(&url, &e))?;
        let status = resp.status();
        if !status.is_success() {
            let hint = match status.as_u16() {
                401 | 403 if opts.hf_token.is_none() => "a private or gated repository needs HF_TOKEN",
                401 | 403 => "HF_TOKEN was refused for this repository",
                404 => "no such repository or revision",
                _ => "",
            };
            return Err(status_error(&url, status, hint));
        }
        let next = resp
            .headers()
            .get(reqwest::header::LINK)
            .and_then(|v| v.to_str().ok())
            .and_then(next_link);
        let text = resp.text().map_err(|e| request_error(&url, &e))?;
        let json: serde_json::Value = serde_json::from_str(&text).map_err(|e| PullError::Http {
            url: url.clone(),
            message: format!("not a JSON tree listing: {e}"),
        })?;
        files.extend(parse_tree(&json).map_err(|message| PullError::Http {
            url: url.clone(),
            message,
        })?);
        match next {
            Some(n) => {
                url = reqwest::Url::parse(&url)
                    .and_then(|base| base.join(&n))
                    .map_err(|e| PullError::Http {
                        url: url.clone(),
                        message: format!("bad next-page link {n:?}: {e}"),
                    })?
                    .to_string()
            }
            None => return Ok(files),
        }
    }
    Err(PullError::Http {
        url,
        message: "the tree listing never ends".into(),
    })
}

/// The file name part of a repository path.
fn file_name(path: &str) -> &str {
    path.rsplit('/').next().unwrap_or(path)
}

/// Whether a GGUF path names this quant: the label appears with no letter, digit or `_` around it.
pub(crate) fn names_quant(path: &str, quant: &str) -> bool {
    let hay = path.to_ascii_lowercase();
    let needle = quant.to_ascii_lowercase();
    let mut from = 0;
    while let Some(i) = hay[from..].find(&needle) {
        let start = from + i;
        let end = start + needle.len();
        let before = hay[..start].chars().next_back();
        let after = hay[end..].chars().next();
        let open = before.is_none_or(|c| !c.is_ascii_alphanumeric());
        let close = after.is_none_or(|c| !(c.is_ascii_alphanumeric() || c == '_'));
        if open && close {
            return true;
        }
        from = start + 1;
    }
    false
}

/// The quant label in a GGUF file name (`Q4_K_M`, `IQ3_XS`, `F16`), else the file name.
pub(crate) fn quant_label(path: &str) -> String {
    let name = file_name(path);
    let stem = name.strip_suffix(".gguf").unwrap_or(name);
    let looks_like_quant = |t: &&str| {
        let u = t.to_ascii_uppercase();
        let body = u
            .strip_prefix("IQ")
            .or_else(|| u.strip_prefix("TQ"))
            .or_else(|| u.strip_prefix("BF"))
            .or_else(|| u.strip_prefix('Q'))
            .or_else(|| u.strip_prefix('F'));
        body.is_some_and(|b| b.starts_with(|c: char| c.is_ascii_digit()))
    };
    stem.split(['-', '.'])
        .rfind(looks_like_quant)
        .map_or_else(|| name.to_string(), |t| t.to_ascii_uppercase())
}

/// Whether a GGUF is one shard of a split file (`-00001-of-00003`).
fn is_shard(path: &str) -> bool {
    let stem = file_name(path).trim_end_matches(".gguf");
    stem.rsplit_once("-of-").is_some_and(|(head, total)| {
        total.len() == 5
            && total.bytes().all(|b| b.is_ascii_digit())
            && head.len() > 6
            && head.as_bytes()[head.len() - 6] == b'-'
            && head[head.len() - 5..].bytes().all(|b| b.is_ascii_digit())
    })
}

/// What to fetch from the listing: one GGUF, or a safetensors model's files.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Selection {
    /// One GGUF file.
    Gguf(RepoFile),
    /// Safetensors weights with their config and tokenizer files.
    Safetensors(Vec<RepoFile>),
}

/// Picks the files to pull for `quant` (or the default) from a repository's listing.
pub(crate) fn select(files: &[RepoFile], quant: Option<&str>) -> Result<Selection, String> {
    let ggufs: Vec<&RepoFile> = files
        .iter()
        .filter(|f| f.path.to_ascii_lowercase().ends_with(".gguf"))
        .filter(|f| !file_name(&f.path).to_ascii_lowercase().starts_with("mmproj"))
        .collect();
    let choices = || {
        let mut labels: Vec<String> = ggufs.iter().map(|f| quant_label(&f.path)).collect();
        labels.sort();
        labels.dedup();
        labels.join(", ")
    };
    let pick = |matches: Vec<&RepoFile>, what: &str| -> Result<Option<RepoFile>, String> {
        let whole: Vec<&RepoFile> = matches.iter().copied().filter(|f| !is_shard(&f.path)).collect();
        match (whole.as_slice(), matches.as_slice()) {
            ([one], _) => Ok(Some((*one).clone())),
            ([], []) => Ok(None),
            ([], [first, ..]) => Err(format!(
                "{what} is split into several GGUF files ({}, ...); split GGUFs cannot be pulled yet",
                first.path
            )),
            (many, _) => Err(format!(
                "{what} matches several files ({}); name the quant more exactly",
                many.iter()
                    .map(|f| f.path.as_str())
                    .collect::<Vec<_>>()
                    .join(", ")
            )),
        }
    };
    if let Some(q) = quant {
        if ggufs.is_empty() {
            return Err(format!(
                "the repository has no GGUF files, so there is no quant {q:?} to pick; pull it without :{q}"
            ));
        }
        let matches: Vec<&RepoFile> = ggufs
            .iter()
            .copied()
            .filter(|f| names_quant(&f.path, q))
            .collect();
        return pick(matches, &format!("quant {q}"))?
            .map(Selection::Gguf)
            .ok_or_else(|| format!("no GGUF file for quant {q}; choices: {}", choices()));
    }
    if !ggufs.is_empty() {
        let default: Vec<&RepoFile> = ggufs
            .iter()
            .copied()
            .filter(|f| names_quant(&f.path, DEFAULT_QUANT))
            .collect();
        if let Some(f) = pick(default, DEFAULT_QUANT)? {
            return Ok(Selection::Gguf(f));
        }
        let whole: Vec<&RepoFile> = ggufs.iter().copied().filter(|f| !is_shard(&f.path)).collect();
        if whole.len() <= 1 {
            if let Some(f) = pick(ggufs.clone(), "the repository")? {
                return Ok(Selection::Gguf(f));
            }
        }
        return Err(format!(
            "several GGUF files and none is {DEFAULT_QUANT}; name one as :QUANT (choices: {})",
            choices()
        ));
    }
    let top: Vec<&RepoFile> = files.iter().filter(|f| !f.path.contains('/')).collect();
    let weights = top.iter().any(|f| f.path.ends_with(".safetensors"));
    let config = top.iter().any(|f| f.path == "config.json");
    if !(weights && config) {
        return Err("the repository has neither GGUF files nor safetensors weights with config.json".into());
    }
    Ok(Selection::Safetensors(
        top.into_iter()
            .filter(|f| {
                f.path.ends_with(".safetensors")
                    || f.path.ends_with(".safetensors.index.json")
                    || SAFETENSORS_COMPANIONS.contains(&f.path.as_str())
            })
            .cloned()
            .collect(),
    ))
}

/// The listed files under the module folders (every file, nested ones too, whose path is safe).
pub(crate) fn module_files(files: &[RepoFile], folders: &[String]) -> Vec<RepoFile> {
    files
        .iter()
        .filter(|f| is_safe_relative(&f.path) && !f.path.contains('\\'))
        .filter(|f| {
            folders.iter().any(|d| {
                f.path
                    .strip_prefix(d.as_str())
                    .is_some_and(|r| r.starts_with('/'))
            })
        })
        .cloned()
        .collect()
}

/// The blob a repository file is fetched as.
fn blob(repo: &Repo, opts: &HubOptions, f: &RepoFile) -> Blob {
    Blob {
        url: format!(
            "{}/{}/resolve/{REVISION}/{}",
            opts.hf_endpoint,
            repo.id,
            encode_path(&f.path)
        ),
        name: f.path.clone(),
        size: f.size,
        digest: f.digest.clone(),
    }
}

/// Pulls `repo` into the store as `local`.
pub(crate) fn pull(
    store: &Store,
    repo: &Repo,
    local: &PackRef,
    opts: &HubOptions,
    progress: &mut dyn FnMut(&Progress),
) -> Result<PackEntry, PullError> {
    let client = opts.client()?;
    let files = list_files(&client, repo, opts)?;
    let selection = select(&files, repo.quant.as_deref()).map_err(|message| PullError::Hub {
        reference: repo.reference.clone(),
        message,
    })?;
    let mut wanted = match &selection {
        Selection::Gguf(f) => vec![f.clone()],
        Selection::Safetensors(fs) => fs.clone(),
    };
    let downloader = opts.downloader(opts.hf_token.as_ref().map(|t| format!("Bearer {t}")))?;
    let modules = wanted.iter().find(|f| f.path == MODULES_FILE).cloned();
    if let Some(m) = modules {
        // Which folders to fetch is in modules.json itself; the blob cache keeps it for the
        // fetch below.
        let path = downloader.fetch(&blob(repo, opts, &m), &mut |_, _| {})?;
        let text = std::fs::read_to_string(&path).map_err(|source| PullError::Io {
            path: path.clone(),
            source,
        })?;
        let modules = parse_modules(&text).map_err(|message| PullError::Hub {
            reference: repo.reference.clone(),
            message,
        })?;
        wanted.extend(module_files(&files, &module_folders(&modules)));
    }
    let blobs: Vec<Blob> = wanted.iter().map(|f| blob(repo, opts, f)).collect();
    let paths = fetch_all(&downloader, &blobs, progress)?;
    crate::hub::emit(progress, Phase::Writing);
    let import = ImportOptions {
        name: Some(local.to_string()),
        template: None,
        family: None,
        quantize: None,
    };
    match selection {
        Selection::Gguf(_) => Ok(store.import(&paths[0], &import)?),
        Selection::Safetensors(_) => {
            let scratch = Scratch::new(store)?;
            let dir: PathBuf = scratch.dir.join("model");
            for (f, path) in wanted.iter().zip(&paths) {
                link_or_copy(path, &dir.join(&f.path))?;
            }
            Ok(store.import(&dir, &import)?)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn file(path: &str) -> RepoFile {
        RepoFile {
            path: path.into(),
            size: 1,
            digest: Digest::sha256(&"a".repeat(64)).unwrap(),
        }
    }

    fn gguf(sel: Result<Selection, String>) -> String {
        match sel {
            Ok(Selection::Gguf(f)) => f.path,
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn quants_match_whole_labels_only() {
        assert!(names_quant("Model-Q4_K_M.gguf", "q4_k_m"));
        assert!(names_quant("model.Q8_0.gguf", "Q8_0"));
        assert!(names_quant("Q4_K_M/model-00001-of-00002.gguf", "Q4_K_M"));
        assert!(!names_quant("Model-Q4_K_M.gguf", "Q4_K"));
        assert!(!names_quant("Model-IQ4_XS.gguf", "Q4_XS"));
        assert_eq!(quant_label("Qwen2.5-0.5B-Instruct-q4_k_m.gguf"), "Q4_K_M");
        assert_eq!(quant_label("x-IQ3_XS.gguf"), "IQ3_XS");
        assert_eq!(quant_label("model.bf16.gguf"), "BF16");
        assert_eq!(quant_label("weights.gguf"), "weights.gguf");
        assert!(is_shard("m-Q4_K_M-00001-of-00003.gguf"));
        assert!(!is_shard("m-Q4_K_M.gguf"));
    }

    #[test]
    fn selection_picks_the_quant_the_default_or_lists_choices() {
        let files = vec![
            file("README.md"),
            file("m-Q8_0.gguf"),
            file("m-Q4_K_M.gguf"),
            file("mmproj-m-f16.gguf"),
        ];
        assert_eq!(gguf(select(&files, Some("q8_0"))), "m-Q8_0.gguf");
        assert_eq!(gguf(select(&files, None)), "m-Q4_K_M.gguf");
        let e = select(&files, Some("Q2_K")).unwrap_err();
        assert_eq!(e, "no GGUF file for quant Q2_K; choices: Q4_K_M, Q8_0");
        let two = vec![file("m-Q8_0.gguf"), file("m-F16.gguf")];
        let e = select(&two, None).unwrap_err();
        assert!(e.contains("choices: F16, Q8_0"), "{e}");
        assert_eq!(gguf(select(&[file("only.gguf")], None)), "only.gguf");
        let split = vec![
            file("m-Q4_K_M-00001-of-00002.gguf"),
            file("m-Q4_K_M-00002-of-00002.gguf"),
        ];
        assert!(select(&split, None).unwrap_err().contains("split"));
    }

    #[test]
    fn safetensors_repos_bring_config_and_tokenizer() {
        let files = vec![
            file("config.json"),
            file("model.safetensors"),
            file("tokenizer.json"),
            file("tokenizer_config.json"),
            file("README.md"),
            file("onnx/model.onnx"),
        ];
        let Ok(Selection::Safetensors(got)) = select(&files, None) else {
            panic!()
        };
        let names: Vec<&str> = got.iter().map(|f| f.path.as_str()).collect();
        assert_eq!(
            names,
            [
                "config.json",
                "model.safetensors",
                "tokenizer.json",
                "tokenizer_config.json"
            ]
        );
        assert!(select(&files, Some("Q4_K_M"))
            .unwrap_err()
            .contains("no GGUF files"));
        assert!(select(&[file("README.md")], None).is_err());
    }

    #[test]
    fn module_files_are_the_nested_files_under_the_named_folders() {
        let files = vec![
            file("config.json"),
            file("2_Dense/config.json"),
            file("2_Dense/sub/model.safetensors"),
            file("2_Dense_old/model.safetensors"),
            file("2_Dense/../config.json"),
            file("1_Pooling/config.json"),
            file("onnx/model.onnx"),
        ];
        let folders = vec![
            "1_Pooling".to_string(),
            "2_Dense".to_string(),
            "4_Normalize".to_string(),
        ];
        let got: Vec<String> = module_files(&files, &folders)
            .into_iter()
            .map(|f| f.path)
            .collect();
        assert_eq!(
            got,
            [
                "2_Dense/config.json",
                "2_Dense/sub/model.safetensors",
                "1_Pooling/config.json"
            ]
        );
    }

    #[test]
    fn sentence_transformers_repos_bring_their_top_level_files() {
        let files = vec![
            file("config.json"),
            file("model.safetensors"),
            file("modules.json"),
            file("sentence_bert_config.json"),
            file("config_sentence_transformers.json"),
            file("2_Dense/model.safetensors"),
        ];
        let Ok(Selection::Safetensors(got)) = select(&files, None) else {
            panic!()
        };
        assert_eq!(got.len(), 5, "{got:?}");
    }

    #[test]
    fn tree_entries_give_lfs_sha256_or_git_ids_and_links_give_next_pages() {
        let sha = "b".repeat(64);
        let json = serde_json::json!([
            {"type": "directory", "path": "sub", "oid": "c".repeat(40), "size": 0},
            {"type": "file", "path": "config.json", "oid": "c".repeat(40), "size": 12},
            {"type": "file", "path": "m.gguf", "oid": "d".repeat(40), "size": 134,
             "lfs": {"oid": sha, "size": 1000, "pointerSize": 134}},
        ]);
        let files = parse_tree(&json).unwrap();
        assert_eq!(files.len(), 2);
        assert_eq!(files[0].digest, Digest::GitSha1("c".repeat(40)));
        assert_eq!(
            (files[1].size, files[1].digest.clone()),
            (1000, Digest::Sha256(sha))
        );
        assert!(parse_tree(&serde_json::json!({"error": "x"})).is_err());
        assert_eq!(
            next_link("<https://h/api/models/a/b/tree/main?cursor=x>; rel=\"next\"").as_deref(),
            Some("https://h/api/models/a/b/tree/main?cursor=x")
        );
        assert_eq!(next_link("<https://h/x>; rel=\"prev\""), None);
    }
}
