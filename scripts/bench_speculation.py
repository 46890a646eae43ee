"""Prompt-lookup speculation benchmark (issues 13 and 36; a benchmark, not a test): greedy decode
tokens/s on a server without speculation (BERTH_SPECULATION=off) and on one with it (=on), for
six workloads, whether the texts are identical, and the draft acceptance from /metrics.

Workloads (--tasks, default all):
  free   a short open question, streamed chat;
  code   code completion: /v1/completions with the raw prompt of a partial Python function;
  chat   a chat with a long history (10 earlier user/assistant turns, the last asking something new);
  batch  8 different free-text chats at once (--streams); the rate is the aggregate: completion
         tokens after each stream's first, summed, over the wall time from the batch's first token
         to its last (per-stream: the median of each stream's own rate, shown under the table);
  json   constrained decoding: response_format json_schema (six people with four fields each);
  copy   rewrite a generated Rust file of --lines lines with one identifier renamed (the answer
         copies most of the prompt).
Each workload runs --repeats times on each server, off and on alternately (never at once); the
decode rate of one answer is its completion tokens after the first divided by the time from the
first to the last token (prompt time is excluded: speculation does not touch it). Only user and
assistant turns (Gemma's template has no system role). Targets (issue 36): on/off >= 0.97 on every
workload, >= 1.5 on copy.

Two modes:
  run    --url-off URL --url-on URL --model M [--out PART.json]: one model's servers; writes its rows
         (and prints them as a table when --out is not given; exits 1 when a text differs).
  report PART.json ... [--json FILE] [--load-before "1.0 0.9 0.8"]: the machine facts (CPU model and
         SIMD flags, load, threads) and one markdown table of every part; exits 1 when any text
         differs off vs on (or between repeats of one server).
"""
import argparse
import concurrent.futures
import json
import os
import re
import statistics
import subprocess
import sys
import time
import urllib.request

import openai

TASKS = ("free", "code", "chat", "batch", "json", "copy")
TARGET = {"copy": 1.5}
TARGET_DEFAULT = 0.97


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


CODE_PROMPT = '''import heapq
from typing import Dict, List, Tuple


def shortest_paths(graph: Dict[str, List[Tuple[str, float]]], source: str) -> Dict[str, float]:
    """Dijkstra's algorithm: the length of the shortest path from `source` to every node of
    `graph` (an adjacency list of (neighbour, weight) pairs); unreachable nodes are left out."""
    dist = {source: 0.0}
    queue = [(0.0, source)]
'''

# Ten earlier turns of one conversation, then a new question.
HISTORY = [
    ("I'm planning a vegetable garden in a small backyard. Where should I start?",
     "Start with the light: watch where the sun falls for a day, since most vegetables want six to "
     "eight hours of direct sun. Then test the soil or plan raised beds, pick a few easy crops, and "
     "sketch the beds so that tall plants do not shade short ones."),
    ("The sunniest spot gets about seven hours. Raised beds or in-ground?",
     "Seven hours is plenty. Raised beds warm up sooner in spring, drain well and spare you from "
     "fixing poor soil; in-ground beds are cheaper and hold moisture longer. In a small yard, two "
     "raised beds of about 1.2 by 2.4 metres are a good start."),
    ("What should I fill the raised beds with?",
     "A common mix is about 60 percent screened topsoil, 30 percent compost and 10 percent coarse "
     "material such as pine bark fines or perlite. Avoid pure potting mix: it is expensive and "
     "slumps. Top up with compost each year."),
    ("Which vegetables are easiest for a beginner?",
     "Lettuce, radishes, bush beans, zucchini, cherry tomatoes and herbs like basil and parsley are "
     "forgiving. Radishes and lettuce give quick wins; zucchini and cherry tomatoes produce a lot "
     "from one or two plants."),
    ("How far apart should I plant tomatoes?",
     "Give indeterminate cherry tomatoes about 45 to 60 centimetres between plants and stake or cage "
     "them early. Crowded tomatoes get less air and more leaf disease."),
    ("When do I plant them?",
     "After your last frost date, once nights stay above about 10 degrees Celsius. Start seeds "
     "indoors six to eight weeks before that date, or buy sturdy transplants and harden them off "
     "outside for a week."),
    ("How often should I water?",
     "Deeply rather than often: about 2.5 centimetres of water a week, more in heat, given in one or "
     "two soakings. Water the soil, not the leaves, in the morning. Raised beds dry faster, so check "
     "them with a finger a few centimetres down."),
    ("Should I use mulch?",
     "Yes. Five to eight centimetres of straw or shredded leaves keeps moisture in, holds down weeds "
     "and keeps soil off the leaves. Keep it a little away from the stems."),
    ("What about pests? I've seen slugs around.",
     "Hand-pick slugs in the evening, set beer traps or board traps and clear debris where they "
     "hide. Copper tape around raised beds helps. Iron phosphate baits are safe around pets."),
    ("Great. Anything I should plant to attract pollinators?",
     "Borage, calendula, zinnias, cosmos and flowering herbs such as dill and oregano bring bees and "
     "hoverflies. Tuck a few along the bed edges; they also draw predators that eat aphids."),
]
CHAT_QUESTION = "Now, can you give me a simple month-by-month plan for my first year with this garden?"

