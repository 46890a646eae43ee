//! The plugin loader: finds plugin libraries on the search path, indexes them by their sidecar
//! manifests (no plugin code runs), opens each library once (`RTLD_NOW | RTLD_LOCAL`) and never
//! closes it, and refuses wrong majors, missing symbols and `panic = "abort"` builds with one line.

use anyhow::{bail, Context, Result};
use berth_plugin_api::abi;
use berth_plugin_api::{Plugin, PluginManifest};
use serde::{Deserialize, Serialize};
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, OnceLock};

/// Suffix of a sidecar manifest: `libfoo.so` is described by `libfoo.berth.json`.
pub const SIDECAR_SUFFIX: &str = ".berth.json";

/// A sidecar manifest: the plugin's manifest plus the library file it describes.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Sidecar {
    /// Library file name, relative to the sidecar's directory.
    pub library: String,
    /// The manifest the library embeds.
    #[serde(flatten)]
    pub manifest: PluginManifest,
}

/// Where a plugin stands after indexing and opening.
#[derive(Clone, Debug)]
pub enum PluginState {
    /// Opened and validated; ready to create models.
    Ready(Arc<Plugin>),
    /// Refused, with the one-line reason.
    Refused(String),
}

/// One plugin library found on the search path.
#[derive(Clone, Debug)]
pub struct PluginRecord {
    /// Path of the library.
    pub library: PathBuf,
    /// The search-path directory it was found in.
    pub found_in: PathBuf,
    /// Manifest from the sidecar, when there is a readable one.
    pub manifest: Option<PluginManifest>,
    /// Ready or refused.
    pub state: PluginState,
}

impl PluginRecord {
    /// The plugin's name, or its file name when it has no manifest.
    pub fn name(&self) -> String {
        match &self.manifest {
            Some(m) => m.name.clone(),
            None => file_name(&self.library),
        }
    }

    /// The ready plugin, if it was not refused.
    pub fn ready(&self) -> Option<&Arc<Plugin>> {
        match &self.state {
            PluginState::Ready(p) => Some(p),
            PluginState::Refused(_) => None,
        }
    }

    /// Whether this plugin declares `family`.
    pub fn serves_family(&self, family: &str) -> bool {
        self.manifest
            .as_ref()
            .is_some_and(|m| m.families.iter().any(|f| f == family))
    }
}

fn file_name(p: &Path) -> String {
    p.file_name()
        .map(|s| s.to_string_lossy().into_owned())
        .unwrap_or_default()
}

/// The plugin directories to search, in order: `$BERTH_PLUGIN_PATH` (colon-separated), then the
/// directory next to the binary ([`beside_binary`]), then `$BERTH_HOME/plugins`.
pub fn search_path(berth_home: &Path) -> Vec<PathBuf> {
    search_path_sources(berth_home)
        .into_iter()
        .map(|(d, _)| d)
        .collect()
}

/// The search path with where each directory comes from: `BERTH_PLUGIN_PATH`,
/// `next to the binary` or `BERTH_HOME`.
pub fn search_path_sources(berth_home: &Path) -> Vec<(PathBuf, &'static str)> {
    let mut dirs = Vec::new();
    if let Some(p) = std::env::var_os("BERTH_PLUGIN_PATH") {
        dirs.extend(
            std::env::split_paths(&p)
                .filter(|d| !d.as_os_str().is_empty())
                .map(|d| (d, "BERTH_PLUGIN_PATH")),
        );
    }
    if let Some(exe_dir) = std::env::current_exe()
        .ok()
        .and_then(|e| e.parent().map(Path::to_path_buf))
    {
        dirs.push((beside_binary(&exe_dir), "next to the binary"));
    }
    dirs.push((berth_home.join("plugins"), "BERTH_HOME"));
    dirs
}

