"""End-to-end checks of `berth serve` with the official `openai` Python package.

Usage: python openai_checks.py BASE_URL MODEL CHECK...   (checks: chat tools usage errors
concurrency disconnect parse). Each check prints one line `ok CHECK ...` or raises.
"""

import json
import sys
import threading
import time
import urllib.request

import openai
from pydantic import BaseModel

BASE, MODEL = sys.argv[1], sys.argv[2]
client = openai.OpenAI(base_url=BASE + "/v1", api_key="unused", max_retries=0, timeout=300)


def greedy_chat(prompt, max_tokens=24, **kw):
    return client.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": prompt}],
        temperature=0,
        max_tokens=max_tokens,
        **kw,
    )


def stream_text(prompt, max_tokens=24):
    """Streams a greedy chat; returns (text, completion tokens, time of the first content token,
    time of the end)."""
    text, usage, first = "", None, None
    for chunk in greedy_chat(prompt, max_tokens, stream=True, stream_options={"include_usage": True}):
        if chunk.usage is not None:
            usage = chunk.usage
        for c in chunk.choices:
            if c.delta.content and first is None:
                first = time.monotonic()
            text += c.delta.content or ""
    end = time.monotonic()
    return text, usage.completion_tokens, first or end, end


def check_chat():
    r = greedy_chat("What is the capital of France? Answer in one sentence.")
    msg = r.choices[0].message
    assert msg.role == "assistant" and "Paris" in msg.content, r
    assert r.choices[0].finish_reason in ("stop", "length"), r
    assert r.usage.prompt_tokens > 0 and r.usage.completion_tokens > 0, r.usage
    assert r.usage.total_tokens == r.usage.prompt_tokens + r.usage.completion_tokens
    streamed = ""
    finish = None
    for chunk in greedy_chat("What is the capital of France? Answer in one sentence.", stream=True):
        assert chunk.object == "chat.completion.chunk"
        for c in chunk.choices:
            streamed += c.delta.content or ""
            finish = c.finish_reason or finish
    assert streamed == msg.content, (streamed, msg.content)
    assert finish == r.choices[0].finish_reason
    models = [m.id for m in client.models.list().data]
    assert MODEL in models, models
    assert client.models.retrieve(MODEL).id == MODEL
    print("ok chat", json.dumps(msg.content))


TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Current weather of a city",
            "parameters": {
                "type": "object",
                "properties": {"city": {"type": "string"}},
                "required": ["city"],
            },
        },
    }
]


def check_tools():
    messages = [{"role": "user", "content": "What is the weather in Paris? Use the tool."}]
    # tool_choice "required" is a grammar: the 0.5B model really calls the tool.
    kw = dict(tools=TOOLS, tool_choice="required", temperature=0, max_tokens=48)
    r = client.chat.completions.create(model=MODEL, messages=messages, **kw)
    msg = r.choices[0].message
    calls = [(c.id, c.function.name, c.function.arguments) for c in msg.tool_calls or []]
    # Reassemble the stream as SDK users do: by index, concatenating argument deltas.
    acc, content, finish = {}, "", None
    for chunk in client.chat.completions.create(model=MODEL, messages=messages, stream=True, **kw):
        for c in chunk.choices:
            finish = c.finish_reason or finish
            content += c.delta.content or ""
            for tc in c.delta.tool_calls or []:
                assert tc.index is not None, tc
                e = acc.setdefault(tc.index, {"id": None, "name": "", "args": ""})
                if tc.id:
                    e["id"] = tc.id
                if tc.function and tc.function.name:
                    e["name"] += tc.function.name
                if tc.function and tc.function.arguments:
                    e["args"] += tc.function.arguments
    streamed = [(e["id"], e["name"], e["args"]) for _, e in sorted(acc.items())]
    assert streamed == calls, (streamed, calls)
    assert (content or None) == (msg.content or None), (content, msg.content)
    assert finish == r.choices[0].finish_reason
    assert calls and calls[0][1] == "get_weather" and "Paris" in calls[0][2], calls
    assert r.choices[0].finish_reason == "tool_calls"
    print("ok tools", json.dumps(calls))


def raw_stream(body):
    req = urllib.request.Request(
        BASE + "/v1/chat/completions",
        data=json.dumps(body).encode(),
        headers={"content-type": "application/json"},
    )
    with urllib.request.urlopen(req) as resp:
        lines = [l.decode().strip() for l in resp]
    return [l[len("data: "):] for l in lines if l.startswith("data: ")]


