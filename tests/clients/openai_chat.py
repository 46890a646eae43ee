"""The official `openai` Python package on /v1/chat/completions (see common.py for the protocol)."""

import json

from common import (
    CITY_ASK,
    FRANCE,
    TIMEOUT,
    TURNS,
    WEATHER_ASK,
    WEATHER_DESCRIPTION,
    WEATHER_RESULT,
    WEATHER_SCHEMA,
    check_city,
    check_city_args,
    check_green,
    check_paris,
    check_weather_answer,
    main,
    model_check,
    need,
    version_of,
)
from openai import OpenAI
from pydantic import BaseModel

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": WEATHER_DESCRIPTION,
            "parameters": WEATHER_SCHEMA,
        },
    }
]


class City(BaseModel):
    name: str
    country: str


def client(base):
    return OpenAI(base_url=f"{base}/v1", api_key="unused", timeout=TIMEOUT, max_retries=0)


def invoke(base, model):
    r = client(base).chat.completions.create(
        model=model, temperature=0, messages=[{"role": "user", "content": FRANCE}]
    )
    need(r.choices[0].finish_reason == "stop", f"finish_reason {r.choices[0].finish_reason}")
    return check_paris(r.choices[0].message.content)


def stream(base, model):
    chunks = client(base).chat.completions.create(
        model=model, temperature=0, stream=True, messages=[{"role": "user", "content": FRANCE}]
    )
    text, finish, n = "", None, 0
    for c in chunks:
        n += 1
        for ch in c.choices:
            text += ch.delta.content or ""
            finish = ch.finish_reason or finish
    need(finish == "stop", f"finish_reason {finish} after {n} chunks")
    return f"{n} chunks: " + check_paris(text)


def round_trip(base, model, tool_choice):
    c = client(base)
    messages = [{"role": "user", "content": WEATHER_ASK}]
    r = c.chat.completions.create(
        model=model, temperature=0, messages=messages, tools=TOOLS, tool_choice=tool_choice
    )
    msg = r.choices[0].message
    if tool_choice == "auto":
        model_check(msg.tool_calls, f"no call under auto, text {msg.content!r}")
    need(msg.tool_calls, f"no tool call under {tool_choice}: {msg.content!r}")
    need(r.choices[0].finish_reason == "tool_calls", f"finish_reason {r.choices[0].finish_reason}")
    need(len(msg.tool_calls) == 1, f"{len(msg.tool_calls)} calls for one question")
    call = msg.tool_calls[0]
    need(call.function.name == "get_weather", f"called {call.function.name}")
    check_city_args(call.function.arguments)
    messages.append(msg)  # the library's own message object, fed back
    messages.append({"role": "tool", "tool_call_id": call.id, "content": WEATHER_RESULT})
    r = c.chat.completions.create(model=model, temperature=0, messages=messages, tools=TOOLS)
    return check_weather_answer(r.choices[0].message.content)


def structured(base, model):
    r = client(base).chat.completions.parse(
        model=model, temperature=0, messages=[{"role": "user", "content": CITY_ASK}], response_format=City
    )
    p = r.choices[0].message.parsed
    need(isinstance(p, City), f"parsed {p!r} from {r.choices[0].message.content!r}")
    return check_city(p.name, p.country)


def multiturn(base, model):
    c = client(base)
    messages = []
    for turn in TURNS:
        messages.append({"role": "user", "content": turn})
        r = c.chat.completions.create(model=model, temperature=0, messages=messages)
        need(r.choices[0].message.content, f"empty reply to {turn!r}")
        messages.append(r.choices[0].message)
    return check_green(messages[-1].content)


if __name__ == "__main__":
    main(
        version_of("openai"),
        {
            "invoke": invoke,
            "stream": stream,
            "tools_auto": lambda b, m: round_trip(b, m, "auto"),
            "tools_required": lambda b, m: round_trip(b, m, "required"),
            "structured": structured,
            "multiturn": multiturn,
        },
    )
