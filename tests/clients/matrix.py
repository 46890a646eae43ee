#!/usr/bin/env python3
"""The client matrix: the scenarios a user of each client library runs first, against a running
`berth serve`, one table of outcomes (library x scenario).

Usage: matrix.py --base http://127.0.0.1:PORT --model qwen2.5-coder:0.5b
                 [--only LIB,...] [--jobs N] [--timeout S] [--markdown docs/works-with.md]
                 [--json FILE] [--logs DIR] [--py PY --instructor PY --npm DIR]

The libraries come from scripts/client-deps (run here unless --py/--instructor/--npm name its
outputs). Each library's scenario file (tests/clients/*.py, *.mjs; see common.py) runs in its own
process, several libraries at once (--jobs; start the server with `--parallel` at least that).
Outcomes: PASS; MODEL (the protocol worked, the 0.5B model's answer was wrong); FAIL (an error
status, a wrong shape, a library exception, an empty reply, a hang); N/A (no such feature). Every
request has a timeout (--timeout, default 120 s) and every scenario a hard deadline (1.5 times
that): a hang is a FAIL and the process is killed, never a stuck run. Exits 1 on any FAIL.
`--markdown` writes the book's "works with" page from the table. The libraries start on a cold
server together: their first requests wait for the one model load, as Ollama's clients expect.
"""

import argparse
import concurrent.futures
import json
import os
import queue
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent

SCENARIOS = ["invoke", "stream", "tools_auto", "tools_required", "structured", "multiturn"]
HEADERS = {
    "invoke": "invoke",
    "stream": "stream",
    "tools_auto": "tools (auto)",
    "tools_required": "tools (required/any)",
    "structured": "structured output",
    "multiturn": "multi-turn",
}

# id, name in the table, runtime (py: the main venv, instructor: its own venv, node), file, API.
LIBRARIES = [
    ("openai", "openai (Python)", "py", "openai_chat.py", "/v1/chat/completions"),
    ("openai-responses", "openai (Python), Responses", "py", "openai_responses.py", "/v1/responses"),
    ("anthropic", "anthropic (Python)", "py", "anthropic_py.py", "/v1/messages"),
    ("ollama", "ollama (Python)", "py", "ollama_py.py", "/api/chat"),
    ("langchain-openai", "langchain-openai `ChatOpenAI`", "py", "lc_openai.py", "/v1/chat/completions"),
    ("langchain-ollama", "langchain-ollama `ChatOllama`", "py", "lc_ollama.py", "/api/chat"),
    ("litellm", "LiteLLM `openai/`", "py", "litellm_py.py", "/v1/chat/completions"),
    ("pydantic-ai", "pydantic-ai `OpenAIChatModel`", "py", "pydantic_ai_agent.py", "/v1/chat/completions"),
    ("openai-agents", "openai-agents `OpenAIChatCompletionsModel`", "py", "openai_agents.py", "/v1/chat/completions"),
    ("instructor", "instructor (`from_openai`, TOOLS mode)", "instructor", "instructor_py.py", "/v1/chat/completions"),
    ("openai-js", "openai (JavaScript)", "node", "openai_js.mjs", "/v1/chat/completions"),
    ("anthropic-js", "@anthropic-ai/sdk (JavaScript)", "node", "anthropic_js.mjs", "/v1/messages"),
    ("ollama-js", "ollama (JavaScript)", "node", "ollama_js.mjs", "/api/chat"),
    ("ai-sdk-compatible", "AI SDK, @ai-sdk/openai-compatible", "node", "ai_sdk_compatible.mjs", "/v1/chat/completions"),
    ("ai-sdk-openai", "AI SDK, @ai-sdk/openai", "node", "ai_sdk_openai.mjs", "/v1/responses"),
]


def client_deps():
    """{py, instructor, npm} from scripts/client-deps (installs on first use)."""
    out = subprocess.run([str(ROOT / "scripts/client-deps")], check=True, capture_output=True, text=True)
    return dict(line.split("=", 1) for line in out.stdout.splitlines() if "=" in line)


