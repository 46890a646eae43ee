#!/usr/bin/env python3
"""Runs the shell (and Python client) examples of the Berth book (docs/) against a real `berth serve`.

Called by `scripts/book test` with a prepared environment (see there): `berth` on PATH,
BERTH_HOME holding the Qwen2.5-Coder pack, BERTH_PLUGIN_PATH naming the plugins under test.

Usage: book_examples.py BOOK_DIR          (BOOK_DIR holds SUMMARY.md)
       book_examples.py --check-links BOOK_DIR

Which blocks run: every fenced block whose info string starts with `sh`, `bash`, `console` or
`python`, in the order SUMMARY.md lists the chapters, and in each chapter from top to bottom. A
`console` block runs only its `$ ` lines (a line ending in `\\` continues the command).

- Each shell block runs in its own `bash` with `set -eo pipefail`, so it must exit 0. Blocks of one
  chapter share a working directory (a fresh temporary one per chapter), so a file one block
  writes is there for the next; environment variables are not shared. A block whose info string
  has the word `repo-root` (its prose says "from the repository root") runs in the repository.
- A line `# expect: TEXT` in a block says what its output contains; the runner checks it.
- `127.0.0.1:11435` and `localhost:11435` in a block are rewritten to the server the block
  talks to, whose port is also in BERTH_PORT (as `berth ps` reads it).
- The info-string word `serve` (```` ```sh serve ````) marks a block that starts a server in
  the foreground, as a reader would in a second terminal. The runner starts it in the background
  with BERTH_PORT=0 (a free port), waits for `/health`, and sends the chapter's later blocks to it;
  it is stopped (SIGTERM) at the end of the chapter. Otherwise blocks talk to the book's shared
  server, started by this script before the first chapter and stopped after the last.
- A `python` block runs with the interpreter in BOOK_PYTHON (the venv of
  scripts/python-test-deps, with the official `openai`, `anthropic` and `ollama` packages).
- `no-run: REASON` in the info string (```` ```sh no-run: needs root ````) skips a block; each
  skipped block is printed with its reason.
"""

import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

RUNNABLE = ("sh", "bash", "console", "python")
BLOCK_TIMEOUT_S = 300
SERVER_START_TIMEOUT_S = 60
REPO = Path(__file__).resolve().parent.parent


def chapters(book: Path) -> list[Path]:
    """The chapter files SUMMARY.md links, in order."""
    text = (book / "SUMMARY.md").read_text()
    return [book / m for m in re.findall(r"\]\(([^)#\s]+\.md)\)", text)]


def blocks(path: Path):
    """Yields (line number, info string, body) for each fenced code block of a chapter."""
    lines = path.read_text().splitlines()
    i = 0
    while i < len(lines):
        m = re.match(r"^(\s*)(`{3,}|~{3,})(.*)$", lines[i])
        if not m:
            i += 1
            continue
        indent, fence, info = m.group(1), m.group(2), m.group(3).strip()
        start = i + 1
        body = []
        i += 1
        while i < len(lines) and not lines[i].strip().startswith(fence):
            line = lines[i]
            body.append(line[len(indent):] if line.startswith(indent) else line.lstrip())
            i += 1
        i += 1
        yield start, info, "\n".join(body) + "\n"


def language(info: str) -> str:
    """The info string's language word (`sh` of `sh,no-run: ...` or `sh serve`)."""
    return re.split(r"[\s,]", info, maxsplit=1)[0].lower() if info else ""


def skip_reason(info: str):
    """The reason a block is not run, or None."""
    m = re.search(r"no-run:?\s*(.*)$", info)
    if not m:
        return None
    return m.group(1).strip() or "(no reason given)"


def console_commands(body: str) -> str:
    """The `$ ` commands of a console block, with their continuation lines."""
    out, cont = [], False
    for line in body.splitlines():
        if line.startswith("$ ") or cont:
            cmd = line[2:] if line.startswith("$ ") and not cont else line
            out.append(cmd)
            cont = cmd.rstrip().endswith("\\")
    return "\n".join(out) + "\n"


def rewrite(script: str, port: int) -> str:
    """Points the book's default address at the server the block talks to."""
    return re.sub(r"(127\.0\.0\.1|localhost):11435\b", f"127.0.0.1:{port}", script)


