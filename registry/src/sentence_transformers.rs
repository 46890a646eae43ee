//! Sentence-transformers model directories: `modules.json` lists the pipeline that turns the
//! transformer's hidden states into one embedding (pooling, dense layers, normalisation), each
//! module with its own folder of config and weights next to the transformer's files.

use serde::Deserialize;

use crate::pack::is_safe_relative;

/// The file that makes a Hugging Face directory a sentence-transformers model.
pub const MODULES_FILE: &str = "modules.json";
/// The sentence-transformers settings file whose `max_seq_length` is the length embedded.
pub const SENTENCE_BERT_CONFIG: &str = "sentence_bert_config.json";
/// The sentence-transformers file with the task prompts (`query`, `document`) and similarity.
pub const SENTENCE_TRANSFORMERS_CONFIG: &str = "config_sentence_transformers.json";
/// The pooling module's type: a pipeline with one produces embeddings.
pub const POOLING_TYPE: &str = "sentence_transformers.models.Pooling";

/// One entry of `modules.json`.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct Module {
    /// The module's position in the pipeline.
    #[serde(default)]
    pub idx: u64,
    /// The module's name (usually its index as text).
    #[serde(default)]
    pub name: String,
    /// Its folder, relative to the model directory (empty for the transformer itself).
    #[serde(default)]
    pub path: String,
    /// Its Python class, `sentence_transformers.models.Pooling` and the like.
    #[serde(default, rename = "type")]
    pub kind: String,
}

impl Module {
    /// The module's own folder when it has one whose path is safe to join to the model directory
    /// (`None` for the transformer, which lives at the top, and for unsafe paths).
    pub fn folder(&self) -> Option<&str> {
        let p = self.path.trim_end_matches('/');
        (!p.is_empty() && !p.contains('\\') && is_safe_relative(p)).then_some(p)
    }

    /// Whether this is a pooling module (any sentence-transformers version's spelling).
    pub fn is_pooling(&self) -> bool {
        self.kind == POOLING_TYPE
            || (self.kind.starts_with("sentence_transformers.") && self.kind.ends_with(".Pooling"))
    }
}

/// The modules of a `modules.json` text, in pipeline order.
pub fn parse_modules(text: &str) -> Result<Vec<Module>, String> {
    let mut modules: Vec<Module> = serde_json::from_str(text).map_err(|e| format!("{MODULES_FILE}: {e}"))?;
    modules.sort_by_key(|m| m.idx);
    Ok(modules)
}

/// The module folders `modules.json` names, in pipeline order, without duplicates.
pub fn module_folders(modules: &[Module]) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    for f in modules.iter().filter_map(Module::folder) {
        if !out.iter().any(|o| o == f) {
            out.push(f.to_string());
        }
    }
    out
}

/// Whether the pipeline pools hidden states into an embedding.
pub fn embeds(modules: &[Module]) -> bool {
    modules.iter().any(Module::is_pooling)
}

#[cfg(test)]
mod tests {
    use super::*;

    const EMBEDDING_GEMMA: &str = r#"[
      {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
      {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"},
      {"idx": 2, "name": "2", "path": "2_Dense", "type": "sentence_transformers.models.Dense"},
      {"idx": 3, "name": "3", "path": "3_Dense", "type": "sentence_transformers.models.Dense"},
      {"idx": 4, "name": "4", "path": "4_Normalize", "type": "sentence_transformers.models.Normalize"}
    ]"#;

    #[test]
    fn modules_json_gives_the_module_folders_and_pooling() {
        let m = parse_modules(EMBEDDING_GEMMA).unwrap();
        assert_eq!(m.len(), 5);
        assert_eq!(
            module_folders(&m),
            ["1_Pooling", "2_Dense", "3_Dense", "4_Normalize"]
        );
        assert!(embeds(&m));
        assert!(!embeds(&m[2..]));
    }

    #[test]
    fn unsafe_or_empty_module_paths_name_no_folder() {
        let text = r#"[{"path": "../up"}, {"path": "/abs"}, {"path": ""}, {"path": "a\\b"},
                       {"path": "ok/"}, {"path": "ok"}, {"idx": 9}]"#;
        assert_eq!(module_folders(&parse_modules(text).unwrap()), ["ok"]);
        assert!(parse_modules("{}").unwrap_err().starts_with("modules.json: "));
    }
}
