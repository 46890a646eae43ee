//! The client matrix (issue 28): fourteen client libraries nobody on the project wrote (openai,
//! anthropic and ollama for Python and JavaScript, langchain-openai, langchain-ollama, LiteLLM,
//! pydantic-ai, openai-agents, instructor, the Vercel AI SDK's openai-compatible and openai
//! providers), current versions pinned by scripts/client-deps, each running the scenarios a user
//! of it runs first (invoke, stream, a tool round trip with `auto` and with `required`/`any`,
//! structured output the library's default way, multi-turn fed the library's own messages) with
//! its own defaults, against a real `berth serve` of Qwen2.5-Coder 0.5B (tests/clients/matrix.py).
//! Any FAIL (an error status, a reply the library cannot parse, an empty reply, a hang) fails the
//! test; a wrong answer of the 0.5B model is recorded as MODEL in the printed table, not a failure.

mod common;

use common::*;
use std::process::Command;

const MODEL: &str = "qwen2.5-coder:0.5b";
/// Libraries run at once by the matrix, and the server's `--parallel`.
const JOBS: &str = "4";

#[test]
fn client_libraries_run_their_first_scenarios_without_a_protocol_failure() {
    let Some(deps) = client_deps() else { return };
    let home = home_with_qwen("berth-clients-", MODEL);
    let server = TestServer::start(home.path(), &["--parallel", JOBS]);
    let logs = home.path().join("client-logs");
    let out = Command::new(&deps.py)
        .arg(repo_root().join("tests/clients/matrix.py"))
        .args(["--base", &server.base, "--model", MODEL, "--jobs", JOBS])
        .arg("--py")
        .arg(&deps.py)
        .arg("--instructor")
        .arg(&deps.instructor)
        .arg("--npm")
        .arg(&deps.npm)
        .arg("--logs")
        .arg(&logs)
        .output()
        .expect("tests/clients/matrix.py runs");
    let table = String::from_utf8_lossy(&out.stdout);
    // Straight to stderr, past the test harness's capture: CI's log shows the table on a pass too.
    let _ = std::io::Write::write_all(&mut std::io::stderr(), format!("\n{table}\n").as_bytes());
    assert!(
        out.status.success(),
        "the client matrix has FAILs (table above; progress below):\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(table.contains(" 0 FAIL"), "no summary line in:\n{table}");
}
