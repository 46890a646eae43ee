//! `berth run` on the real models: chat with Qwen2.5-Coder, raw completion with Gemma 3 base.

mod common;

use common::*;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::OnceLock;

/// A Berth home with both real models imported and the two family plugins installed, shared by
/// the tests of this file.
fn home() -> &'static Path {
    static HOME: OnceLock<PathBuf> = OnceLock::new();
    HOME.get_or_init(|| real_models_home("berth-run-"))
}

#[test]
fn qwen_answers_the_capital_of_france_with_paris() {
    let out = berth_ok(
        home(),
        Some(&home_plugins(home())),
        &[
            "run",
            "qwen2.5-coder:0.5b",
            "What is the capital of France? Answer in one sentence.",
            "--temperature",
            "0",
        ],
    );
    assert!(out.contains("Paris"), "{out}");
    assert!(out.trim().lines().count() <= 3, "one sentence expected: {out}");
}

#[test]
fn gemma_base_completes_the_eiffel_tower_sentence_with_paris() {
    let out = berth_ok(
        home(),
        Some(&home_plugins(home())),
        &[
            "run",
            "--raw",
            "gemma3:270m",
            "The Eiffel Tower is located in the city of",
            "--temperature",
            "0",
            "--max-tokens",
            "8",
        ],
    );
    assert!(out.trim_start().starts_with("Paris"), "{out}");
}

#[test]
fn chat_with_a_base_model_without_template_is_a_clear_error() {
    let out = berth(
        home(),
        Some(&home_plugins(home())),
        &["run", "gemma3:270m", "Hello"],
    );
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("has no chat template") && err.contains("--raw"),
        "{err}"
    );
}

#[test]
fn interactive_chat_keeps_history_and_understands_commands() {
    let mut child = Command::new(berth_exe())
        .args([
            "run",
            "qwen2.5-coder:0.5b",
            "--temperature",
            "0",
            "--max-tokens",
            "24",
            "--verbose",
        ])
        .env("BERTH_HOME", home())
        .env("BERTH_PLUGIN_PATH", home_plugins(home()))
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let script = "/show info\nMy name is Ada. Reply with one word: OK.\nWhat is my name? Answer with the name only.\n/clear\n/bye\n";
    child.stdin.take().unwrap().write_all(script.as_bytes()).unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success());
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("context length"), "{stderr}");
    assert!(stderr.contains("Cleared session context"), "{stderr}");
    assert!(stderr.contains("eval rate:"), "{stderr}");
    assert!(stderr.contains("cached"), "{stderr}");
    assert!(
        stdout.contains("Ada"),
        "the second answer uses the first turn: {stdout}"
    );
}

/// `berth run` and `berth serve` give Qwen2.5-Coder's same greedy answer: speculation on and
/// off (a copy-heavy prompt, so drafts are taken), and under a JSON schema.
#[test]
fn qwen_run_and_serve_give_the_same_greedy_answer() {
    // No trailing newline: `berth run` trims what is typed, as `ollama run` does.
    let code = "def area(width, height):\n    return width * height";
    let prompt = format!("Rename `width` to `w` in this function and show the whole function:\n{code}");
    let schema = serde_json::json!({"type": "object", "properties": {"city": {"type": "string"},
        "country": {"type": "string"}}, "required": ["city", "country"]});
    for (speculation, schema) in [("on", None), ("off", None), ("off", Some(&schema))] {
        let mut args = vec![
            "run",
            "qwen2.5-coder:0.5b",
            &prompt,
            "--temperature",
            "0",
            "--max-tokens",
            "48",
        ];
        let format = schema.map(|s| s.to_string());
        if let Some(f) = &format {
            args.extend(["--format", f.as_str()]);
        }
        let plugins = home_plugins(home());
        let mut run = Command::new(berth_exe());
        run.args(&args)
            .env("BERTH_HOME", home())
            .env("BERTH_PLUGIN_PATH", &plugins)
            .env("BERTH_SPECULATION", speculation);
        let out = run.output().expect("berth runs");
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        let ran = String::from_utf8_lossy(&out.stdout).into_owned();
        let (mut child, _, port) = common::spawn_serve(
            Command::new(berth_exe())
                .args(["serve", "--port", "0", "--host", "127.0.0.1"])
                .env("BERTH_HOME", home())
                .env("BERTH_PLUGIN_PATH", &plugins)
                .env("BERTH_SPECULATION", speculation)
                .env("BERTH_LOG", "warn"),
        );
        let mut body = serde_json::json!({"model": "qwen2.5-coder:0.5b", "temperature": 0, "max_tokens": 48,
            "messages": [{"role": "user", "content": prompt}]});
        if let Some(s) = schema {
            body["response_format"] =
                serde_json::json!({"type": "json_schema", "json_schema": {"name": "place", "schema": s}});
        }
        let (status, text) = http_request(port, "POST", "/v1/chat/completions", &body.to_string());
        let _ = child.kill();
        let _ = child.wait();
        assert_eq!(status, 200, "{text}");
        let answer: serde_json::Value = serde_json::from_str(&text).unwrap();
        let served = answer["choices"][0]["message"]["content"]
            .as_str()
            .unwrap_or_default();
        assert!(!served.is_empty(), "{answer}");
        assert_eq!(
            ran.trim_end(),
            served.trim_end(),
            "speculation {speculation}, schema {schema:?}: `berth run` and `berth serve` differ"
        );
    }
}

