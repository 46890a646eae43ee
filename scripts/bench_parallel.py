"""Serving throughput benchmark (issue 13 item 4, issue 34 item 5; a benchmark, not a test): N
concurrent greedy chat streams on one `berth serve` and on llama.cpp's `llama-server -np N`
(continuous batching), same GGUF, same threads, same prompts; aggregate tokens/s and time to first
token (p50, p99) of both, and whether Berth's concurrent texts equal its texts alone.

Two steps, run by scripts/bench-parallel:
  run     one engine at one N: a warm-up request, then (with --alone) each of the N prompts alone,
          one after another, then all N at once; writes a JSON file with every stream's tokens,
          time to first token and text.
  report  reads the run files of a folder, prints the table with Berth's ratios against
          llama-server, appends one JSON line to docs/bench/parallel.jsonl, and exits 1 when a
          concurrent Berth text differs from its text alone.

The aggregate rate of a run is its completion tokens divided by its wall time from the first
request to the last token (prompt processing included; the prompts are short). Time to first
token is from sending a request to its first content token, all N sent at once. p99 is the
nearest-rank percentile, so below 100 streams it is the slowest stream's.

Usage: bench_parallel.py run --url URL --engine NAME --streams N --out FILE [--max-tokens 128]
                            [--model M] [--alone] [--metrics]
       bench_parallel.py report DIR --threads T --load-before "..." --load-after "..."
                            [--jsonl docs/bench/parallel.jsonl]
"""
import argparse
import concurrent.futures
import datetime
import glob
import json
import math
import os
import re
import sys
import time
import urllib.request

from bench_common import git, table

TOPICS = [
    "how a compiler turns source code into machine code",
    "why the sky is blue",
    "how a hash map works",
    "the water cycle",
    "what a CPU cache is for",
    "how vaccines train the immune system",
    "the rules of chess for a beginner",
    "how public-key cryptography works",
    "why leaves change colour in autumn",
    "how a bicycle stays upright",
    "what a database index does",
    "how rainbows form",
]


def topics(n):
    """The first n prompts' topics: the same for every engine and every N."""
    return [TOPICS[i % len(TOPICS)] + ("" if i < len(TOPICS) else f" (part {i})") for i in range(n)]