BATCH_PROMPTS = [
    "Write a short story about a lighthouse keeper.",
    "Describe a busy market in a coastal town at dawn.",
    "Explain why the sky is blue to a ten-year-old.",
    "Write a letter from a traveller to a friend back home.",
    "Tell a fable about a fox and a crow who become friends.",
    "Describe the first snow of winter in a mountain village.",
    "Write a short speech for the opening of a new library.",
    "Explain how bread rises, step by step.",
]

PERSON = {
    "type": "object",
    "properties": {
        "name": {"type": "string"},
        "age": {"type": "integer"},
        "city": {"type": "string"},
        "hobbies": {"type": "array", "items": {"type": "string"}},
    },
    "required": ["name", "age", "city", "hobbies"],
    "additionalProperties": False,
}
# Six people: an answer of about 200 tokens, long enough for a stable rate (one person's 35
# tokens swung by several percent between repeats).
JSON_SCHEMA = {
    "type": "object",
    "properties": {"people": {"type": "array", "items": PERSON, "minItems": 6, "maxItems": 6}},
    "required": ["people"],
    "additionalProperties": False,
}


class Answer:
    """One streamed greedy answer: text, completion tokens, first and last token times."""

    def __init__(self):
        self.text, self.tokens, self.first, self.last = "", 0, None, None

    def piece(self, text):
        if text:
            now = time.monotonic()
            self.first = self.first or now
            self.last = now
            self.text += text

    @property
    def secs(self):
        return (self.last - self.first) if self.first else 0.0

    @property
    def rate(self):
        return (self.tokens - 1) / self.secs if self.secs > 0 else 0.0


def chat(client, model, messages, max_tokens, **extra):
    a = Answer()
    s = client.chat.completions.create(model=model, messages=messages, temperature=0, max_tokens=max_tokens,
                                       stream=True, stream_options={"include_usage": True}, **extra)
    for chunk in s:
        if chunk.usage is not None:
            a.tokens = chunk.usage.completion_tokens
        for c in chunk.choices:
            a.piece(c.delta.content)
    return a


def complete(client, model, prompt, max_tokens):
    a = Answer()
    s = client.completions.create(model=model, prompt=prompt, temperature=0, max_tokens=max_tokens, stream=True,
                                  stream_options={"include_usage": True})
    for chunk in s:
        if chunk.usage is not None:
            a.tokens = chunk.usage.completion_tokens
        for c in chunk.choices:
            a.piece(c.text)
    return a


def user(prompt):
    return [{"role": "user", "content": prompt}]


def workload(task, args):
    """A function of (client, model) giving (rate, texts, per-stream rate or None, completion tokens)."""
    n = args.tokens

    def single(f):
        def run(client, model):
            a = f(client, model)
            return a.rate, [a.text], None, a.tokens
        return run

    if task == "free":
        return single(lambda c, m: chat(c, m, user("Write a short story about a lighthouse keeper."), n))
    if task == "code":
        return single(lambda c, m: complete(c, m, CODE_PROMPT, n))
    if task == "chat":
        messages = []
        for q, a in HISTORY:
            messages += [{"role": "user", "content": q}, {"role": "assistant", "content": a}]
        messages += user(CHAT_QUESTION)
        return single(lambda c, m: chat(c, m, messages, n))
    if task == "json":
        fmt = {"type": "json_schema", "json_schema": {"name": "people", "schema": JSON_SCHEMA, "strict": True}}
        return single(lambda c, m: chat(c, m, user("Invent six people and describe them as JSON, each with their "
                                                   "name, age, city and hobbies."), n, response_format=fmt))
    if task == "copy":
        src = source_file(args.lines)
        prompt = (f"Rewrite this Rust file with `counter_value` renamed to `tally`. Output the whole file, "
                  f"only code.\n\n```rust\n{src}```")
        return single(lambda c, m: chat(c, m, user(prompt), args.lines * 16))
    if task == "batch":
        prompts = [BATCH_PROMPTS[i % len(BATCH_PROMPTS)] + ("" if i < len(BATCH_PROMPTS) else f" (take {i})")
                   for i in range(args.streams)]

        def run(client, model):
            with concurrent.futures.ThreadPoolExecutor(len(prompts)) as pool:
                answers = list(pool.map(lambda p: chat(client, model, user(p), args.batch_tokens), prompts))
            got = [a for a in answers if a.first]
            secs = max(a.last for a in got) - min(a.first for a in got) if got else 0.0
            tokens = sum(max(a.tokens - 1, 0) for a in got)
            return (tokens / secs if secs > 0 else 0.0, [a.text for a in answers],
                    statistics.median(a.rate for a in got) if got else 0.0, sum(a.tokens for a in answers))
        return run
    raise SystemExit(f"unknown task {task}")


