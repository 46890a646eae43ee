"""Soak test of a Berth server: many clients, every API, for a long time; nothing lost, nothing leaks.

Run by `scripts/load-test --soak` (which starts `berth serve` on the real Qwen2.5-Coder 0.5B pack
and, beside it, the tiny random-weight LFM2-VL pack of scripts/lib/tiny_vision_pack.py, and passes
the server's pid and the vision pack's name). Three phases:

1. Reference: every distinct greedy request of the mix (REQUESTS, 25 of them, and with a vision
   pack the 3 of vision_requests) is sent once, alone, and its answer reduced to a canonical form
   (text, tool calls with their arguments, finish reason, logprob tokens, each choice of n > 1).
2. Load: CLIENTS asyncio clients (httpx) loop over the mix for DURATION seconds: streamed and
   non-streamed chat, tool calls (`tool_choice` auto and required), `json_schema`, n > 1,
   logprobs, the Responses, Anthropic Messages and Ollama chat routes, sampled requests, streams
   the client closes after a few chunks (cancellations) and requests that must be refused (4xx).
   With --vision-model, images too: OpenAI chat with a PNG as a base64 data URL (streamed and
   not), Ollama chat with a JPEG in `images`, and a corrupt PNG that both routes must refuse.
   Every greedy answer must equal its reference; every other request must succeed.
3. Drain: in-flight requests finish; then the server must come back to rest (no queued or active
   sequences, open fds back to where they were).

A sampler reads the server's RSS and RssAnon, threads (/proc/PID/status), open fds (/proc/PID/fd)
and queue depth / active sequences / KV-cache use / loaded models (/metrics) every
--sample-interval seconds into OUT.csv, plots them to OUT.png and writes OUT.json and OUT.md. The
musts (exit 1 if any fails): 0 errors, 0 mismatched greedy answers, every refused request a 4xx,
no 5xx in the server's own counters, RSS growth after warm-up < 5 % (the median RSS over the last
minute of the load against the median over the first minute after the warm-up; peaks and the RSS
at rest are reported beside it), the queue drained, open fds back within 8 of their count before
the load, and with a vision pack both packs loaded in every sample from the start of the load to
its drain (/metrics' berth_loaded_models >= 2): the image requests must not evict the pack the
rest of the mix needs.

Without --vision-model no image requests are sent; the report says so and why (--no-vision: the
tiny pack could not be built, or the server is not the one scripts/load-test started).

Usage: soak.py --url BASE_URL --pid PID --out PREFIX [--clients 256] [--duration 600]
               [--warmup 60] [--sample-interval 3] [--settings TEXT]
               [--vision-model NAME | --no-vision WHY]
"""
import argparse
import asyncio
import base64
import csv
import json
import math
import os
import platform
import sys
import time

import httpx

MODEL = "qwen2.5-coder:0.5b"
WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Current weather for a city.",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}, "unit": {"type": "string", "enum": ["c", "f"]}},
            "required": ["city"],
        },
    },
}
PERSON_SCHEMA = {
    "type": "object",
    "properties": {"name": {"type": "string"}, "age": {"type": "integer"}},
    "required": ["name", "age"],
    "additionalProperties": False,
}


def user(text):
    """One user message in the OpenAI / Anthropic / Ollama shape."""
    return [{"role": "user", "content": text}]


def chat(prompt, stream, max_tokens=32, model=MODEL, **extra):
    """A greedy /v1/chat/completions body (prompt: text, or content parts)."""
    body = {"model": model, "messages": user(prompt), "temperature": 0, "max_tokens": max_tokens, "stream": stream}
    if stream:
        body["stream_options"] = {"include_usage": True}
    body.update(extra)
    return body


def req(kind, path, body, api, stream, greedy=True, expect="ok"):
    """One request of the mix: what to send, how to read it, what it must give."""
    return {"kind": kind, "path": path, "body": body, "api": api, "stream": stream, "greedy": greedy, "expect": expect}


