#!/usr/bin/env python3
"""Benchmark of `tool_choice: "auto"`: does the model call the right tool when a prompt needs one,
and answer in text when it does not? Driven by the official `openai` client against any
OpenAI-compatible server (`berth serve`, llama.cpp's `llama-server --jinja`).

Usage: bench_tools.py --server NAME=BASE_URL [--server NAME=BASE_URL ...] [--model M]
                      [--no-stream-check] [--no-stream-check-for NAME] [--max-tokens N]
                      [--json FILE] [--verbose]

Per server it reports recall (of the prompts that need a tool: finish_reason "tool_calls" and a
first call to the right tool whose arguments validate against that tool's JSON schema), the
no-call rate (of the prompts that need none: no tool call at all and finish_reason "stop" or
"length"), the same rate over the prompts among those that name a tool or its subject without
needing it, and, unless --no-stream-check, how many streamed answers equal the non-streamed ones
(content, tool calls and finish_reason). Decoding is greedy (temperature 0).
"""

import argparse
import json
import sys
import time

import openai

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Get the current weather for a city.",
            "parameters": {
                "type": "object",
                "properties": {
                    "city": {"type": "string", "description": "City name, e.g. Lima"},
                    "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
                },
                "required": ["city"],
            },
        },
    },
    {
        "type": "function",
        "function": {
            "name": "convert_currency",
            "description": "Convert an amount of money from one currency to another.",
            "parameters": {
                "type": "object",
                "properties": {
                    "amount": {"type": "number"},
                    "from_currency": {"type": "string", "description": "ISO code, e.g. USD"},
                    "to_currency": {"type": "string", "description": "ISO code, e.g. EUR"},
                },
                "required": ["amount", "from_currency", "to_currency"],
            },
        },
    },
    {
        "type": "function",
        "function": {
            "name": "search_files",
            "description": "Search the user's files by a text pattern and return matching paths.",
            "parameters": {
                "type": "object",
                "properties": {
                    "pattern": {"type": "string", "description": "Text or glob to look for"},
                    "directory": {"type": "string", "description": "Directory to search in"},
                },
                "required": ["pattern"],
            },
        },
    },
    {
        "type": "function",
        "function": {
            "name": "create_calendar_event",
            "description": "Add an event to the user's calendar.",
            "parameters": {
                "type": "object",
                "properties": {
                    "title": {"type": "string"},
                    "date": {"type": "string", "description": "Date, YYYY-MM-DD"},
                    "time": {"type": "string", "description": "Time, HH:MM"},
                },
                "required": ["title", "date"],
            },
        },
    },
]

# (prompt, the tool it needs or None).
PROMPTS = [
    ("What's the weather in Lima right now?", "get_weather"),
    ("Is it raining in Tokyo at the moment?", "get_weather"),
    ("How cold is it in Oslo today, in celsius?", "get_weather"),
    ("Tell me the current weather in Nairobi.", "get_weather"),
    ("Do I need an umbrella in London today? Check the weather.", "get_weather"),
    ("What is the temperature in Phoenix in fahrenheit?", "get_weather"),
    ("Convert 100 US dollars to euros.", "convert_currency"),
    ("How many Japanese yen is 250 GBP?", "convert_currency"),
    ("Please convert 75.5 EUR into Swiss francs.", "convert_currency"),
    ("I have 1200 Mexican pesos. How much is that in USD?", "convert_currency"),
    ("Exchange 40 Canadian dollars to Australian dollars.", "convert_currency"),
    ("Find the files in my projects folder that mention 'TODO'.", "search_files"),
    ("Search my documents for files named invoice.", "search_files"),
    ("Which of my files contain the word 'budget'?", "search_files"),
    ("Look for *.py files under /home/ana/src.", "search_files"),
    ("Search my files for the phrase 'quarterly report'.", "search_files"),
    ("Add a dentist appointment to my calendar on 2025-03-14 at 09:30.", "create_calendar_event"),
    ("Schedule a team meeting on 2025-06-02 at 14:00 in my calendar.", "create_calendar_event"),
    ("Put 'Mom's birthday' on my calendar for 2025-11-08.", "create_calendar_event"),
    ("Create a calendar event called Gym on 2025-01-20 at 18:00.", "create_calendar_event"),
    ("Write a Python function that reverses a string.", None),
    ("Explain what a hash map is in two sentences.", None),
    ("What does the `git rebase` command do?", None),
    ("Write a haiku about autumn leaves.", None),
    ("What is 17 multiplied by 23?", None),
    ("Translate 'good morning' into Spanish.", None),
    ("Give me three tips for writing clean code.", None),
    ("What is the difference between a list and a tuple in Python?", None),
    ("Write a SQL query that counts the rows of a table named users.", None),
    ("Who wrote the novel 'Pride and Prejudice'?", None),
    ("Summarize the plot of Romeo and Juliet in one sentence.", None),
    ("What is recursion? Answer briefly.", None),
    ("Write a bash one-liner that counts the lines of all .txt files.", None),
    ("Say hello in French.", None),
    ("What is the time complexity of binary search?", None),
    ("Suggest a name for a pet goldfish.", None),
    ("Explain the difference between TCP and UDP briefly.", None),
    ("Write a JavaScript arrow function that adds two numbers.", None),
    ("Why is the sky blue? One sentence.", None),
    ("What does HTTP status code 404 mean?", None),
]

