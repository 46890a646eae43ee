//! Fuzzes pack manifests and references (`berth_registry::pack`): the input is parsed as
//! `pack.toml` text and as a pack reference. Parsing must not panic; a parsed manifest must
//! survive a save/load round trip, its `created` time an RFC 3339 round trip, and a parsed
//! reference its own display; any text sanitized into a name must make a valid reference.

#![no_main]

use std::path::{Component, Path};

use berth_registry::pack::{is_safe_relative, parse_rfc3339, rfc3339, sanitize_name};
use berth_registry::{family_for_architecture, PackManifest, PackRef};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let text = String::from_utf8_lossy(data);

    if let Ok(manifest) = PackManifest::parse(&text, Path::new("pack.toml")) {
        let _ = (
            manifest.problems(),
            manifest.reference(),
            manifest.weights().count(),
        );
        let _ = (
            manifest.has_capability("chat"),
            family_for_architecture(&manifest.architecture),
        );
        for file in &manifest.files {
            let _ = is_safe_relative(&file.path);
        }
        if let Some(created) = manifest.created.as_deref() {
            if let Some(time) = parse_rfc3339(created) {
                let again = rfc3339(time);
                // An offset can move a time just outside the four-digit years RFC 3339 has.
                let four_digit_year = again.find('-') == Some(4);
                assert!(
                    !four_digit_year || parse_rfc3339(&again) == Some(time),
                    "{created:?} -> {again:?}"
                );
            }
        }
        if let Ok(saved) = manifest.to_toml() {
            let loaded = PackManifest::parse(&saved, Path::new("pack.toml"))
                .unwrap_or_else(|e| panic!("a saved manifest does not load: {e}\n{saved}"));
            let resaved = loaded.to_toml().expect("a loaded manifest saves");
            assert_eq!(saved, resaved, "save/load changed the manifest");
        }
    }

    if let Ok(reference) = PackRef::parse(&text) {
        let shown = reference.to_string();
        let again = PackRef::parse(&shown).unwrap_or_else(|e| panic!("{shown:?}: {e:?}"));
        assert_eq!((&again.name, &again.tag), (&reference.name, &reference.tag));
        assert!(reference
            .rel_dir()
            .components()
            .all(|c| matches!(c, Component::Normal(_))));
    }

    let name = sanitize_name(&text);
    if let Err(e) = PackRef::new(&name, "latest") {
        panic!("sanitize_name({text:?}) = {name:?} is not a valid name: {e:?}");
    }
    let _ = parse_rfc3339(&text);
});
