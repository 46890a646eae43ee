//! `/save`: a `berth run` session written as a new pack (its system prompt, messages and
//! parameters over the current pack's files), and the pack's own parameters as written.

use super::params::SessionParams;
use crate::turn::{Content, Message, Part};
use anyhow::Result;
use berth_registry::modelfile::Modelfile;
use berth_registry::pack::PackMessage;
use berth_registry::store::{PackEntry, Store};

/// A session as a pack holds it: what `/save` writes (and a pack gives back when loaded).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct PackSession {
    /// The system prompt (a Modelfile's `SYSTEM`).
    pub system: Option<String>,
    /// The conversation put before every new one (a Modelfile's `MESSAGE` lines).
    pub messages: Vec<PackMessage>,
    /// Parameters under Ollama's names (the manifest's `defaults`).
    pub params: SessionParams,
}

/// A pack's own parameters (its manifest's `defaults`, as written), for `/show parameters` and
/// `/save`; empty for a pack without a manifest.
pub fn pack_params(store: &Store, reference: &str) -> Result<SessionParams> {
    let entry = store.get(reference)?;
    Ok(SessionParams::from_table(
        entry.manifest.map(|m| m.defaults).unwrap_or_default(),
    ))
}

/// A message of the conversation as a pack keeps it (text only).
pub fn pack_message(m: &Message) -> PackMessage {
    PackMessage {
        role: m.role.as_str().to_string(),
        content: text_of(m),
    }
}

/// Saves `session` as the pack `name` the way `berth create` makes one from a Modelfile: the
/// files of `from` (hard-linked when the filesystem allows) with the session's system prompt,
/// parameters and messages in its manifest. A pack already named `name` is replaced.
pub fn save_pack(store: &Store, from: &str, name: &str, session: &PackSession) -> Result<PackEntry> {
    let base = store.create_base(from, None)?;
    let modelfile = Modelfile {
        from: Some(from.to_string()),
        system: session.system.clone(),
        parameters: session.params.table().clone(),
        messages: session.messages.clone(),
        ..Modelfile::default()
    };
    Ok(store.create(name, &base, &modelfile, &mut |_| {})?)
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
    use crate::turn::Role;
    use berth_registry::pack::PackManifest;

    #[test]
    fn a_saved_session_is_a_pack_with_its_system_messages_and_parameters() {
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
            messages: [(Role::User, "My name is Ada."), (Role::Assistant, "OK.")]
                .map(|(r, t)| pack_message(&Message::text(r, t)))
                .to_vec(),
            params,
        };
        let saved = save_pack(&store, "base:1", "ada", &session).unwrap();
        assert_eq!(saved.reference, "ada:latest");
        assert!(saved.is_ok(), "{:?}", saved.problems);
        let m = saved.manifest.unwrap();
        assert_eq!(m.system, session.system);
        assert_eq!(m.messages, session.messages);
        assert_eq!(m.messages[1].role, "assistant");
        assert_eq!(pack_params(&store, "ada").unwrap(), session.params);
        // The source pack is unchanged.
        let base = store.get("base:1").unwrap().manifest.unwrap();
        assert!(base.system.is_none() && base.messages.is_empty() && base.defaults.is_empty());
    }
}
