//! content_only: no tool markup, everything is content (Gemma 2/3); a leading `<think>` block is
//! still reasoning.

use crate::format::{ChatFormat, ParseStart};
use crate::formats::Format;
use crate::scan::Out;
use crate::think::think_block;

/// content_only.
pub(crate) struct ContentOnly;

impl Format for ContentOnly {
    fn id(&self) -> ChatFormat {
        ChatFormat::ContentOnly
    }
    fn name(&self) -> &'static str {
        "content_only"
    }
    fn in_template(&self, _template: &str) -> bool {
        false
    }
    fn parse(&self, out: &mut Out, text: &str, start: ParseStart) {
        if let Some(pos) = think_block(out, text, start, None) {
            out.content_tail(text, pos, &[]);
        }
    }
    #[cfg(any(test, feature = "testutil"))]
    fn render(&self, s: &crate::testutil::Sample) -> Option<(ParseStart, String)> {
        if !s.calls.is_empty() {
            return None;
        }
        let t = crate::think::render(s.reasoning.as_deref(), "\n", "\n\n") + &s.content;
        Some((ParseStart::Content, t))
    }
}
