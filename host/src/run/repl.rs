//! The input side of `berth run`'s chat: a line editor on a terminal (history kept in the Berth
//! home, recalled with the up arrow), plain lines from a pipe, and `"""` blocks of several lines
//! on both, as `ollama run` reads them.

use anyhow::Result;
use rustyline::error::ReadlineError;
use rustyline::{Config, DefaultEditor};
use std::io::{BufRead, IsTerminal, Write};
use std::path::{Path, PathBuf};

/// Opens and closes a block of several lines.
const FENCE: &str = "\"\"\"";

/// Commands whose text may be a `"""` block (`/set system """...`), besides a plain message.
const BLOCK_COMMANDS: [&str; 1] = ["/set system "];

/// Entries kept in the history file.
const HISTORY_SIZE: usize = 1000;

/// The history file of `berth run`'s chat in a Berth home.
pub fn history_file(home: &Path) -> PathBuf {
    home.join("history")
}

/// What one read gave.
#[derive(Debug, PartialEq, Eq)]
pub enum Entry {
    /// A message or command (a block's lines joined by newlines, without its fences).
    Text(String),
    /// Ctrl-C at the prompt: the line (or the unfinished block) is dropped.
    Interrupted,
    /// Ctrl-D on an empty line, or the end of the input.
    Eof,
}

/// Where the chat's lines come from.
pub enum Input {
    /// A terminal: rustyline, with the history file (when the home can hold one).
    Editor {
        editor: Box<DefaultEditor>,
        history: Option<PathBuf>,
    },
    /// A pipe or file: one line at a time, the prompt on stderr.
    Lines(std::io::Lines<std::io::StdinLock<'static>>),
}

impl Input {
    /// A line editor when stdin and stdout are terminals, else plain lines; the editor's history
    /// is loaded from `history` (a missing file is an empty history).
    pub fn open(history: PathBuf) -> Input {
        if std::io::stdin().is_terminal() && std::io::stdout().is_terminal() {
            let config = Config::builder()
                .max_history_size(HISTORY_SIZE)
                .map(|b| b.auto_add_history(false).history_ignore_space(false).build());
            if let Ok(mut editor) = config.and_then(DefaultEditor::with_config) {
                let history = match editor.load_history(&history) {
                    Ok(()) => Some(history),
                    Err(ReadlineError::Io(e)) if e.kind() == std::io::ErrorKind::NotFound => Some(history),
                    Err(e) => {
                        eprintln!("warning: the history in {} is not read: {e}", history.display());
                        None
                    }
                };
                return Input::Editor {
                    editor: Box::new(editor),
                    history,
                };
            }
        }
        Input::Lines(std::io::stdin().lock().lines())
    }

    /// Whether the input is a terminal (Ctrl-C then stops an answer rather than the program).
    pub fn is_terminal(&self) -> bool {
        matches!(self, Input::Editor { .. })
    }

    /// Reads one message or command: a line, or a `"""` block of several (the `... ` prompt
    /// continues it). What was typed goes into the history as one entry.
    pub fn next(&mut self) -> Result<Entry> {
        let mut block = Block::default();
        loop {
            let prompt = if block.is_open() { "... " } else { ">>> " };
            let line = match self.read_line(prompt)? {
                Entry::Text(line) => line,
                Entry::Interrupted => {
                    // Ollama's hint; the unfinished block, if any, is dropped.
                    eprintln!("Use Ctrl + d or /bye to exit.");
                    return Ok(Entry::Interrupted);
                }
                Entry::Eof if block.is_open() => return Ok(Entry::Text(block.finish())),
                Entry::Eof => return Ok(Entry::Eof),
            };
            if let Some(text) = block.push(&line) {
                self.remember(block.typed());
                return Ok(Entry::Text(text));
            }
        }
    }

    /// One line from the editor or the pipe.
    fn read_line(&mut self, prompt: &str) -> Result<Entry> {
        match self {
            Input::Editor { editor, .. } => match editor.readline(prompt) {
                Ok(line) => Ok(Entry::Text(line)),
                Err(ReadlineError::Interrupted) => Ok(Entry::Interrupted),
                Err(ReadlineError::Eof) => Ok(Entry::Eof),
                Err(e) => Err(e.into()),
            },
            Input::Lines(lines) => {
                eprint!("{prompt}");
                let _ = std::io::stderr().flush();
                match lines.next() {
                    Some(line) => Ok(Entry::Text(line?)),
                    None => {
                        eprintln!();
                        Ok(Entry::Eof)
                    }
                }
            }
        }
    }

