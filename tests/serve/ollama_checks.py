"""End-to-end checks of `berth serve`'s Ollama API with the official `ollama` Python package.

Usage: python ollama_checks.py BASE_URL MODEL   (prints `ok ...` lines or raises)
"""

import sys

import ollama

BASE, MODEL = sys.argv[1], sys.argv[2]
client = ollama.Client(host=BASE)
opts = {"temperature": 0, "num_predict": 16}

r = client.chat(model=MODEL, messages=[{"role": "user", "content": "What is the capital of France? One sentence."}], options=opts)
assert r.done and "Paris" in r.message.content, r
assert r.eval_count > 0 and r.prompt_eval_count > 0, r
streamed = "".join(
    p.message.content
    for p in client.chat(
        model=MODEL,
        messages=[{"role": "user", "content": "What is the capital of France? One sentence."}],
        options=opts,
        stream=True,
    )
)
assert streamed == r.message.content, (streamed, r.message.content)
print("ok chat", repr(r.message.content))

g = client.generate(model=MODEL, prompt="What is 2 + 2? Answer with a number.", options=opts)
assert g.done and "4" in g.response, g
parts = list(client.generate(model=MODEL, prompt="What is 2 + 2? Answer with a number.", options=opts, stream=True))
assert parts[-1].done and "".join(p.response for p in parts) == g.response
raw = client.generate(model=MODEL, prompt="The capital of France is", raw=True, options=opts)
assert raw.response.strip(), raw
print("ok generate", repr(g.response))

names = [m.model for m in client.list().models]
assert MODEL in names, names
print("ok list", names)

s = client.show(MODEL)
assert s.details.family and s.template and "completion" in s.capabilities, s
print("ok show", s.details.family)

ps = client.ps()
assert [m.model for m in ps.models] == [MODEL], ps
print("ok ps", ps.models[0].expires_at)

try:
    client.chat(model="no-such:model", messages=[{"role": "user", "content": "hi"}])
    raise AssertionError("unknown model accepted")
except ollama.ResponseError as e:
    assert e.status_code == 404, e
print("ok errors")

# Ollama's logprobs / top_logprobs (raw HTTP: the pinned client predates them).
import json
import urllib.request


def post(path, body):
    req = urllib.request.Request(BASE + path, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=300) as r:
        return [json.loads(line) for line in r.read().decode().splitlines() if line.strip()]


chat = {"model": MODEL, "messages": [{"role": "user", "content": "Say hello."}], "options": {"temperature": 0, "num_predict": 8},
        "logprobs": True, "top_logprobs": 2}
whole = post("/api/chat", dict(chat, stream=False))[0]
lps = whole["logprobs"]
assert lps and all(len(e["top_logprobs"]) == 2 and e["top_logprobs"][0]["token"] == e["token"] for e in lps), whole
assert "".join(e["token"] for e in lps).strip() == whole["message"]["content"].strip(), whole
lines = post("/api/chat", dict(chat, stream=True))
streamed = [e for line in lines for e in line.get("logprobs", [])]
assert [e["token"] for e in streamed] == [e["token"] for e in lps], (streamed, lps)
gen = post("/api/generate", {"model": MODEL, "prompt": "Say hello.", "stream": False, "logprobs": True,
                             "options": {"temperature": 0, "num_predict": 4}})[0]
assert len(gen["logprobs"]) == gen["eval_count"] and all(e["top_logprobs"] == [] for e in gen["logprobs"]), gen
assert "logprobs" not in post("/api/generate", {"model": MODEL, "prompt": "Hi", "stream": False, "options": {"num_predict": 2}})[0]
print("ok logprobs", len(lps))
