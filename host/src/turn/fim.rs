//! Fill-in-the-middle: the prompt that asks a code model for the text between a prefix and a
//! suffix, built from the FIM tokens found in its vocabulary. Ollama's `suffix`, OpenAI's
//! `suffix` on completions and llama-server's `/infill` map their fields to a [`Fill`]; this
//! module alone knows the layout.
//!
//! The layout is prefix-suffix-middle (PSM), as Qwen2.5-Coder, CodeGemma and StarCoder document
//! it: `PRE prefix SUF suffix MID`, the model then writes the middle and ends it with an end token.
//! Other files of the project (`/infill`'s `input_extra`) go before it in the repository-level
//! layout of Qwen2.5-Coder's report: `REPO name\n` then `SEP path\ncontent` per file, then
//! `SEP path\n` of the file being edited, then the FIM part.

use super::ApiError;

/// The FIM token names of one family of code models.
struct Style {
    /// Before the prefix.
    prefix: &'static str,
    /// Before the suffix.
    suffix: &'static str,
    /// Before the middle the model writes.
    middle: &'static str,
    /// Before the repository's name, the first found in the vocabulary.
    repo: &'static [&'static str],
    /// Before each file's path, the first found in the vocabulary.
    file_sep: &'static [&'static str],
    /// Tokens that end the middle (besides the model's own end tokens), those in the vocabulary.
    ends: &'static [&'static str],
}

/// The styles Berth knows, tried in order. Qwen2.5-Coder and CodeGemma (and Gemma's vocabulary)
/// share the `<|fim_...|>` names and differ in the file separator; StarCoder (1 and 2),
/// StableCode and many others use `<fim_...>`.
const STYLES: &[Style] = &[
    Style {
        prefix: "<|fim_prefix|>",
        suffix: "<|fim_suffix|>",
        middle: "<|fim_middle|>",
        repo: &["<|repo_name|>"],
        file_sep: &["<|file_sep|>", "<|file_separator|>"],
        ends: &[
            "<|fim_pad|>",
            "<|file_sep|>",
            "<|file_separator|>",
            "<|repo_name|>",
            "<|fim_prefix|>",
            "<|endoftext|>",
        ],
    },
    Style {
        prefix: "<fim_prefix>",
        suffix: "<fim_suffix>",
        middle: "<fim_middle>",
        repo: &["<repo_name>", "<reponame>"],
        file_sep: &["<file_sep>", "<filename>"],
        ends: &[
            "<fim_pad>",
            "<file_sep>",
            "<filename>",
            "<repo_name>",
            "<reponame>",
            "<fim_prefix>",
            "<|endoftext|>",
        ],
    },
];

/// The repository name of the repository-level layout (clients do not send one).
pub const REPO_NAME: &str = "myproject";

/// The path of the file being edited in the repository-level layout (clients do not send one).
pub const CURRENT_FILE: &str = "filename";

/// The FIM tokens of one model, as found in its vocabulary.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FimTokens {
    /// Before the prefix.
    pub prefix: &'static str,
    /// Before the suffix.
    pub suffix: &'static str,
    /// Before the middle.
    pub middle: &'static str,
    /// Before the repository's name, when the vocabulary has it.
    pub repo: Option<&'static str>,
    /// Before each file's path, when the vocabulary has it.
    pub file_sep: Option<&'static str>,
    /// Stop strings that end the middle.
    pub ends: Vec<String>,
}