def metric(url, name):
    text = urllib.request.urlopen(url.rstrip("/") + "/metrics").read().decode()
    for line in text.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[1])
    return 0.0


def where_parted(a, b):
    i = next((k for k in range(min(len(a), len(b))) if a[k] != b[k]), min(len(a), len(b)))
    return f"texts part at character {i} of {len(a)}/{len(b)}:\n  off: {a[max(0, i - 60):i + 60]!r}" \
           f"\n  on:  {b[max(0, i - 60):i + 60]!r}"


def run(args):
    urls = {"off": args.url_off, "on": args.url_on}
    clients = {name: openai.OpenAI(base_url=url.rstrip("/") + "/v1", api_key="unused", max_retries=0, timeout=3600)
               for name, url in urls.items()}
    for c in clients.values():
        chat(c, args.model, user("Say hi."), 4)
    rows = []
    for task in [t for t in TASKS if t in args.tasks.split(",")]:
        go = workload(task, args)
        rates, streams, tokens, texts, notes = {"off": [], "on": []}, {"off": [], "on": []}, {}, {}, []
        drafted0 = metric(args.url_on, "berth_speculative_draft_tokens_total")
        accepted0 = metric(args.url_on, "berth_speculative_accepted_tokens_total")
        for _ in range(args.repeats):
            for name, c in clients.items():
                rate, text, per_stream, n = go(c, args.model)
                rates[name].append(rate)
                if per_stream is not None:
                    streams[name].append(per_stream)
                tokens[name] = n
                if texts.setdefault(name, text) != text:
                    notes.append(f"{name} answered differently on a repeat")
                    print(f"{args.model} {task}: {name} answered differently on a repeat", file=sys.stderr)
                print(f"  {args.model} {task} {name}: {n} tokens, {rate:.2f} tokens/s"
                      + (f" (per stream {per_stream:.2f})" if per_stream is not None else ""), flush=True)
        drafted = metric(args.url_on, "berth_speculative_draft_tokens_total") - drafted0
        accepted = metric(args.url_on, "berth_speculative_accepted_tokens_total") - accepted0
        same = texts["off"] == texts["on"]
        if not same:
            for a, b in zip(texts["off"], texts["on"]):
                if a != b:
                    print(f"{args.model} {task}: {where_parted(a, b)}", file=sys.stderr)
                    break
        off, on = statistics.median(rates["off"]), statistics.median(rates["on"])
        rows.append({
            "model": args.model, "workload": task, "off": off, "on": on,
            "ratio": on / off if off > 0 else 0.0, "target": TARGET.get(task, TARGET_DEFAULT),
            "identical": same, "repeats_identical": not notes, "drafted": drafted, "accepted": accepted,
            "acceptance": accepted / drafted if drafted else None,
            "per_stream_off": statistics.median(streams["off"]) if streams["off"] else None,
            "per_stream_on": statistics.median(streams["on"]) if streams["on"] else None,
            "tokens_off": tokens["off"], "tokens_on": tokens["on"], "rates_off": rates["off"], "rates_on": rates["on"],
        })
        print(f"{args.model} {task}: off {off:.2f}, on {on:.2f} tokens/s, ratio {rows[-1]['ratio']:.3f}, "
              f"identical {same}", flush=True)
    if args.out:
        with open(args.out, "w") as f:
            json.dump(rows, f, indent=1)
        return 0
    return print_report(rows, {})