/// `berth run` on a pseudo-terminal: a private tmux server (its socket in a temporary folder)
/// runs it in a 120×50 pane; keys are sent as a person types them and the screen is read back.
struct Terminal {
    dir: tempfile::TempDir,
}

impl Terminal {
    /// `berth run ARGS` over `home` in a fresh pane; `None` (a recorded skip) without tmux.
    fn start(home: &Path, args: &[&str]) -> Option<Terminal> {
        if Command::new("tmux").arg("-V").output().is_err() {
            berth_registry::test_skip::skip_unless_ci("tmux is not installed (apt-get install tmux)");
            return None;
        }
        let t = Terminal {
            dir: tempfile::tempdir().unwrap(),
        };
        let home_env = format!("BERTH_HOME={}", home.display());
        let plugins_env = format!("BERTH_PLUGIN_PATH={}", home_plugins(home).display());
        let exe = berth_exe();
        // A shell runs `berth` and prints its exit status (tmux may not reap a pane's process
        // in time to report it); its no-op trap keeps it alive when Ctrl-C reaches the group.
        let script = "trap : INT; \"$@\"; echo \"[berth exited with $?]\"";
        let mut command = vec![
            "new-session",
            "-d",
            "-x",
            "120",
            "-y",
            "50",
            "sh",
            "-c",
            script,
            "sh",
        ];
        command.extend(["env", "-u", "BERTH_LOG", home_env.as_str(), plugins_env.as_str()]);
        command.extend([exe.to_str().unwrap(), "run"]);
        command.extend(args);
        t.tmux(&command);
        // The pane (and its screen) stays after the shell exits.
        t.tmux(&["set-option", "-g", "remain-on-exit", "on"]);
        Some(t)
    }

