"""Load test of a Berth server: many concurrent streaming clients, nothing lost, nothing mixed up.

First every prompt is asked once, alone, streamed and greedy: that text is the reference. Then
CLIENTS threads each ask prompts in turn, streamed, for DURATION seconds, through the official
`openai` client; every stream must end with a finish_reason and its text must equal the prompt's
reference byte for byte (a sequence's tokens must not depend on what it was batched with). Prints
one line: clients, duration, requests, errors, mismatched streams, tokens and tokens/s; exits 1 on
any error or mismatch.

Usage: load_test.py --url BASE_URL [--clients 64] [--duration 180] [--max-tokens 48] [--model M]
"""
import argparse
import sys
import threading
import time

import openai

PROMPTS = [
    "Write a Python function that reverses a string.",
    "What is a closure in JavaScript? One paragraph.",
    "Explain the difference between a list and a tuple in Python.",
    "Write a SQL query that counts orders per customer.",
    "What does the Rust borrow checker prevent?",
    "Give three tips for writing readable code.",
    "Write a bash one-liner that counts lines in all .py files.",
    "What is the time complexity of binary search and why?",
    "Write a Go function that sums a slice of ints.",
    "Explain what a mutex is to a beginner.",
    "Write a regular expression that matches an email address.",
    "What is the difference between TCP and UDP?",
    "Write a C function that returns the length of a string.",
    "Name two uses of a hash map.",
    "Write a Python list comprehension for the squares of 1 to 10.",
    "What is recursion? Give a tiny example.",
]


def ask(client, model, prompt, max_tokens):
    """One streamed greedy answer: (text, finish_reason, completion tokens or None)."""
    text, finish, tokens = "", None, None
    stream = client.chat.completions.create(
        model=model,
        messages=[{"role": "user", "content": prompt}],
        temperature=0,
        max_tokens=max_tokens,
        stream=True,
        stream_options={"include_usage": True},
    )
    for chunk in stream:
        if chunk.usage is not None:
            tokens = chunk.usage.completion_tokens
        for c in chunk.choices:
            text += c.delta.content or ""
            finish = c.finish_reason or finish
    return text, finish, tokens


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--url", required=True)
    ap.add_argument("--model", default="qwen2.5-coder:0.5b")
    ap.add_argument("--clients", type=int, default=64)
    ap.add_argument("--duration", type=float, default=180)
    ap.add_argument("--max-tokens", type=int, default=48)
    args = ap.parse_args()
    client = openai.OpenAI(base_url=args.url.rstrip("/") + "/v1", api_key="unused", max_retries=0, timeout=900)

    reference = {}
    for p in PROMPTS:
        text, finish, _ = ask(client, args.model, p, args.max_tokens)
        if not finish:
            sys.exit(f"load_test: reference for {p!r} ended without finish_reason")
        reference[p] = text
    print(f"load_test: {len(PROMPTS)} reference answers taken alone", file=sys.stderr)

    lock = threading.Lock()
    stats = {"requests": 0, "errors": 0, "mismatched": 0, "tokens": 0}
    problems = []
    deadline = time.monotonic() + args.duration

    def worker(k):
        i = k
        while time.monotonic() < deadline:
            p = PROMPTS[i % len(PROMPTS)]
            i += 1
            try:
                text, finish, tokens = ask(client, args.model, p, args.max_tokens)
                bad = None if finish and text == reference[p] else (p, finish, text)
                err = None
            except Exception as e:  # every failure is counted, none ends the test early
                bad, err, tokens = None, f"{type(e).__name__}: {e}", 0
            with lock:
                stats["requests"] += 1
                stats["tokens"] += tokens or 0
                if err:
                    stats["errors"] += 1
                    problems.append(f"error: {err}")
                if bad:
                    stats["mismatched"] += 1
                    problems.append(f"mismatch on {bad[0]!r} (finish {bad[1]}): {bad[2]!r} != {reference[bad[0]]!r}")

    started = time.monotonic()
    threads = [threading.Thread(target=worker, args=(k,)) for k in range(args.clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    elapsed = time.monotonic() - started
    for line in problems[:10]:
        print("  " + line, file=sys.stderr)
    print(f"{args.clients} clients, {elapsed:.0f} s, {stats['requests']} requests, {stats['errors']} errors, "
          f"{stats['mismatched']} mismatched streams, {stats['tokens']} tokens "
          f"({stats['tokens'] / elapsed:.1f} tokens/s aggregate)")
    sys.exit(1 if stats["errors"] or stats["mismatched"] else 0)


if __name__ == "__main__":
    main()
