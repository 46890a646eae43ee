//! One module per chat format, each behind [`Format`]: its marker strings (written once, here in
//! its module), detection, reasoning markup, prefill, parser and call grammar. Adding a format is
//! one module, one [`ChatFormat`] id and one entry in [`DETECT_ORDER`].

pub(crate) mod content_only;
pub(crate) mod gemma4;
pub(crate) mod harmony;
pub(crate) mod hermes_json;
pub(crate) mod lfm2_pythonic;
pub(crate) mod minicpm_xml;
pub(crate) mod qwen_xml;

use crate::format::{ChatFormat, ParseStart, Reasoning};
use crate::grammar::{Lark, Markers, Plan};
use crate::request::ParamError;
use crate::scan::Out;
use crate::think;

/// The strings of a format's single-token markers (each must be one token of the vocabulary);
/// [`Markers::resolve`] looks them up by id.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct MarkerNames {
    /// Tool-call open and close.
    pub(crate) tool: Option<(&'static str, &'static str)>,
    /// Gemma 4's string delimiter.
    pub(crate) quote: Option<&'static str>,
    /// Harmony's `<|channel|>`, `<|message|>`, `<|constrain|>`, `<|end|>`, `<|start|>`.
    pub(crate) harmony: Option<[&'static str; 5]>,
}

/// Everything Berth knows about one chat format; detection, parser, stream and grammar all read it.
pub(crate) trait Format: Sync {
    /// The format's stable id.
    fn id(&self) -> ChatFormat;
    /// The format's name in logs and on the command line (`qwen_xml`).
    fn name(&self) -> &'static str;
    /// Whether a chat template writes this format's markup.
    fn in_template(&self, template: &str) -> bool;
    /// Whether a vocabulary (without a template) shows this format.
    fn in_vocab(&self, _has_token: &dyn Fn(&str) -> bool) -> bool {
        false
    }
    /// The format's own reasoning markup; `None`: `<think>` tags when the template or vocabulary
    /// has them.
    fn reasoning(&self) -> Option<Reasoning> {
        None
    }
    /// Where parsing starts, from what the rendered generation prompt opened.
    fn prefill(&self, rendered_prompt: &str) -> ParseStart {
        think::prefill(rendered_prompt)
    }
    /// Parses `text` (the whole output) into `out`.
    fn parse(&self, out: &mut Out, text: &str, start: ParseStart);
    /// The single-token markers the grammar writes by id.
    fn markers(&self) -> MarkerNames {
        MarkerNames::default()
    }
    /// The grammar of the calls `plan` allows (one, or several in the format's own joining);
    /// `None` for a format without call markup.
    fn call_grammar(
        &self,
        _g: &mut Lark,
        _markers: &Markers,
        _plan: &Plan,
    ) -> Option<Result<String, ParamError>> {
        None
    }
    /// Free text that stays content (it cannot open a call).
    fn text_grammar(&self, _g: &mut Lark) -> String {
        "TEXT".into()
    }
    /// Free text, then (once the opener appears) the calls.
    fn text_then_calls(&self, _g: &mut Lark, calls: &str, _plan: &Plan) -> String {
        format!("TEXT ({calls})?")
    }
    /// Writes `sample` as a model would in this format's markup, with the parse start the text
    /// assumes; `None` when the format cannot hold it (calls without call markup).
    #[cfg(any(test, feature = "testutil"))]
    fn render(&self, sample: &crate::testutil::Sample) -> Option<(ParseStart, String)>;
    /// The whole body after any reasoning, for a format that writes its own (harmony's channels).
    fn body_grammar(
        &self,
        _g: &mut Lark,
        _markers: &Markers,
        _plan: &Plan,
    ) -> Option<Result<String, ParamError>> {
        None
    }
}

/// Every format, in detection order: the first whose markup the template shows wins, else the
/// first the vocabulary shows, else content_only. Harmony's `<|channel|>` is tested before Gemma
/// 4's `<|channel>` (they differ by one pipe), MiniCPM5's and Qwen's XML before hermes' plain
/// `<tool_call>`.
pub(crate) static DETECT_ORDER: &[&dyn Format] = &[
    &harmony::Harmony,
    &gemma4::Gemma4,
    &lfm2_pythonic::Lfm2Pythonic,
    &minicpm_xml::MiniCpmXml,
    &qwen_xml::QwenXml,
    &hermes_json::HermesJson,
    &content_only::ContentOnly,
];

/// The description of one format.
pub(crate) fn of(format: ChatFormat) -> &'static dyn Format {
    match format {
        ChatFormat::HermesJson => &hermes_json::HermesJson,
        ChatFormat::QwenXml => &qwen_xml::QwenXml,
        ChatFormat::Gemma4 => &gemma4::Gemma4,
        ChatFormat::Lfm2Pythonic => &lfm2_pythonic::Lfm2Pythonic,
        ChatFormat::Harmony => &harmony::Harmony,
        ChatFormat::MiniCpmXml => &minicpm_xml::MiniCpmXml,
        ChatFormat::ContentOnly => &content_only::ContentOnly,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_format_is_in_the_detection_order_once_under_its_own_id() {
        let ids: Vec<ChatFormat> = DETECT_ORDER.iter().map(|f| f.id()).collect();
        assert_eq!(ids, ChatFormat::ALL);
        for f in DETECT_ORDER {
            assert_eq!(of(f.id()).name(), f.name());
        }
        assert_eq!(DETECT_ORDER.last().map(|f| f.id()), Some(ChatFormat::ContentOnly));
    }
}