def ask(client, model, topic, max_tokens):
    """One greedy answer, streamed: a dict of its text, completion tokens and timestamps."""
    text, tokens, chunks, first, last = "", None, 0, None, None
    sent = time.monotonic()
    s = client.chat.completions.create(
        model=model,
        messages=[{"role": "user", "content": f"Explain {topic} in a few paragraphs."}],
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
                text += c.delta.content
                chunks += 1
                last = time.monotonic()
                first = first or last
    # A server that sends no usage: one content chunk per token (both servers stream so).
    return {"text": text, "tokens": tokens if tokens is not None else chunks, "usage": tokens is not None,
            "sent": sent, "first": first, "last": last}


def decode_counters(url):
    """(decode steps, seconds in plugin decode calls) from Berth's /metrics."""
    text = urllib.request.urlopen(url + "/metrics", timeout=30).read().decode()
    v = {l.split()[0]: float(l.split()[1]) for l in text.splitlines() if l and not l.startswith("#")}
    return v.get("berth_decode_steps_total", 0.0), v.get("berth_decode_seconds_total", 0.0)


def percentile(xs, q):
    """Nearest-rank percentile q (0-100) of xs."""
    s = sorted(xs)
    return s[max(0, math.ceil(q / 100 * len(s)) - 1)]


def run(a):
    import openai

    client = openai.OpenAI(base_url=a.url + "/v1", api_key="none", timeout=900)
    ts = topics(a.streams)
    ask(client, a.model, "a warm-up", 8)
    result = {"engine": a.engine, "streams": a.streams, "max_tokens": a.max_tokens}
    if a.alone:
        alone = [ask(client, a.model, t, a.max_tokens) for t in ts]
        result["alone"] = [{"text": r["text"], "tokens": r["tokens"]} for r in alone]
        result["alone_tokens_per_second"] = (sum(r["tokens"] for r in alone)
                                            / sum(r["last"] - r["sent"] for r in alone))
    if a.metrics:
        steps0, secs0 = decode_counters(a.url)
    t0 = time.monotonic()
    with concurrent.futures.ThreadPoolExecutor(a.streams) as pool:
        together = list(pool.map(lambda t: ask(client, a.model, t, a.max_tokens), ts))
    last = max(r["last"] for r in together)
    tokens = sum(r["tokens"] for r in together)
    ttft = [r["first"] - r["sent"] for r in together]
    result.update({
        "tokens": tokens,
        "wall_seconds": last - t0,
        "tokens_per_second": tokens / (last - t0),
        # From the first token of any stream to the last: prompts mostly done, decode dominates.
        "decode_tokens_per_second": sum(r["tokens"] - 1 for r in together)
        / (last - min(r["first"] for r in together)),
        "ttft_seconds": ttft,
        "ttft_p50": percentile(ttft, 50),
        "ttft_p99": percentile(ttft, 99),
        "usage_reported": all(r["usage"] for r in together),
        "texts": [r["text"] for r in together],
        "stream_tokens": [r["tokens"] for r in together],
    })
    if a.metrics:
        steps1, secs1 = decode_counters(a.url)
        result["decode_steps"] = steps1 - steps0
        result["decode_seconds_in_plugin"] = secs1 - secs0
    with open(a.out, "w", encoding="utf-8") as f:
        json.dump(result, f)
    print(f"{a.engine} N={a.streams}: {tokens} tokens in {last - t0:.1f} s, {result['tokens_per_second']:.2f} "
          f"tokens/s; TTFT p50 {result['ttft_p50']:.2f} s, p99 {result['ttft_p99']:.2f} s", file=sys.stderr)


def report(a):
    runs = {}
    for f in glob.glob(os.path.join(a.dir, "*.json")):
        r = json.load(open(f))
        runs[(r["engine"], r["streams"])] = r
    berth = {n: r for (e, n), r in runs.items() if e == "berth"}
    peer = {n: r for (e, n), r in runs.items() if e == "llama-server"}
    alone = next((r for r in berth.values() if "alone" in r), None)
    rows, failed = [], False
    for n in sorted(berth):
        b, l = berth[n], peer.get(n)
        same = "-"
        if alone:
            same_n = sum(t == alone["alone"][i]["text"] for i, t in enumerate(b["texts"]))
            same = f"{same_n}/{n}"
            failed |= same_n != n
        rows.append((str(n), f"{b['tokens_per_second']:.2f}", f"{l['tokens_per_second']:.2f}" if l else "-",
                     f"{b['tokens_per_second'] / l['tokens_per_second']:.2f}x" if l else "-",
                     f"{b['ttft_p50']:.2f} / {b['ttft_p99']:.2f}",
                     f"{l['ttft_p50']:.2f} / {l['ttft_p99']:.2f}" if l else "-",
                     f"{l['ttft_p99'] / b['ttft_p99']:.2f}x" if l else "-", same))
    table(("N", "BERTH t/s", "LLAMA-SERVER t/s", "RATIO", "BERTH TTFT p50/p99 s", "LLAMA-SERVER TTFT p50/p99 s",
           "TTFT p99 RATIO", "BERTH TEXTS = ALONE"), rows)
    print("\nt/s: aggregate completion tokens / wall time, N greedy streams sent at once (prompt processing")
    print("included); RATIO: Berth's over llama-server's (target >= 1.5 at N = 8 and 16); TTFT p99 RATIO:")
    print("llama-server's over Berth's (>= 1 means Berth's is no worse); p99 of N streams is the slowest one.")
    if alone:
        one = alone["alone_tokens_per_second"]
        print(f"\nBerth one stream at a time: {one:.2f} tokens/s; N at once over that: "
              + ", ".join(f"N={n} {berth[n]['tokens_per_second'] / one:.2f}x" for n in sorted(berth))
              + " (target >= 3 at N = 8)")
    for n in sorted(berth):
        b = berth[n]
        if b.get("decode_steps"):
            print(f"Berth N={n}: {b['decode_steps']:.0f} decode steps, "
                  f"{1e3 * b['decode_seconds_in_plugin'] / b['decode_steps']:.1f} ms each in the plugin, "
                  f"{100 * b['decode_seconds_in_plugin'] / b['wall_seconds']:.0f} % of the wall time")
    cpu = open("/proc/cpuinfo").read()
    model = re.search(r"^model name\s*:\s*(.*)$", cpu, re.M)
    print(f"\ncpu: {model.group(1) if model else '?'}; {os.cpu_count()} cores; {a.threads} threads per engine")
    print(f"load average before: {a.load_before}; after: {a.load_after}")

    status = git("status", "--porcelain", "--untracked-files=no", "--", ".", ":!docs/bench/*.jsonl")
    flags = re.search(r"^flags\s*:\s*(.*)$", cpu, re.M)
    line = {
        "schema": 1,
        "script": "scripts/bench-parallel",
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "commit": git("rev-parse", "HEAD"),
        "dirty": bool(status) if status is not None else None,
        "cpu": {"model": model.group(1) if model else "?", "cores": os.cpu_count(),
                "flags": sorted(set(flags.group(1).split())) if flags else []},
        "kernels": os.environ.get("BERTH_KERNELS", "best"),
        "threads": a.threads,
        "model": a.model_name,
        "load_before": [float(x) for x in a.load_before.split()],
        "load_after": [float(x) for x in a.load_after.split()],
        "berth_alone_tokens_per_second": alone["alone_tokens_per_second"] if alone else None,
        "results": [{k: v for k, v in r.items() if k not in ("texts", "alone")}
                    | ({"texts_equal_alone": sum(t == alone["alone"][i]["text"] for i, t in enumerate(r["texts"]))}
                       if alone and r["engine"] == "berth" else {})
                    for _, r in sorted(runs.items())],
    }
    os.makedirs(os.path.dirname(a.jsonl) or ".", exist_ok=True)
    with open(a.jsonl, "a", encoding="utf-8") as f:
        f.write(json.dumps(line, separators=(",", ":")) + "\n")
    print(f"\nappended this run to {a.jsonl}")
    if failed:
        print("a concurrent Berth text differs from its text alone", file=sys.stderr)
        sys.exit(1)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="step", required=True)
    r = sub.add_parser("run")
    r.add_argument("--url", required=True)
    r.add_argument("--engine", required=True, choices=["berth", "llama-server"])
    r.add_argument("--streams", type=int, required=True)
    r.add_argument("--out", required=True)
    r.add_argument("--max-tokens", type=int, default=128)
    r.add_argument("--model", default="qwen2.5-coder:0.5b")
    r.add_argument("--alone", action="store_true", help="first ask each prompt alone (Berth's equality check)")
    r.add_argument("--metrics", action="store_true", help="read Berth's decode counters from /metrics")
    p = sub.add_parser("report")
    p.add_argument("dir")
    p.add_argument("--threads", type=int, required=True)
    p.add_argument("--load-before", required=True)
    p.add_argument("--load-after", required=True)
    p.add_argument("--model-name", default="qwen2.5-coder:0.5b")
    p.add_argument("--jsonl", default="docs/bench/parallel.jsonl")
    a = ap.parse_args()
    run(a) if a.step == "run" else report(a)


if __name__ == "__main__":
    main()