impl FimTokens {
    /// The FIM tokens of a vocabulary (`has`: whether a text is one token of it); `None` when it
    /// has no complete prefix/suffix/middle set.
    pub fn detect(has: &dyn Fn(&str) -> bool) -> Option<FimTokens> {
        let s = STYLES
            .iter()
            .find(|s| has(s.prefix) && has(s.suffix) && has(s.middle))?;
        let first = |names: &[&'static str]| names.iter().copied().find(|n| has(n));
        Some(FimTokens {
            prefix: s.prefix,
            suffix: s.suffix,
            middle: s.middle,
            repo: first(s.repo),
            file_sep: first(s.file_sep),
            ends: s.ends.iter().filter(|n| has(n)).map(|n| n.to_string()).collect(),
        })
    }

    /// The FIM tokens of a model's tokenizer, or a 400 naming `param` that says the model has none.
    pub fn of(
        tokenizer: &crate::tokenizer::Tokenizer,
        reference: &str,
        param: &str,
    ) -> Result<FimTokens, ApiError> {
        FimTokens::detect(&|t| tokenizer.token_id(t).is_some()).ok_or_else(|| {
            ApiError::param(
                param,
                format!(
                    "'{param}' (fill-in-the-middle) needs a code model with FIM tokens (<|fim_prefix|> or <fim_prefix>) in its vocabulary; model {reference} has none"
                ),
            )
        })
    }

    /// The prompt that asks for the middle of `fill`, as text.
    pub fn render(&self, fill: &Fill) -> String {
        self.segments(fill)
            .iter()
            .map(|s| match s {
                Segment::Token(t) => *t,
                Segment::Text(t) => t.as_str(),
            })
            .collect()
    }

    /// The prompt that asks for the middle of `fill`, as tokens: the FIM tokens by id, and the
    /// client's text with special-token text in it read as plain text (a file that mentions
    /// `<|endoftext|>` does not end the context), as llama-server tokenizes it.
    pub fn tokenize(&self, tokenizer: &crate::tokenizer::Tokenizer, fill: &Fill) -> Vec<u32> {
        let mut ids = Vec::new();
        if tokenizer.add_bos() {
            ids.extend(tokenizer.bos_id());
        }
        for s in self.segments(fill) {
            match s {
                Segment::Token(t) => ids.extend(tokenizer.token_id(t)),
                Segment::Text(t) => ids.extend(tokenizer.encode_literal(&t, false)),
            }
        }
        ids
    }

    /// The prompt in order: FIM tokens and text.
    fn segments(&self, fill: &Fill) -> Vec<Segment> {
        let text = |t: &str| Segment::Text(t.to_string());
        let mut out = Vec::new();
        if !fill.files.is_empty() {
            match self.file_sep {
                Some(sep) => {
                    if let Some(repo) = self.repo {
                        out.extend([Segment::Token(repo), text(&format!("{REPO_NAME}\n"))]);
                    }
                    for f in &fill.files {
                        let nl = if f.text.ends_with('\n') { "" } else { "\n" };
                        out.extend([Segment::Token(sep), text(&format!("{}\n{}{nl}", f.name, f.text))]);
                    }
                    out.extend([Segment::Token(sep), text(&format!("{CURRENT_FILE}\n"))]);
                }
                // Without a file separator the other files read as plain snippets before the code.
                None => {
                    let mut t = String::new();
                    for f in &fill.files {
                        t.push_str(&format!("\n\n// file: {}\n\n{}", f.name, f.text));
                    }
                    t.push_str("\n\n");
                    out.push(Segment::Text(t));
                }
            }
        }
        out.extend([
            Segment::Token(self.prefix),
            text(&fill.prefix),
            Segment::Token(self.suffix),
            text(&fill.suffix),
            Segment::Token(self.middle),
        ]);
        out.retain(|s| !matches!(s, Segment::Text(t) if t.is_empty()));
        out
    }
}

/// A part of a FIM prompt.
enum Segment {
    /// A FIM token, by its text.
    Token(&'static str),
    /// The client's text.
    Text(String),
}

/// Another file of the project, given as context (`/infill`'s `input_extra`).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct File {
    /// Its path.
    pub name: String,
    /// Its text.
    pub text: String,
}

/// What a fill-in-the-middle request asks for: the text around the gap, and other files.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Fill {
    /// The text before the gap.
    pub prefix: String,
    /// The text after the gap.
    pub suffix: String,
    /// Other files of the project, in order.
    pub files: Vec<File>,
}

/// Rebuilds `req` as the FIM prompt of `fill` for `model`: a raw prompt and the FIM end tokens
/// as stop strings. Returns the prompt's tokens, which the caller puts on the prepared turn
/// ([`place`]): the raw text would read special-token text in the client's code as tokens. A
/// model without FIM tokens is a 400 naming `param`, and so are images (code has none).
pub fn apply(
    model: &crate::state::models::Model,
    req: &mut super::ChatRequest,
    fill: &Fill,
    param: &str,
) -> Result<Vec<u32>, ApiError> {
    let tokens = FimTokens::of(&model.tokenizer, &model.reference, param)?;
    let has_images = match &req.prompt {
        super::Prompt::Chat(messages) => messages.iter().any(|m| m.images().next().is_some()),
        super::Prompt::Raw { images, .. } => !images.is_empty(),
    };
    if has_images {
        return Err(ApiError::param(
            param,
            format!("'{param}' (fill-in-the-middle) cannot be used with images"),
        ));
    }
    req.prompt = super::Prompt::Raw {
        text: tokens.render(fill),
        images: Vec::new(),
    };
    for end in &tokens.ends {
        if !req.decode.stop.contains(end) {
            req.decode.stop.push(end.clone());
        }
    }
    // The middle is code as the model writes it: no chat format reads it.
    req.parse_reply = false;
    Ok(tokens.tokenize(&model.tokenizer, fill))
}

