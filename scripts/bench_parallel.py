"""Batched decode benchmark (issue 13 item 4; a benchmark, not a test): aggregate tokens/s of N
concurrent greedy streams against one stream at a time, on one `berth serve`, and whether each
concurrent stream's text equals the same request's text alone.

Each of N distinct prompts is first asked alone, one after another; then all N at once. The rate
of a run is its completion tokens divided by its wall time from the first request to the last
token (prompt processing included; the prompts are short). Prints both rates and their ratio
(target: >= 3 at N = 8); exits 1 when a concurrent text differs from its text alone.

Usage: bench_parallel.py --url URL [--streams 8] [--max-tokens 128] [--model M]
"""
import argparse
import concurrent.futures
import sys
import time
import urllib.request

import openai

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


def ask(client, model, topic, max_tokens):
    """One greedy answer, streamed: (text, completion tokens, time of its first token, of its last)."""
    text, tokens, first, last = "", 0, None, None
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
                last = time.monotonic()
                first = first or last
    return text, tokens, first, last


def decode_counters(url):
    """(decode steps, seconds in plugin decode calls) from the server's /metrics."""
    text = urllib.request.urlopen(url + "/metrics", timeout=30).read().decode()
    v = {l.split()[0]: float(l.split()[1]) for l in text.splitlines() if l and not l.startswith("#")}
    return v.get("berth_decode_steps_total", 0.0), v.get("berth_decode_seconds_total", 0.0)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--url", required=True)
    ap.add_argument("--streams", type=int, default=8)
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--model", default="qwen2.5-coder:0.5b")
    a = ap.parse_args()
    client = openai.OpenAI(base_url=a.url + "/v1", api_key="none", timeout=600)
    topics = [TOPICS[i % len(TOPICS)] + ("" if i < len(TOPICS) else f" (part {i})") for i in range(a.streams)]
    ask(client, a.model, "a warm-up", 8)
    alone, alone_tokens, alone_secs, alone_decode = [], 0, 0.0, 0.0
    for t in topics:
        t0 = time.monotonic()
        text, n, first, last = ask(client, a.model, t, a.max_tokens)
        alone.append(text)
        alone_tokens += n
        alone_secs += last - t0
        alone_decode += last - first
    steps0, secs0 = decode_counters(a.url)
    t0 = time.monotonic()
    with concurrent.futures.ThreadPoolExecutor(a.streams) as pool:
        together = list(pool.map(lambda t: ask(client, a.model, t, a.max_tokens), topics))
    last_token = max(last for _, _, _, last in together)
    steps1, secs1 = decode_counters(a.url)
    wall = last_token - t0
    together_tokens = sum(n for _, n, _, _ in together)
    one, many = alone_tokens / alone_secs, together_tokens / wall
    # Decode alone: from the first token to the last (after the last prompt was processed).
    decode_wall = last_token - max(first for _, _, first, _ in together)
    one_decode = (alone_tokens - len(topics)) / alone_decode
    many_decode = sum(n - 1 for _, n, first, _ in together) / (last_token - min(f for _, _, f, _ in together))
    same = sum(text == alone[i] for i, (text, _, _, _) in enumerate(together))
    print(f"one stream at a time: {alone_tokens} tokens in {alone_secs:.1f} s, {one:.2f} tokens/s")
    print(f"{a.streams} streams at once:   {together_tokens} tokens in {wall:.1f} s, {many:.2f} tokens/s")
    print(f"aggregate ratio: {many / one:.2f}x (target >= 3 at 8 streams); texts equal to alone: {same} of {a.streams}")
    print(f"decode only (first token to last): one {one_decode:.2f} tokens/s, {a.streams} at once {many_decode:.2f} "
          f"tokens/s, {many_decode / one_decode:.2f}x (all {a.streams} decoding together for the last {decode_wall:.1f} s)")
    steps, secs = steps1 - steps0, secs1 - secs0
    if steps:
        print(f"{a.streams} at once: {steps:.0f} decode steps, {1e3 * secs / steps:.1f} ms each in the plugin, "
              f"{100 * secs / wall:.0f} % of the wall time")
    if same != a.streams:
        sys.exit(1)


if __name__ == "__main__":
    main()