# Prompts that name an offered tool or its subject without needing a call: a model that calls
# whenever a tool's name or topic comes up fails them. Judged like the prompts above.
MENTIONS = [
    "What does a weather API usually return?",
    "Explain what the get_weather function in my tools list would do.",
    "Which arguments does the convert_currency tool take, and which are required?",
    "What is the difference between the search_files and create_calendar_event tools?",
    "Describe the JSON schema of the get_weather tool's parameters in one paragraph.",
    "Why do weather forecasts sometimes get the temperature wrong?",
    "How are currency exchange rates determined? Answer briefly.",
    "What do ISO currency codes like USD and EUR stand for?",
    "How do I search for files by name on Linux with the find command?",
    "Give me two tips for keeping a calendar organized.",
    "Is YYYY-MM-DD a better date format than DD/MM/YYYY? Explain briefly.",
    "When would an assistant use a tool like search_files instead of answering directly?",
]
PROMPTS += [(p, None) for p in MENTIONS]

TYPES = {
    "string": str,
    "number": (int, float),
    "integer": int,
    "boolean": bool,
    "object": dict,
    "array": list,
}


def schema_errors(value, schema, path="$"):
    """The ways `value` breaks `schema` (the subset the bench's tools use): type, enum,
    properties, required, additionalProperties."""
    errors = []
    t = schema.get("type")
    if t is not None:
        ok = isinstance(value, TYPES[t]) and not (t in ("number", "integer") and isinstance(value, bool))
        if not ok:
            return [f"{path}: expected {t}, got {type(value).__name__}"]
    if "enum" in schema and value not in schema["enum"]:
        errors.append(f"{path}: {value!r} not in {schema['enum']}")
    if isinstance(value, dict):
        props = schema.get("properties", {})
        for key in schema.get("required", []):
            if key not in value:
                errors.append(f"{path}: missing {key}")
        for key, v in value.items():
            if key in props:
                errors.extend(schema_errors(v, props[key], f"{path}.{key}"))
            elif schema.get("additionalProperties") is False:
                errors.append(f"{path}: unexpected {key}")
    return errors


def tool_schema(name):
    for t in TOOLS:
        if t["function"]["name"] == name:
            return t["function"]["parameters"]
    return None


def judge(calls, finish, want):
    """(passed, note) for one answer against the tool the prompt needs. A call passes only with
    finish_reason "tool_calls" (what a client acts on), the right tool first and arguments valid
    against its schema; an answer needing no tool passes only with no call and finish_reason
    "stop" or "length"."""
    if want is None:
        if calls:
            return (False, "called " + ",".join(n for n, _ in calls))
        if finish not in ("stop", "length"):
            return (False, f"finish_reason {finish}")
        return (True, "")
    if not calls:
        return (False, "no call")
    if finish != "tool_calls":
        return (False, f"finish_reason {finish}")
    name, args = calls[0]
    if name != want:
        return (False, f"called {name}")
    try:
        parsed = json.loads(args)
    except ValueError:
        return (False, f"arguments are not JSON: {args!r}")
    errors = schema_errors(parsed, tool_schema(name))
    return (not errors, "; ".join(errors))


def ask(client, model, prompt, max_tokens):
    r = client.chat.completions.create(
        model=model,
        messages=[{"role": "user", "content": prompt}],
        tools=TOOLS,
        tool_choice="auto",
        temperature=0,
        max_tokens=max_tokens,
    )
    c = r.choices[0]
    calls = [(t.function.name, t.function.arguments) for t in c.message.tool_calls or []]
    return c.message.content or None, calls, c.finish_reason


