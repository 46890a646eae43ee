//! `berth pull` and `berth catalog`: fetch packs from the catalog, Hugging Face or an Ollama
//! registry with a progress bar; list the catalog.

use anyhow::Result;
use berth_registry::format::human_size;
use berth_registry::hub::{pull_reference, HubOptions, PullOutcome};
use berth_registry::pull::{load_catalog, Phase, Progress};
use berth_registry::store::Store;
use indicatif::{ProgressBar, ProgressStyle};

/// Pulls `name` (a catalog name, `hf.co/OWNER/REPO[:QUANT]` or an Ollama registry name) into the
/// store, drawing a progress bar on a terminal; an installed pack is reported, not fetched again.
pub fn pull(store: &Store, name: &str) -> Result<()> {
    let opts = HubOptions::from_env();
    let style = ProgressStyle::with_template("{msg} {bar:30} {bytes}/{total_bytes} {bytes_per_sec} {eta}")
        .expect("the progress template parses");
    let mut bar: Option<(usize, ProgressBar)> = None;
    let mut report = |p: &Progress| match &p.phase {
        Phase::Part {
            index, count, digest, ..
        } => {
            if bar.as_ref().map(|(i, _)| *i) != Some(*index) {
                if let Some((_, b)) = bar.take() {
                    b.finish();
                }
                let b = ProgressBar::new(p.total).with_style(style.clone());
                let msg = format!(
                    "pulling {} ({}/{count})",
                    &digest[..12.min(digest.len())],
                    index + 1
                );
                if b.is_hidden() {
                    // Not a terminal: one line per part instead of a bar.
                    eprintln!("{msg}");
                }
                b.set_message(msg);
                bar = Some((*index, b));
            }
            if let Some((_, b)) = &bar {
                b.set_length(p.total);
                b.set_position(p.completed);
            }
        }
        other => {
            if let Some((_, b)) = bar.take() {
                b.finish();
            }
            eprintln!("{}", status_line(other));
        }
    };
    let outcome = pull_reference(store, name, &opts, &mut report)?;
    if let Some((_, b)) = bar.take() {
        b.finish();
    }
    match outcome {
        PullOutcome::Pulled(entry) => {
            println!("pulled '{}' into {}", entry.reference, entry.dir.display())
        }
        PullOutcome::AlreadyInstalled(entry) => println!(
            "'{}' is already installed in {}; `berth rm {}` first to fetch it again",
            entry.reference,
            entry.dir.display(),
            entry.reference
        ),
    }
    Ok(())
}

/// Ollama's status text for a phase that has no byte counts.
pub fn status_line(phase: &Phase) -> String {
    match phase {
        Phase::Manifest => "pulling manifest".into(),
        Phase::Part { digest, .. } => format!("pulling {}", &digest[..12.min(digest.len())]),
        Phase::Verifying => "verifying sha256 digest".into(),
        Phase::Unpacking => "unpacking model folder".into(),
        Phase::Writing => "writing manifest".into(),
        Phase::Success => "success".into(),
    }
}

/// Prints the catalog: name, family, size, parts, description; or JSON.
pub fn catalog(store: &Store, json: bool) -> Result<()> {
    let catalog = load_catalog()?;
    let installed: Vec<String> = store.list().into_iter().map(|e| e.reference).collect();
    if json {
        let arr: Vec<serde_json::Value> = catalog
            .packs
            .iter()
            .map(|p| {
                serde_json::json!({
                    "name": p.name, "family": p.family, "description": p.description,
                    "file": p.file, "size": p.size, "sha256": p.sha256,
                    "parts": p.parts.iter().map(|x| format!("{}=={}", x.package, x.version)).collect::<Vec<_>>(),
                    "installed": installed.contains(&p.name),
                })
            })
            .collect();
        println!("{}", serde_json::to_string_pretty(&arr)?);
        return Ok(());
    }
    let rows: Vec<Vec<String>> = catalog
        .packs
        .iter()
        .map(|p| {
            vec![
                p.name.clone(),
                p.family.clone(),
                human_size(p.size),
                p.parts.len().to_string(),
                if installed.contains(&p.name) { "yes" } else { "" }.to_string(),
                p.description.clone(),
            ]
        })
        .collect();
    crate::table::print_table(
        &["NAME", "FAMILY", "SIZE", "PARTS", "INSTALLED", "DESCRIPTION"],
        &rows,
    );
    Ok(())
}