/// Where plugins shipped with a binary in `exe_dir` live: `<exe dir>/../lib/berth/plugins` for an
/// installed binary (`/usr/bin` → `/usr/lib/berth/plugins`), but `<exe dir>/lib/berth/plugins`
/// for a binary in a cargo target directory (one holding `CACHEDIR.TAG`), so each build profile
/// (`target/debug`, `target/release`) has its own plugins and a debug build never loads the
/// release plugins `scripts/setup` installed.
pub fn beside_binary(exe_dir: &Path) -> PathBuf {
    if exe_dir.join("../CACHEDIR.TAG").is_file() {
        exe_dir.join("lib/berth/plugins")
    } else {
        exe_dir.join("../lib/berth/plugins")
    }
}

fn is_library(p: &Path) -> bool {
    matches!(
        p.extension().and_then(|e| e.to_str()),
        Some("so" | "dylib" | "dll")
    )
}

/// The sidecar path for a library file.
pub fn sidecar_path(library: &Path) -> PathBuf {
    let stem = library
        .file_stem()
        .map(|s| s.to_string_lossy().into_owned())
        .unwrap_or_default();
    library.with_file_name(format!("{stem}{SIDECAR_SUFFIX}"))
}

/// All plugins found on a search path, indexed and opened.
#[derive(Clone, Debug, Default)]
pub struct PluginSet {
    /// Every library found, in search order, refused ones included.
    pub records: Vec<PluginRecord>,
}

impl PluginSet {
    /// Indexes every directory (missing ones are skipped) by sidecar, then opens the libraries
    /// that pass the sidecar checks. Nothing here fails: problems become refusals.
    pub fn discover(dirs: &[PathBuf]) -> PluginSet {
        let mut records = Vec::new();
        let mut seen = std::collections::HashSet::new();
        for dir in dirs {
            let Ok(read) = std::fs::read_dir(dir) else {
                continue;
            };
            let mut entries: Vec<PathBuf> = read.filter_map(|e| e.ok().map(|e| e.path())).collect();
            entries.sort();
            for lib in entries.iter().filter(|p| is_library(p)) {
                let canonical = lib.canonicalize().unwrap_or_else(|_| lib.clone());
                if !seen.insert(canonical) {
                    continue;
                }
                records.push(index_one(dir, lib));
            }
        }
        PluginSet { records }
    }

    /// Discovers plugins on the default search path for a Berth home.
    pub fn discover_default(berth_home: &Path) -> PluginSet {
        Self::discover(&search_path(berth_home))
    }

    /// Every family some ready plugin declares.
    pub fn families(&self) -> Vec<String> {
        let mut f: Vec<String> = self
            .records
            .iter()
            .filter(|r| r.ready().is_some())
            .flat_map(|r| r.manifest.iter().flat_map(|m| m.families.clone()))
            .collect();
        f.sort();
        f.dedup();
        f
    }

    /// The ready plugin found earlier on the search path that shares a family with record `i`:
    /// it wins over record `i` when their probe scores tie (see `best_for`).
    pub fn tie_winner(&self, i: usize) -> Option<&PluginRecord> {
        let fams = self.records.get(i)?.manifest.as_ref()?.families.clone();
        self.records[..i]
            .iter()
            .find(|r| r.ready().is_some() && fams.iter().any(|f| r.serves_family(f)))
    }

    /// The ready plugin with the best probe score for a model description (JSON with `family`,
    /// `architecture`, `format`); `None` when no plugin can serve it.
    pub fn best_for(&self, model_config: &serde_json::Value) -> Option<(&PluginRecord, Arc<Plugin>)> {
        let family = model_config.get("family").and_then(|v| v.as_str()).unwrap_or("");
        let text = model_config.to_string();
        let mut best: Option<(u32, &PluginRecord, Arc<Plugin>)> = None;
        for r in &self.records {
            let Some(p) = r.ready() else { continue };
            if !r.serves_family(family) {
                continue;
            }
            let score = p.probe(&text);
            if score > 0 && best.as_ref().is_none_or(|(s, _, _)| score > *s) {
                best = Some((score, r, p.clone()));
            }
        }
        // Strictly greater: on a tie the plugin earlier on the search path wins.
        best.map(|(_, r, p)| (r, p))
    }
}

