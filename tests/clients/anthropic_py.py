"""The official `anthropic` Python package on /v1/messages (see common.py for the protocol).

The Messages API requires `max_tokens`: every request sends 1024 (as Anthropic's own examples do).
"""

from anthropic import Anthropic
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
from pydantic import BaseModel

MAX_TOKENS = 1024
# The SDK has no sampling parameters of its own; the server takes Anthropic's `temperature`.
GREEDY = {"extra_body": {"temperature": 0}}
TOOLS = [{"name": "get_weather", "description": WEATHER_DESCRIPTION, "input_schema": WEATHER_SCHEMA}]


class City(BaseModel):
    name: str
    country: str


def client(base):
    return Anthropic(base_url=base, api_key="unused", timeout=TIMEOUT, max_retries=0)


def text_of(message):
    return "".join(b.text for b in message.content if b.type == "text")


def invoke(base, model):
    r = client(base).messages.create(
        model=model, max_tokens=MAX_TOKENS, **GREEDY, messages=[{"role": "user", "content": FRANCE}]
    )
    need(r.stop_reason == "end_turn", f"stop_reason {r.stop_reason}")
    return check_paris(text_of(r))


def stream(base, model):
    with client(base).messages.stream(
        model=model, max_tokens=MAX_TOKENS, **GREEDY, messages=[{"role": "user", "content": FRANCE}]
    ) as s:
        text = "".join(s.text_stream)
        final = s.get_final_message()
    need(final.stop_reason == "end_turn", f"stop_reason {final.stop_reason}")
    need(text_of(final) == text, f"deltas {text!r} != final {text_of(final)!r}")
    return check_paris(text)


def round_trip(base, model, tool_choice):
    c = client(base)
    messages = [{"role": "user", "content": WEATHER_ASK}]
    r = c.messages.create(
        model=model,
        max_tokens=MAX_TOKENS,
        **GREEDY,
        messages=messages,
        tools=TOOLS,
        tool_choice={"type": tool_choice},
    )
    calls = [b for b in r.content if b.type == "tool_use"]
    if tool_choice == "auto":
        model_check(calls, f"no call under auto, text {text_of(r)!r}")
    need(calls, f"no tool_use under {tool_choice}: {text_of(r)!r} ({r.stop_reason})")
    need(r.stop_reason == "tool_use", f"stop_reason {r.stop_reason}")
    need(len(calls) == 1, f"{len(calls)} calls for one question")
    call = calls[0]
    need(call.name == "get_weather", f"called {call.name}")
    check_city_args(call.input)
    messages.append({"role": "assistant", "content": r.content})  # the library's own blocks
    messages.append(
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": call.id, "content": WEATHER_RESULT}]}
    )
    r = c.messages.create(model=model, max_tokens=MAX_TOKENS, **GREEDY, messages=messages, tools=TOOLS)
    need(r.stop_reason == "end_turn", f"stop_reason {r.stop_reason} after the tool result")
    return check_weather_answer(text_of(r))


def structured(base, model):
    r = client(base).messages.parse(
        model=model,
        max_tokens=MAX_TOKENS,
        **GREEDY,
        messages=[{"role": "user", "content": CITY_ASK}],
        output_format=City,
    )
    p = r.parsed_output
    need(isinstance(p, City), f"parsed {p!r} from {text_of(r)!r}")
    return check_city(p.name, p.country)


def multiturn(base, model):
    c = client(base)
    messages = []
    for turn in TURNS:
        messages.append({"role": "user", "content": turn})
        r = c.messages.create(model=model, max_tokens=MAX_TOKENS, **GREEDY, messages=messages)
        need(text_of(r), f"empty reply to {turn!r}")
        messages.append({"role": "assistant", "content": r.content})  # the library's own blocks
    return check_green(text_of(r))


if __name__ == "__main__":
    main(
        version_of("anthropic"),
        {
            "invoke": invoke,
            "stream": stream,
            "tools_auto": lambda b, m: round_trip(b, m, "auto"),
            "tools_required": lambda b, m: round_trip(b, m, "any"),
            "structured": structured,
            "multiturn": multiturn,
        },
    )