# The greedy requests: each is answered once alone (the reference), then many times under load.
REQUESTS = [
    req("chat_stream", "/v1/chat/completions", chat("Write a Python function that reverses a string.", True), "openai", True),
    req("chat_stream", "/v1/chat/completions", chat("What does the Rust borrow checker prevent?", True), "openai", True),
    req("chat_stream", "/v1/chat/completions", chat("Write a SQL query that counts orders per customer.", True), "openai", True),
    req("chat_stream", "/v1/chat/completions", chat("Explain what a mutex is to a beginner.", True), "openai", True),
    req("chat", "/v1/chat/completions", chat("What is the difference between TCP and UDP?", False), "openai", False),
    req("chat", "/v1/chat/completions", chat("Write a Go function that sums a slice of ints.", False), "openai", False),
    req("chat", "/v1/chat/completions", chat("Name two uses of a hash map.", False), "openai", False),
    req("tools_auto", "/v1/chat/completions",
        chat("What's the weather in Paris right now?", False, 48, tools=[WEATHER_TOOL], tool_choice="auto"), "openai", False),
    req("tools_auto", "/v1/chat/completions",
        chat("What does a weather API usually return? One sentence.", False, 48, tools=[WEATHER_TOOL], tool_choice="auto"),
        "openai", False),
    req("tools_auto", "/v1/chat/completions",
        chat("Is it raining in Berlin?", True, 48, tools=[WEATHER_TOOL], tool_choice="auto"), "openai", True),
    req("tools_required", "/v1/chat/completions",
        chat("Check the weather in Tokyo.", False, 48, tools=[WEATHER_TOOL], tool_choice="required"), "openai", False),
    req("tools_required", "/v1/chat/completions",
        chat("I am flying to Lima tomorrow.", True, 48, tools=[WEATHER_TOOL], tool_choice="required"), "openai", True),
    req("json_schema", "/v1/chat/completions",
        chat("Invent a person; give their name and age.", False, 48,
             response_format={"type": "json_schema", "json_schema": {"name": "person", "schema": PERSON_SCHEMA}}),
        "openai", False),
    req("json_schema", "/v1/chat/completions",
        chat("Describe a famous scientist as JSON with name and age.", True, 48,
             response_format={"type": "json_schema", "json_schema": {"name": "person", "schema": PERSON_SCHEMA}}),
        "openai", True),
    req("n_choices", "/v1/chat/completions", chat("Give three tips for writing readable code.", False, n=2), "openai", False),
    req("n_choices", "/v1/chat/completions", chat("What is recursion? Give a tiny example.", True, n=3), "openai", True),
    req("logprobs", "/v1/chat/completions",
        chat("What is the time complexity of binary search and why?", False, logprobs=True, top_logprobs=2), "openai", False),
    req("logprobs", "/v1/chat/completions",
        chat("Write a C function that returns the length of a string.", True, logprobs=True, top_logprobs=2), "openai", True),
    req("responses", "/v1/responses",
        {"model": MODEL, "input": "What is a closure in JavaScript? One paragraph.", "temperature": 0,
         "max_output_tokens": 32, "store": False}, "responses", False),
    req("responses", "/v1/responses",
        {"model": MODEL, "input": "Write a bash one-liner that counts lines in all .py files.", "temperature": 0,
         "max_output_tokens": 32, "stream": True, "store": False}, "responses", True),
    req("anthropic", "/v1/messages",
        {"model": MODEL, "messages": user("Explain the difference between a list and a tuple in Python."),
         "temperature": 0, "max_tokens": 32}, "anthropic", False),
    req("anthropic", "/v1/messages",
        {"model": MODEL, "messages": user("Write a regular expression that matches an email address."),
         "temperature": 0, "max_tokens": 32, "stream": True}, "anthropic", True),
    req("anthropic", "/v1/messages",
        {"model": MODEL, "messages": user("What's the weather like in Oslo?"), "temperature": 0, "max_tokens": 48,
         "stream": True, "tool_choice": {"type": "auto"},
         "tools": [{"name": "get_weather", "description": "Current weather for a city.",
                    "input_schema": WEATHER_TOOL["function"]["parameters"]}]}, "anthropic", True),
    req("ollama_chat", "/api/chat",
        {"model": MODEL, "messages": user("Write a Python list comprehension for the squares of 1 to 10."),
         "stream": False, "options": {"temperature": 0, "num_predict": 32}}, "ollama", False),
    req("ollama_chat", "/api/chat",
        {"model": MODEL, "messages": user("Write a Python function that checks for a palindrome."),
         "stream": True, "options": {"temperature": 0, "num_predict": 32}}, "ollama", True),
]

# Requests whose answer is not compared: sampled choices, and streams the client abandons.
OTHER = [
    req("sampled", "/v1/chat/completions",
        {"model": MODEL, "messages": user("Name a fruit and a colour."), "temperature": 0.8, "max_tokens": 24, "n": 2},
        "openai", False, greedy=False),
    req("sampled", "/api/chat",
        {"model": MODEL, "messages": user("Say something kind."), "stream": True,
         "options": {"temperature": 0.9, "num_predict": 24}}, "ollama", True, greedy=False),
    req("cancel", "/v1/chat/completions", chat("Write a long essay about the history of computing.", True, 400),
        "openai", True, greedy=False, expect="cancel"),
    req("cancel", "/v1/messages",
        {"model": MODEL, "messages": user("Tell a long story about a lighthouse keeper."), "max_tokens": 400,
         "stream": True}, "anthropic", True, greedy=False, expect="cancel"),
    req("cancel", "/api/chat",
        {"model": MODEL, "messages": user("List every prime below a thousand."), "stream": True,
         "options": {"num_predict": 400}}, "ollama", True, greedy=False, expect="cancel"),
    req("cancel", "/v1/responses",
        {"model": MODEL, "input": "Write a long poem about the sea.", "max_output_tokens": 400, "stream": True,
         "store": False}, "responses", True, greedy=False, expect="cancel"),
]

# Requests that must be refused with a 4xx in the route's own error shape (bytes: sent as is).
REFUSED = [
    req("refused", "/v1/chat/completions", b'{"model": "qwen2.5-coder:0.5b", "messages": [', "openai", False, False, "4xx"),
    req("refused", "/v1/chat/completions", {"model": "no-such-model:1b", "messages": user("hi")}, "openai", False, False, "4xx"),
    req("refused", "/v1/chat/completions", {"model": MODEL, "messages": user("hi"), "n": 0}, "openai", False, False, "4xx"),
    req("refused", "/v1/chat/completions", {"model": MODEL, "messages": "hi", "temperature": 9}, "openai", False, False, "4xx"),
    req("refused", "/v1/responses", b'{"model": 5, "input": }', "responses", False, False, "4xx"),
    req("refused", "/v1/responses", {"model": "no-such-model:1b", "input": "hi"}, "responses", False, False, "4xx"),
    req("refused", "/v1/messages", {"model": MODEL, "messages": user("hi")}, "anthropic", False, False, "4xx"),
    req("refused", "/v1/messages", {"model": "no-such-model:1b", "max_tokens": 8, "messages": user("hi")},
        "anthropic", False, False, "4xx"),
    req("refused", "/api/chat", b'{"model": "qwen2.5-coder:0.5b", "messages": [{"role": "user", "content": 3}]}',
        "ollama", False, False, "4xx"),
    req("refused", "/api/chat", {"model": "no-such-model:1b", "messages": user("hi")}, "ollama", False, False, "4xx"),
]