/// Reads a library's sidecar and, when it passes, opens the library.
fn index_one(dir: &Path, lib: &Path) -> PluginRecord {
    let file = file_name(lib);
    let sidecar = sidecar_path(lib);
    let refused = |manifest, why: String| PluginRecord {
        library: lib.to_path_buf(),
        found_in: dir.to_path_buf(),
        manifest,
        state: PluginState::Refused(why),
    };
    let text = match std::fs::read_to_string(&sidecar) {
        Ok(t) => t,
        Err(_) => {
            return refused(
                None,
                format!(
                    "plugin '{file}' has no sidecar manifest {}; install it with `berth plugins install {}`",
                    file_name(&sidecar),
                    lib.display()
                ),
            )
        }
    };
    let manifest = match serde_json::from_str::<Sidecar>(&text) {
        Ok(s) => s.manifest,
        Err(e) => {
            return refused(
                None,
                format!("plugin '{file}': sidecar {} is malformed: {e}", sidecar.display()),
            )
        }
    };
    let name = manifest.name.clone();
    if manifest.abi_major != abi::ABI_MAJOR {
        let why = format!(
            "plugin '{name}' ({file}) was built for ABI {}.{}; this host speaks {}.0-{}.{}",
            manifest.abi_major,
            manifest.abi_minor,
            abi::ABI_MAJOR,
            abi::ABI_MAJOR,
            abi::ABI_MINOR
        );
        return refused(Some(manifest), why);
    }
    if manifest.panic != "unwind" {
        let why = format!(
            "plugin '{name}' ({file}) was built with panic = \"{}\"; this host needs panic = \"unwind\" to contain plugin panics",
            manifest.panic
        );
        return refused(Some(manifest), why);
    }
    match open_plugin(lib) {
        Ok(p) => PluginRecord {
            library: lib.to_path_buf(),
            found_in: dir.to_path_buf(),
            manifest: Some(manifest),
            state: PluginState::Ready(p),
        },
        Err(why) => refused(Some(manifest), format!("plugin '{name}' ({file}) {why}")),
    }
}

/// Libraries opened by this process, by canonical path, with what opening them gave.
type OpenedLibraries = Mutex<HashMap<PathBuf, Result<Arc<Plugin>, String>>>;

/// Every library this process opened: each is opened once and never closed.
fn opened() -> &'static OpenedLibraries {
    static OPENED: OnceLock<OpenedLibraries> = OnceLock::new();
    OPENED.get_or_init(Default::default)
}

/// Opens a library (once per process) and validates its entry table.
pub fn open_plugin(lib: &Path) -> std::result::Result<Arc<Plugin>, String> {
    let key = lib.canonicalize().unwrap_or_else(|_| lib.to_path_buf());
    let mut map = opened().lock().unwrap_or_else(|e| e.into_inner());
    if let Some(r) = map.get(&key) {
        return r.clone();
    }
    let result = open_uncached(&key);
    map.insert(key, result.clone());
    result
}

fn dlopen(lib: &Path) -> std::result::Result<&'static libloading::Library, String> {
    // SAFETY: opening a library runs its initialisers; Berth plugins are Rust cdylibs without
    // life-before-main. The handle is leaked on purpose: plugins are never unloaded.
    let lib = unsafe { libloading::os::unix::Library::open(Some(lib), libc::RTLD_NOW | libc::RTLD_LOCAL) }
        .map_err(|e| format!("could not be opened: {e}"))?;
    Ok(Box::leak(Box::new(libloading::Library::from(lib))))
}

fn open_uncached(lib: &Path) -> std::result::Result<Arc<Plugin>, String> {
    let handle = dlopen(lib)?;
    // SAFETY: the symbol's type is fixed by ABI v1; the library is never unloaded, so the
    // function pointer stays valid.
    let entry: abi::EntryFn = unsafe {
        match handle.get::<abi::EntryFn>(abi::ENTRY_SYMBOL.as_bytes()) {
            Ok(sym) => *sym,
            Err(_) => {
                return Err(format!(
                    "has no `{}` symbol; this host speaks ABI {}.0-{}.{}",
                    abi::ENTRY_SYMBOL,
                    abi::ABI_MAJOR,
                    abi::ABI_MAJOR,
                    abi::ABI_MINOR
                ))
            }
        }
    };
    // SAFETY: calling the entry returns a static table owned by the never-unloaded library.
    let table = unsafe { entry() };
    // SAFETY: the table is static for the rest of the process.
    unsafe { Plugin::from_entry(table) }
        .map(Arc::new)
        .map_err(|e| e.to_string())
}

