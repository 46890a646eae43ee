"""End-to-end checks of a served gpt-oss pack (harmony) with the official `openai` and `ollama`
Python packages.

The pack is the tiny gpt-oss model of tests/fixtures/tiny-gptoss (trained by
scripts/train_tiny_gptoss.py to reason on `analysis`, call `get_weather` on
`commentary to=functions.get_weather`, and answer on `final`) with gpt-oss's real tokenizer.

Usage: python harmony_checks.py BASE_URL MODEL CHECK...   (checks: openai ollama errors)
Each check prints one line `ok CHECK ...` or raises.
"""

import json
import sys
import urllib.error
import urllib.request

import ollama
import openai

BASE, MODEL = sys.argv[1], sys.argv[2]
client = openai.OpenAI(base_url=BASE + "/v1", api_key="unused", max_retries=0, timeout=300)
WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Get the current weather in a city.",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string", "description": "The city name."}},
            "required": ["city"],
        },
    },
}
ASK_WEATHER = [{"role": "user", "content": "What is the weather in Paris?"}]
ASK_CAPITAL = [{"role": "user", "content": "What is the capital of France?"}]


def reasoning_of(message):
    """The reasoning text an OpenAI-compatible server returns beside the content."""
    extra = message.model_extra or {}
    return extra.get("reasoning_content") or extra.get("reasoning") or ""


def chat(messages, **kw):
    kw.setdefault("max_tokens", 96)
    return client.chat.completions.create(model=MODEL, messages=messages, temperature=0, **kw)


def stream(messages, **kw):
    """Streams a greedy chat; returns (content, reasoning, {index: [name, arguments, id]}, finish)."""
    content, reasoning, calls, finish = "", "", {}, None
    for chunk in chat(messages, stream=True, **kw):
        for c in chunk.choices:
            d = c.delta
            content += d.content or ""
            reasoning += (d.model_extra or {}).get("reasoning_content") or ""
            for t in d.tool_calls or []:
                slot = calls.setdefault(t.index, ["", "", None])
                if t.id:
                    slot[2] = t.id
                if t.function and t.function.name:
                    slot[0] += t.function.name
                if t.function and t.function.arguments:
                    slot[1] += t.function.arguments
            finish = c.finish_reason or finish
    return content, reasoning, calls, finish


def check_openai():
    # A weather question with the tool declared: reasoning, then the call, no content.
    r = chat(ASK_WEATHER, tools=[WEATHER])
    msg, choice = r.choices[0].message, r.choices[0]
    assert reasoning_of(msg).strip(), f"no reasoning: {msg}"
    assert "<|" not in reasoning_of(msg), f"harmony markup leaked into the reasoning: {msg}"
    assert not (msg.content or "").strip(), f"content beside the call: {msg}"
    assert choice.finish_reason == "tool_calls", choice
    assert len(msg.tool_calls) == 1, msg
    call = msg.tool_calls[0]
    assert call.type == "function" and call.function.name == "get_weather", call
    assert json.loads(call.function.arguments) == {"city": "Paris"}, call
    assert call.id, call

    # Streamed, the deltas add up to the same message.
    content, reasoning, calls, finish = stream(ASK_WEATHER, tools=[WEATHER])
    assert (content or "", reasoning, finish) == (msg.content or "", reasoning_of(msg), "tool_calls"), (
        content,
        reasoning,
        finish,
    )
    assert [(n, json.loads(a)) for n, a, _ in calls.values()] == [("get_weather", {"city": "Paris"})], calls
    assert all(i for _, _, i in calls.values()), calls

    # The tool's result goes back; the answer comes on the final channel, reasoning apart.
    history = ASK_WEATHER + [
        {
            "role": "assistant",
            "content": None,
            "reasoning_content": reasoning_of(msg),
            "tool_calls": [call.model_dump(exclude_none=True)],
        },
        {"role": "tool", "tool_call_id": call.id, "content": json.dumps({"temperature": 21, "condition": "sunny"})},
    ]
    r2 = chat(history, tools=[WEATHER])
    m2 = r2.choices[0].message
    assert r2.choices[0].finish_reason == "stop", r2
    assert not m2.tool_calls, m2
    assert reasoning_of(m2).strip() and "Paris" in (m2.content or ""), m2
    assert "<|" not in m2.content, m2

    # No tools: reasoning, then the answer.
    r3 = chat(ASK_CAPITAL, reasoning_effort="high")
    m3 = r3.choices[0].message
    assert reasoning_of(m3).strip() and "Paris" in (m3.content or ""), m3
    assert r3.choices[0].finish_reason == "stop", r3

    # tool_choice "none": no call even for a weather question; the final channel answers.
    r4 = chat(ASK_WEATHER, tools=[WEATHER], tool_choice="none", max_tokens=48)
    assert not r4.choices[0].message.tool_calls, r4
    assert (r4.choices[0].message.content or "").strip(), r4

    # A named tool_choice: the call comes under the grammar, its arguments follow the schema.
    named = {"type": "function", "function": {"name": "get_weather"}}
    r5 = chat(ASK_WEATHER, tools=[WEATHER], tool_choice=named)
    m5 = r5.choices[0].message
    assert r5.choices[0].finish_reason == "tool_calls" and len(m5.tool_calls) == 1, r5
    assert json.loads(m5.tool_calls[0].function.arguments) == {"city": "Paris"}, m5
    print(
        f"ok openai reasoning={reasoning_of(msg)!r} call={call.function.name}({call.function.arguments}) "
        f"answer={m2.content!r}"
    )