def check_usage():
    body = {
        "model": MODEL,
        "messages": [{"role": "user", "content": "Say hello."}],
        "temperature": 0,
        "max_tokens": 8,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    events = raw_stream(body)
    assert events[-1] == "[DONE]", events[-1]
    chunks = [json.loads(e) for e in events[:-1]]
    for c in chunks[:-1]:
        assert "usage" in c and c["usage"] is None, c
        assert len(c["choices"]) == 1, c
    last = chunks[-1]
    assert last["choices"] == [] and last["usage"]["completion_tokens"] > 0, last
    u = last["usage"]
    assert u["total_tokens"] == u["prompt_tokens"] + u["completion_tokens"], u
    body["stream_options"] = None
    for e in raw_stream(body)[:-1]:
        assert "usage" not in json.loads(e), e
    print("ok usage", json.dumps(u))


def check_errors():
    try:
        client.chat.completions.create(model="no-such-model:1b", messages=[{"role": "user", "content": "hi"}])
        raise AssertionError("unknown model accepted")
    except openai.NotFoundError as e:
        assert e.status_code == 404 and e.body["code"] == "model_not_found", e.body
    for bad in [{"temperature": "hot"}, {"max_tokens": -1}, {"top_p": 3}, {"n": 2}, {"stop": [1]}]:
        try:
            client.chat.completions.create(
                model=MODEL, messages=[{"role": "user", "content": "hi"}], extra_body=bad
            )
            raise AssertionError(f"{bad} accepted")
        except openai.BadRequestError as e:
            assert e.status_code == 400 and e.body["param"] == next(iter(bad)), e.body
    try:
        client.chat.completions.create(model=MODEL, messages=[])
        raise AssertionError("empty messages accepted")
    except openai.BadRequestError:
        pass
    # null is unset everywhere.
    r = client.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": "hi"}],
        max_tokens=2,
        extra_body={"temperature": None, "top_p": None, "stop": None, "seed": None, "tools": None},
    )
    assert r.choices[0].finish_reason in ("stop", "length")
    print("ok errors")


# Prompts whose answers run past the token budget, so generation (not prompts) dominates.
PROMPTS = [
    "Count from 1 to 100, separated by commas.",
    "List the first 50 prime numbers, separated by commas.",
    "Write the alphabet in capital letters, separated by spaces, twice.",
    "Count down from 100 to 1, separated by commas.",
    "List the even numbers from 2 to 200, separated by commas.",
    "Write the multiples of 7 up to 350, separated by commas.",
    "List the squares of 1 to 40, separated by commas.",
    "Count from 1000 to 1100, separated by commas.",
]


def gen_stream(prompt, max_tokens):
    """Streams a greedy chat with a one-word system prompt; returns (text, tokens, start, end)."""
    t0 = time.monotonic()
    text, usage = "", None
    for chunk in client.chat.completions.create(
        model=MODEL,
        messages=[{"role": "system", "content": "Answer."}, {"role": "user", "content": prompt}],
        temperature=0,
        max_tokens=max_tokens,
        stream=True,
        stream_options={"include_usage": True},
    ):
        if chunk.usage is not None:
            usage = chunk.usage
        for c in chunk.choices:
            text += c.delta.content or ""
    return text, usage.completion_tokens, t0, time.monotonic()


def check_concurrency():
    """Generated tokens per second of whole requests (prompt included): eight streams one at a
    time, then all eight at once; each batched output must equal its single one."""
    n_tokens = int(sys.argv[4]) if len(sys.argv) > 4 else 40
    single = [gen_stream(p, n_tokens) for p in PROMPTS]
    single_rate = sum(r[1] for r in single) / sum(r[3] - r[2] for r in single)
    results = [None] * len(PROMPTS)

    def run(i):
        results[i] = gen_stream(PROMPTS[i], n_tokens)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(PROMPTS))]
    t0 = time.monotonic()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.monotonic() - t0
    for i, r in enumerate(results):
        assert r[0] == single[i][0], (i, r[0], single[i][0])
    agg = sum(r[1] for r in results) / wall
    print(
        f"ok concurrency tokens={sum(r[1] for r in results)} single_stream_tok_s={single_rate:.2f} "
        f"aggregate_8_streams_tok_s={agg:.2f}"
    )
    assert agg > single_rate, (agg, single_rate)


def metric(name):
    with urllib.request.urlopen(BASE + "/metrics") as r:
        for line in r.read().decode().splitlines():
            if line.startswith(name + " "):
                return float(line.split()[1])
    raise AssertionError(name + " missing")


def check_disconnect():
    stream = greedy_chat("Count from 1 to 1000, one number per line.", 400, stream=True)
    got = 0
    for chunk in stream:
        got += 1
        if got == 3:
            break
    assert metric("berth_active_sequences") >= 1
    stream.close()
    t0 = time.monotonic()
    while metric("berth_active_sequences") > 0:
        assert time.monotonic() - t0 < 1.0, "sequence still active 1 s after the client left"
        time.sleep(0.02)
    print(f"ok disconnect freed_after_s={time.monotonic() - t0:.3f}")


class Capital(BaseModel):
    country: str
    capital: str


def check_parse():
    r = client.chat.completions.parse(
        model=MODEL,
        messages=[{"role": "user", "content": "Give the capital of France as JSON."}],
        response_format=Capital,
        temperature=0,
        max_tokens=64,
    )
    cap = r.choices[0].message.parsed
    assert isinstance(cap, Capital) and "Paris" in cap.capital, r
    print("ok parse", cap.model_dump_json())


for name in sys.argv[3:4]:
    globals()["check_" + name]()