def machine(load_before):
    cpu = open("/proc/cpuinfo").read()
    model = re.search(r"^model name\s*:\s*(.*)$", cpu, re.M)
    flags = set((re.search(r"^flags\s*:\s*(.*)$", cpu, re.M) or re.search("()", "")).group(1).split())
    simd = [f for f in ("avx2", "fma", "f16c", "avx512f", "avx512bw", "avx512vl", "avx512_vnni", "avx512_bf16",
                        "avx512_fp16", "avx_vnni", "amx_tile") if f in flags]
    try:
        uptime = subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()
    except OSError:
        uptime = open("/proc/loadavg").read().strip()
    try:
        commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    except OSError:
        commit = ""
    return {
        "cpu": model.group(1) if model else "?", "cores": os.cpu_count(), "simd": simd,
        "threads": os.environ.get("BERTH_THREADS") or f"all cores ({os.cpu_count()})",
        "kernels": os.environ.get("BERTH_KERNELS", "(best the CPU has)"),
        "load_before": load_before, "uptime_after": uptime, "commit": commit,
    }


def print_report(rows, facts):
    if facts:
        print(f"cpu: {facts['cpu']}; {facts['cores']} cores; flags: {' '.join(facts['simd']) or '(none of avx2/avx512)'}")
        print(f"berth serve threads: {facts['threads']}; kernels: BERTH_KERNELS={facts['kernels']}; commit {facts['commit']}")
        print(f"load average before: {facts['load_before'] or '?'}; after: {facts['uptime_after']}")
        print()
    print("| model | workload | off tok/s | on tok/s | ratio | target | identical | acceptance |")
    print("|---|---|---:|---:|---:|---|---|---|")
    failed = False
    for r in rows:
        ok = r["ratio"] >= r["target"]
        acc = f"{r['acceptance']:.2f} ({r['accepted']:.0f}/{r['drafted']:.0f})" if r["acceptance"] is not None \
            else "n/a (0 drafted)"
        same = ("yes" if r["identical"] else "**NO**") + ("" if r["repeats_identical"] else " (repeats differ)")
        print(f"| {r['model']} | {r['workload']} | {r['off']:.2f} | {r['on']:.2f} | {r['ratio']:.3f} | "
              f">= {r['target']} {'ok' if ok else '**MISS**'} | {same} | {acc} |")
        failed |= not (r["identical"] and r["repeats_identical"])
    for r in rows:
        if r["per_stream_off"] is not None:
            print(f"\n{r['model']} batch: aggregate over the batch above; per stream (median) off "
                  f"{r['per_stream_off']:.2f}, on {r['per_stream_on']:.2f} tokens/s, "
                  f"ratio {r['per_stream_on'] / r['per_stream_off'] if r['per_stream_off'] else 0:.3f}")
    misses = [f"{r['model']} {r['workload']}" for r in rows if r["ratio"] < r["target"]]
    print(f"\ntargets (on/off >= {TARGET_DEFAULT} everywhere, >= {TARGET['copy']} on copy): "
          + ("all met" if not misses else "missed on " + ", ".join(misses)))
    if failed:
        print("texts differ (see above / stderr): exit 1")
    return 1 if failed else 0


def report(args):
    rows = []
    for p in args.parts:
        with open(p) as f:
            rows += json.load(f)
    facts = machine(args.load_before)
    code = print_report(rows, facts)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"machine": facts, "targets": {"default": TARGET_DEFAULT, **TARGET}, "results": rows}, f, indent=1)
    return code


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="mode", required=True)
    r = sub.add_parser("run", help="measure one model's off/on servers")
    r.add_argument("--url-off", required=True)
    r.add_argument("--url-on", required=True)
    r.add_argument("--model", default="qwen2.5-coder:0.5b")
    r.add_argument("--lines", type=int, default=150, help="copy: lines of the Rust file")
    r.add_argument("--tokens", type=int, default=256, help="max_tokens of free, code, chat and json")
    r.add_argument("--batch-tokens", type=int, default=128, help="max_tokens of each batch stream")
    r.add_argument("--streams", type=int, default=8, help="batch: concurrent streams")
    r.add_argument("--repeats", type=int, default=3)
    r.add_argument("--tasks", default=",".join(TASKS), help="comma-separated: " + ", ".join(TASKS))
    r.add_argument("--out", help="write the rows here (for report) instead of printing the table")
    p = sub.add_parser("report", help="machine facts and one table of the parts")
    p.add_argument("parts", nargs="+")
    p.add_argument("--json", help="also write machine facts and rows as JSON here")
    p.add_argument("--load-before", default="", help="load average when the run began")
    args = ap.parse_args()
    sys.exit(run(args) if args.mode == "run" else report(args))


if __name__ == "__main__":
    main()