    /// Runs a tmux command on this terminal's server; returns its stdout.
    fn tmux(&self, args: &[&str]) -> String {
        let out = Command::new("tmux")
            .arg("-S")
            .arg(self.dir.path().join("tmux.sock"))
            .args(["-f", "/dev/null"])
            .args(args)
            .env("TERM", "xterm")
            .output()
            .expect("tmux runs");
        assert!(
            out.status.success(),
            "tmux {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// Types `text` as it is, then Enter.
    fn line(&self, text: &str) {
        self.tmux(&["send-keys", "-l", text]);
        self.keys("Enter");
    }

    /// Presses a key by tmux's name for it (`Up`, `C-c`, `Enter`).
    fn keys(&self, key: &str) {
        self.tmux(&["send-keys", key]);
    }

    /// The whole screen, scrollback included, without trailing blank lines.
    fn screen(&self) -> String {
        self.tmux(&["capture-pane", "-p", "-S", "-"])
            .trim_end()
            .to_string()
    }

    /// Waits until the screen satisfies `ready` (read every 100 ms, for at most 4 minutes: a
    /// busy machine answers slowly); returns that screen, or panics with it.
    fn wait(&self, what: &str, ready: impl Fn(&str) -> bool) -> String {
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(240);
        loop {
            let screen = self.screen();
            if ready(&screen) {
                return screen;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "timed out waiting for {what}; the screen:\n{screen}"
            );
            std::thread::sleep(std::time::Duration::from_millis(100));
        }
    }

    /// Waits for the `>>>` prompt on the last line, after `after` has shown (text the answer or
    /// command before it prints, so an earlier prompt does not count).
    fn wait_prompt_after(&self, after: &str) -> String {
        self.wait(&format!("the prompt after {after:?}"), |s| {
            s.rfind(after)
                .is_some_and(|i| s[i..].lines().count() > 1 && s.lines().last() == Some(">>>"))
        })
    }

    /// Waits for `berth` to exit; returns its exit status.
    fn wait_exit(&self) -> i32 {
        const EXITED: &str = "[berth exited with ";
        let screen = self.wait("berth to exit", |s| {
            s.rsplit_once(EXITED).is_some_and(|(_, rest)| rest.contains(']'))
        });
        let status = screen.rsplit(EXITED).next().unwrap();
        status.split(']').next().unwrap().parse().unwrap()
    }
}

impl Drop for Terminal {
    fn drop(&mut self) {
        let _ = Command::new("tmux")
            .arg("-S")
            .arg(self.dir.path().join("tmux.sock"))
            .arg("kill-server")
            .output();
    }
}

/// The chat on a terminal: the up arrow recalls (and re-sends) the previous line, in the session
/// and in the next one (the history is kept in the Berth home); a `"""` block is one message;
/// Ctrl-C stops an answer and the chat goes on; Ctrl-C at the prompt gives a hint; Ctrl-D exits.
#[test]
fn repl_recalls_history_reads_blocks_and_ctrl_c_stops_an_answer() {
    let home = home_with_qwen("berth-repl-", "qwen2.5-coder:0.5b");
    let args = ["qwen2.5-coder:0.5b", "--temperature", "0", "--max-tokens", "2000"];
    let Some(t) = Terminal::start(home.path(), &args) else {
        return;
    };
    t.wait("the prompt", |s| s.lines().last() == Some(">>>"));

    let question = "What is the capital of France? Answer with one word.";
    t.line(question);
    t.wait_prompt_after(question);
    t.keys("Up");
    t.wait("the recalled line", |s| {
        s.lines().last() == Some(&format!(">>> {question}")[..])
    });
    t.keys("Enter");
    let screen = t.wait("the second answer", |s| {
        s.matches("Paris").count() == 2 && s.ends_with(">>>")
    });
    assert_eq!(screen.matches(question).count(), 2, "{screen}");

    t.line("\"\"\"Repeat these two words, one per line:");
    t.line("alpha");
    t.line("beta\"\"\"");
    let screen = t.wait_prompt_after("... beta\"\"\"");
    let answer = screen.rsplit("... beta\"\"\"").next().unwrap();
    assert!(answer.contains("alpha") && answer.contains("beta"), "{screen}");

    let count = "Count from 1 to 300, one number per line, and nothing else.";
    t.line(count);
    t.wait("the count to reach 10", |s| s.lines().any(|l| l.trim() == "10"));
    t.keys("C-c");
    let screen = t.wait_prompt_after("(stopped)");
    assert!(
        !screen.lines().any(|l| l.trim() == "300"),
        "the answer went on: {screen}"
    );
    let next = "What is 2 + 2? Answer with the number only.";
    t.line(next);
    let screen = t.wait_prompt_after(next);
    assert!(screen.rsplit(next).next().unwrap().contains('4'), "{screen}");

    t.keys("C-c");
    t.wait("the exit hint", |s| s.contains("Use Ctrl + d or /bye to exit."));
    t.keys("C-d");
    assert_eq!(t.wait_exit(), 0);
    let history = std::fs::read_to_string(home.path().join("history")).unwrap();
    assert!(
        history.contains(next) && history.contains("alpha\\nbeta"),
        "{history}"
    );
    drop(t);

    // The next session recalls the last line of the previous one.
    let t = Terminal::start(home.path(), &args).unwrap();
    t.wait("the prompt", |s| s.lines().last() == Some(">>>"));
    t.keys("Up");
    t.wait("the line of the last session", |s| {
        s.lines().last() == Some(&format!(">>> {next}")[..])
    });
    t.keys("Enter");
    let screen = t.wait_prompt_after(next);
    assert!(screen.rsplit(next).next().unwrap().contains('4'), "{screen}");
    t.line("/bye");
    assert_eq!(t.wait_exit(), 0);
}

/// `/set parameter`, `/set system`, `/show`, then `/save` writes the session as a pack (listed by
/// `berth list`) and `/load` brings back its system prompt, parameters and conversation.
#[test]
fn repl_sets_parameters_and_saves_and_loads_a_session() {
    let home = home_with_qwen("berth-repl-", "qwen2.5-coder:0.5b");
    let Some(t) = Terminal::start(home.path(), &["qwen2.5-coder:0.5b", "--max-tokens", "32"]) else {
        return;
    };
    t.wait("the prompt", |s| s.lines().last() == Some(">>>"));
    t.line("/set parameter temperature 0");
    t.wait_prompt_after("Set parameter 'temperature' to '0'");
    t.line("/set parameter mirostat 2");
    t.wait_prompt_after("'mirostat' is an Ollama parameter Berth does not implement");
    t.line("/show parameters");
    let screen = t.wait_prompt_after("User defined parameters:");
    let shown = screen.rsplit("User defined parameters:").next().unwrap();
    assert!(
        shown
            .lines()
            .any(|l| l.split_whitespace().eq(["temperature", "0"])),
        "{screen}"
    );
    let system = "You are a helpful assistant. Always answer in English.";
    t.line(&format!("/set system {system}"));
    t.wait_prompt_after("Set system message.");
    let first = "My name is Ada. Reply with OK.";
    t.line(first);
    t.wait_prompt_after(first);
    t.line("/save ada-session");
    t.wait_prompt_after("Created new model 'ada-session:latest'");
    t.line("/clear");
    t.wait_prompt_after("Cleared session context");
    t.line("/load ada-session");
    // The restored conversation is shown again.
    let screen = t.wait_prompt_after("Loading model 'ada-session'");
    assert!(
        screen.rsplit("Loading model").next().unwrap().contains(first),
        "{screen}"
    );
    t.line("/show system");
    let screen = t.wait_prompt_after("/show system");
    assert!(
        screen.rsplit("/show system").next().unwrap().contains(system),
        "{screen}"
    );
    t.line("/show parameters");
    let screen = t.wait_prompt_after("Model defined parameters:");
    let shown = screen.rsplit("Model defined parameters:").next().unwrap();
    assert!(
        shown
            .lines()
            .any(|l| l.split_whitespace().eq(["temperature", "0"])),
        "{screen}"
    );
    let question = "What is my name? Answer with the name only.";
    t.line(question);
    let screen = t.wait_prompt_after(question);
    assert!(
        screen.rsplit(question).next().unwrap().contains("Ada"),
        "{screen}"
    );
    t.line("/bye");
    assert_eq!(t.wait_exit(), 0);

    let list = berth_ok(home.path(), None, &["list"]);
    assert!(list.contains("ada-session:latest"), "{list}");
    // The saved session answers from its conversation in a one-shot run too.
    let out = berth_ok(home.path(), None, &["run", "ada-session", question]);
    assert!(out.contains("Ada"), "{out}");
    let manifest = std::fs::read_to_string(home.path().join("packs/ada-session/latest/pack.toml")).unwrap();
    assert!(
        manifest.contains(system) && manifest.contains(first),
        "{manifest}"
    );
}

/// A chat longer than the context goes on: the oldest turns are dropped, with a notice, and the
/// system prompt stays.
#[test]
fn chat_drops_the_oldest_turns_when_the_context_is_full() {
    let mut child = Command::new(berth_exe())
        .args([
            "run",
            "qwen2.5-coder:0.5b",
            "--temperature",
            "0",
            "--max-tokens",
            "40",
        ])
        .args(["--system", "You answer in one sentence."])
        .env("BERTH_HOME", home())
        .env("BERTH_PLUGIN_PATH", home_plugins(home()))
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let script = "/set parameter num_ctx 160\nWrite a sentence about the sea.\n\
        Write a sentence about mountains.\nWrite a sentence about rivers.\n\
        Write a sentence about forests.\n/show system\n/bye\n";
    child.stdin.take().unwrap().write_all(script.as_bytes()).unwrap();
    let out = child.wait_with_output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert!(
        stderr.contains("no longer fits the 160-token context") && !stderr.contains("error"),
        "{stderr}"
    );
    assert!(stdout.contains("You answer in one sentence."), "{stdout}");
    assert!(
        stdout.to_lowercase().contains("forest"),
        "the last question is answered: {stdout}"
    );
}