IMAGES = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "fixtures", "images")
# The images sent (tests/fixtures/images): 64x48, a few kB, so that the requests measure serving,
# not decoding; and one whose bytes are not an image.
IMAGE_PNG, IMAGE_JPG, IMAGE_CORRUPT = "fmt.png", "fmt.jpg", "corrupt.png"


def image_b64(name):
    """A fixture image's bytes in base64."""
    with open(os.path.join(IMAGES, name), "rb") as f:
        return base64.b64encode(f.read()).decode()


def image_parts(name, text):
    """OpenAI content parts: the image as a data URL, then the text (as Ollama orders them)."""
    url = f"data:image/png;base64,{image_b64(name)}"
    return [{"type": "image_url", "image_url": {"url": url}}, {"type": "text", "text": text}]


def vision_requests(model):
    """The image requests for the vision pack `model`: (greedy, refused). Its random weights answer
    gibberish, but greedily and the same whatever else the batch holds, so the answers are
    compared like the others'; 16 tokens keep the pack's share of the load small."""
    def ollama(image):
        return {"model": model, "stream": False, "options": {"temperature": 0, "num_predict": 16},
                "messages": [{"role": "user", "content": "Describe this photo.", "images": [image_b64(image)]}]}

    greedy = [
        req("image_chat", "/v1/chat/completions",
            chat(image_parts(IMAGE_PNG, "What is in this picture?"), False, 16, model), "openai", False),
        req("image_chat_stream", "/v1/chat/completions",
            chat(image_parts(IMAGE_PNG, "Describe the colours of this image."), True, 16, model), "openai", True),
        req("image_ollama_chat", "/api/chat", ollama(IMAGE_JPG), "ollama", False),
    ]
    refused = [
        req("image_refused", "/v1/chat/completions",
            chat(image_parts(IMAGE_CORRUPT, "What is in this picture?"), False, 16, model), "openai", False, False, "4xx"),
        req("image_refused", "/api/chat", ollama(IMAGE_CORRUPT), "ollama", False, False, "4xx"),
    ]
    return greedy, refused


