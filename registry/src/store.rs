//! The on-disk store of packs: `<home>/packs/<name>/<tag>/pack.toml` plus the pack's files.
//!
//! Listing never hides a broken pack: each entry carries its problems. Hashing multi-gigabyte
//! weights on every listing would be slow, so each pack keeps `.verified.json`, recording the
//! size, mtime and sha256 of every file when it was last hashed; a file is re-hashed only when its
//! size or mtime changed. Imports are built under `<home>/tmp` and renamed into place, so a pack
//! directory is always either absent or complete.

use std::collections::BTreeMap;
use std::fs;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::time::{SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use crate::gguf::{file_type_name, GgmlType, GgufError, GgufFile};
use crate::modelfile::Modelfile;
use crate::pack::{
    family_for_architecture, is_safe_relative, sanitize_name, FileRole, PackError, PackFile, PackFormat,
    PackManifest, PackRef, PackRefError, MANIFEST_FILE,
};
use crate::safetensors::{SafetensorsError, SafetensorsFile};
use crate::sentence_transformers;

/// The per-pack verification stamp file.
pub const STAMP_FILE: &str = ".verified.json";
/// The file name a GGUF import gets inside its pack.
pub const GGUF_WEIGHTS_FILE: &str = "model.gguf";
/// The file name of a chat template inside a pack.
pub const TEMPLATE_FILE: &str = "chat_template.jinja";

/// A store operation that failed; the message is one line naming the path or reference.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// A filesystem operation failed.
    #[error("{path}: {source}")]
    Io {
        /// The path involved.
        path: PathBuf,
        /// The underlying error.
        source: std::io::Error,
    },
    /// No pack has this reference.
    #[error("model {reference} not found in {}", store.display())]
    NotFound {
        /// The reference looked up.
        reference: String,
        /// The store's packs directory.
        store: PathBuf,
    },
    /// A bare name matches several tags and none is `latest`.
    #[error("model {name} has several tags ({}); name one as {name}:<tag>", tags.join(", "))]
    AmbiguousTag {
        /// The name looked up.
        name: String,
        /// Its tags.
        tags: Vec<String>,
    },
    /// The reference is malformed.
    #[error(transparent)]
    Reference(#[from] PackRefError),
    /// A manifest could not be read or written.
    #[error(transparent)]
    Pack(#[from] PackError),
    /// A GGUF file could not be read.
    #[error(transparent)]
    Gguf(#[from] GgufError),
    /// A safetensors file could not be read.
    #[error(transparent)]
    Safetensors(#[from] SafetensorsError),
    /// No family serves the model's architecture and none was given.
    #[error("{}: no plugin family serves architecture {arch:?}; pass a family explicitly", path.display())]
    UnknownArchitecture {
        /// The model file or directory.
        path: PathBuf,
        /// The architecture found.
        arch: String,
    },
    /// The import source is neither a GGUF file, a pack nor a Hugging Face directory.
    #[error("{}: {msg}", path.display())]
    Unsupported {
        /// The source.
        path: PathBuf,
        /// Why it cannot be imported.
        msg: String,
    },
    /// The source pack is broken.
    #[error("{}: {}", path.display(), problems.join("; "))]
    Broken {
        /// The pack directory.
        path: PathBuf,
        /// Its problems.
        problems: Vec<String>,
    },
}

fn io_err(path: &Path) -> impl FnOnce(std::io::Error) -> StoreError + '_ {
    move |source| StoreError::Io {
        path: path.to_path_buf(),
        source,
    }
}

/// One pack as found in the store.
#[derive(Debug, Clone)]
pub struct PackEntry {
    /// `name:tag`, from the pack's location in the store.
    pub reference: String,
    /// The pack directory.
    pub dir: PathBuf,
    /// The manifest, when it could be read.
    pub manifest: Option<PackManifest>,
    /// Everything wrong with the pack (empty when it is servable).
    pub problems: Vec<String>,
    /// When the pack was last modified (its manifest's mtime).
    pub modified: SystemTime,
    /// Total bytes of the pack's files.
    pub size: u64,
}

impl PackEntry {
    /// Whether the pack has no problems.
    pub fn is_ok(&self) -> bool {
        self.problems.is_empty()
    }
}

/// Options for [`Store::import`].
#[derive(Debug, Clone, Default)]
pub struct ImportOptions {
    /// The reference to import as (`name` or `name:tag`); derived from the source when absent.
    pub name: Option<String>,
    /// A chat template file to add to the pack.
    pub template: Option<PathBuf>,
    /// The plugin family, overriding the architecture mapping.
    pub family: Option<String>,
    /// Quantize the weights when the pack is loaded (`q8_0`; see [`PackManifest::quantize`]).
    pub quantize: Option<String>,
}

/// Where `berth create` takes a new pack's weights and settings from (a Modelfile's `FROM`).
#[derive(Debug, Clone)]
pub enum CreateBase {
    /// A pack in the store: its files are hard-linked, its manifest values are the starting point.
    Pack(Box<PackEntry>),
    /// A `.gguf` file or a model folder, imported as `berth import` would.
    Path(PathBuf),
}

#[derive(Debug, Clone, Default, Serialize, Deserialize)]
struct Stamps {
    files: BTreeMap<String, Stamp>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
struct Stamp {
    size: u64,
    mtime_ns: u64,
    sha256: String,
}

fn mtime_ns(meta: &fs::Metadata) -> u64 {
    meta.modified()
        .ok()
        .and_then(|t| t.duration_since(UNIX_EPOCH).ok())
        .map_or(0, |d| d.as_nanos() as u64)
}

/// The lowercase hex sha256 of a file's contents.
pub fn sha256_file(path: &Path) -> Result<String, StoreError> {
    let mut f = fs::File::open(path).map_err(io_err(path))?;
    let mut hasher = Sha256::new();
    let mut buf = vec![0u8; 1 << 20];
    loop {
        let n = f.read(&mut buf).map_err(io_err(path))?;
        if n == 0 {
            break;
        }
        hasher.update(&buf[..n]);
    }
    Ok(hasher.finalize().iter().map(|b| format!("{b:02x}")).collect())
}

/// A unique-enough suffix for temporary names.
fn unique_suffix() -> String {
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    static COUNTER: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let n = COUNTER.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    format!("{}-{nanos}-{n}", std::process::id())
}

/// Hard-link `src` to `dst`, copying when linking is not possible (other filesystem, no support).
fn link_or_copy(src: &Path, dst: &Path) -> Result<(), StoreError> {
    if fs::hard_link(src, dst).is_ok() {
        return Ok(());
    }
    fs::copy(src, dst).map(|_| ()).map_err(io_err(src))
}

/// A temporary build directory under `<home>/tmp`, removed on drop unless installed.
struct Staging {
    dir: PathBuf,
    keep: bool,
}

impl Drop for Staging {
    fn drop(&mut self) {
        if !self.keep {
            let _ = fs::remove_dir_all(&self.dir);
        }
    }
}

/// The pack store under a home directory.
#[derive(Debug, Clone)]
pub struct Store {
    home: PathBuf,
}

impl Store {
    /// A store rooted at `home` (nothing is created until something is written).
    pub fn new(home: PathBuf) -> Store {
        Store { home }
    }

    /// `$BERTH_HOME`, else `$HOME/.local/share/berth`.
    pub fn default_home() -> PathBuf {
        if let Some(h) = std::env::var_os("BERTH_HOME").filter(|h| !h.is_empty()) {
            return PathBuf::from(h);
        }
        let home = std::env::var_os("HOME").unwrap_or_else(|| ".".into());
        PathBuf::from(home).join(".local/share/berth")
    }

    /// The home directory.
    pub fn home(&self) -> &Path {
        &self.home
    }

    /// `<home>/packs`.
    pub fn packs_dir(&self) -> PathBuf {
        self.home.join("packs")
    }

    /// The directory a reference lives in (whether or not it exists).
    pub fn pack_dir(&self, reference: &PackRef) -> PathBuf {
        self.packs_dir().join(reference.rel_dir())
    }

    /// Every pack in the store, broken ones included, sorted by reference.
    pub fn list(&self) -> Vec<PackEntry> {
        let root = self.packs_dir();
        let mut dirs = Vec::new();
        find_pack_dirs(&root, 0, &mut dirs);
        let mut entries: Vec<PackEntry> = dirs
            .into_iter()
            .map(|d| {
                let reference = reference_from_dir(&root, &d);
                load_entry(reference, d, false)
            })
            .collect();
        entries.sort_by(|a, b| a.reference.cmp(&b.reference));
        entries
    }

    /// Look a pack up by reference; a bare name means `name:latest`, or its only tag.
    pub fn get(&self, reference: &str) -> Result<PackEntry, StoreError> {
        let direct = self.get_stored(reference);
        match crate::hub::local_name(reference) {
            // A hub name (`hf.co/o/r:q`) finds the pack its pull imported.
            Some(local) if direct.is_err() && local != reference => self.get_stored(&local).or(direct),
            _ => direct,
        }
    }

    /// The pack stored under `reference` itself.
    fn get_stored(&self, reference: &str) -> Result<PackEntry, StoreError> {
        let r = PackRef::parse(reference)?;
        let dir = self.pack_dir(&r);
        if dir.join(MANIFEST_FILE).is_file() || (dir.is_dir() && has_plain_files(&dir)) {
            return Ok(load_entry(r.to_string(), dir, false));
        }
        if !r.explicit_tag {
            let name_dir = dir.parent().map(Path::to_path_buf).unwrap_or_default();
            let tags = self.tags_in(&name_dir);
            match tags.as_slice() {
                [only] => {
                    let r = PackRef::new(&r.name, only)?;
                    return Ok(load_entry(r.to_string(), self.pack_dir(&r), false));
                }
                [] => {}
                _ => return Err(StoreError::AmbiguousTag { name: r.name, tags }),
            }
        }
        Err(StoreError::NotFound {
            reference: r.to_string(),
            store: self.packs_dir(),
        })
    }

    fn tags_in(&self, name_dir: &Path) -> Vec<String> {
        let mut tags: Vec<String> = fs::read_dir(name_dir)
            .into_iter()
            .flatten()
            .flatten()
            .filter(|e| e.path().join(MANIFEST_FILE).is_file())
            .filter_map(|e| e.file_name().to_str().map(str::to_string))
            .collect();
        tags.sort();
        tags
    }

    /// Recheck a pack's manifest and files; `full` re-hashes every file, ignoring stamps.
    pub fn verify(&self, entry: &mut PackEntry, full: bool) {
        *entry = load_entry(entry.reference.clone(), entry.dir.clone(), full);
    }

    /// Delete a pack; returns it as it was.
    pub fn remove(&self, reference: &str) -> Result<PackEntry, StoreError> {
        let entry = self.get(reference)?;
        // Rename first so a concurrent listing never sees a half-deleted pack.
        let trash = self.staging_path("remove")?;
        fs::rename(&entry.dir, &trash).map_err(io_err(&entry.dir))?;
        fs::remove_dir_all(&trash).map_err(io_err(&trash))?;
        self.prune_empty_parents(&entry.dir);
        Ok(entry)
    }

    /// Copy a pack to a new reference, hard-linking its files.
    pub fn copy(&self, src: &str, dst: &str) -> Result<PackEntry, StoreError> {
        let entry = self.get(src)?;
        let dst = PackRef::parse(dst)?;
        let mut manifest = PackManifest::load(&entry.dir)?;
        let staging = self.staging("copy")?;
        copy_tree(&entry.dir, &staging.dir, true)?;
        manifest.name = dst.name.clone();
        manifest.tag = dst.tag.clone();
        manifest.save(&staging.dir)?;
        self.install(staging, &dst)
    }

    /// Resolves a Modelfile's `FROM`: with `dir` (the Modelfile's folder, which relative paths
    /// are taken against) a file or folder that exists, else a pack in the store. Without `dir`
    /// (`/api/create`) only packs: a client does not name files on the server's disk.
    pub fn create_base(&self, from: &str, dir: Option<&Path>) -> Result<CreateBase, StoreError> {
        let from = from.trim();
        if let Some(dir) = dir {
            let p = match from.strip_prefix("~/") {
                Some(rest) => PathBuf::from(std::env::var_os("HOME").unwrap_or_default()).join(rest),
                None => PathBuf::from(from),
            };
            let p = if p.is_absolute() { p } else { dir.join(p) };
            if p.exists() {
                return Ok(CreateBase::Path(p));
            }
        }
        if from.starts_with(['/', '.', '~']) || from.ends_with(".gguf") {
            let msg = match dir {
                Some(_) => "no such file or folder",
                None => {
                    "a file path is not a model here: name a pack in the store (`berth create` or \
                     `berth import` on the server makes one from a file)"
                }
            };
            return Err(StoreError::Unsupported {
                path: PathBuf::from(from),
                msg: msg.into(),
            });
        }
        let entry = self.get(from)?;
        if !entry.is_ok() {
            return Err(StoreError::Broken {
                path: entry.dir,
                problems: entry.problems,
            });
        }
        Ok(CreateBase::Pack(Box::new(entry)))
    }

    /// Creates pack `name` from `base` with a Modelfile's values over the base's (see
    /// [`Modelfile::apply`]); `progress` hears one status line per step, as Ollama's create.
    pub fn create(
        &self,
        name: &str,
        base: &CreateBase,
        mf: &Modelfile,
        progress: &mut dyn FnMut(&str),
    ) -> Result<PackEntry, StoreError> {
        let r = PackRef::parse(name)?;
        let staging = self.staging("create")?;
        match base {
            CreateBase::Pack(entry) => {
                progress(&format!("using pack {}", entry.reference));
                copy_tree(&entry.dir, &staging.dir, true)?;
            }
            CreateBase::Path(path) => {
                progress("reading model metadata");
                // Imported into a scratch store, then linked over: the pack appears whole.
                let scratch_home = self.staging_path("create-import")?;
                let scratch = Store::new(scratch_home.clone());
                let import = ImportOptions {
                    name: Some(r.to_string()),
                    ..ImportOptions::default()
                };
                let result = scratch
                    .import(path, &import)
                    .and_then(|built| copy_tree(&built.dir, &staging.dir, true));
                let _ = fs::remove_dir_all(&scratch_home);
                result?;
            }
        }
        let mut manifest = PackManifest::load(&staging.dir)?;
        manifest.name = r.name.clone();
        manifest.tag = r.tag.clone();
        manifest.created = Some(crate::pack::rfc3339(SystemTime::now()));
        let mut stamps = load_stamps(&staging.dir);
        if let Some(t) = &mf.template {
            progress("writing chat template");
            put_template(&staging.dir, &mut manifest, t, &mut stamps)?;
            manifest
                .capabilities
                .retain(|c| !matches!(c.as_str(), "completion" | "chat" | "tools" | "thinking"));
            let implied = capabilities(Some(t));
            let rest = std::mem::take(&mut manifest.capabilities);
            manifest.capabilities = implied;
            manifest.capabilities.extend(rest);
        }
        for (given, what) in [
            (mf.system.is_some(), "writing system prompt"),
            (!mf.parameters.is_empty(), "writing parameters"),
            (!mf.messages.is_empty(), "writing messages"),
            (!mf.license.is_empty(), "writing license"),
        ] {
            if given {
                progress(what);
            }
        }
        mf.apply(&mut manifest);
        let problems = manifest.problems();
        if !problems.is_empty() {
            return Err(StoreError::Broken {
                path: staging.dir.clone(),
                problems,
            });
        }
        progress("writing manifest");
        manifest.save(&staging.dir)?;
        save_stamps(&staging.dir, &stamps);
        self.install(staging, &r)
    }

    /// Import a GGUF file, an existing pack directory or a Hugging Face model directory (with
    /// the module folders its `modules.json` names, when it is a sentence-transformers model).
    pub fn import(&self, source: &Path, opts: &ImportOptions) -> Result<PackEntry, StoreError> {
        let meta = fs::metadata(source).map_err(io_err(source))?;
        if meta.is_dir() {
            if source.join(MANIFEST_FILE).is_file() {
                self.import_pack(source, opts)
            } else if source.join("config.json").is_file() {
                self.import_hf(source, opts)
            } else {
                Err(StoreError::Unsupported {
                    path: source.to_path_buf(),
                    msg: "directory has neither pack.toml nor config.json".into(),
                })
            }
        } else {
            self.import_gguf(source, opts)
        }
    }

    fn staging_path(&self, what: &str) -> Result<PathBuf, StoreError> {
        let tmp = self.home.join("tmp");
        fs::create_dir_all(&tmp).map_err(io_err(&tmp))?;
        Ok(tmp.join(format!("{what}-{}", unique_suffix())))
    }

    fn staging(&self, what: &str) -> Result<Staging, StoreError> {
        let dir = self.staging_path(what)?;
        fs::create_dir(&dir).map_err(io_err(&dir))?;
        Ok(Staging { dir, keep: false })
    }

    /// Move a finished staging directory to the reference's place, replacing any pack there.
    fn install(&self, mut staging: Staging, r: &PackRef) -> Result<PackEntry, StoreError> {
        let dest = self.pack_dir(r);
        let parent = dest.parent().unwrap_or(&self.home).to_path_buf();
        fs::create_dir_all(&parent).map_err(io_err(&parent))?;
        let old = if dest.exists() {
            let old = self.staging_path("replaced")?;
            fs::rename(&dest, &old).map_err(io_err(&dest))?;
            Some(old)
        } else {
            None
        };
        if let Err(e) = fs::rename(&staging.dir, &dest) {
            if let Some(old) = &old {
                let _ = fs::rename(old, &dest);
            }
            return Err(io_err(&dest)(e));
        }
        staging.keep = true;
        if let Some(old) = old {
            let _ = fs::remove_dir_all(old);
        }
        Ok(load_entry(r.to_string(), dest, false))
    }

    fn prune_empty_parents(&self, dir: &Path) {
        let root = self.packs_dir();
        let mut cur = dir.parent();
        while let Some(p) = cur {
            if p == root || !p.starts_with(&root) || fs::remove_dir(p).is_err() {
                break;
            }
            cur = p.parent();
        }
    }

    fn resolve_ref(&self, opts: &ImportOptions, name: &str, tag: &str) -> Result<PackRef, StoreError> {
        match &opts.name {
            Some(n) => Ok(PackRef::parse(n)?),
            None => Ok(PackRef::new(name, tag)?),
        }
    }

    fn import_gguf(&self, source: &Path, opts: &ImportOptions) -> Result<PackEntry, StoreError> {
        let gguf = GgufFile::open(source)?;
        let arch = gguf.architecture().unwrap_or("").to_string();
        let family = pick_family(source, &arch, opts)?;
        let quantization = gguf
            .get_u64("general.file_type")
            .and_then(|t| u32::try_from(t).ok())
            .and_then(file_type_name)
            .map(str::to_string)
            .or_else(|| dominant_gguf_type(&gguf));
        let context_length = gguf.get_u64(&format!("{arch}.context_length"));
        let embedded = gguf.get_str("tokenizer.chat_template").map(str::to_string);
        let given = read_template(opts)?;
        let template = given.clone().or(embedded);

        let stem = source.file_stem().and_then(|s| s.to_str()).unwrap_or("model");
        let name = sanitize_name(gguf.get_str("general.name").unwrap_or(stem));
        let tag = gguf
            .get_str("general.size_label")
            .map(sanitize_name)
            .unwrap_or_else(|| "latest".into());
        let r = self.resolve_ref(opts, &name, &tag)?;

        let mut manifest = PackManifest::new(&r, &family);
        manifest.architecture = arch;
        manifest.format = PackFormat::Gguf;
        manifest.description = gguf.get_str("general.description").map(str::to_string);
        manifest.parameters = Some(gguf.parameter_count());
        manifest.quantization = quantization;
        manifest.context_length = context_length;
        manifest.capabilities = capabilities(template.as_deref());
        drop(gguf);

        let staging = self.staging("import")?;
        let mut stamps = Stamps::default();
        let weights = staging.dir.join(GGUF_WEIGHTS_FILE);
        link_or_copy(source, &weights)?;
        manifest.files.push(hashed_file(
            &staging.dir,
            GGUF_WEIGHTS_FILE,
            FileRole::Weights,
            &mut stamps,
        )?);
        if let Some(t) = given {
            let p = staging.dir.join(TEMPLATE_FILE);
            fs::write(&p, t).map_err(io_err(&p))?;
            manifest.files.push(hashed_file(
                &staging.dir,
                TEMPLATE_FILE,
                FileRole::Template,
                &mut stamps,
            )?);
        }
        if opts.quantize.is_some() {
            manifest.quantize = opts.quantize.clone();
        }
        manifest.save(&staging.dir)?;
        save_stamps(&staging.dir, &stamps);
        self.install(staging, &r)
    }

    fn import_pack(&self, source: &Path, opts: &ImportOptions) -> Result<PackEntry, StoreError> {
        let mut manifest = PackManifest::load(source)?;
        let r = self.resolve_ref(opts, &manifest.name, &manifest.tag)?;
        manifest.name = r.name.clone();
        manifest.tag = r.tag.clone();
        if let Some(f) = &opts.family {
            manifest.family = f.clone();
        }
        let problems = manifest.problems();
        if !problems.is_empty() {
            return Err(StoreError::Broken {
                path: source.to_path_buf(),
                problems,
            });
        }
        let staging = self.staging("import")?;
        copy_tree(source, &staging.dir, false)?;
        let mut stamps = Stamps::default();
        let mut problems = Vec::new();
        for f in &mut manifest.files {
            let p = staging.dir.join(&f.path);
            let Ok(meta) = fs::metadata(&p) else {
                problems.push(format!("{}: missing", f.path));
                continue;
            };
            if let Some(size) = f.size.filter(|&s| s != meta.len()) {
                problems.push(size_problem(&f.path, meta.len(), size));
                continue;
            }
            let actual = hashed_file(&staging.dir, &f.path, f.role, &mut stamps)?;
            match &f.sha256 {
                Some(h) if !h.eq_ignore_ascii_case(actual.sha256.as_deref().unwrap_or("")) => {
                    problems.push(format!("{}: sha256 mismatch", f.path))
                }
                _ => {
                    f.size = actual.size;
                    f.sha256 = actual.sha256;
                }
            }
        }
        if let Some(t) = read_template(opts)? {
            put_template(&staging.dir, &mut manifest, &t, &mut stamps)?;
            for cap in capabilities(Some(&t)) {
                if !manifest.has_capability(&cap) {
                    manifest.capabilities.push(cap);
                }
            }
        }
        if !problems.is_empty() {
            return Err(StoreError::Broken {
                path: source.to_path_buf(),
                problems,
            });
        }
        if opts.quantize.is_some() {
            manifest.quantize = opts.quantize.clone();
        }
        manifest.save(&staging.dir)?;
        save_stamps(&staging.dir, &stamps);
        self.install(staging, &r)
    }

    fn import_hf(&self, source: &Path, opts: &ImportOptions) -> Result<PackEntry, StoreError> {
        let config_path = source.join("config.json");
        let text = fs::read_to_string(&config_path).map_err(io_err(&config_path))?;
        let config: serde_json::Value = serde_json::from_str(&text).map_err(|e| StoreError::Unsupported {
            path: config_path.clone(),
            msg: format!("invalid JSON: {e}"),
        })?;
        let text_config = config.get("text_config");
        let lookup = |key: &str| config.get(key).or_else(|| text_config.and_then(|t| t.get(key)));
        let arch_class = config
            .get("architectures")
            .and_then(|a| a.get(0))
            .and_then(|a| a.as_str())
            .unwrap_or("");
        let arch = match config.get("model_type").and_then(|m| m.as_str()) {
            Some(m) => m.to_string(),
            None => arch_class
                .trim_end_matches("ForCausalLM")
                .trim_end_matches("ForConditionalGeneration")
                .to_ascii_lowercase(),
        };
        let family = pick_family(source, &arch, opts)?;
        let modules = read_modules(source)?;
        let module_files = match &modules {
            Some(m) => module_files(source, m)?,
            None => Vec::new(),
        };

        let mut entries: Vec<PathBuf> = fs::read_dir(source)
            .map_err(io_err(source))?
            .flatten()
            .map(|e| e.path())
            .filter(|p| p.is_file())
            .filter(|p| {
                p.file_name()
                    .and_then(|n| n.to_str())
                    .is_some_and(|n| !n.starts_with('.'))
            })
            .collect();
        entries.sort();
        let mut params = 0u64;
        let mut by_dtype: BTreeMap<String, u64> = BTreeMap::new();
        let mut n_weights = 0;
        for p in &entries {
            if p.extension().and_then(|e| e.to_str()) == Some("safetensors") {
                let st = SafetensorsFile::open(p)?;
                n_weights += 1;
                params += st.parameter_count();
                for t in st.tensors() {
                    *by_dtype.entry(t.dtype.name().to_string()).or_default() += t.n_bytes();
                }
            }
        }
        if n_weights == 0 {
            return Err(StoreError::Unsupported {
                path: source.to_path_buf(),
                msg: "no .safetensors files next to config.json".into(),
            });
        }
        // A module's dense layers run on every embedding: they count as the model's parameters.
        for rel in module_files.iter().filter(|r| r.ends_with(".safetensors")) {
            let st = SafetensorsFile::open(source.join(rel))?;
            params += st.parameter_count();
            for t in st.tensors() {
                *by_dtype.entry(t.dtype.name().to_string()).or_default() += t.n_bytes();
            }
        }
        let quantization = by_dtype
            .iter()
            .max_by_key(|(_, bytes)| **bytes)
            .map(|(d, _)| d.clone());

        let given = read_template(opts)?;
        let in_dir = fs::read_to_string(source.join(TEMPLATE_FILE)).ok();
        let from_tokenizer_config = tokenizer_config_template(source);
        let template = given.clone().or(in_dir.clone()).or(from_tokenizer_config.clone());

        let dir_name = source
            .canonicalize()
            .ok()
            .and_then(|p| p.file_name().and_then(|n| n.to_str()).map(str::to_string))
            .unwrap_or_else(|| "model".into());
        let r = self.resolve_ref(opts, &sanitize_name(&dir_name), "latest")?;

        let mut manifest = PackManifest::new(&r, &family);
        manifest.architecture = arch;
        manifest.format = PackFormat::Safetensors;
        manifest.parameters = Some(params);
        manifest.quantization = quantization;
        // An embedding model was trained to embed `max_seq_length` tokens, often fewer than its
        // position table holds.
        manifest.context_length = sentence_bert_max_seq_length(source)
            .or_else(|| lookup("max_position_embeddings").and_then(|v| v.as_u64()));
        manifest.capabilities = match &modules {
            // A pooled pipeline answers with vectors, whatever template the tokenizer carries.
            Some(m) if sentence_transformers::embeds(m) => vec!["embedding".to_string()],
            _ => capabilities(template.as_deref()),
        };

        let staging = self.staging("import")?;
        let mut stamps = Stamps::default();
        for p in &entries {
            let Some(name) = p.file_name().and_then(|n| n.to_str()) else {
                continue;
            };
            if given.is_some() && name == TEMPLATE_FILE {
                continue;
            }
            link_or_copy(p, &staging.dir.join(name))?;
            manifest
                .files
                .push(hashed_file(&staging.dir, name, hf_role(name), &mut stamps)?);
        }
        for rel in &module_files {
            let dst = staging.dir.join(rel);
            if let Some(parent) = dst.parent() {
                fs::create_dir_all(parent).map_err(io_err(parent))?;
            }
            // The file itself, not a link to it (a Hugging Face cache's folders hold symlinks).
            let src = source.join(rel);
            link_or_copy(&fs::canonicalize(&src).unwrap_or(src), &dst)?;
            manifest
                .files
                .push(hashed_file(&staging.dir, rel, FileRole::Module, &mut stamps)?);
        }
        let extracted = given.or(if in_dir.is_none() {
            from_tokenizer_config
        } else {
            None
        });
        if let Some(t) = extracted {
            let p = staging.dir.join(TEMPLATE_FILE);
            fs::write(&p, t).map_err(io_err(&p))?;
            manifest.files.push(hashed_file(
                &staging.dir,
                TEMPLATE_FILE,
                FileRole::Template,
                &mut stamps,
            )?);
        }
        if opts.quantize.is_some() {
            manifest.quantize = opts.quantize.clone();
        }
        manifest.save(&staging.dir)?;
        save_stamps(&staging.dir, &stamps);
        self.install(staging, &r)
    }
}

/// The modules of a sentence-transformers directory (`None` when it has no `modules.json`).
fn read_modules(dir: &Path) -> Result<Option<Vec<sentence_transformers::Module>>, StoreError> {
    let path = dir.join(sentence_transformers::MODULES_FILE);
    if !path.is_file() {
        return Ok(None);
    }
    let text = fs::read_to_string(&path).map_err(io_err(&path))?;
    sentence_transformers::parse_modules(&text)
        .map(Some)
        .map_err(|msg| StoreError::Unsupported { path, msg })
}

/// The files (paths relative to `dir`, `/`-separated, sorted) of every module folder that
/// exists; a listed folder that does not (`4_Normalize`: it has no files) is skipped.
fn module_files(dir: &Path, modules: &[sentence_transformers::Module]) -> Result<Vec<String>, StoreError> {
    let mut out = Vec::new();
    for folder in sentence_transformers::module_folders(modules) {
        if dir.join(&folder).is_dir() {
            walk_files(dir, &folder, &mut out)?;
        }
    }
    Ok(out)
}

/// Appends the files under `dir/rel` (recursively, sorted, hidden names skipped) as relative paths.
fn walk_files(dir: &Path, rel: &str, out: &mut Vec<String>) -> Result<(), StoreError> {
    let abs = dir.join(rel);
    let mut names: Vec<String> = fs::read_dir(&abs)
        .map_err(io_err(&abs))?
        .flatten()
        .filter_map(|e| e.file_name().to_str().map(str::to_string))
        .filter(|n| !n.starts_with('.'))
        .collect();
    names.sort();
    for name in names {
        let child = format!("{rel}/{name}");
        let meta = fs::metadata(dir.join(&child)).map_err(io_err(&dir.join(&child)))?;
        if meta.is_dir() {
            walk_files(dir, &child, out)?;
        } else if meta.is_file() {
            out.push(child);
        }
    }
    Ok(())
}

/// `max_seq_length` from `sentence_bert_config.json`, when the directory has one.
fn sentence_bert_max_seq_length(dir: &Path) -> Option<u64> {
    let text = fs::read_to_string(dir.join(sentence_transformers::SENTENCE_BERT_CONFIG)).ok()?;
    let v: serde_json::Value = serde_json::from_str(&text).ok()?;
    v.get("max_seq_length")?.as_u64()
}

fn pick_family(source: &Path, arch: &str, opts: &ImportOptions) -> Result<String, StoreError> {
    if let Some(f) = &opts.family {
        return Ok(f.clone());
    }
    family_for_architecture(arch)
        .map(str::to_string)
        .ok_or_else(|| StoreError::UnknownArchitecture {
            path: source.to_path_buf(),
            arch: arch.to_string(),
        })
}

fn read_template(opts: &ImportOptions) -> Result<Option<String>, StoreError> {
    opts.template
        .as_ref()
        .map(|p| fs::read_to_string(p).map_err(io_err(p)))
        .transpose()
}

/// The chat template from `tokenizer_config.json` (a string, or the `default` of a named list).
fn tokenizer_config_template(dir: &Path) -> Option<String> {
    let text = fs::read_to_string(dir.join("tokenizer_config.json")).ok()?;
    let v: serde_json::Value = serde_json::from_str(&text).ok()?;
    match v.get("chat_template")? {
        serde_json::Value::String(s) => Some(s.clone()),
        serde_json::Value::Array(list) => list
            .iter()
            .find(|t| t.get("name").and_then(|n| n.as_str()) == Some("default"))
            .or_else(|| list.first())
            .and_then(|t| t.get("template"))
            .and_then(|t| t.as_str())
            .map(str::to_string),
        _ => None,
    }
}

/// Capabilities implied by a chat template (or its absence).
pub fn capabilities(template: Option<&str>) -> Vec<String> {
    let mut caps = vec!["completion".to_string()];
    if let Some(t) = template {
        caps.push("chat".into());
        if t.contains("tools") {
            caps.push("tools".into());
        }
        if t.contains("enable_thinking") || t.contains("<think>") {
            caps.push("thinking".into());
        }
    }
    caps
}

/// The most common non-F32 tensor type by bytes (F32 when every tensor is F32).
fn dominant_gguf_type(gguf: &GgufFile) -> Option<String> {
    let mut bytes: BTreeMap<GgmlType, u64> = BTreeMap::new();
    for t in gguf.tensors() {
        *bytes.entry(t.ggml_type).or_default() += t.n_bytes;
    }
    bytes
        .iter()
        .filter(|(t, _)| **t != GgmlType::F32)
        .max_by_key(|(_, b)| **b)
        .or_else(|| bytes.iter().next())
        .map(|(t, _)| t.name())
}

fn hf_role(name: &str) -> FileRole {
    if name.ends_with(".safetensors") {
        FileRole::Weights
    } else if name.ends_with(".jinja") {
        FileRole::Template
    } else if name.starts_with("tokenizer")
        || matches!(
            name,
            "vocab.json" | "merges.txt" | "special_tokens_map.json" | "added_tokens.json"
        )
    {
        FileRole::Tokenizer
    } else if name.ends_with("config.json")
        || name.ends_with(".index.json")
        || name == sentence_transformers::MODULES_FILE
        || name == sentence_transformers::SENTENCE_TRANSFORMERS_CONFIG
    {
        FileRole::Config
    } else {
        FileRole::Other
    }
}

/// Hash a file inside `dir`, record its stamp, and describe it for the manifest.
/// Writes a pack's chat template file into `dir` and lists it in the manifest. A file already
/// there may be a hard link to another pack's: it is replaced, never written through.
fn put_template(
    dir: &Path,
    manifest: &mut PackManifest,
    text: &str,
    stamps: &mut Stamps,
) -> Result<(), StoreError> {
    let p = dir.join(TEMPLATE_FILE);
    if p.exists() {
        fs::remove_file(&p).map_err(io_err(&p))?;
    }
    fs::write(&p, text).map_err(io_err(&p))?;
    manifest.files.retain(|f| f.path != TEMPLATE_FILE);
    manifest
        .files
        .push(hashed_file(dir, TEMPLATE_FILE, FileRole::Template, stamps)?);
    Ok(())
}

fn hashed_file(dir: &Path, rel: &str, role: FileRole, stamps: &mut Stamps) -> Result<PackFile, StoreError> {
    let p = dir.join(rel);
    let meta = fs::metadata(&p).map_err(io_err(&p))?;
    let sha = sha256_file(&p)?;
    stamps.files.insert(
        rel.to_string(),
        Stamp {
            size: meta.len(),
            mtime_ns: mtime_ns(&meta),
            sha256: sha.clone(),
        },
    );
    Ok(PackFile {
        path: rel.to_string(),
        role,
        size: Some(meta.len()),
        sha256: Some(sha),
    })
}

fn load_stamps(dir: &Path) -> Stamps {
    fs::read(dir.join(STAMP_FILE))
        .ok()
        .and_then(|b| serde_json::from_slice(&b).ok())
        .unwrap_or_default()
}

/// Best effort: a read-only store still lists, it just re-hashes next time.
fn save_stamps(dir: &Path, stamps: &Stamps) {
    let Ok(text) = serde_json::to_vec_pretty(stamps) else {
        return;
    };
    let tmp = dir.join(format!("{STAMP_FILE}.{}", unique_suffix()));
    if fs::write(&tmp, text).is_ok() && fs::rename(&tmp, dir.join(STAMP_FILE)).is_err() {
        let _ = fs::remove_file(&tmp);
    }
}

/// Copy a directory tree, hard-linking files where possible; `with_stamps` keeps `.verified.json`.
fn copy_tree(src: &Path, dst: &Path, with_stamps: bool) -> Result<(), StoreError> {
    for e in fs::read_dir(src).map_err(io_err(src))? {
        let e = e.map_err(io_err(src))?;
        let name = e.file_name();
        if name == MANIFEST_FILE || (!with_stamps && name == STAMP_FILE) {
            if name == MANIFEST_FILE {
                fs::copy(e.path(), dst.join(&name)).map_err(io_err(&e.path()))?;
            }
            continue;
        }
        let ty = e.file_type().map_err(io_err(&e.path()))?;
        let target = dst.join(&name);
        if ty.is_dir() {
            fs::create_dir(&target).map_err(io_err(&target))?;
            copy_tree(&e.path(), &target, with_stamps)?;
        } else {
            // Follows symlinks: the pack gets the file, not the link.
            link_or_copy(&e.path(), &target)?;
        }
    }
    Ok(())
}

fn has_plain_files(dir: &Path) -> bool {
    fs::read_dir(dir).into_iter().flatten().flatten().any(|e| {
        e.file_type().is_ok_and(|t| t.is_file()) && !e.file_name().to_string_lossy().starts_with('.')
    })
}

/// Collect pack directories: those with `pack.toml`, or with files but no manifest (broken).
fn find_pack_dirs(dir: &Path, depth: usize, out: &mut Vec<PathBuf>) {
    if depth > 0 && dir.join(MANIFEST_FILE).is_file() {
        out.push(dir.to_path_buf());
        return;
    }
    if depth >= 2 && has_plain_files(dir) {
        out.push(dir.to_path_buf());
        return;
    }
    if depth >= 3 {
        return;
    }
    let Ok(rd) = fs::read_dir(dir) else {
        return;
    };
    let mut subdirs: Vec<PathBuf> = rd
        .flatten()
        .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
        .filter(|e| !e.file_name().to_string_lossy().starts_with('.'))
        .map(|e| e.path())
        .collect();
    subdirs.sort();
    for d in subdirs {
        find_pack_dirs(&d, depth + 1, out);
    }
}

/// `name:tag` from a pack directory's path under `packs/`.
fn reference_from_dir(root: &Path, dir: &Path) -> String {
    let rel = dir.strip_prefix(root).unwrap_or(dir);
    let parts: Vec<String> = rel
        .components()
        .map(|c| c.as_os_str().to_string_lossy().into_owned())
        .collect();
    match parts.split_last() {
        Some((tag, name)) if !name.is_empty() => format!("{}:{tag}", name.join("/")),
        _ => parts.join("/"),
    }
}

fn size_problem(path: &str, actual: u64, expected: u64) -> String {
    let hint = if actual < expected { " (truncated)" } else { "" };
    format!("{path}: size is {actual} bytes, manifest says {expected}{hint}")
}

/// Read a pack directory and check it; `full` re-hashes every file.
fn load_entry(reference: String, dir: PathBuf, full: bool) -> PackEntry {
    let mut problems = Vec::new();
    if PackRef::parse(&reference).map(|r| r.to_string()) != Ok(reference.clone()) {
        problems.push(format!(
            "directory {} is not a valid <name>/<tag> location",
            dir.display()
        ));
    }
    let manifest_path = dir.join(MANIFEST_FILE);
    let modified = fs::metadata(&manifest_path)
        .or_else(|_| fs::metadata(&dir))
        .and_then(|m| m.modified())
        .unwrap_or(UNIX_EPOCH);
    let manifest = match PackManifest::load(&dir) {
        Ok(m) => Some(m),
        Err(PackError::Io { source, .. }) if source.kind() == std::io::ErrorKind::NotFound => {
            problems.push(format!("{} is missing", manifest_path.display()));
            None
        }
        Err(e) => {
            problems.push(e.to_string());
            None
        }
    };
    let mut size = 0;
    match &manifest {
        Some(m) => {
            if m.reference() != reference {
                problems.push(format!(
                    "manifest names {} but the pack is stored as {reference}",
                    m.reference()
                ));
            }
            problems.extend(m.problems());
            let needs_weights = matches!(m.format, PackFormat::Gguf | PackFormat::Safetensors);
            if needs_weights && m.weights().next().is_none() {
                problems.push("no weights file listed".into());
            }
            let (file_problems, bytes) = check_files(&dir, m, full);
            problems.extend(file_problems);
            size = bytes;
        }
        None => {
            for e in fs::read_dir(&dir).into_iter().flatten().flatten() {
                if let Ok(meta) = e.metadata() {
                    if meta.is_file() {
                        size += meta.len();
                    }
                }
            }
        }
    }
    PackEntry {
        reference,
        dir,
        manifest,
        problems,
        modified,
        size,
    }
}

/// Check every listed file's presence, size and sha256 (via stamps unless `full`).
fn check_files(dir: &Path, m: &PackManifest, full: bool) -> (Vec<String>, u64) {
    let mut problems = Vec::new();
    let mut total = 0;
    let old = load_stamps(dir);
    let mut stamps = Stamps::default();
    for f in &m.files {
        if !is_safe_relative(&f.path) {
            continue;
        }
        let p = dir.join(&f.path);
        let meta = match fs::metadata(&p) {
            Ok(meta) if meta.is_file() => meta,
            Ok(_) => {
                problems.push(format!("{}: not a regular file", f.path));
                continue;
            }
            Err(_) => {
                problems.push(format!("{}: missing", f.path));
                continue;
            }
        };
        total += meta.len();
        if let Some(expected) = f.size.filter(|&s| s != meta.len()) {
            problems.push(size_problem(&f.path, meta.len(), expected));
            continue;
        }
        let Some(expected) = &f.sha256 else {
            continue;
        };
        let current = (meta.len(), mtime_ns(&meta));
        let cached = old
            .files
            .get(&f.path)
            .filter(|s| !full && (s.size, s.mtime_ns) == current);
        let actual = match cached {
            Some(s) => s.sha256.clone(),
            None => match sha256_file(&p) {
                Ok(h) => h,
                Err(e) => {
                    problems.push(e.to_string());
                    continue;
                }
            },
        };
        stamps.files.insert(
            f.path.clone(),
            Stamp {
                size: current.0,
                mtime_ns: current.1,
                sha256: actual.clone(),
            },
        );
        if !actual.eq_ignore_ascii_case(expected) {
            problems.push(format!(
                "{}: sha256 mismatch (manifest {}, file {})",
                f.path,
                short(expected),
                short(&actual)
            ));
        }
    }
    if stamps.files != old.files {
        save_stamps(dir, &stamps);
    }
    (problems, total)
}

fn short(hash: &str) -> &str {
    hash.get(..12).unwrap_or(hash)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gguf::GgufValue;
    use crate::testutil::{safetensors_bytes, sample_gguf, GgufWriter};
    use std::time::Duration;

    const TEMPLATE: &str = "{% if tools %}{{ tools }}{% endif %}<think>{{ messages }}";

    fn setup(template: Option<&str>) -> (tempfile::TempDir, Store, PathBuf) {
        let tmp = tempfile::tempdir().unwrap();
        let src = tmp.path().join("Tiny.gguf");
        fs::write(&src, sample_gguf(template)).unwrap();
        let store = Store::new(tmp.path().join("home"));
        (tmp, store, src)
    }

    fn bump_mtime(p: &Path) {
        let f = fs::File::options().write(true).open(p).unwrap();
        let t = f.metadata().unwrap().modified().unwrap();
        f.set_modified(t + Duration::from_secs(10)).unwrap();
    }

    #[test]
    fn gguf_import_then_list() {
        let (_tmp, store, src) = setup(Some(TEMPLATE));
        let e = store.import(&src, &ImportOptions::default()).unwrap();
        assert_eq!(e.reference, "tiny-coder:0.5b");
        assert!(e.is_ok(), "{:?}", e.problems);
        let m = e.manifest.as_ref().unwrap();
        assert_eq!(m.architecture, "qwen2");
        assert_eq!(m.family, "qwen3");
        assert_eq!(m.format, PackFormat::Gguf);
        assert_eq!(m.quantization.as_deref(), Some("Q4_K_M"));
        assert_eq!(m.context_length, Some(4096));
        assert_eq!(m.parameters, Some(256 + 512 + 64 + 64));
        assert_eq!(m.capabilities, ["completion", "chat", "tools", "thinking"]);
        assert!(m.created.is_some());
        let w = &m.files[0];
        assert_eq!((w.path.as_str(), w.role), (GGUF_WEIGHTS_FILE, FileRole::Weights));
        assert_eq!(w.size, Some(fs::metadata(&src).unwrap().len()));
        assert_eq!(w.sha256.as_deref(), Some(sha256_file(&src).unwrap().as_str()));
        assert_eq!(e.dir, store.home().join("packs/tiny-coder/0.5b"));
        assert!(e.dir.join(STAMP_FILE).is_file());
        assert_eq!(e.size, w.size.unwrap());

        let list = store.list();
        assert_eq!(list.len(), 1);
        assert_eq!(list[0].reference, "tiny-coder:0.5b");
        assert!(list[0].is_ok(), "{:?}", list[0].problems);
        // Nothing left behind in the staging area.
        assert_eq!(fs::read_dir(store.home().join("tmp")).unwrap().count(), 0);
    }

    #[test]
    fn import_options_override_name_family_and_template() {
        let (tmp, store, src) = setup(None);
        let tpl = tmp.path().join("t.jinja");
        fs::write(&tpl, "{{ messages }}").unwrap();
        let opts = ImportOptions {
            name: Some("ns/custom:v1".into()),
            template: Some(tpl),
            family: Some("scripted".into()),
            quantize: Some("q8_0".into()),
        };
        let e = store.import(&src, &opts).unwrap();
        assert_eq!(e.reference, "ns/custom:v1");
        let m = e.manifest.as_ref().unwrap();
        assert_eq!(
            m.quantize.as_deref(),
            Some("q8_0"),
            "the pack says how it is loaded"
        );
        assert!(e.is_ok(), "{:?}", e.problems);
        let m = e.manifest.unwrap();
        assert_eq!(m.family, "scripted");
        assert_eq!(m.capabilities, ["completion", "chat"]);
        assert_eq!(m.files[1].role, FileRole::Template);
        assert_eq!(
            fs::read_to_string(e.dir.join(TEMPLATE_FILE)).unwrap(),
            "{{ messages }}"
        );
        assert_eq!(store.list()[0].reference, "ns/custom:v1");
        assert_eq!(store.get("ns/custom").unwrap().reference, "ns/custom:v1");
    }

    #[test]
    fn no_template_means_no_chat() {
        let (_tmp, store, src) = setup(None);
        let m = store
            .import(&src, &ImportOptions::default())
            .unwrap()
            .manifest
            .unwrap();
        assert_eq!(m.capabilities, ["completion"]);
    }

    #[test]
    fn fallback_names_and_quantization() {
        let tmp = tempfile::tempdir().unwrap();
        let src = tmp.path().join("My Model.gguf");
        let bytes = GgufWriter::new()
            .str("general.architecture", "gemma3")
            .tensor("a", &[256], GgmlType::Q6_K)
            .tensor("b", &[512], GgmlType::Q4_K)
            .tensor("c", &[64], GgmlType::F32)
            .build();
        fs::write(&src, bytes).unwrap();
        let store = Store::new(tmp.path().join("home"));
        let e = store.import(&src, &ImportOptions::default()).unwrap();
        assert_eq!(e.reference, "my-model:latest");
        let m = e.manifest.unwrap();
        assert_eq!(m.family, "gemma");
        assert_eq!(
            m.quantization.as_deref(),
            Some("Q4_K"),
            "dominant non-F32 type by bytes"
        );
        assert_eq!(m.context_length, None);
    }

    #[test]
    fn unknown_architecture_is_refused_without_a_family() {
        let tmp = tempfile::tempdir().unwrap();
        let src = tmp.path().join("x.gguf");
        fs::write(
            &src,
            GgufWriter::new().str("general.architecture", "llama").build(),
        )
        .unwrap();
        let store = Store::new(tmp.path().join("home"));
        let e = store.import(&src, &ImportOptions::default()).unwrap_err();
        assert!(matches!(e, StoreError::UnknownArchitecture { .. }), "{e}");
        assert!(e.to_string().contains("x.gguf"), "{e}");
        assert!(store.list().is_empty());
    }

    #[test]
    fn failed_import_leaves_nothing_behind() {
        let (_tmp, store, src) = setup(None);
        let full = fs::read(&src).unwrap();
        fs::write(&src, &full[..full.len() - 5]).unwrap();
        let e = store.import(&src, &ImportOptions::default()).unwrap_err();
        assert!(matches!(e, StoreError::Gguf(GgufError::Truncated { .. })), "{e}");
        assert!(store.list().is_empty());
        let leftovers = fs::read_dir(store.home().join("tmp")).map_or(0, |d| d.count());
        assert_eq!(leftovers, 0);
    }

    #[test]
    fn corrupted_weights_are_reported() {
        let (_tmp, store, src) = setup(None);
        let e = store.import(&src, &ImportOptions::default()).unwrap();
        let weights = e.dir.join(GGUF_WEIGHTS_FILE);
        let mut bytes = fs::read(&weights).unwrap();
        let n = bytes.len();
        bytes[n - 1] ^= 0xff;
        fs::remove_file(&weights).unwrap(); // break the hard link to the source
        fs::write(&weights, &bytes).unwrap();
        bump_mtime(&weights);
        let list = store.list();
        assert_eq!(list.len(), 1);
        assert!(
            list[0].problems.iter().any(|p| p.contains("sha256 mismatch")),
            "{:?}",
            list[0].problems
        );

        fs::write(&weights, &bytes[..n - 100]).unwrap();
        let list = store.list();
        assert!(
            list[0]
                .problems
                .iter()
                .any(|p| p.contains("size") && p.contains("truncated")),
            "{:?}",
            list[0].problems
        );

        fs::remove_file(&weights).unwrap();
        let p = &store.list()[0].problems;
        assert!(p.iter().any(|p| p.contains("model.gguf: missing")), "{p:?}");
    }

    #[test]
    fn stamps_skip_rehashing_until_the_file_changes() {
        let (_tmp, store, src) = setup(None);
        let e = store.import(&src, &ImportOptions::default()).unwrap();
        // Forge the stamp: a listing trusts it while size and mtime are unchanged ...
        let mut stamps = load_stamps(&e.dir);
        stamps.files.get_mut(GGUF_WEIGHTS_FILE).unwrap().sha256 = "ab".repeat(32);
        save_stamps(&e.dir, &stamps);
        assert!(!store.list()[0].is_ok());
        // ... a full verify re-hashes and repairs it ...
        let mut entry = store.get("tiny-coder:0.5b").unwrap();
        store.verify(&mut entry, true);
        assert!(entry.is_ok(), "{:?}", entry.problems);
        assert!(store.list()[0].is_ok());
        // ... and a changed mtime also forces a re-hash.
        let mut stamps = load_stamps(&e.dir);
        stamps.files.get_mut(GGUF_WEIGHTS_FILE).unwrap().sha256 = "ab".repeat(32);
        save_stamps(&e.dir, &stamps);
        bump_mtime(&e.dir.join(GGUF_WEIGHTS_FILE));
        assert!(store.list()[0].is_ok());
    }

    #[test]
    fn malformed_and_foreign_packs_are_listed_with_problems() {
        let (_tmp, store, src) = setup(None);
        store.import(&src, &ImportOptions::default()).unwrap();
        let packs = store.packs_dir();
        let bad = packs.join("bad/latest");
        fs::create_dir_all(&bad).unwrap();
        fs::write(bad.join(MANIFEST_FILE), "name = \"bad\"\nfamily = = 3\n").unwrap();
        let odd = packs.join("odd/v1");
        fs::create_dir_all(&odd).unwrap();
        fs::write(
            odd.join(MANIFEST_FILE),
            "name = \"odd\"\ntag = \"v1\"\nfamily = \"llama\"\n",
        )
        .unwrap();
        let empty = packs.join("nofamily/v1");
        fs::create_dir_all(&empty).unwrap();
        fs::write(empty.join(MANIFEST_FILE), "name = \"nofamily\"\ntag = \"v1\"\n").unwrap();
        let orphan = packs.join("orphan/v1");
        fs::create_dir_all(&orphan).unwrap();
        fs::write(orphan.join("model.gguf"), b"x").unwrap();

        let list = store.list();
        let refs: Vec<&str> = list.iter().map(|e| e.reference.as_str()).collect();
        assert_eq!(
            refs,
            [
                "bad:latest",
                "nofamily:v1",
                "odd:v1",
                "orphan:v1",
                "tiny-coder:0.5b"
            ]
        );
        assert!(list[0].manifest.is_none());
        assert!(
            list[0].problems[0].contains("pack.toml:2:"),
            "{:?}",
            list[0].problems
        );
        assert!(list[1].problems.iter().any(|p| p.contains("no family")));
        assert!(!list[2].problems.iter().any(|p| p.contains("family")));
        assert!(list[3].problems[0].contains("missing"), "{:?}", list[3].problems);
        assert_eq!(list[3].size, 1);
        assert!(list[4].is_ok());
        // A broken pack can still be fetched by reference and removed.
        assert!(!store.get("bad").unwrap().is_ok());
        store.remove("bad").unwrap();
        store.remove("orphan:v1").unwrap();
        assert_eq!(store.list().len(), 3);
    }

    #[test]
    fn get_resolves_tags() {
        let (_tmp, store, src) = setup(None);
        store.import(&src, &ImportOptions::default()).unwrap();
        assert_eq!(store.get("tiny-coder").unwrap().reference, "tiny-coder:0.5b");
        assert!(matches!(
            store.get("tiny-coder:1b"),
            Err(StoreError::NotFound { .. })
        ));
        let opts = ImportOptions {
            name: Some("tiny-coder:q8".into()),
            ..Default::default()
        };
        store.import(&src, &opts).unwrap();
        let e = store.get("tiny-coder").unwrap_err();
        assert!(matches!(e, StoreError::AmbiguousTag { .. }), "{e}");
        assert_eq!(
            e.to_string(),
            "model tiny-coder has several tags (0.5b, q8); name one as tiny-coder:<tag>"
        );
        let opts = ImportOptions {
            name: Some("tiny-coder".into()),
            ..Default::default()
        };
        store.import(&src, &opts).unwrap();
        assert_eq!(store.get("tiny-coder").unwrap().reference, "tiny-coder:latest");
        assert!(matches!(store.get("bad name"), Err(StoreError::Reference(_))));
        let e = store.get("nothing").unwrap_err();
        assert!(e.to_string().contains("not found in"), "{e}");
    }

    #[test]
    fn remove_and_copy() {
        let (_tmp, store, src) = setup(Some(TEMPLATE));
        let e = store.import(&src, &ImportOptions::default()).unwrap();
        let c = store.copy("tiny-coder:0.5b", "lib/mine:x").unwrap();
        assert!(c.is_ok(), "{:?}", c.problems);
        assert_eq!(c.manifest.as_ref().unwrap().reference(), "lib/mine:x");
        #[cfg(unix)]
        {
            use std::os::unix::fs::MetadataExt;
            let a = fs::metadata(e.dir.join(GGUF_WEIGHTS_FILE)).unwrap();
            let b = fs::metadata(c.dir.join(GGUF_WEIGHTS_FILE)).unwrap();
            assert_eq!(a.ino(), b.ino(), "copies hard-link");
        }
        store.remove("tiny-coder:0.5b").unwrap();
        assert!(
            !store.packs_dir().join("tiny-coder").exists(),
            "empty parents pruned"
        );
        let list = store.list();
        assert_eq!(list.len(), 1);
        assert!(list[0].is_ok());
        store.remove("lib/mine:x").unwrap();
        assert!(store.list().is_empty());
        assert!(matches!(
            store.remove("lib/mine:x"),
            Err(StoreError::NotFound { .. })
        ));
    }

    #[test]
    fn create_from_a_gguf_then_from_that_pack_overrides_and_links() {
        let (tmp, store, _src) = setup(Some(TEMPLATE));
        let mf = Modelfile::parse(
            "FROM ./Tiny.gguf\nSYSTEM Be brief.\nPARAMETER temperature 0\nPARAMETER stop \"<|im_end|>\"\n\
             MESSAGE user hi\nMESSAGE assistant hello\nLICENSE MIT\n",
        )
        .unwrap();
        let base = store.create_base("./Tiny.gguf", Some(tmp.path())).unwrap();
        assert!(matches!(&base, CreateBase::Path(p) if p.ends_with("Tiny.gguf")));
        let mut steps = Vec::new();
        let a = store
            .create("mine", &base, &mf, &mut |s| steps.push(s.to_string()))
            .unwrap();
        assert!(a.is_ok(), "{:?}", a.problems);
        assert_eq!(steps.first().map(String::as_str), Some("reading model metadata"));
        assert_eq!(steps.last().map(String::as_str), Some("writing manifest"));
        let m = a.manifest.clone().unwrap();
        assert_eq!(m.reference(), "mine:latest");
        assert_eq!(m.system.as_deref(), Some("Be brief."));
        assert_eq!(m.defaults["temperature"].as_float(), Some(0.0));
        assert_eq!(m.messages.len(), 2);
        assert_eq!(m.license.as_deref(), Some("MIT"));
        assert_eq!(m.family, "qwen3");

        // From the pack: its values stay unless overridden; a new template replaces its own.
        let over = Modelfile::parse(
            "FROM mine\nPARAMETER temperature 0.5\nTEMPLATE \"{{ messages[0].content }}\"\n",
        )
        .unwrap();
        let base = store.create_base("mine", None).unwrap();
        let b = store.create("lib/other:v2", &base, &over, &mut |_| {}).unwrap();
        assert!(b.is_ok(), "{:?}", b.problems);
        let mb = b.manifest.clone().unwrap();
        assert_eq!(mb.defaults["temperature"].as_float(), Some(0.5));
        assert_eq!(mb.defaults["stop"], m.defaults["stop"]);
        assert_eq!(
            (&mb.system, &mb.messages, &mb.license),
            (&m.system, &m.messages, &m.license)
        );
        assert_eq!(
            mb.capabilities,
            ["completion", "chat"],
            "the new template has no tools"
        );
        assert_eq!(
            fs::read_to_string(b.dir.join(TEMPLATE_FILE)).unwrap(),
            "{{ messages[0].content }}"
        );
        #[cfg(unix)]
        {
            use std::os::unix::fs::MetadataExt;
            let x = fs::metadata(a.dir.join(GGUF_WEIGHTS_FILE)).unwrap();
            let y = fs::metadata(b.dir.join(GGUF_WEIGHTS_FILE)).unwrap();
            assert_eq!(x.ino(), y.ino(), "weights are hard-linked");
        }

        assert!(matches!(
            store.create_base("nothing-here", None),
            Err(StoreError::NotFound { .. })
        ));
        let e = store.create_base("./missing.gguf", Some(tmp.path())).unwrap_err();
        assert!(e.to_string().contains("no such file"), "{e}");
        for path in ["./Tiny.gguf", "/etc/passwd", "../../etc/passwd"] {
            let e = store.create_base(path, None).unwrap_err();
            assert!(e.to_string().contains("name a pack"), "{e}");
        }
        assert!(store.create("bad name", &base, &over, &mut |_| {}).is_err());
        assert!(
            !store.home().join("tmp").read_dir().unwrap().any(|_| true),
            "no staging left"
        );
    }

    #[test]
    fn import_replaces_an_existing_reference() {
        let (_tmp, store, src) = setup(None);
        store.import(&src, &ImportOptions::default()).unwrap();
        let bytes = GgufWriter::new()
            .str("general.architecture", "qwen3")
            .str("general.name", "Tiny Coder")
            .str("general.size_label", "0.5B")
            .kv("qwen3.context_length", GgufValue::U64(99))
            .tensor("a", &[32], GgmlType::F16)
            .build();
        fs::write(&src, bytes).unwrap();
        let e = store.import(&src, &ImportOptions::default()).unwrap();
        assert!(e.is_ok(), "{:?}", e.problems);
        assert_eq!(e.manifest.unwrap().context_length, Some(99));
        assert_eq!(store.list().len(), 1);
    }

    #[test]
    fn scripted_pack_dir_imports() {
        let tmp = tempfile::tempdir().unwrap();
        let src = tmp.path().join("scripted");
        fs::create_dir(&src).unwrap();
        fs::write(src.join("script.json"), r#"{"tokens": [1, 2, 3]}"#).unwrap();
        fs::write(
            src.join(MANIFEST_FILE),
            "name = \"echo\"\ntag = \"test\"\nfamily = \"scripted\"\ncapabilities = [\"completion\", \"chat\"]\n\
             [[files]]\npath = \"script.json\"\nrole = \"other\"\n",
        )
        .unwrap();
        let store = Store::new(tmp.path().join("home"));
        let e = store.import(&src, &ImportOptions::default()).unwrap();
        assert_eq!(e.reference, "echo:test");
        assert!(e.is_ok(), "{:?}", e.problems);
        let m = e.manifest.as_ref().unwrap();
        assert_eq!(m.files[0].size, Some(21), "size and sha256 filled in on import");
        assert!(m.files[0].sha256.is_some());
        assert!(e.dir.join("script.json").is_file());

        // A pack whose files do not match its manifest is refused.
        let broken = tmp.path().join("broken");
        copy_tree(
            &e.dir,
            &fs::create_dir(&broken).map(|_| broken.clone()).unwrap(),
            false,
        )
        .unwrap();
        fs::write(broken.join("script.json"), r#"{"tokens": [9, 9, 9]}"#).unwrap();
        let err = store.import(&broken, &ImportOptions::default()).unwrap_err();
        assert!(err.to_string().contains("sha256 mismatch"), "{err}");
        let err = store
            .import(&tmp.path().join("nowhere"), &ImportOptions::default())
            .unwrap_err();
        assert!(matches!(err, StoreError::Io { .. }));
    }

    #[test]
    fn hf_dir_imports() {
        let tmp = tempfile::tempdir().unwrap();
        let src = tmp.path().join("Qwen3-Tiny");
        fs::create_dir(&src).unwrap();
        fs::write(
            src.join("config.json"),
            r#"{"architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3", "max_position_embeddings": 4096}"#,
        )
        .unwrap();
        fs::write(
            src.join("model.safetensors"),
            safetensors_bytes(
                &[
                    ("embed", "BF16", &[8, 4], vec![0; 64]),
                    ("norm", "F32", &[4], vec![0; 16]),
                ],
                &[("format", "pt")],
            ),
        )
        .unwrap();
        fs::write(src.join("tokenizer.json"), "{}").unwrap();
        fs::write(
            src.join("tokenizer_config.json"),
            r#"{"chat_template": "{% for m in messages %}{{ m.content }}{% endfor %}{{ tools }}"}"#,
        )
        .unwrap();
        let store = Store::new(tmp.path().join("home"));
        let e = store.import(&src, &ImportOptions::default()).unwrap();
        assert!(e.is_ok(), "{:?}", e.problems);
        assert_eq!(e.reference, "qwen3-tiny:latest");
        let m = e.manifest.unwrap();
        assert_eq!((m.architecture.as_str(), m.family.as_str()), ("qwen3", "qwen3"));
        assert_eq!(m.format, PackFormat::Safetensors);
        assert_eq!(m.parameters, Some(36));
        assert_eq!(m.quantization.as_deref(), Some("BF16"));
        assert_eq!(m.context_length, Some(4096));
        assert_eq!(m.capabilities, ["completion", "chat", "tools"]);
        let roles: Vec<(&str, FileRole)> = m.files.iter().map(|f| (f.path.as_str(), f.role)).collect();
        assert_eq!(
            roles,
            [
                ("config.json", FileRole::Config),
                ("model.safetensors", FileRole::Weights),
                ("tokenizer.json", FileRole::Tokenizer),
                ("tokenizer_config.json", FileRole::Tokenizer),
                (TEMPLATE_FILE, FileRole::Template),
            ]
        );
    }

    /// A sentence-transformers directory: the transformer at the top, modules.json naming a
    /// pooling folder, a dense folder (with a nested file and a hidden one), a normalize folder
    /// that does not exist and an unsafe path; an `onnx/` folder no module names.
    fn sentence_transformers_dir(root: &Path) -> PathBuf {
        let src = root.join("EmbeddingTiny");
        for d in ["1_Pooling", "2_Dense/extra", "onnx"] {
            fs::create_dir_all(src.join(d)).unwrap();
        }
        let write = |rel: &str, data: &[u8]| fs::write(src.join(rel), data).unwrap();
        write(
            "config.json",
            br#"{"architectures": ["Gemma3TextModel"], "model_type": "gemma3_text", "max_position_embeddings": 2048}"#,
        );
        write(
            "model.safetensors",
            &safetensors_bytes(&[("embed", "F32", &[8, 4], vec![0; 128])], &[]),
        );
        write("tokenizer.json", b"{}");
        write("tokenizer_config.json", br#"{"chat_template": "{{ messages }}"}"#);
        write(
            "modules.json",
            br#"[{"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
                {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"},
                {"idx": 2, "name": "2", "path": "2_Dense", "type": "sentence_transformers.models.Dense"},
                {"idx": 3, "name": "3", "path": "3_Normalize", "type": "sentence_transformers.models.Normalize"},
                {"idx": 4, "name": "4", "path": "../outside", "type": "sentence_transformers.models.Dense"}]"#,
        );
        write(
            "sentence_bert_config.json",
            br#"{"max_seq_length": 256, "do_lower_case": false}"#,
        );
        write("README.md", b"# tiny");
        write(
            "config_sentence_transformers.json",
            br#"{"prompts": {"query": "q: "}}"#,
        );
        write("1_Pooling/config.json", br#"{"pooling_mode_mean_tokens": true}"#);
        write("2_Dense/config.json", br#"{"in_features": 4, "out_features": 2}"#);
        write(
            "2_Dense/model.safetensors",
            &safetensors_bytes(&[("linear.weight", "F32", &[2, 4], vec![0; 32])], &[]),
        );
        write("2_Dense/extra/notes.txt", b"nested");
        write("2_Dense/.cache", b"hidden");
        write("onnx/model.onnx", b"not a module");
        fs::create_dir_all(root.join("outside")).unwrap();
        fs::write(root.join("outside/secret.txt"), b"x").unwrap();
        src
    }

    #[test]
    fn sentence_transformers_dir_imports_its_module_folders_as_an_embedding_model() {
        let tmp = tempfile::tempdir().unwrap();
        let src = sentence_transformers_dir(tmp.path());
        let store = Store::new(tmp.path().join("home"));
        let e = store.import(&src, &ImportOptions::default()).unwrap();
        assert!(e.is_ok(), "{:?}", e.problems);
        assert_eq!(e.reference, "embeddingtiny:latest");
        let m = e.manifest.clone().unwrap();
        assert_eq!(
            (m.architecture.as_str(), m.family.as_str()),
            ("gemma3_text", "gemma")
        );
        assert_eq!(
            m.capabilities,
            ["embedding"],
            "a template does not make it a chat model"
        );
        assert_eq!(
            m.context_length,
            Some(256),
            "max_seq_length, not max_position_embeddings"
        );
        assert_eq!(m.parameters, Some(32 + 8), "the dense layer's parameters count");
        let roles: Vec<(&str, FileRole)> = m.files.iter().map(|f| (f.path.as_str(), f.role)).collect();
        assert_eq!(
            roles,
            [
                ("README.md", FileRole::Other),
                ("config.json", FileRole::Config),
                ("config_sentence_transformers.json", FileRole::Config),
                ("model.safetensors", FileRole::Weights),
                ("modules.json", FileRole::Config),
                ("sentence_bert_config.json", FileRole::Config),
                ("tokenizer.json", FileRole::Tokenizer),
                ("tokenizer_config.json", FileRole::Tokenizer),
                ("1_Pooling/config.json", FileRole::Module),
                ("2_Dense/config.json", FileRole::Module),
                ("2_Dense/extra/notes.txt", FileRole::Module),
                ("2_Dense/model.safetensors", FileRole::Module),
                (TEMPLATE_FILE, FileRole::Template),
            ]
        );
        assert_eq!(m.weights().count(), 1);
        assert_eq!(
            fs::read(e.dir.join("2_Dense/model.safetensors")).unwrap(),
            fs::read(src.join("2_Dense/model.safetensors")).unwrap()
        );
        for absent in ["onnx", "2_Dense/.cache", "3_Normalize", "secret.txt"] {
            assert!(!e.dir.join(absent).exists(), "{absent}");
        }
        assert!(!store.home().join("packs/outside").exists());

        // The pack copies and re-imports whole, module folders included.
        let c = store.copy("embeddingtiny", "emb:copy").unwrap();
        assert!(c.is_ok(), "{:?}", c.problems);
        let again = store
            .import(
                &c.dir,
                &ImportOptions {
                    name: Some("emb:again".into()),
                    ..Default::default()
                },
            )
            .unwrap();
        assert!(again.is_ok(), "{:?}", again.problems);
        assert_eq!(again.manifest.unwrap().files.len(), m.files.len());
        let mut broken = store.get("emb:copy").unwrap();
        fs::remove_file(broken.dir.join("1_Pooling/config.json")).unwrap();
        store.verify(&mut broken, false);
        assert!(
            broken
                .problems
                .iter()
                .any(|p| p.contains("1_Pooling/config.json: missing")),
            "{:?}",
            broken.problems
        );
    }

    #[test]
    fn modules_json_without_pooling_keeps_the_template_capabilities() {
        let tmp = tempfile::tempdir().unwrap();
        let src = sentence_transformers_dir(tmp.path());
        fs::write(
            src.join("modules.json"),
            r#"[{"idx": 0, "path": "", "type": "sentence_transformers.models.Transformer"}]"#,
        )
        .unwrap();
        fs::remove_file(src.join("sentence_bert_config.json")).unwrap();
        let store = Store::new(tmp.path().join("home"));
        let m = store
            .import(&src, &ImportOptions::default())
            .unwrap()
            .manifest
            .unwrap();
        assert_eq!(m.capabilities, ["completion", "chat"]);
        assert_eq!(m.context_length, Some(2048));
        assert!(m.files.iter().all(|f| f.role != FileRole::Module));
        fs::write(src.join("modules.json"), "[not json").unwrap();
        let e = store.import(&src, &ImportOptions::default()).unwrap_err();
        assert!(e.to_string().contains("modules.json: "), "{e}");
    }

    #[test]
    fn real_reference_tiny_hf_dir_imports() {
        let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../shared/fixtures/reference-tiny/qwen3");
        if !src.join("config.json").exists() {
            crate::test_skip::skip_unless_ci(&format!("{} not present (../shared)", src.display()));
            return;
        }
        let tmp = tempfile::tempdir().unwrap();
        let store = Store::new(tmp.path().join("home"));
        let e = store.import(&src, &ImportOptions::default()).unwrap();
        assert!(e.is_ok(), "{:?}", e.problems);
        let m = e.manifest.unwrap();
        assert_eq!(m.family, "qwen3");
        assert_eq!(m.quantization.as_deref(), Some("F32"));
    }

    #[test]
    fn real_ggufs_import() {
        let tmp = tempfile::tempdir().unwrap();
        let store = Store::new(tmp.path().join("home"));
        let mut imported = Vec::new();
        if let Some(p) = crate::test_skip::fetched_model("qwen2.5-coder-0.5b-instruct.gguf") {
            let e = store.import(&p, &ImportOptions::default()).unwrap();
            assert!(e.is_ok(), "{:?}", e.problems);
            let m = e.manifest.unwrap();
            assert_eq!((m.architecture.as_str(), m.family.as_str()), ("qwen2", "qwen3"));
            assert_eq!(m.context_length, Some(32768));
            assert!(m.has_capability("chat") && m.has_capability("tools"));
            assert!(m.quantization.is_some());
            eprintln!(
                "{} {:?} {:?} {}",
                e.reference,
                m.quantization,
                m.parameters,
                crate::format::human_size(e.size)
            );
            imported.push(e.reference);
        }
        if let Some(p) = crate::test_skip::fetched_model("gemma-3-270m-q4_k_m.gguf") {
            let e = store.import(&p, &ImportOptions::default()).unwrap();
            assert!(e.is_ok(), "{:?}", e.problems);
            let m = e.manifest.unwrap();
            assert_eq!((m.architecture.as_str(), m.family.as_str()), ("gemma3", "gemma"));
            assert!(!m.has_capability("chat"), "{:?}", m.capabilities);
            assert_eq!(m.quantization.as_deref(), Some("Q4_K_M"));
            eprintln!(
                "{} {:?} {:?} {:?}",
                e.reference, m.quantization, m.parameters, m.context_length
            );
            imported.push(e.reference);
        }
        // The store lists exactly the imported packs, each whole (nothing to list when both
        // models were skipped: then nothing is asserted here and the skips say so).
        let listed = store.list();
        let mut names: Vec<&str> = listed.iter().map(|e| e.reference.as_str()).collect();
        names.sort_unstable();
        imported.sort();
        assert_eq!(names, imported);
        for e in listed {
            assert!(e.is_ok(), "{}: {:?}", e.reference, e.problems);
        }
    }
}
