"""The official `ollama` Python package on Berth's Ollama API (see common.py for the protocol).

Ollama has no `tool_choice`: the required-tool scenario does not apply.
"""

from common import (
    CITY_ASK,
    FRANCE,
    TIMEOUT,
    TURNS,
    WEATHER_ASK,
    check_city,
    check_city_args,
    check_green,
    check_paris,
    check_weather_answer,
    get_weather,
    main,
    model_check,
    need,
    version_of,
)
from ollama import Client
from pydantic import BaseModel

GREEDY = {"temperature": 0}


class City(BaseModel):
    name: str
    country: str


def client(base):
    return Client(host=base, timeout=TIMEOUT)


def invoke(base, model):
    r = client(base).chat(model=model, options=GREEDY, messages=[{"role": "user", "content": FRANCE}])
    need(r.done and r.done_reason == "stop", f"done {r.done} {r.done_reason}")
    return check_paris(r.message.content)


def stream(base, model):
    parts = list(
        client(base).chat(model=model, options=GREEDY, stream=True, messages=[{"role": "user", "content": FRANCE}])
    )
    need(parts and parts[-1].done, f"{len(parts)} parts, the last not done")
    return f"{len(parts)} parts: " + check_paris("".join(p.message.content or "" for p in parts))


def tools_auto(base, model):
    c = client(base)
    messages = [{"role": "user", "content": WEATHER_ASK}]
    # A Python function as the tool: the library makes its schema from the signature and docstring.
    r = c.chat(model=model, options=GREEDY, messages=messages, tools=[get_weather])
    calls = r.message.tool_calls or []
    model_check(calls, f"no call, text {r.message.content!r}")
    need(len(calls) == 1, f"{len(calls)} calls for one question")
    call = calls[0]
    need(call.function.name == "get_weather", f"called {call.function.name}")
    check_city_args(dict(call.function.arguments))
    messages.append(r.message)  # the library's own message, fed back
    messages.append({"role": "tool", "content": get_weather(**call.function.arguments), "tool_name": "get_weather"})
    r = c.chat(model=model, options=GREEDY, messages=messages, tools=[get_weather])
    return check_weather_answer(r.message.content)


def structured(base, model):
    r = client(base).chat(
        model=model,
        options=GREEDY,
        messages=[{"role": "user", "content": CITY_ASK}],
        format=City.model_json_schema(),
    )
    p = City.model_validate_json(r.message.content)
    return check_city(p.name, p.country)


def multiturn(base, model):
    c = client(base)
    messages = []
    for turn in TURNS:
        messages.append({"role": "user", "content": turn})
        r = c.chat(model=model, options=GREEDY, messages=messages)
        need(r.message.content, f"empty reply to {turn!r}")
        messages.append(r.message)  # the library's own message, fed back
    return check_green(r.message.content)


if __name__ == "__main__":
    main(
        version_of("ollama"),
        {
            "invoke": invoke,
            "stream": stream,
            "tools_auto": tools_auto,
            "tools_required": "Ollama's API has no tool_choice",
            "structured": structured,
            "multiturn": multiturn,
        },
    )