def healthy(port: int) -> bool:
    """Whether a server answers `/health` on a loopback port."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2) as r:
            return r.status == 200
    except OSError:
        return False


class Server:
    """A `berth serve` (or a block that runs one) in its own process group."""

    def __init__(self, script: str, cwd: Path, env: dict, log: Path):
        self.log = log
        env = dict(env, BERTH_PORT="0")
        self.out = open(log, "w")
        self.proc = subprocess.Popen(
            ["bash", "-eo", "pipefail", "-c", script],
            cwd=cwd,
            env=env,
            stdout=subprocess.PIPE,
            stderr=self.out,
            text=True,
            start_new_session=True,
        )
        self.port = None
        deadline = time.time() + SERVER_START_TIMEOUT_S
        for line in self.proc.stdout:
            self.out.write(line)
            m = re.search(r"listening on http://[^:]+:(\d+)", line)
            if m:
                self.port = int(m.group(1))
                break
            if time.time() > deadline:
                break
        if self.port is None:
            self.stop()
            raise RuntimeError(f"the server did not start; its log:\n{log.read_text()}")
        # Keep draining stdout so the server never blocks on a full pipe.
        threading.Thread(target=self._drain, daemon=True).start()
        while not healthy(self.port):
            if self.proc.poll() is not None or time.time() > deadline:
                self.stop()
                raise RuntimeError(f"/health never answered; the log:\n{log.read_text()}")
            time.sleep(0.2)

    def _drain(self):
        for line in self.proc.stdout:
            self.out.write(line)

    def stop(self):
        """SIGTERM to the group, then SIGKILL after 20 s."""
        if self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
        self.out.flush()


def check_links(book: Path) -> list[str]:
    """Relative links between the book's files that point nowhere."""
    bad = []
    for ch in chapters(book):
        text = re.sub(r"```.*?```", "", ch.read_text(), flags=re.S)
        for target in re.findall(r"\]\(([^)\s]+)\)", text):
            if re.match(r"^[a-z]+:", target) or target.startswith("#"):
                continue
            path = target.split("#")[0]
            if not (ch.parent / path).exists():
                bad.append(f"{ch.relative_to(book)}: broken link {target}")
    return bad


def main() -> int:
    if sys.argv[1:2] == ["--check-links"]:
        bad = check_links(Path(sys.argv[2]))
        print("\n".join(bad), file=sys.stderr)
        return 1 if bad else 0
    book = Path(sys.argv[1]).resolve()
    env = dict(os.environ)
    scratch = Path(tempfile.mkdtemp(prefix="berth-book-"))
    ran, failed, skipped = 0, [], []
    shared = Server("exec berth serve", scratch, env, scratch / "shared-server.log")
    print(f"book: shared server on port {shared.port}", file=sys.stderr)
    try:
        for ch in chapters(book):
            name = ch.relative_to(book)
            work = scratch / str(name).replace("/", "_").removesuffix(".md")
            work.mkdir()
            local = None
            port = shared.port
            for n, (line, info, body) in enumerate(blocks(ch)):
                lang = language(info)
                if lang not in RUNNABLE:
                    continue
                where = f"{name}:{line}"
                why = skip_reason(info)
                if why:
                    skipped.append((where, why))
                    print(f"book: not run: {where}: {why}", file=sys.stderr)
                    continue
                script = console_commands(body) if lang == "console" else body
                script = rewrite(script, port)
                ran += 1
                if re.search(r"(^|[\s,])serve\b", info[len(lang):]):
                    if local:
                        local.stop()
                    try:
                        local = Server(script, work, env, work / f"server-{n}.log")
                    except RuntimeError as e:
                        failed.append(where)
                        print(f"book: FAILED {where} (server block)\n{e}", file=sys.stderr)
                        continue
                    port = local.port
                    print(f"book: ok {where} (server on port {port})", file=sys.stderr)
                    continue
                block_env = dict(env, BERTH_PORT=str(port), BERTH_HOST="127.0.0.1")
                if lang == "python":
                    command = [env.get("BOOK_PYTHON", "python3"), "-c", script]
                else:
                    command = ["bash", "-eo", "pipefail", "-c", script]
                cwd = REPO if re.search(r"\brepo-root\b", info) else work
                t0 = time.time()
                try:
                    r = subprocess.run(
                        command,
                        cwd=cwd,
                        env=block_env,
                        capture_output=True,
                        text=True,
                        timeout=BLOCK_TIMEOUT_S,
                    )
                    code, out, err = r.returncode, r.stdout, r.stderr
                except subprocess.TimeoutExpired as e:
                    code, out, err = "timeout", str(e.stdout or ""), str(e.stderr or "")
                missing = [
                    x.strip()
                    for x in re.findall(r"^\s*# expect: (.*)$", body, flags=re.M)
                    if x.strip() not in out
                ]
                if code != 0 or missing:
                    failed.append(where)
                    print(f"book: FAILED {where} (exit {code})", file=sys.stderr)
                    print(f"--- script\n{script}--- stdout\n{out}--- stderr\n{err}", file=sys.stderr)
                    for x in missing:
                        print(f"--- the output lacks the expected: {x}", file=sys.stderr)
                else:
                    print(f"book: ok {where} ({time.time() - t0:.1f}s)", file=sys.stderr)
            if local:
                local.stop()
    finally:
        shared.stop()
    for where, why in skipped:
        print(f"  not runnable: {where}: {why}")
    print(f"book examples: {ran} run, {len(failed)} failed, {len(skipped)} not runnable (listed)")
    if failed:
        print("failed: " + ", ".join(failed))
        print(f"(server logs and working directories kept in {scratch})")
        return 1
    shutil.rmtree(scratch, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
