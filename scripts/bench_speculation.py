"""Prompt-lookup speculation benchmark (issue 13 item 6; a benchmark, not a test): decode
tokens/s of greedy requests on a server without speculation and on one with it, and whether the
texts are identical.

Tasks: "copy" asks to rewrite a generated Rust source file of --lines lines with one identifier
renamed (the answer copies most of the prompt); "free" asks for free text. Each task is asked
--repeats times on each server, streamed; the decode rate is completion tokens after the first
one divided by the time from the first to the last token (prompt time is excluded: speculation
does not touch it). Prints per task the median rates, their ratio (targets: >= 1.5 on copy,
>= 0.97 on free) and the draft acceptance from /metrics; exits 1 when a text differs.

Usage: bench_speculation.py --url-off URL --url-on URL [--lines 150] [--repeats 2] [--model M]
"""
import argparse
import statistics
import sys
import time
import urllib.request

import openai


def source_file(lines):
    """A Rust source file of about `lines` lines that uses `counter_value` throughout."""
    out = ["use std::collections::HashMap;", ""]
    k = 0
    while len(out) < lines:
        out += [
            f"/// Adds entry {k} to the running counter.",
            f"pub fn step_{k}(counter_value: &mut HashMap<String, i64>, amount: i64) -> i64 {{",
            f"    let entry = counter_value.entry(\"key_{k}\".to_string()).or_insert(0);",
            f"    *entry += amount * {k + 1};",
            "    *entry",
            "}",
            "",
        ]
        k += 1
    return "\n".join(out[:lines]) + "\n"


def stream(client, model, prompt, max_tokens):
    """One streamed greedy answer: (text, completion tokens, decode seconds after the first token)."""
    text, tokens, first, last = "", 0, None, None
    s = client.chat.completions.create(
        model=model,
        messages=[{"role": "user", "content": prompt}],
        temperature=0,
        max_tokens=max_tokens,
        stream=True,
        stream_options={"include_usage": True},
    )
    for chunk in s:
        if chunk.usage is not None:
            tokens = chunk.usage.completion_tokens
        for c in chunk.choices:
            if c.delta.content:
                now = time.monotonic()
                first = first or now
                last = now
                text += c.delta.content
    return text, tokens, (last - first) if first else 0.0


def metric(url, name):
    text = urllib.request.urlopen(url.rstrip("/") + "/metrics").read().decode()
    for line in text.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[1])
    return 0.0


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--url-off", required=True)
    ap.add_argument("--url-on", required=True)
    ap.add_argument("--model", default="qwen2.5-coder:0.5b")
    ap.add_argument("--lines", type=int, default=150)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--tasks", default="copy,free", help="comma-separated: copy, free")
    args = ap.parse_args()
    src = source_file(args.lines)
    tasks = {
        "copy": (f"Rewrite this Rust file with `counter_value` renamed to `tally`. Output the whole file, "
                 f"only code.\n\n```rust\n{src}```", args.lines * 16),
        "free": ("Write a long essay about the history of the printing press in Europe.", 300),
    }
    clients = {name: openai.OpenAI(base_url=url.rstrip("/") + "/v1", api_key="unused", max_retries=0, timeout=3600)
               for name, url in (("off", args.url_off), ("on", args.url_on))}
    for c in clients.values():
        stream(c, args.model, "Say hi.", 4)
    failed = False
    for task, (prompt, max_tokens) in tasks.items():
        if task not in args.tasks.split(","):
            continue
        rates, texts = {"off": [], "on": []}, {}
        drafted0 = metric(args.url_on, "berth_speculative_draft_tokens_total")
        accepted0 = metric(args.url_on, "berth_speculative_accepted_tokens_total")
        for _ in range(args.repeats):
            for name, c in clients.items():
                text, tokens, secs = stream(c, args.model, prompt, max_tokens)
                rates[name].append((tokens - 1) / secs if secs > 0 else 0.0)
                if texts.setdefault(name, text) != text:
                    print(f"{task}: {name} answered differently on a repeat", file=sys.stderr)
                    failed = True
                print(f"  {task} {name}: {tokens} tokens, {rates[name][-1]:.2f} tokens/s", flush=True)
        drafted = metric(args.url_on, "berth_speculative_draft_tokens_total") - drafted0
        accepted = metric(args.url_on, "berth_speculative_accepted_tokens_total") - accepted0
        off, on = statistics.median(rates["off"]), statistics.median(rates["on"])
        same = texts["off"] == texts["on"]
        failed |= not same
        if not same:
            a, b = texts["off"], texts["on"]
            i = next((k for k in range(min(len(a), len(b))) if a[k] != b[k]), min(len(a), len(b)))
            print(f"{task}: texts part at character {i} of {len(a)}/{len(b)}:\n  off: {a[max(0, i - 60):i + 60]!r}"
                  f"\n  on:  {b[max(0, i - 60):i + 60]!r}", file=sys.stderr)
        acc = f"{accepted / drafted:.2f}" if drafted else "n/a"
        print(f"{task}: off {off:.2f} tokens/s, on {on:.2f} tokens/s, ratio {on / off:.3f}, "
              f"acceptance {acc} ({accepted:.0f}/{drafted:.0f}), identical text: {same}", flush=True)
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
