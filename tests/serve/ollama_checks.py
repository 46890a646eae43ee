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