    /// Adds an entry to the history and appends it to the file at once (so a session that is
    /// killed keeps what it had).
    fn remember(&mut self, typed: &str) {
        let Input::Editor { editor, history } = self else {
            return;
        };
        if typed.trim().is_empty() || !matches!(editor.add_history_entry(typed), Ok(true)) {
            return;
        }
        if let Some(path) = history {
            if let Err(e) = editor.append_history(path) {
                eprintln!("warning: the history is not saved to {}: {e}", path.display());
                *history = None;
            }
        }
    }
}

/// A message being read: one line, or the lines of a `"""` block.
#[derive(Debug, Default)]
struct Block {
    /// The text of an open block (the command before its fence included).
    open: Option<String>,
    /// Everything typed for this entry, fences included (the history entry).
    typed: String,
}

impl Block {
    /// Takes a line; returns the entry once complete. A line that starts with `"""` (or
    /// `/set system """`) opens a block unless it also ends with `"""`; a line that ends with `"""`
    /// closes it. A recalled block (several lines in one) is complete at once.
    fn push(&mut self, line: &str) -> Option<String> {
        if !self.typed.is_empty() {
            self.typed.push('\n');
        }
        self.typed.push_str(line);
        let Some(mut text) = self.open.take() else {
            let Some((head, rest)) = opening(line) else {
                return Some(line.to_string());
            };
            return match rest.strip_suffix(FENCE) {
                Some(inner) => Some(format!("{head}{inner}")),
                None => {
                    self.open = Some(format!("{head}{rest}\n"));
                    None
                }
            };
        };
        match line.strip_suffix(FENCE) {
            Some(before) => {
                text.push_str(before);
                Some(text)
            }
            None => {
                text.push_str(line);
                text.push('\n');
                self.open = Some(text);
                None
            }
        }
    }

    /// Whether a block is open.
    fn is_open(&self) -> bool {
        self.open.is_some()
    }

    /// The text of a block the input ended inside.
    fn finish(&mut self) -> String {
        self.open.take().unwrap_or_default()
    }

    /// What was typed for the entry.
    fn typed(&self) -> &str {
        &self.typed
    }
}

/// Splits a line that opens a block into what comes before the fence (a command, or nothing) and
/// the text after it; `None` for a single line, returned as it is.
fn opening(line: &str) -> Option<(&str, &str)> {
    if let Some(rest) = line.strip_prefix(FENCE) {
        return Some(("", rest));
    }
    BLOCK_COMMANDS.iter().find_map(|c| {
        let rest = line.strip_prefix(c)?.strip_prefix(FENCE)?;
        Some((*c, rest))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn read(lines: &[&str]) -> (Vec<Option<String>>, String) {
        let mut b = Block::default();
        let out = lines.iter().map(|l| b.push(l)).collect();
        (out, b.typed().to_string())
    }

    #[test]
    fn a_plain_line_is_complete_at_once() {
        assert_eq!(read(&["hello"]).0, [Some("hello".to_string())]);
        assert_eq!(read(&["/show info"]).0, [Some("/show info".to_string())]);
    }

    #[test]
    fn a_block_runs_from_its_opening_fence_to_its_closing_one() {
        let (out, typed) = read(&["\"\"\"first", "second", "third\"\"\""]);
        assert_eq!(out, [None, None, Some("first\nsecond\nthird".to_string())]);
        assert_eq!(typed, "\"\"\"first\nsecond\nthird\"\"\"");
        let (out, _) = read(&["\"\"\"", "only", "\"\"\""]);
        assert_eq!(out[2].as_deref(), Some("\nonly\n"));
        // One line with both fences, and a recalled block (one entry of several lines).
        assert_eq!(read(&["\"\"\"one line\"\"\""]).0, [Some("one line".to_string())]);
        assert_eq!(read(&["\"\"\"a\nb\"\"\""]).0, [Some("a\nb".to_string())]);
    }

    #[test]
    fn set_system_takes_a_block() {
        let (out, _) = read(&["/set system \"\"\"You are terse.", "Answer in one word.\"\"\""]);
        assert_eq!(
            out[1].as_deref(),
            Some("/set system You are terse.\nAnswer in one word.")
        );
    }
}
