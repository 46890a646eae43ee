//! What a pack gives a `berth run` session (its system prompt, messages and parameters), and
//! `/save`: the session written back as a new pack.

use super::params::SessionParams;
use crate::turn::{Content, Message, Part, Role};
use anyhow::{Context, Result};
use berth_registry::pack::{PackManifest, PackMessage};
use berth_registry::store::{PackEntry, Store};

/// A session as a pack holds it: what `/load` restores and `/save` writes.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct PackSession {
    /// The system prompt (a Modelfile's `SYSTEM`).
    pub system: Option<String>,
    /// The conversation put before the first message (a Modelfile's `MESSAGE` lines).
    pub messages: Vec<Message>,
    /// Parameters under Ollama's names (the manifest's `defaults`).
    pub params: SessionParams,
}

/// The session a pack starts with, from its manifest (empty for a pack without one).
pub fn from_pack(store: &Store, reference: &str) -> Result<PackSession> {
    let entry = store.get(reference)?;
    let Some(m) = entry.manifest else {
        return Ok(PackSession::default());
    };
    Ok(PackSession {
        system: m.system.filter(|s| !s.is_empty()),
        messages: m
            .messages
            .iter()
            .filter_map(|p| {
                let role = serde_json::from_value(serde_json::Value::String(p.role.clone())).ok()?;
                Some(Message::text(role, p.content.clone()))
            })
            .collect(),
        params: SessionParams::from_table(m.defaults),
    })
}

/// Saves `session` as the pack `name`: the files of `from` (hard-linked when the filesystem
/// allows, as `berth cp` makes them) with the session's system prompt, parameters and messages in
/// its manifest. A pack already named `name` is replaced.
pub fn save_pack(store: &Store, from: &str, name: &str, session: &PackSession) -> Result<PackEntry> {
    let entry = store.copy(from, name)?;
    let mut manifest = PackManifest::load(&entry.dir)?;
    manifest.system = session.system.clone();
    manifest.defaults = session.params.table().clone();
    manifest.messages = session
        .messages
        .iter()
        .filter(|m| m.role != Role::System)
        .map(|m| PackMessage {
            role: m.role.as_str().to_string(),
            content: text_of(m),
        })
        .collect();
    manifest
        .save(&entry.dir)
        .with_context(|| format!("writing the manifest of {name}"))?;
    Ok(store.get(&entry.reference)?)
}

/// A message's text (images are not kept in a pack).
pub fn text_of(m: &Message) -> String {
    match &m.content {
        None => String::new(),
        Some(Content::Text(t)) => t.clone(),
        Some(Content::Parts(parts)) => parts
            .iter()
            .filter_map(|p| match p {
                Part::Text(t) => Some(t.as_str()),
                Part::Image(_) => None,
            })
            .collect::<Vec<_>>()
            .join(""),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_saved_session_is_read_back_from_its_pack() {
        let home = tempfile::tempdir().unwrap();
        let store = Store::new(home.path().to_path_buf());
        let src = home.path().join("src");
        std::fs::create_dir_all(&src).unwrap();
        std::fs::write(src.join("weights.bin"), b"w").unwrap();
        let r = berth_registry::pack::PackRef::parse("base:1").unwrap();
        let mut m = PackManifest::new(&r, "scripted");
        m.files.push(berth_registry::pack::PackFile {
            path: "weights.bin".into(),
            role: berth_registry::pack::FileRole::Weights,
            size: None,
            sha256: None,
        });
        m.save(&src).unwrap();
        store.import(&src, &Default::default()).unwrap();

        let mut params = SessionParams::default();
        params.set("temperature", &["0"]).unwrap();
        let session = PackSession {
            system: Some("You are terse.".into()),
            messages: vec![
                Message::text(Role::System, "You are terse."),
                Message::text(Role::User, "My name is Ada."),
                Message::text(Role::Assistant, "OK."),
            ],
            params,
        };
        let saved = save_pack(&store, "base:1", "ada", &session).unwrap();
        assert_eq!(saved.reference, "ada:latest");
        assert!(saved.is_ok(), "{:?}", saved.problems);
        let back = from_pack(&store, "ada").unwrap();
        assert_eq!(back.system, session.system);
        assert_eq!(back.messages, session.messages[1..]);
        assert_eq!(back.params, session.params);
        // The source pack is unchanged.
        assert_eq!(from_pack(&store, "base:1").unwrap(), PackSession::default());
    }
}