def schedule(images):
    """The order each client cycles through (the clients start spread evenly over it):
    cancellations, refusals and the image requests (`images`, in turn) are spread among the greedy
    requests."""
    out = []
    for i, r in enumerate(REQUESTS):
        out.append(r)
        if i % 3 == 0:
            out.append(OTHER[(i // 3) % len(OTHER)])
        if i % 3 == 1 and images:
            out.append(images[(i // 3) % len(images)])
        if i % 2 == 0:
            out.append(REFUSED[(i // 2) % len(REFUSED)])
    return out


def error_shape_ok(api, data):
    """Whether a refusal body has the route's own error shape."""
    if api in ("openai", "responses"):
        return isinstance(data.get("error"), dict) and isinstance(data["error"].get("message"), str)
    if api == "anthropic":
        return data.get("type") == "error" and isinstance(data.get("error"), dict)
    return isinstance(data.get("error"), str)


def canon_args(text):
    """Tool-call arguments as written (a JSON string), normalised when they parse."""
    try:
        return json.dumps(json.loads(text), sort_keys=True)
    except (TypeError, ValueError):
        return text


def read_openai(data):
    """A chat completion -> (canonical choices, completion tokens)."""
    out = []
    for c in sorted(data["choices"], key=lambda c: c["index"]):
        m = c["message"]
        calls = [(t["function"]["name"], canon_args(t["function"]["arguments"])) for t in m.get("tool_calls") or []]
        lp = [e["token"] for e in ((c.get("logprobs") or {}).get("content") or [])]
        out.append({"content": m.get("content") or "", "calls": calls, "finish": c["finish_reason"], "logprob_tokens": lp})
    return out, (data.get("usage") or {}).get("completion_tokens", 0)


def read_responses(data):
    """A Responses object -> (canonical output, output tokens)."""
    items = []
    for it in data.get("output", []):
        if it["type"] == "message":
            items.append(["text", "".join(p.get("text", "") for p in it["content"])])
        elif it["type"] == "function_call":
            items.append(["call", it["name"], canon_args(it["arguments"])])
    return {"items": items, "status": data["status"]}, (data.get("usage") or {}).get("output_tokens", 0)


def read_anthropic(data):
    """An Anthropic message -> (canonical content, output tokens)."""
    blocks = []
    for b in data["content"]:
        if b["type"] == "text":
            blocks.append(["text", b["text"]])
        elif b["type"] == "tool_use":
            blocks.append(["tool_use", b["name"], json.dumps(b["input"], sort_keys=True)])
    return {"blocks": blocks, "stop": data["stop_reason"]}, (data.get("usage") or {}).get("output_tokens", 0)


def read_ollama(data):
    """An Ollama chat reply -> (canonical message, eval tokens)."""
    m = data["message"]
    calls = [[t["function"]["name"], json.dumps(t["function"]["arguments"], sort_keys=True)] for t in m.get("tool_calls") or []]
    return {"content": m.get("content", ""), "calls": calls, "done_reason": data.get("done_reason")}, data.get("eval_count", 0)


class Problem(Exception):
    """A request that did not give what it must."""


async def events(resp, api):
    """The parsed events of a streamed response (SSE data lines or Ollama's NDJSON lines)."""
    async for line in resp.aiter_lines():
        if api == "ollama":
            if line.strip():
                yield json.loads(line)
        elif line.startswith("data:"):
            payload = line[5:].strip()
            if payload == "[DONE]":
                return
            yield json.loads(payload)


async def read_stream(resp, api):
    """A whole streamed response -> (canonical answer as the non-streamed reader gives it, tokens)."""
    if api == "openai":
        choices, tokens = {}, 0
        async for ev in events(resp, api):
            if ev.get("usage"):
                tokens = ev["usage"]["completion_tokens"]
            for c in ev.get("choices", []):
                ch = choices.setdefault(c["index"], {"content": "", "calls": {}, "finish": None, "logprob_tokens": []})
                d = c.get("delta") or {}
                ch["content"] += d.get("content") or ""
                for t in d.get("tool_calls") or []:
                    call = ch["calls"].setdefault(t["index"], ["", ""])
                    f = t.get("function") or {}
                    call[0] += f.get("name") or ""
                    call[1] += f.get("arguments") or ""
                ch["logprob_tokens"] += [e["token"] for e in ((c.get("logprobs") or {}).get("content") or [])]
                ch["finish"] = c.get("finish_reason") or ch["finish"]
        out = []
        for i in sorted(choices):
            ch = choices[i]
            ch["calls"] = [(n, canon_args(a)) for _, (n, a) in sorted(ch["calls"].items())]
            if ch["finish"] is None:
                raise Problem("stream ended without finish_reason")
            out.append(ch)
        return out, tokens
    if api == "responses":
        text, final = "", None
        async for ev in events(resp, api):
            if ev["type"] == "response.output_text.delta":
                text += ev["delta"]
            elif ev["type"] in ("response.completed", "response.incomplete", "response.failed"):
                final = ev["response"]
        if final is None:
            raise Problem("Responses stream ended without response.completed")
        answer, tokens = read_responses(final)
        if text != "".join(i[1] for i in answer["items"] if i[0] == "text"):
            raise Problem("Responses stream deltas differ from its final response")
        return answer, tokens
    if api == "anthropic":
        blocks, stop, tokens, stopped = {}, None, 0, False
        async for ev in events(resp, api):
            t = ev["type"]
            if t == "content_block_start":
                b = ev["content_block"]
                blocks[ev["index"]] = ["text", ""] if b["type"] == "text" else [b["type"], b.get("name", ""), ""]
            elif t == "content_block_delta":
                d = ev["delta"]
                if d["type"] == "text_delta":
                    blocks[ev["index"]][1] += d["text"]
                elif d["type"] == "input_json_delta":
                    blocks[ev["index"]][2] += d["partial_json"]
            elif t == "message_delta":
                stop = ev["delta"].get("stop_reason")
                tokens = (ev.get("usage") or {}).get("output_tokens", 0)
            elif t == "message_stop":
                stopped = True
            elif t == "error":
                raise Problem(f"Anthropic error event: {ev}")
        if not stopped:
            raise Problem("Anthropic stream ended without message_stop")
        out = []
        for i in sorted(blocks):
            b = blocks[i]
            if b[0] == "tool_use":
                out.append(["tool_use", b[1], json.dumps(json.loads(b[2] or "{}"), sort_keys=True)])
            elif b[0] == "text":
                out.append(b)
        return {"blocks": out, "stop": stop}, tokens
    content, calls, last = "", [], None
    async for ev in events(resp, api):
        if "error" in ev:
            raise Problem(f"Ollama error line: {ev}")
        m = ev.get("message") or {}
        content += m.get("content", "")
        calls += [[t["function"]["name"], json.dumps(t["function"]["arguments"], sort_keys=True)] for t in m.get("tool_calls") or []]
        last = ev
    if not last or not last.get("done"):
        raise Problem("Ollama stream ended without done")
    return {"content": content, "calls": calls, "done_reason": last.get("done_reason")}, last.get("eval_count", 0)


READERS = {"openai": read_openai, "responses": read_responses, "anthropic": read_anthropic, "ollama": read_ollama}


async def send(client, r):
    """Sends one request of the mix; returns (canonical answer or None, tokens, refused-as-expected)."""
    body = r["body"]
    kw = {"content": body, "headers": {"content-type": "application/json"}} if isinstance(body, bytes) else {"json": body}
    if r["expect"] == "4xx":
        resp = await client.post(r["path"], **kw)
        if not 400 <= resp.status_code < 500:
            raise Problem(f"refusal expected, got {resp.status_code}: {resp.text[:200]}")
        if not error_shape_ok(r["api"], resp.json()):
            raise Problem(f"refusal {resp.status_code} not in the {r['api']} error shape: {resp.text[:200]}")
        return None, 0, True
    if not r["stream"]:
        resp = await client.post(r["path"], **kw)
        if resp.status_code != 200:
            raise Problem(f"HTTP {resp.status_code}: {resp.text[:300]}")
        answer, tokens = READERS[r["api"]](resp.json())
        return answer, tokens, False
    async with client.stream("POST", r["path"], **kw) as resp:
        if resp.status_code != 200:
            await resp.aread()
            raise Problem(f"HTTP {resp.status_code}: {resp.text[:300]}")
        if r["expect"] == "cancel":
            # Read a few events, then leave: closing an unfinished response closes the connection,
            # which the server must notice and free the sequence.
            seen = 0
            async for _ in events(resp, r["api"]):
                seen += 1
                if seen >= 3:
                    break
            if seen < 3:
                raise Problem(f"stream to cancel ended after {seen} events")
            return None, 0, False
        answer, tokens = await read_stream(resp, r["api"])
        return answer, tokens, False


def label(r):
    """A short name for a request in problem lines."""
    b = r["body"]
    if isinstance(b, bytes):
        return f"{r['kind']} {r['path']} (raw body)"
    text = b.get("input") or (b.get("messages") or [{}])[0].get("content")
    if isinstance(text, list):  # content parts: their text, not an image's base64
        text = " ".join(p.get("text", f"[{p['type']}]") for p in text)
    return f"{r['kind']} {r['path']} stream={r['stream']} {str(text)[:48]!r}"


def parse_metrics(text):
    """Prometheus text -> {name or name{labels}: value}."""
    out = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            key, _, value = line.rpartition(" ")
            try:
                out[key] = float(value)
            except ValueError:
                pass
    return out


def server_5xx(metrics):
    """Sum of berth_requests_total over 5xx statuses."""
    return sum(v for k, v in metrics.items() if k.startswith("berth_requests_total{") and 'status="5' in k)


def median(values):
    """The median of a non-empty list."""
    v = sorted(values)
    return (v[(len(v) - 1) // 2] + v[len(v) // 2]) / 2


def slope(rows, key):
    """Least-squares slope of rows[key] over rows["t"] (per second)."""
    n = len(rows)
    mt = sum(r["t"] for r in rows) / n
    mv = sum(r[key] for r in rows) / n
    var = sum((r["t"] - mt) ** 2 for r in rows)
    return sum((r["t"] - mt) * (r[key] - mv) for r in rows) / var if var else 0.0


def proc_sample(pid):
    """RSS and RssAnon (MB), threads and open fds of the server process."""
    fields = {}
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            k, _, v = line.partition(":")
            fields[k] = v.strip()
    kb = lambda k: int(fields[k].split()[0]) / 1024  # noqa: E731 (kB -> MB)
    return {"rss_mb": round(kb("VmRSS"), 1), "rss_anon_mb": round(kb("RssAnon"), 1),
            "threads": int(fields["Threads"]), "fds": len(os.listdir(f"/proc/{pid}/fd"))}


class Soak:
    """The state of one soak run."""

    def __init__(self, args):
        self.args = args
        self.requests, self.refused, images = list(REQUESTS), list(REFUSED), []
        if args.vision_model:
            greedy, refused = vision_requests(args.vision_model)
            self.requests += greedy
            self.refused += refused
            images = greedy + refused
        self.schedule = schedule(images)
        self.refs = {}
        self.samples = []
        self.phase = "reference"
        self.t0 = time.monotonic()
        self.in_flight = 0
        self.by_kind = {}
        self.problems = []
        self.totals = {"requests": 0, "errors": 0, "mismatched": 0, "refused_as_expected": 0,
                       "cancelled": 0, "greedy_compared": 0, "tokens": 0}

    async def metrics(self, client):
        """The server's /metrics, parsed."""
        resp = await client.get("/metrics")
        resp.raise_for_status()
        return parse_metrics(resp.text)

    async def sample(self, client):
        """One row of the sampler."""
        row = {"t": round(time.monotonic() - self.t0, 1), "phase": self.phase}
        row.update(proc_sample(self.args.pid) if self.args.pid else {})
        m = await self.metrics(client)
        row["queue_depth"] = m.get("berth_queue_depth", 0)
        row["active_sequences"] = m.get("berth_active_sequences", 0)
        row["kv_cache_usage"] = round(m.get("berth_kv_cache_usage_ratio", 0), 4)
        row["generated_tokens"] = m.get("berth_generated_tokens_total", 0)
        row["loaded_models"] = m.get("berth_loaded_models", 0)
        row["client_in_flight"] = self.in_flight
        self.samples.append(row)
        return row

    async def sampler(self, client, stop):
        """Samples every --sample-interval seconds until stop is set."""
        while not stop.is_set():
            try:
                await self.sample(client)
            except Exception as e:  # a failed sample is a problem, not the end of the run
                self.problem(f"sampler: {type(e).__name__}: {e}")
            try:
                await asyncio.wait_for(stop.wait(), self.args.sample_interval)
            except asyncio.TimeoutError:
                pass

    def problem(self, line):
        """Keeps a problem line (the first 1000: enough to see what went wrong)."""
        if len(self.problems) < 1000:
            self.problems.append(line)

    def record(self, r, answer, tokens, refused, err):
        """Counts one finished request and compares a greedy answer with its reference."""
        k = self.by_kind.setdefault(r["kind"], {"requests": 0, "tokens": 0, "errors": 0, "mismatched": 0})
        k["requests"] += 1
        k["tokens"] += tokens or 0
        self.totals["requests"] += 1
        self.totals["tokens"] += tokens or 0
        if err:
            k["errors"] += 1
            self.totals["errors"] += 1
            self.problem(f"error [{self.phase} t={time.monotonic() - self.t0:.0f}s] {label(r)}: {err}")
            return
        self.totals["refused_as_expected"] += refused
        self.totals["cancelled"] += r["expect"] == "cancel"
        if r["greedy"]:
            self.totals["greedy_compared"] += 1
            ref = self.refs[id(r)]
            if answer != ref:
                k["mismatched"] += 1
                self.totals["mismatched"] += 1
                self.problem(f"mismatch {label(r)}: {json.dumps(answer)[:300]} != {json.dumps(ref)[:300]}")
        elif r["kind"] == "sampled" and r["api"] == "openai" and len(answer) != r["body"]["n"]:
            k["errors"] += 1
            self.totals["errors"] += 1
            self.problem(f"error {label(r)}: {len(answer)} choices for n={r['body']['n']}")

    async def one(self, client, r):
        """Sends one request and records it."""
        self.in_flight += 1
        try:
            answer, tokens, refused = await send(client, r)
            err = None
        except Exception as e:  # every failure is counted, none ends the run
            answer, tokens, refused, err = None, 0, False, f"{type(e).__name__}: {e}"
        finally:
            self.in_flight -= 1
        self.record(r, answer, tokens, refused, err)

    async def client_loop(self, client, k, deadline):
        """Client k: the schedule from its k-th share, until the deadline (so that a short run with
        fewer clients than the schedule has requests still sends every kind)."""
        i = k * len(self.schedule) // self.args.clients
        while time.monotonic() < deadline:
            await self.one(client, self.schedule[i % len(self.schedule)])
            i += 1

    async def run(self):
        """The three phases; returns the report."""
        a = self.args
        timeout = httpx.Timeout(a.request_timeout, connect=60)
        limits = httpx.Limits(max_connections=a.clients + 8, max_keepalive_connections=a.clients + 8)
        async with httpx.AsyncClient(base_url=a.url, timeout=60) as probe:
            stop = asyncio.Event()
            sampler = asyncio.create_task(self.sampler(probe, stop))
            m0 = await self.metrics(probe)
            async with httpx.AsyncClient(base_url=a.url, timeout=timeout, limits=limits) as client:
                # 1. References, one request at a time (this also loads the models).
                for r in self.requests:
                    answer, _, _ = await send(client, r)
                    self.refs[id(r)] = answer
                print(f"soak: {len(self.requests)} reference answers taken alone", file=sys.stderr)
                for r in self.refused:
                    await self.one(client, r)

                # 2. Load, then the requests in flight at the deadline finish (drain).
                before = await self.sample(probe)
                self.phase = "warmup"
                load_start = time.monotonic()
                deadline = load_start + a.duration

                async def mark_phases():
                    await asyncio.sleep(max(0.0, load_start + a.warmup - time.monotonic()))
                    self.phase = "load"
                    await asyncio.sleep(max(0.0, deadline - time.monotonic()))
                    self.phase = "drain"
                marker = asyncio.create_task(mark_phases())
                await asyncio.gather(*(self.client_loop(client, k, deadline) for k in range(a.clients)))
                marker.cancel()
                load_s = time.monotonic() - load_start
            # The clients' connections are closed here.

            # 3. The server at rest again (waits on state, with a deadline).
            self.phase = "rest"
            rest_deadline = time.monotonic() + 120
            while True:
                row = await self.sample(probe)
                at_rest = row["queue_depth"] == 0 and row["active_sequences"] == 0
                # Closed connections take a moment to leave the server's table: wait for them.
                fds_back = not a.pid or row["fds"] <= before["fds"] + 2
                if (at_rest and fds_back) or time.monotonic() > rest_deadline:
                    break
                await asyncio.sleep(0.5)
            m1 = await self.metrics(probe)
            stop.set()
            await sampler
        return self.report(before, row, m0, m1, load_start, load_s)

    def vision(self):
        """The report's line on images: the pack and the image requests sent, or why none were."""
        a = self.args
        if not a.vision_model:
            return f"not exercised: {a.no_vision}"
        kinds = {k: v["requests"] for k, v in sorted(self.by_kind.items()) if k.startswith("image_")}
        return (f"{sum(kinds.values())} image requests to {a.vision_model}, loaded beside {MODEL} ({IMAGE_PNG} "
                f"as a data URL, {IMAGE_JPG} as Ollama images, {IMAGE_CORRUPT} to be refused): "
                + ", ".join(f"{k} {n}" for k, n in kinds.items()))

    def report(self, before, after, m0, m1, load_start, load_s):
        """The report (dict) with its musts."""
        a = self.args
        t_load = load_start - self.t0
        warm = [s for s in self.samples if s["phase"] == "warmup"]
        load = [s for s in self.samples if s["phase"] == "load"]
        under_load = warm + load + [s for s in self.samples if s["phase"] == "drain"]
        rep = {
            "clients": a.clients, "duration_s": a.duration, "load_s": round(load_s, 1), "warmup_s": a.warmup,
            "settings": a.settings, "machine": f"{platform.machine()}, {os.cpu_count()} CPUs, load average "
            + " ".join(f"{x:.2f}" for x in os.getloadavg()) + " at the end",
            "distinct_greedy_requests": len(self.requests), "vision": self.vision(),
            "totals": self.totals, "by_kind": self.by_kind,
            "server_generated_tokens": m1.get("berth_generated_tokens_total", 0) - m0.get("berth_generated_tokens_total", 0),
            "server_5xx": server_5xx(m1) - server_5xx(m0),
            "peak_batch_sequences": m1.get("berth_peak_batch_sequences", 0),
            "max_queue_depth": max((s["queue_depth"] for s in under_load), default=0),
            "max_active_sequences": max((s["active_sequences"] for s in under_load), default=0),
            "rest_after_load": {"queue_depth": after["queue_depth"], "active_sequences": after["active_sequences"]},
            "problems": self.problems[:40],
        }
        rep["server_tokens_per_s"] = round(rep["server_generated_tokens"] / max(load_s, 1e-9), 1)
        musts = {
            "errors == 0": self.totals["errors"] == 0,
            "mismatched greedy answers == 0": self.totals["mismatched"] == 0,
            "no 5xx in the server's counters": rep["server_5xx"] == 0,
            "queue and active sequences back to 0 after the load": after["queue_depth"] == 0 and after["active_sequences"] == 0,
            "no sampler failures": not any(p.startswith("sampler") for p in self.problems),
        }
        if a.vision_model:
            # The mix needs both packs: neither may evict the other (or expire) while it runs.
            loaded = min((s["loaded_models"] for s in under_load), default=before["loaded_models"])
            rep["min_loaded_models_under_load"] = loaded
            musts["both packs loaded in every sample under load"] = loaded >= 2
        if a.pid:
            # Growth is the change of the RSS level (the median over a minute, so that one
            # sample caught on a transient peak does not decide it) from the first minute after the
            # warm-up to the last minute of the load; the peaks are reported beside it.
            window = min(60.0, a.duration / 10)
            t_warm, t_end = t_load + a.warmup, t_load + a.duration
            first = [s["rss_mb"] for s in load if s["t"] <= t_warm + window] or [before["rss_mb"]]
            last = [s["rss_mb"] for s in load if s["t"] >= t_end - window] or first
            level_first, level_last = median(first), median(last)
            growth = (level_last - level_first) / level_first * 100
            rss_warm = max(s["rss_mb"] for s in warm) if warm else before["rss_mb"]
            rss_after = max((s["rss_mb"] for s in load), default=rss_warm)
            rep["rss_mb"] = {"start": before["rss_mb"], "end_of_load": (load or warm or [before])[-1]["rss_mb"],
                             "at_rest": after["rss_mb"], "max": max(s["rss_mb"] for s in self.samples),
                             "level_first_minute_after_warmup": level_first, "level_last_minute": level_last,
                             "growth_after_warmup_pct": round(growth, 2),
                             "max_during_warmup": rss_warm, "max_after_warmup": rss_after,
                             "peak_over_warmup_peak_pct": round((rss_after - rss_warm) / rss_warm * 100, 2),
                             "at_rest_over_level_first_pct": round((after["rss_mb"] - level_first) / level_first * 100, 2)}
            rep["rss_anon_mb"] = {"start": before["rss_anon_mb"],
                                  "end_of_load": (load or warm or [before])[-1]["rss_anon_mb"],
                                  "at_rest": after["rss_anon_mb"], "max": max(s["rss_anon_mb"] for s in self.samples)}
            for key in ("fds", "threads"):
                rep[key] = {"start": before[key], "at_rest": after[key], "max": max(s[key] for s in self.samples)}
            half = load[len(load) // 2:]
            rep["rss_mb"]["trend_second_half_mb_per_min"] = round(slope(half, "rss_mb") * 60, 2) if len(half) > 2 else None
            musts["RSS growth after warm-up < 5 %"] = growth < 5
            musts["open fds back within 8 of the start"] = after["fds"] <= before["fds"] + 8
        rep["samples"] = len(self.samples)
        rep["load_started_at_s"] = round(t_load, 1)
        rep["musts"] = musts
        rep["passed"] = all(musts.values())
        return rep


def write_outputs(soak, rep, prefix):
    """OUT.csv, OUT.png, OUT.json and OUT.md."""
    rows = soak.samples
    cols = ["t", "phase", "rss_mb", "rss_anon_mb", "fds", "threads", "queue_depth", "active_sequences",
            "kv_cache_usage", "generated_tokens", "loaded_models", "client_in_flight"]
    with open(prefix + ".csv", "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=[c for c in cols if c in rows[0]], extrasaction="ignore")
        w.writeheader()
        w.writerows(rows)
    with open(prefix + ".json", "w") as f:
        json.dump(rep, f, indent=1)
        f.write("\n")
    plot(rows, rep, prefix + ".png")
    with open(prefix + ".md", "w") as f:
        f.write(markdown(rep, os.path.basename(prefix)))


def plot(rows, rep, path):
    """Three panels over time: memory, fds and threads, queue and active sequences."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    t = [r["t"] for r in rows]
    fig, axes = plt.subplots(3, 1, figsize=(8, 7.5), sharex=True, dpi=80)
    if "rss_mb" in rows[0]:
        axes[0].plot(t, [r["rss_mb"] for r in rows], label="RSS")
        axes[0].plot(t, [r["rss_anon_mb"] for r in rows], label="RssAnon")
        axes[0].set_ylim(bottom=0)
        axes[0].set_ylabel("MB")
        axes[1].plot(t, [r["fds"] for r in rows], label="open fds")
        axes[1].plot(t, [r["threads"] for r in rows], label="threads")
    axes[2].plot(t, [r["queue_depth"] for r in rows], label="queue depth")
    axes[2].plot(t, [r["active_sequences"] for r in rows], label="active sequences")
    axes[2].plot(t, [r["client_in_flight"] for r in rows], label="client requests in flight", alpha=0.6)
    axes[2].set_xlabel("seconds since start (reference pass first)")
    start = rep["load_started_at_s"]
    for ax in axes:
        ax.axvline(start, color="grey", ls="--", lw=0.8)
        ax.axvline(start + rep["warmup_s"], color="grey", ls=":", lw=0.8)
        ax.axvline(start + rep["duration_s"], color="grey", ls="--", lw=0.8)
        ax.axvline(start + rep["load_s"], color="grey", ls="-.", lw=0.8)
        ax.legend(loc="upper left", fontsize=8)
        ax.grid(alpha=0.3)
    fig.suptitle(f"berth serve soak: {rep['clients']} clients, {rep['duration_s']:.0f} s\n"
                 "dashed: load start and end; dotted: end of warm-up; dash-dot: requests in flight done", fontsize=9)
    fig.tight_layout()
    fig.savefig(path)


def markdown(rep, name):
    """The human report."""
    t = rep["totals"]
    lines = [
        f"# Soak: {rep['clients']} clients x {rep['duration_s']:.0f} s",
        "",
        f"Server settings: {rep['settings']}. Machine: {rep['machine']}.",
        f"Load {rep['duration_s']:.0f} s (warm-up {rep['warmup_s']:.0f} s), then "
        f"{rep['load_s'] - rep['duration_s']:.0f} s for the requests in flight at the deadline to finish, after a "
        f"reference pass of {rep['distinct_greedy_requests']} distinct greedy requests taken alone. "
        f"Images: {rep['vision']}.",
        "",
        "| must | |",
        "|---|---|",
    ]
    lines += [f"| {k} | {'pass' if v else '**FAIL**'} |" for k, v in rep["musts"].items()]
    lines += [
        "",
        f"Requests {t['requests']}, errors {t['errors']}, greedy answers compared {t['greedy_compared']}, "
        f"mismatched {t['mismatched']}, refused as expected {t['refused_as_expected']}, "
        f"cancelled mid-stream {t['cancelled']}. Tokens: {t['tokens']} counted by the clients from usage fields, "
        f"{rep['server_generated_tokens']:.0f} generated by the server (cancelled streams included), "
        f"{rep['server_tokens_per_s']} tokens/s. Server 5xx: {rep['server_5xx']:.0f}. "
        f"Peak queue depth {rep['max_queue_depth']:.0f}, peak active sequences {rep['max_active_sequences']:.0f}, "
        f"peak batch {rep['peak_batch_sequences']:.0f}.",
        "",
        "| kind | requests | tokens | errors | mismatched |",
        "|---|---|---|---|---|",
    ]
    lines += [f"| {k} | {v['requests']} | {v['tokens']} | {v['errors']} | {v['mismatched']} |"
              for k, v in sorted(rep["by_kind"].items())]
    if "rss_mb" in rep:
        r, ra = rep["rss_mb"], rep["rss_anon_mb"]
        lines += [
            "",
            "| process | start of load | end of load | at rest after | max |",
            "|---|---|---|---|---|",
            f"| RSS (MB) | {r['start']} | {r['end_of_load']} | {r['at_rest']} | {r['max']} |",
            f"| RssAnon (MB) | {ra['start']} | {ra['end_of_load']} | {ra['at_rest']} | {ra['max']} |",
            f"| open fds | {rep['fds']['start']} | | {rep['fds']['at_rest']} | {rep['fds']['max']} |",
            f"| threads | {rep['threads']['start']} | | {rep['threads']['at_rest']} | {rep['threads']['max']} |",
            "",
            f"RSS growth after warm-up: {r['growth_after_warmup_pct']} % (median RSS over the last minute of the "
            f"load, {r['level_last_minute']} MB, against the median over the first minute after the warm-up, "
            f"{r['level_first_minute_after_warmup']} MB). Peaks: the largest RSS after the warm-up, "
            f"{r['max_after_warmup']} MB, is {r['peak_over_warmup_peak_pct']} % above the largest during it "
            f"({r['max_during_warmup']} MB); at rest after the load, {r['at_rest']} MB, "
            f"{r['at_rest_over_level_first_pct']} % above the first level. Trend over the second half of the load "
            f"(least squares): {r['trend_second_half_mb_per_min']} MB/min.",
        ]
    lines += ["", f"![RSS, fds, threads, queue over time]({name}.png)", "",
              f"Samples: {rep['samples']} (`{name}.csv`); full figures in `{name}.json`."]
    if rep["problems"]:
        lines += ["", "Problems (first 40):", ""] + [f"- `{p}`" for p in rep["problems"]]
    return "\n".join(lines) + "\n"


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--url", required=True)
    ap.add_argument("--pid", type=int, default=0, help="the server's pid (0: sample /metrics only)")
    ap.add_argument("--out", required=True, help="path prefix of the .csv/.png/.json/.md outputs")
    ap.add_argument("--clients", type=int, default=256)
    ap.add_argument("--duration", type=float, default=600)
    ap.add_argument("--warmup", type=float, default=None, help="seconds (default 10 %% of the duration, at most 60)")
    ap.add_argument("--sample-interval", type=float, default=3)
    ap.add_argument("--request-timeout", type=float, default=900)
    ap.add_argument("--settings", default="(not given)")
    ap.add_argument("--vision-model", help="a vision pack the server holds: image requests join the mix")
    ap.add_argument("--no-vision", default="no vision pack loaded", help="why there is no --vision-model (the report)")
    args = ap.parse_args()
    if args.warmup is None:
        args.warmup = min(60.0, args.duration / 10)
    soak = Soak(args)
    rep = asyncio.run(soak.run())
    write_outputs(soak, rep, args.out)
    for p in rep["problems"][:10]:
        print("  " + p, file=sys.stderr)
    t = rep["totals"]
    rss = rep.get("rss_mb", {})
    print(f"soak: {args.clients} clients, {rep['load_s']:.0f} s, {t['requests']} requests, {t['errors']} errors, "
          f"{t['mismatched']} mismatched of {t['greedy_compared']} greedy, {t['refused_as_expected']} refused as expected, "
          f"{t['cancelled']} cancelled, {rep['server_generated_tokens']:.0f} tokens, RSS growth "
          f"{rss.get('growth_after_warmup_pct', math.nan)} %: {'pass' if rep['passed'] else 'FAIL'} ({args.out}.md)")
    sys.exit(0 if rep["passed"] else 1)


if __name__ == "__main__":
    main()