class Run:
    """One library's scenario process; restarted after a scenario is killed for a hang."""

    def __init__(self, lib, args, deps, log):
        self.lib, self.args, self.deps, self.log = lib, args, deps, log

    def command(self, scenarios):
        _, _, runtime, file, _ = self.lib
        target = [str(HERE / file), self.args.base, self.args.model, *scenarios]
        if runtime == "node":
            return ["node", "--import", str(HERE / "register.mjs"), *target]
        return [self.deps[runtime], *target]

    def run(self):
        """Returns (version, {scenario: result})."""
        todo = list(SCENARIOS)
        results, version = {}, None
        deadline = self.args.timeout * 1.5
        env = dict(os.environ, BERTH_CLIENT_TIMEOUT=str(self.args.timeout), BERTH_CLIENT_NPM=self.deps["npm"])
        env.setdefault("PYTHONUNBUFFERED", "1")
        env.setdefault("PYTHONDONTWRITEBYTECODE", "1")
        while todo:
            self.log.write(f"$ {' '.join(self.command(todo))}\n".encode())
            self.log.flush()
            p = subprocess.Popen(
                self.command(todo),
                cwd=HERE,
                env=env,
                stdout=subprocess.PIPE,
                stderr=self.log,
                start_new_session=True,
            )
            lines = queue.Queue()
            # One thread, so the end (None) is queued only after the last line: with a second
            # thread waiting on the process, a scenario printed just before exit could come after
            # the end and be reported as never run.
            threading.Thread(
                target=lambda: ([lines.put(x) for x in p.stdout], p.wait(), lines.put(None)), daemon=True
            ).start()
            current = todo[0]
            while todo:
                started = time.monotonic()
                try:
                    line = lines.get(timeout=deadline)
                except queue.Empty:
                    os.killpg(p.pid, signal.SIGKILL)
                    p.wait()
                    results[current] = {
                        "outcome": "FAIL",
                        "reason": f"no result in {deadline:.0f} s: a hang (process killed)",
                        "seconds": round(time.monotonic() - started, 1),
                    }
                    self.report(current, results[current])
                    todo.remove(current)
                    break
                if line is None:  # the process ended with scenarios left
                    p.wait()
                    why = f"the scenario process exited ({p.returncode}) before it"
                    for name in todo:
                        results[name] = {"outcome": "FAIL", "reason": why, "seconds": 0}
                        self.report(name, results[name])
                    todo = []
                    break
                try:
                    msg = json.loads(line)
                except ValueError:
                    self.log.write(b"stdout: " + line)
                    continue
                if "version" in msg:
                    version = msg["version"]
                    continue
                name = msg.pop("scenario")
                results[name] = msg
                self.report(name, msg)
                todo.remove(name)
                current = todo[0] if todo else None
            if p.poll() is None and not todo:
                p.wait()
        return version, results

    def report(self, name, r):
        print(f"[{self.lib[0]}] {name}: {r['outcome']} {r['reason']} ({r['seconds']} s)", file=sys.stderr, flush=True)


def table(rows):
    """A plain-text table: rows of cells, the first the header."""
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    fmt = lambda r: "  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip()  # noqa: E731
    return "\n".join([fmt(rows[0]), fmt(["-" * w for w in widths]), *map(fmt, rows[1:])])


def cell(r):
    return {"PASS": "PASS", "FAIL": "FAIL", "MODEL": "MODEL", "N/A": "-"}.get(r["outcome"], r["outcome"])


def notes(results):
    """The reason of every cell that is not a pass."""
    out = []
    for lib, (version, res) in results.items():
        for name in SCENARIOS:
            r = res[name]
            if r["outcome"] != "PASS":
                out.append((lib, name, r["outcome"], r["reason"]))
    return out