def check_ollama():
    c = ollama.Client(host=BASE, timeout=300)
    r = c.chat(model=MODEL, messages=ASK_WEATHER, tools=[WEATHER], think=True, options={"temperature": 0})
    m = r.message
    assert m.thinking and m.thinking.strip(), r
    assert m.tool_calls and len(m.tool_calls) == 1, r
    assert m.tool_calls[0].function.name == "get_weather", r
    assert dict(m.tool_calls[0].function.arguments) == {"city": "Paris"}, r
    assert not (m.content or "").strip(), r

    # Streamed.
    thinking, content, calls = "", "", []
    for part in c.chat(
        model=MODEL, messages=ASK_WEATHER, tools=[WEATHER], think=True, options={"temperature": 0}, stream=True
    ):
        thinking += part.message.thinking or ""
        content += part.message.content or ""
        calls += part.message.tool_calls or []
    assert (thinking, content.strip()) == (m.thinking, ""), (thinking, content)
    assert [(t.function.name, dict(t.function.arguments)) for t in calls] == [("get_weather", {"city": "Paris"})], calls

    # A reasoning level by name; the answer keeps thinking and content apart.
    r2 = c.chat(model=MODEL, messages=ASK_CAPITAL, think="low", options={"temperature": 0})
    assert r2.message.thinking and "Paris" in r2.message.content, r2
    print(f"ok ollama thinking={m.thinking!r} call={m.tool_calls[0].function.name}")


def check_errors():
    try:
        chat(ASK_CAPITAL, reasoning_effort="extreme")
        raise AssertionError("reasoning_effort 'extreme' was accepted")
    except openai.BadRequestError as e:
        assert e.status_code == 400 and "reasoning_effort" in str(e), e
    # The ollama package refuses `think: "extreme"` itself; send it as raw JSON.
    body = json.dumps({"model": MODEL, "messages": ASK_CAPITAL, "think": "extreme", "stream": False}).encode()
    req = urllib.request.Request(BASE + "/api/chat", data=body, headers={"Content-Type": "application/json"})
    try:
        urllib.request.urlopen(req, timeout=300)
        raise AssertionError("think 'extreme' was accepted")
    except urllib.error.HTTPError as e:
        text = e.read().decode()
        assert e.code == 400 and "think" in text, (e.code, text)
    print("ok errors")


for name in sys.argv[3:]:
    globals()[f"check_{name}"]()