/// Reads the version-independent manifest of a library (`berth_plugin_manifest`). This runs the
/// library's code: `berth plugins install` calls it in a child process.
pub fn read_embedded_manifest(lib: &Path) -> Result<PluginManifest> {
    let handle = dlopen(lib).map_err(|e| anyhow::anyhow!("{}: {e}", lib.display()))?;
    // SAFETY: the symbol's type is fixed for every ABI version; the library stays loaded.
    let f: abi::ManifestFn = unsafe {
        *handle
            .get::<abi::ManifestFn>(abi::MANIFEST_SYMBOL.as_bytes())
            .map_err(|_| {
                anyhow::anyhow!(
                    "{}: not a Berth plugin (no `{}` symbol)",
                    lib.display(),
                    abi::MANIFEST_SYMBOL
                )
            })?
    };
    // SAFETY: the function returns a static NUL-terminated string or null.
    let text = unsafe { berth_plugin_api::sdk::manifest_from_cstr(f()) }
        .with_context(|| format!("{}: `{}` returned null", lib.display(), abi::MANIFEST_SYMBOL))?;
    serde_json::from_str(&text).with_context(|| format!("{}: embedded manifest is malformed", lib.display()))
}

/// Installs a plugin library into `dir`: asks a child process for its manifest (so nothing of
/// the plugin runs in this process), copies the library in atomically (a loaded file is never
/// overwritten in place) and writes its sidecar. Returns the installed library path.
pub fn install(lib: &Path, dir: &Path) -> Result<(PathBuf, PluginManifest)> {
    if !lib.is_file() {
        bail!("{}: no such file", lib.display());
    }
    let exe = std::env::current_exe().context("locating the berth executable")?;
    let out = std::process::Command::new(exe)
        .args(["plugins", "describe"])
        .arg(lib)
        .output()
        .context("running `berth plugins describe`")?;
    if !out.status.success() {
        let stderr = String::from_utf8_lossy(&out.stderr);
        bail!("{}", stderr.trim().trim_start_matches("berth: "));
    }
    let manifest: PluginManifest = serde_json::from_slice(&out.stdout)
        .with_context(|| format!("{}: manifest is malformed", lib.display()))?;
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    let name = lib.file_name().context("library path has no file name")?;
    let dest = dir.join(name);
    let same = dest.canonicalize().ok() == lib.canonicalize().ok();
    if !same {
        let tmp = dir.join(format!(".{}.tmp-{}", name.to_string_lossy(), std::process::id()));
        std::fs::copy(lib, &tmp)
            .with_context(|| format!("copying {} to {}", lib.display(), tmp.display()))?;
        std::fs::rename(&tmp, &dest).with_context(|| format!("moving into {}", dest.display()))?;
    }
    let sidecar = Sidecar {
        library: name.to_string_lossy().into_owned(),
        manifest: manifest.clone(),
    };
    let text = serde_json::to_string_pretty(&sidecar)? + "\n";
    std::fs::write(sidecar_path(&dest), text)?;
    Ok((dest, manifest))
}

#[cfg(test)]
mod tests {
    use super::beside_binary;

    #[test]
    fn each_cargo_profile_has_its_own_plugin_dir_and_installs_use_lib() {
        let tmp = tempfile::tempdir().unwrap();
        let target = tmp.path().join("target");
        std::fs::create_dir_all(target.join("debug")).unwrap();
        std::fs::write(
            target.join("CACHEDIR.TAG"),
            "Signature: 8a477f597d28d172789f06886806bc55",
        )
        .unwrap();
        assert_eq!(
            beside_binary(&target.join("debug")),
            target.join("debug/lib/berth/plugins")
        );
        let usr = tmp.path().join("usr");
        std::fs::create_dir_all(usr.join("bin")).unwrap();
        assert_eq!(
            beside_binary(&usr.join("bin")),
            usr.join("bin/../lib/berth/plugins")
        );
    }
}