def markdown(results, args):
    md_cell = {"PASS": "pass", "FAIL": "**FAIL**", "MODEL": "model", "N/A": "—"}
    libs = {lib[0]: lib for lib in LIBRARIES}
    lines = [
        "# Works with",
        "",
        "<!-- Generated by tests/clients/matrix.py --markdown docs/works-with.md: do not edit by hand. -->",
        "",
        "The client libraries below are run against a real `berth serve` of "
        f"`{args.model}` in CI (`host/tests/clients_matrix.rs` runs `tests/clients/matrix.py`; "
        "`scripts/client-deps` installs the pinned versions). Each runs the scenarios a user of "
        "that library runs first, with the library's own defaults (no `max_tokens` where the "
        "library does not require one; greedy sampling where it can be set):",
        "",
        "- **invoke**: one question, one answer.",
        "- **stream**: the same question streamed the library's way.",
        "- **tools (auto)**: a tool round trip: the model calls `get_weather`, the library's own "
        "returned message and the tool's result go back, the model answers.",
        "- **tools (required/any)**: the same with the call forced (`tool_choice: required`, "
        "Anthropic's `any`, LangChain's `any`).",
        "- **structured output**: the library's default way (`parse` with a Pydantic or Zod model, "
        "`with_structured_output`, pydantic-ai's `output_type`, instructor's TOOLS mode, the AI "
        "SDK's `Output.object`, Anthropic's `output_format`, Ollama's `format`).",
        "- **multi-turn**: three turns, each fed the library's own returned messages (for the AI "
        "SDK's OpenAI provider: Responses with `store` on, so history goes back as `item_reference`).",
        "",
        "**pass**: the protocol worked and the answer was right. **model**: the protocol worked "
        "but the 0.5B model's answer was wrong (the note says how). **FAIL**: a server or protocol "
        "bug (an error status, a reply the library could not parse, an empty reply, a hang). "
        "**—**: the library has no such feature.",
        "",
        "| library | version | API | " + " | ".join(HEADERS[s] for s in SCENARIOS) + " |",
        "|---|---|---|" + "---|" * len(SCENARIOS),
    ]
    for lib, (version, res) in results.items():
        _, name, _, _, api = libs[lib]
        cells = [md_cell.get(res[s]["outcome"], res[s]["outcome"]) for s in SCENARIOS]
        lines.append(f"| {name} | {version or '?'} | `{api}` | " + " | ".join(cells) + " |")
    rest = notes(results)
    if rest:
        lines += ["", "Notes:", ""]
        for lib, name, outcome, reason in rest:
            reason = reason.replace("|", "\\|")
            lines.append(f"- {libs[lib][1]}, {HEADERS[name]} ({md_cell.get(outcome, outcome)}): {reason}")
    lines += [
        "",
        "Two cases need care with a model this small: after a tool result it tends to repeat the",
        "call as bare JSON lines instead of answering, so the test tool's own output ends with",
        '"Now answer the user in plain text."; and `@ai-sdk/openai-compatible` sends structured',
        "output as `response_format: json_object` without the schema (unless",
        "`supportsStructuredOutputs: true`), so the keys are the model's choice there.",
        "",
    ]
    return "\n".join(lines)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--base", required=True, help="the server, e.g. http://127.0.0.1:11435")
    ap.add_argument("--model", required=True)
    ap.add_argument("--only", help="comma-separated library ids: " + ",".join(lib[0] for lib in LIBRARIES))
    ap.add_argument("--jobs", type=int, default=4, help="libraries at once (default 4)")
    ap.add_argument("--timeout", type=float, default=120, help="seconds per request (default 120)")
    ap.add_argument("--markdown", help="write the book's works-with page here")
    ap.add_argument("--json", help="write the raw results here")
    ap.add_argument("--logs", help="a folder for each library's stderr (default: a temp folder)")
    ap.add_argument("--py", help="the main venv's python (scripts/client-deps py=)")
    ap.add_argument("--instructor", help="instructor's venv python (scripts/client-deps instructor=)")
    ap.add_argument("--npm", help="the npm folder (scripts/client-deps npm=)")
    args = ap.parse_args()

    deps = {"py": args.py, "instructor": args.instructor, "npm": args.npm}
    if not all(deps.values()):
        deps = {**client_deps(), **{k: v for k, v in deps.items() if v}}
    libs = LIBRARIES
    if args.only:
        wanted = args.only.split(",")
        unknown = set(wanted) - {lib[0] for lib in LIBRARIES}
        if unknown:
            ap.error(f"unknown libraries {sorted(unknown)}")
        libs = [lib for lib in LIBRARIES if lib[0] in wanted]
    logs = Path(args.logs or tempfile.mkdtemp(prefix="berth-clients-"))
    logs.mkdir(parents=True, exist_ok=True)

    start = time.monotonic()

    def one(lib):
        with open(logs / f"{lib[0]}.log", "wb") as log:
            return Run(lib, args, deps, log).run()

    with concurrent.futures.ThreadPoolExecutor(max_workers=args.jobs) as pool:
        futures = {lib[0]: pool.submit(one, lib) for lib in libs}
        results = {lib: f.result() for lib, f in futures.items()}
    wall = time.monotonic() - start

    rows = [["library", "version", *[HEADERS[s] for s in SCENARIOS]]]
    for lib, (version, res) in results.items():
        rows.append([lib, version or "?", *[cell(res[s]) for s in SCENARIOS]])
    print(table(rows))
    rest = notes(results)
    if rest:
        print()
        for lib, name, outcome, reason in rest:
            if outcome != "N/A":
                print(f"{outcome:5}  {lib} / {name}: {reason}")
    fails = [(lib, name) for lib, name, outcome, _ in rest if outcome == "FAIL"]
    counts = {o: sum(1 for _, (_, res) in results.items() for r in res.values() if r["outcome"] == o)
              for o in ("PASS", "MODEL", "FAIL", "N/A")}
    print(f"\n{counts['PASS']} pass, {counts['MODEL']} model, {counts['FAIL']} FAIL, {counts['N/A']} n/a "
          f"in {wall:.0f} s; stderr of each library in {logs}")
    for lib in sorted({lib for lib, _ in fails}):
        tail = (logs / f"{lib}.log").read_text(errors="replace").splitlines()[-25:]
        print(f"\n--- {lib} stderr (last {len(tail)} lines) ---\n" + "\n".join(tail))
    if args.json:
        Path(args.json).write_text(json.dumps({"model": args.model, "results": results}, indent=1))
    if args.markdown:
        Path(args.markdown).write_text(markdown(results, args))
    sys.exit(1 if fails else 0)


if __name__ == "__main__":
    main()