/// Puts the FIM prompt's tokens (from [`apply`]) on a prepared turn.
pub fn place(turn: &mut super::Turn, prompt: Vec<u32>) {
    turn.prompt = prompt;
}

#[cfg(test)]
mod tests {
    use super::*;

    fn vocab(names: &'static [&'static str]) -> impl Fn(&str) -> bool {
        move |t| names.contains(&t)
    }

    const QWEN: &[&str] = &[
        "<|fim_prefix|>",
        "<|fim_suffix|>",
        "<|fim_middle|>",
        "<|fim_pad|>",
        "<|repo_name|>",
        "<|file_sep|>",
        "<|endoftext|>",
        "<|im_end|>",
    ];

    #[test]
    fn qwen_coder_prompt_is_prefix_suffix_middle_as_its_readme_shows() {
        let t = FimTokens::detect(&vocab(QWEN)).unwrap();
        let fill = Fill {
            prefix: "def add(a, b):\n    ".into(),
            suffix: "\n\nprint(add(1, 2))\n".into(),
            files: Vec::new(),
        };
        assert_eq!(
            t.render(&fill),
            "<|fim_prefix|>def add(a, b):\n    <|fim_suffix|>\n\nprint(add(1, 2))\n<|fim_middle|>"
        );
        assert_eq!(
            t.ends,
            [
                "<|fim_pad|>",
                "<|file_sep|>",
                "<|repo_name|>",
                "<|fim_prefix|>",
                "<|endoftext|>"
            ]
        );
    }

    #[test]
    fn other_files_come_first_in_the_repository_level_layout() {
        let t = FimTokens::detect(&vocab(QWEN)).unwrap();
        let fill = Fill {
            prefix: "from util import two\nx = ".into(),
            suffix: "\n".into(),
            files: vec![
                File {
                    name: "util.py".into(),
                    text: "def two():\n    return 2\n".into(),
                },
                File {
                    name: "README".into(),
                    text: "no newline".into(),
                },
            ],
        };
        assert_eq!(
            t.render(&fill),
            "<|repo_name|>myproject\n\
             <|file_sep|>util.py\ndef two():\n    return 2\n\
             <|file_sep|>README\nno newline\n\
             <|file_sep|>filename\n\
             <|fim_prefix|>from util import two\nx = <|fim_suffix|>\n<|fim_middle|>"
        );
    }

    #[test]
    fn codegemma_and_starcoder_names_are_found_and_a_plain_vocab_has_none() {
        let gemma = FimTokens::detect(&vocab(&[
            "<|fim_prefix|>",
            "<|fim_suffix|>",
            "<|fim_middle|>",
            "<|file_separator|>",
        ]))
        .unwrap();
        assert_eq!((gemma.repo, gemma.file_sep), (None, Some("<|file_separator|>")));
        assert_eq!(gemma.ends, ["<|file_separator|>", "<|fim_prefix|>"]);
        let star = FimTokens::detect(&vocab(&[
            "<fim_prefix>",
            "<fim_suffix>",
            "<fim_middle>",
            "<fim_pad>",
            "<file_sep>",
            "<repo_name>",
            "<|endoftext|>",
        ]))
        .unwrap();
        let fill = Fill {
            prefix: "a".into(),
            suffix: "c".into(),
            files: vec![File {
                name: "f.py".into(),
                text: "x\n".into(),
            }],
        };
        assert_eq!(
            star.render(&fill),
            "<repo_name>myproject\n<file_sep>f.py\nx\n<file_sep>filename\n<fim_prefix>a<fim_suffix>c<fim_middle>"
        );
        assert_eq!(FimTokens::detect(&vocab(&["<|im_start|>", "<|im_end|>"])), None);
        // Two of the three are not enough.
        assert_eq!(FimTokens::detect(&vocab(&["<fim_prefix>", "<fim_suffix>"])), None);
    }

    #[test]
    fn without_a_file_separator_other_files_are_snippets_before_the_code() {
        let t = FimTokens::detect(&vocab(&["<fim_prefix>", "<fim_suffix>", "<fim_middle>"])).unwrap();
        let fill = Fill {
            prefix: "p".into(),
            suffix: "s".into(),
            files: vec![File {
                name: "a.rs".into(),
                text: "fn a() {}".into(),
            }],
        };
        assert_eq!(
            t.render(&fill),
            "\n\n// file: a.rs\n\nfn a() {}\n\n<fim_prefix>p<fim_suffix>s<fim_middle>"
        );
    }
}
