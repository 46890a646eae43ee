"""Time to first token of a request whose long system prompt is shared with a request still
streaming, against the same request cold (issue 13 item 5; a benchmark, not a test).

Each round uses a system prompt of about --system-tokens tokens that no earlier round used (a
round number leads it), so nothing is cached from before. Request A (system + one question) is
sent alone and streamed: its time to first token is the cold time. While A still streams,
request B (same system prompt, another question) is sent: its time to first token is the shared
time, and its usage must report cached prompt tokens. Once A has ended, B is asked again alone
(greedy) and must give the same text.
Prints one line per round and a summary (median cold, median shared, ratio); exits 1 when a
shared request reported no cached tokens, A ended before B's first token, or texts differ.

Usage: bench_prefix.py --url BASE_URL [--rounds 5] [--system-tokens 600] [--model M]
"""
import argparse
import statistics
import sys
import threading
import time

import openai

RULES = [
    "Answer in plain English without markdown headings.",
    "Prefer short sentences and concrete examples.",
    "When asked for code, write idiomatic Rust with comments.",
    "Never invent library functions; say when you are unsure.",
    "Keep numbers exact and show units where they apply.",
    "If a question is ambiguous, state the reading you chose.",
]


def system_prompt(round_no, approx_tokens):
    """A system prompt of about `approx_tokens` tokens, led by the round number."""
    lines = [f"Session {round_no}. You are Berth's careful assistant. Follow these house rules."]
    k = 0
    # About 16 tokens a rule line with this tokenizer.
    while len(lines) * 16 < approx_tokens:
        lines.append(f"Rule {k // len(RULES) + 1}.{k % len(RULES) + 1}: {RULES[k % len(RULES)]}")
        k += 1
    return "\n".join(lines)


def stream(client, model, system, user, max_tokens, out):
    """Streams one greedy chat answer; fills out with ttft, end, text, usage."""
    t0 = time.monotonic()
    out["text"] = ""
    s = client.chat.completions.create(
        model=model,
        messages=[{"role": "system", "content": system}, {"role": "user", "content": user}],
        temperature=0,
        max_tokens=max_tokens,
        stream=True,
        stream_options={"include_usage": True},
    )
    for chunk in s:
        if chunk.usage is not None:
            out["usage"] = chunk.usage
        for c in chunk.choices:
            if c.delta.content:
                out.setdefault("ttft", time.monotonic() - t0)
                out["first_at"] = out.get("first_at") or time.monotonic()
                out["text"] += c.delta.content
    out["end"] = time.monotonic()


def cached(usage):
    details = getattr(usage, "prompt_tokens_details", None)
    return (getattr(details, "cached_tokens", None) or 0) if details else 0


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--url", required=True)
    ap.add_argument("--model", default="qwen2.5-coder:0.5b")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--system-tokens", type=int, default=600)
    args = ap.parse_args()
    client = openai.OpenAI(base_url=args.url.rstrip("/") + "/v1", api_key="unused", max_retries=0, timeout=900)
    question_a = "Count from 1 to 300, separated by commas."
    question_b = "Name three prime numbers."
    # Warm-up: the first request pays for loading the model.
    stream(client, args.model, "Warm up.", "Say hi.", 4, {})

    colds, shareds, failures = [], [], []
    for r in range(1, args.rounds + 1):
        system = system_prompt(r, args.system_tokens)
        a, b = {}, {}
        ta = threading.Thread(target=stream, args=(client, args.model, system, question_a, 400, a))
        ta.start()
        while "ttft" not in a and ta.is_alive():
            time.sleep(0.005)
        stream(client, args.model, system, question_b, 24, b)
        ta.join()
        # The reference: B asked alone once A has ended (its prefix then comes from a finished
        # slot, the reuse that predates forking).
        ref = {}
        stream(client, args.model, system, question_b, 24, ref)
        prompt_tokens = b["usage"].prompt_tokens
        line = (f"round {r}: prompt {prompt_tokens} tokens, cold TTFT {a['ttft'] * 1000:.0f} ms, "
                f"shared TTFT {b['ttft'] * 1000:.0f} ms (cached {cached(b['usage'])}), "
                f"ratio {b['ttft'] / a['ttft']:.3f}")
        print(line, flush=True)
        if cached(b["usage"]) == 0:
            failures.append(f"round {r}: the shared request reported no cached tokens")
        if a["end"] < b["first_at"]:
            failures.append(f"round {r}: the first request ended before the second's first token")
        if b["text"] != ref["text"]:
            failures.append(f"round {r}: shared text {b['text']!r} != alone {ref['text']!r}")
        colds.append(a["ttft"])
        shareds.append(b["ttft"])
    cold, shared = statistics.median(colds), statistics.median(shareds)
    print(f"median cold TTFT {cold * 1000:.0f} ms, median shared TTFT {shared * 1000:.0f} ms, "
          f"ratio {shared / cold:.3f} (target < 0.333)")
    for f in failures:
        print("  " + f, file=sys.stderr)
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
