//! Chat formats, their detection from a template and a vocabulary, and the prefill: what the
//! rendered generation prompt already opened.

use std::fmt;
use std::str::FromStr;

use crate::formats::gemma4::{G_CHANNEL, G_END_CHANNEL};
use crate::formats::harmony::H_END;
use crate::formats::{self, DETECT_ORDER};
use crate::think;

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

    /// Every format by its stable id (the index here): new formats are appended, so an id never
    /// changes meaning (the fuzz seeds name formats by id).
    pub const BY_ID: [ChatFormat; 7] = [
        ChatFormat::ContentOnly,
        ChatFormat::Harmony,
        ChatFormat::Gemma4,
        ChatFormat::Lfm2Pythonic,
        ChatFormat::MiniCpmXml,
        ChatFormat::QwenXml,
        ChatFormat::HermesJson,
    ];

    /// The format's name as written in logs and on the command line (`qwen_xml`).
    pub fn name(self) -> &'static str {
        formats::of(self).name()
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
            if let Some(end) = token_id(H_END) {
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

impl Reasoning {
    /// The reasoning block's open and close markers, where they are a pair of single tokens.
    pub fn markers(self) -> Option<(&'static str, &'static str)> {
        match self {
            Reasoning::ThinkTags => Some(think::MARKERS),
            Reasoning::Gemma4Thought => Some((G_CHANNEL, G_END_CHANNEL)),
            Reasoning::HarmonyAnalysis => None,
        }
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

/// Detect the chat format from the template text, falling back on the vocabulary (spec §2.2):
/// the first format in detection order whose markup the template shows, else the first the
/// vocabulary shows, else content_only. The vocabulary cannot tell qwen_xml from hermes_json:
/// that takes the template text.
pub fn detect(template_text: Option<&str>, vocab_has: impl Fn(&str) -> bool) -> Detected {
    let t = template_text.unwrap_or("");
    let format = DETECT_ORDER
        .iter()
        .find(|f| f.in_template(t))
        .or_else(|| DETECT_ORDER.iter().find(|f| f.in_vocab(&vocab_has)))
        .map_or(ChatFormat::ContentOnly, |f| f.id());
    let (think, _) = think::MARKERS;
    let reasoning = formats::of(format)
        .reasoning()
        .or_else(|| (t.contains(think) || vocab_has(think)).then_some(Reasoning::ThinkTags));
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
    formats::of(format).prefill(rendered_prompt)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testutil::{fixture, templates_dir};

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
    fn fuzz_seeds_name_their_format_by_stable_id() {
        let seeds = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../fuzz/seeds/chat_parse_stream");
        let short = |f: ChatFormat| match f {
            ChatFormat::HermesJson => "hermes",
            ChatFormat::Lfm2Pythonic => "lfm2",
            ChatFormat::MiniCpmXml => "minicpm",
            other => other.name(),
        };
        let mut seen = 0;
        for entry in std::fs::read_dir(seeds).expect("fuzz/seeds/chat_parse_stream") {
            let path = entry.unwrap().path();
            let name = path.file_name().unwrap().to_string_lossy().into_owned();
            let first = std::fs::read(&path).unwrap()[0];
            let id = first.wrapping_sub(b'0') as usize;
            assert!(id < ChatFormat::BY_ID.len(), "{name}: id {id}");
            let format = ChatFormat::BY_ID[id];
            assert!(name.starts_with(short(format)), "seed {name} is {format}");
            seen += 1;
        }
        assert!(seen >= ChatFormat::BY_ID.len());
        let mut ids = ChatFormat::BY_ID.to_vec();
        ids.sort_by_key(|f| f.name());
        let mut all = ChatFormat::ALL.to_vec();
        all.sort_by_key(|f| f.name());
        assert_eq!(ids, all, "every format has one stable id");
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
}
