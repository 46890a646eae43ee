"""End-to-end checks of `berth serve` with the official `openai` Python package.

Usage: python openai_checks.py BASE_URL MODEL CHECK...   (checks: chat tools usage errors
concurrency disconnect parse logprobs n toolsemantics root
tolerant [CASES.json]). Each check prints one line `ok CHECK ...` or raises.
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
    # tool_choice "required" is a grammar: the 0.5B model really calls the tool. One call (with
    # parallel calls this model repeats it until max_tokens, which then ends as `length`).
    kw = dict(tools=TOOLS, tool_choice="required", parallel_tool_calls=False, temperature=0, max_tokens=48)
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
    for bad in [{"temperature": "hot"}, {"max_tokens": -1}, {"top_p": 3}, {"n": 0}, {"n": 17}, {"stop": [1]}, {"top_logprobs": 3}, {"logprobs": "yes"}]:
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
    """Eight streams one at a time, then all eight at once: each batched output must equal its
    single one, and /metrics must show that the eight were decoded together (steps carrying
    several sequences, a peak of at least half of them in one step), not merely that they all
    finished. The tokens per second of both are printed, not asserted."""
    n_tokens = int(sys.argv[4]) if len(sys.argv) > 4 else 40
    single = [gen_stream(p, n_tokens) for p in PROMPTS]
    single_rate = sum(r[1] for r in single) / sum(r[3] - r[2] for r in single)
    results = [None] * len(PROMPTS)

    def run(i):
        results[i] = gen_stream(PROMPTS[i], n_tokens)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(PROMPTS))]
    batched_before = metric("berth_batched_decode_steps_total")
    t0 = time.monotonic()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.monotonic() - t0
    batched = metric("berth_batched_decode_steps_total") - batched_before
    peak = metric("berth_peak_batch_sequences")
    for i, r in enumerate(results):
        assert r[0] == single[i][0], (i, r[0], single[i][0])
    # All eight were sent at once and each decodes for many steps: decoded together, most steps
    # carry several of them. One after another (a server that serialises), none would.
    shortest = min(r[1] for r in results)
    assert peak >= len(PROMPTS) // 2, f"at most {peak} sequences in one decode step"
    assert batched >= shortest // 2, (
        f"only {batched} decode steps carried more than one sequence "
        f"(the shortest stream alone took {shortest})"
    )
    agg = sum(r[1] for r in results) / wall
    print(
        f"ok concurrency tokens={sum(r[1] for r in results)} batched_steps={batched:.0f} "
        f"peak_batch={peak:.0f} single_stream_tok_s={single_rate:.2f} "
        f"aggregate_8_streams_tok_s={agg:.2f}"
    )
    # Throughput is a benchmark figure (scripts/bench), never asserted: CI machines are loaded.


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
        # Freed at the next engine step; a loaded machine may take long over a step.
        assert time.monotonic() - t0 < 120.0, "sequence still active 2 min after the client left"
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


def check_logprobs():
    """logprobs / top_logprobs, streamed and not: at temperature 0 each position's top-1 token is
    the token generated, the tokens spell the content, and both ways agree."""
    prompt = "Name three colours of the rainbow."
    r = greedy_chat(prompt, max_tokens=16, logprobs=True, top_logprobs=5)
    c = r.choices[0]
    entries = c.logprobs.content
    assert len(entries) == r.usage.completion_tokens, (len(entries), r.usage)
    for e in entries:
        assert len(e.top_logprobs) == 5, e
        assert e.top_logprobs[0].token == e.token and abs(e.top_logprobs[0].logprob - e.logprob) < 1e-6, e
        assert e.logprob <= 0 and all(a.logprob >= b.logprob for a, b in zip(e.top_logprobs, e.top_logprobs[1:])), e
        assert bytes(e.bytes).decode("utf-8", "replace") == e.token, e
    assert b"".join(bytes(e.bytes) for e in entries).decode().strip() == c.message.content.strip(), (entries, c.message.content)
    streamed = []
    text = ""
    for chunk in greedy_chat(prompt, max_tokens=16, stream=True, logprobs=True, top_logprobs=5):
        for ch in chunk.choices:
            text += ch.delta.content or ""
            if ch.logprobs and ch.logprobs.content:
                streamed.extend(ch.logprobs.content)
    assert text == c.message.content, (text, c.message.content)
    assert [e.token for e in streamed] == [e.token for e in entries]
    assert all(abs(a.logprob - b.logprob) < 1e-4 for a, b in zip(streamed, entries))
    plain = greedy_chat(prompt, max_tokens=16)
    assert plain.choices[0].logprobs is None and plain.choices[0].message.content == c.message.content
    # No alternatives asked: the chosen token only.
    r = greedy_chat(prompt, max_tokens=4, logprobs=True)
    assert all(e.top_logprobs == [] for e in r.choices[0].logprobs.content), r
    # The legacy completions shape.
    comp = client.completions.create(model=MODEL, prompt="def add(a, b):", max_tokens=8, temperature=0, logprobs=3)
    lp = comp.choices[0].logprobs
    assert "".join(lp.tokens) == comp.choices[0].text and len(lp.top_logprobs) == len(lp.tokens), lp
    assert all(max(t, key=t.get) == tok for t, tok in zip(lp.top_logprobs, lp.tokens)), lp
    print("ok logprobs", len(entries), "tokens, first", repr(entries[0].token), round(entries[0].logprob, 4))


def check_n():
    """n=3: three choices from one prompt, identical at temperature 0, the prompt counted once;
    seeded sampling gives choices of their own, reproducibly."""
    prompt = "Write a haiku about the sea."
    one = greedy_chat(prompt, max_tokens=12)
    three = greedy_chat(prompt, max_tokens=12, n=3)
    assert [c.index for c in three.choices] == [0, 1, 2], three
    texts = {c.message.content for c in three.choices}
    assert texts == {one.choices[0].message.content}, (texts, one.choices[0].message.content)
    assert three.usage.prompt_tokens == one.usage.prompt_tokens, (three.usage, one.usage)
    assert three.usage.completion_tokens == 3 * one.usage.completion_tokens, (three.usage, one.usage)
    streamed = {0: "", 1: "", 2: ""}
    finishes = {}
    usage = None
    for chunk in greedy_chat(prompt, max_tokens=12, n=3, stream=True, stream_options={"include_usage": True}):
        if chunk.usage is not None:
            usage = chunk.usage
        for c in chunk.choices:
            streamed[c.index] += c.delta.content or ""
            if c.finish_reason:
                finishes[c.index] = c.finish_reason
    assert set(streamed.values()) == texts and len(finishes) == 3, (streamed, finishes)
    assert usage.prompt_tokens == one.usage.prompt_tokens, usage
    sample = lambda: client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": prompt}], temperature=1.0, seed=7, max_tokens=12, n=3
    )
    a, b = sample(), sample()
    ta = [c.message.content for c in a.choices]
    assert ta == [c.message.content for c in b.choices], "a seeded request is reproducible"
    assert len(set(ta)) > 1, ("seeded choices should differ", ta)
    print("ok n", len(texts), "distinct greedy text;", len(set(ta)), "distinct sampled")


def tool_turn(messages, **kw):
    """One greedy tool turn, non-streamed and streamed (reassembled by index as SDK users do).
    Returns two (finish_reason, content, [(id, name, arguments)], completion_tokens)."""
    kw = dict(model=MODEL, messages=messages, tools=TOOLS, temperature=0, **kw)
    r = client.chat.completions.create(**kw)
    c = r.choices[0]
    calls = [(t.id, t.function.name, t.function.arguments) for t in c.message.tool_calls or []]
    whole = (c.finish_reason, c.message.content or None, calls, r.usage.completion_tokens)
    acc, content, finish, tokens = {}, "", None, None
    for chunk in client.chat.completions.create(stream=True, stream_options={"include_usage": True}, **kw):
        if chunk.usage is not None:
            tokens = chunk.usage.completion_tokens
        for ch in chunk.choices:
            finish = ch.finish_reason or finish
            content += ch.delta.content or ""
            for tc in ch.delta.tool_calls or []:
                e = acc.setdefault(tc.index, {"id": None, "name": "", "args": ""})
                e["id"] = tc.id or e["id"]
                e["name"] += (tc.function and tc.function.name) or ""
                e["args"] += (tc.function and tc.function.arguments) or ""
    streamed = [(e["id"], e["name"], e["args"]) for _, e in sorted(acc.items())]
    return whole, (finish, content or None, streamed, tokens)


def is_json_object(text):
    try:
        return isinstance(json.loads(text), dict)
    except ValueError:
        return False


def check_toolsemantics():
    one = [{"role": "user", "content": "What is the weather in Paris? Use the tool."}]
    named = {"type": "function", "function": {"name": "get_weather"}}
    # A named tool_choice: exactly one call of that function, and the turn ends there (with
    # parallel calls allowed, which alone lets this model repeat the call: see below).
    whole, streamed = tool_turn(one, tool_choice=named, max_tokens=64)
    assert whole == streamed, ("named: streamed and not differ", whole, streamed)
    finish, _, calls, full_tokens = whole
    assert finish == "tool_calls" and len(calls) == 1, whole
    assert calls[0][1] == "get_weather" and is_json_object(calls[0][2]), whole
    assert full_tokens < 64, whole
    full_args = calls[0][2]
    # `parallel_tool_calls: false` is one call as well.
    whole, streamed = tool_turn(one, tool_choice="required", parallel_tool_calls=False, max_tokens=64)
    assert whole == streamed and whole[0] == "tool_calls" and len(whole[2]) == 1, (whole, streamed)
    # max_tokens cutting inside the call: `length`, and the call keeps only the arguments the
    # model wrote (a prefix of the full ones), never made-up ones; streamed and not agree.
    cut_inside = 0
    for max_tokens in (full_tokens - 6, full_tokens - 4):
        whole, streamed = tool_turn(one, tool_choice=named, max_tokens=max_tokens)
        assert whole == streamed, ("cut: streamed and not differ", max_tokens, whole, streamed)
        finish, _, calls, tokens = whole
        assert finish == "length" and tokens == max_tokens, whole
        for _, name, args in calls:
            assert name == "get_weather" and full_args.startswith(args), (max_tokens, whole, full_args)
            cut_inside += args != full_args and not is_json_object(args)
    assert cut_inside, ("no cut landed inside the arguments", full_tokens, full_args)
    # Parallel calls allowed, and a model that repeats the same call: bounded by max_tokens, and
    # the finish says why it stopped (`length` exactly when the budget cut it).
    budget = 2 * full_tokens
    whole, streamed = tool_turn(one, tool_choice="required", max_tokens=budget)
    assert whole == streamed, ("parallel: streamed and not differ", whole, streamed)
    finish, _, calls, tokens = whole
    assert tokens <= budget and calls, whole
    assert finish == ("length" if tokens == budget else "tool_calls"), whole
    done = calls if finish == "tool_calls" else calls[:-1]
    assert all(n == "get_weather" and is_json_object(a) for _, n, a in done), whole
    print("ok toolsemantics", json.dumps({"named": full_args, "parallel": [finish, len(calls), tokens]}))


def auto_turn(prompt, tools, **kw):
    """One greedy turn, non-streamed and streamed (reassembled by index): two
    (finish_reason, content, [(id, name, arguments)])."""
    kw = dict(model=MODEL, messages=[{"role": "user", "content": prompt}], temperature=0, **kw)
    if tools is not None:
        kw["tools"] = tools
    r = client.chat.completions.create(**kw)
    c = r.choices[0]
    calls = [(t.id, t.function.name, t.function.arguments) for t in c.message.tool_calls or []]
    whole = (c.finish_reason, c.message.content or None, calls)
    acc, content, finish = {}, "", None
    for chunk in client.chat.completions.create(stream=True, **kw):
        for ch in chunk.choices:
            finish = ch.finish_reason or finish
            content += ch.delta.content or ""
            for tc in ch.delta.tool_calls or []:
                e = acc.setdefault(tc.index, {"id": None, "name": "", "args": ""})
                e["id"] = tc.id or e["id"]
                e["name"] += (tc.function and tc.function.name) or ""
                e["args"] += (tc.function and tc.function.arguments) or ""
    streamed = [(e["id"], e["name"], e["args"]) for _, e in sorted(acc.items())]
    return whole, (finish, content or None, streamed)


def ollama_turn(prompt, tools):
    """The same turn through the official `ollama` client, non-streamed and streamed: two
    (content, [(name, arguments as an object)])."""
    import ollama

    oc = ollama.Client(host=BASE)
    kw = dict(model=MODEL, messages=[{"role": "user", "content": prompt}], options={"temperature": 0})
    if tools is not None:
        kw["tools"] = tools
    r = oc.chat(**kw)
    whole = (r.message.content or None, [(t.function.name, dict(t.function.arguments)) for t in r.message.tool_calls or []])
    content, calls = "", []
    for part in oc.chat(stream=True, **kw):
        content += part.message.content or ""
        calls += [(t.function.name, dict(t.function.arguments)) for t in part.message.tool_calls or []]
    return whole, (content or None, calls)


def check_tolerant():
    """Calls written without the template's markup (`tool_choice: auto`). With a cases file (a
    scripted model replaying each form): every form is the expected calls, streamed and not, through
    the openai and ollama clients, and without tools (or with `tool_choice: none`) the same text
    is content byte for byte. Without one (the real model): a call it writes is the same streamed
    and not."""
    if len(sys.argv) > 4:
        spec = json.load(open(sys.argv[4]))
        tools = spec["tools"]
        for case in spec["cases"]:
            prompt, text = case["prompt"], case["text"]
            want = [tuple(c) for c in case["calls"]]
            whole, streamed = auto_turn(prompt, tools)
            assert whole == streamed, ("streamed and not differ", text, whole, streamed)
            finish, content, calls = whole
            assert finish == "tool_calls", (text, whole)
            assert [(n, a) for _, n, a in calls] == want, (text, calls, want)
            assert content == case["content"], (text, content)
            o_whole, o_streamed = ollama_turn(prompt, tools)
            assert o_whole == o_streamed, ("ollama: streamed and not differ", text, o_whole, o_streamed)
            assert o_whole[1] == [(n, json.loads(a)) for n, a in want], (text, o_whole)
            for kw in ({}, {"tool_choice": "none"}):
                plain, plain_streamed = auto_turn(prompt, tools if kw else None, **kw)
                assert plain == plain_streamed == ("stop", text, []), (kw, text, plain, plain_streamed)
            assert ollama_turn(prompt, None)[0] == (text, []), text
        print("ok tolerant", len(spec["cases"]), "forms")
        return
    prompt = "Is it raining in Tokyo at the moment?"
    whole, streamed = auto_turn(prompt, TOOLS, tool_choice="auto", max_tokens=64)
    assert whole == streamed, ("streamed and not differ", whole, streamed)
    finish, content, calls = whole
    assert finish == "tool_calls" and calls and calls[0][1] == "get_weather", whole
    assert is_json_object(calls[0][2]) and "Tokyo" in calls[0][2], whole
    print("ok tolerant", json.dumps(calls))


def check_root():
    """The OpenAI routes also answer at the server's root (a `base_url` without `/v1`, as
    llama.cpp's own tests of this package and several editor plugins configure it)."""
    root = openai.OpenAI(base_url=BASE, api_key="unused", max_retries=0, timeout=300)
    ids = [m.id for m in root.models.list()]
    assert MODEL in ids, ids
    assert root.models.retrieve(MODEL).id == MODEL
    ask = [{"role": "user", "content": "What is the capital of France? Answer in one word."}]
    r = root.chat.completions.create(model=MODEL, messages=ask, temperature=0, max_tokens=8)
    whole = r.choices[0].message.content
    streamed = "".join(
        c.choices[0].delta.content or ""
        for c in root.chat.completions.create(
            model=MODEL, messages=ask, temperature=0, max_tokens=8, stream=True
        )
        if c.choices
    )
    assert "Paris" in whole and streamed == whole, (whole, streamed)
    # Errors keep OpenAI's shape at the root too.
    try:
        root.chat.completions.create(model="no-such-model", messages=ask)
        raise AssertionError("an unknown model was accepted")
    except openai.NotFoundError as e:
        assert e.body["code"] == "model_not_found", e.body
    print("ok root", json.dumps(whole))


for name in sys.argv[3:4]:
    globals()["check_" + name]()