def ask_streamed(client, model, prompt, max_tokens):
    content, acc, finish = "", {}, None
    stream = client.chat.completions.create(
        model=model,
        messages=[{"role": "user", "content": prompt}],
        tools=TOOLS,
        tool_choice="auto",
        temperature=0,
        max_tokens=max_tokens,
        stream=True,
    )
    for chunk in stream:
        for c in chunk.choices:
            finish = c.finish_reason or finish
            content += c.delta.content or ""
            for tc in c.delta.tool_calls or []:
                e = acc.setdefault(tc.index, ["", ""])
                if tc.function and tc.function.name:
                    e[0] += tc.function.name
                if tc.function and tc.function.arguments:
                    e[1] += tc.function.arguments
    calls = [tuple(e) for _, e in sorted(acc.items())]
    return content or None, calls, finish


def bench(name, base, model, args):
    client = openai.OpenAI(base_url=base.rstrip("/") + "/v1", api_key="unused", max_retries=0, timeout=600)
    stream_check = args.stream_check and name not in args.no_stream_check_for
    rows = []
    started = time.monotonic()
    for prompt, want in PROMPTS:
        content, calls, finish = ask(client, model, prompt, args.max_tokens)
        passed, note = judge(calls, finish, want)
        same = None
        if stream_check:
            streamed = ask_streamed(client, model, prompt, args.max_tokens)
            same = streamed == (content, calls, finish)
            if not same:
                note += f" [stream differs: {streamed!r}]"
        rows.append({"prompt": prompt, "want": want, "mentions_tool": prompt in MENTIONS,
                     "passed": passed, "calls": calls, "content": content, "finish": finish,
                     "stream_same": same, "note": note})
        if args.verbose:
            mark = "ok " if passed else "BAD"
            print(f"  [{name}] {mark} {prompt!r} -> {calls or content!r} {note}", file=sys.stderr)
    need = [r for r in rows if r["want"]]
    none = [r for r in rows if not r["want"]]
    mention = [r for r in none if r["mentions_tool"]]
    result = {
        "server": name,
        "recall": sum(r["passed"] for r in need) / len(need),
        "no_call": sum(r["passed"] for r in none) / len(none),
        "no_call_mentions": sum(r["passed"] for r in mention) / len(mention),
        "need_tool": len(need),
        "need_none": len(none),
        "need_none_mentions": len(mention),
        "stream_same": None if not stream_check else sum(bool(r["stream_same"]) for r in rows),
        "seconds": time.monotonic() - started,
        "rows": rows,
    }
    return result


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--server", action="append", required=True, help="NAME=BASE_URL (repeatable)")
    ap.add_argument("--model", default="qwen2.5-coder:0.5b")
    ap.add_argument("--max-tokens", type=int, default=80)
    ap.add_argument("--no-stream-check", dest="stream_check", action="store_false")
    ap.add_argument("--no-stream-check-for", action="append", default=[], metavar="NAME",
                    help="skip the stream check for this server only (repeatable)")
    ap.add_argument("--json", help="write every answer to this file")
    ap.add_argument("--verbose", action="store_true")
    args = ap.parse_args()
    results = []
    for spec in args.server:
        name, _, base = spec.partition("=")
        results.append(bench(name, base, args.model, args))
        # Written after each server, so a later server's failure keeps the earlier answers.
        if args.json:
            with open(args.json, "w") as f:
                json.dump(results, f, indent=1)
    print(f"{len(PROMPTS)} prompts ({sum(1 for _, w in PROMPTS if w)} need one of "
          f"{len(TOOLS)} tools, {sum(1 for _, w in PROMPTS if not w)} need none, "
          f"{len(MENTIONS)} of which name a tool or its subject), "
          f"tool_choice auto, greedy, max_tokens {args.max_tokens}\n")
    head = ("SERVER", "RECALL", "NO-CALL", "OF WHICH NAMING A TOOL", "STREAM=NON-STREAM", "SECONDS")
    table = [head]

    def rate(r, key, count):
        return f"{r[key] * 100:.1f}% ({round(r[key] * r[count])}/{r[count]})"

    for r in results:
        n = r["need_tool"] + r["need_none"]
        table.append((
            r["server"],
            rate(r, "recall", "need_tool"),
            rate(r, "no_call", "need_none"),
            rate(r, "no_call_mentions", "need_none_mentions"),
            "-" if r["stream_same"] is None else f"{r['stream_same']}/{n}",
            f"{r['seconds']:.0f}",
        ))
    widths = [max(len(row[i]) for row in table) for i in range(len(head))]
    for row in table:
        print("   ".join(c.ljust(widths[i]) for i, c in enumerate(row)).rstrip())
    for r in results:
        misses = [x for x in r["rows"] if not x["passed"] or x["stream_same"] is False]
        for x in misses:
            got = x["calls"] or x["content"]
            print(f"  {r['server']}: {x['prompt']!r} wanted {x['want'] or 'no call'}: {got!r} {x['note']}")


if __name__ == "__main__":
    main()
