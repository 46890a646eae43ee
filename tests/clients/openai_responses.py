"""The official `openai` Python package on /v1/responses (see common.py for the protocol)."""

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
        "name": "get_weather",
        "description": WEATHER_DESCRIPTION,
        "parameters": WEATHER_SCHEMA,
    }
]


class City(BaseModel):
    name: str
    country: str


def client(base):
    return OpenAI(base_url=f"{base}/v1", api_key="unused", timeout=TIMEOUT, max_retries=0)


def invoke(base, model):
    r = client(base).responses.create(model=model, temperature=0, input=FRANCE)
    need(r.status == "completed", f"status {r.status}")
    return check_paris(r.output_text)


def stream(base, model):
    events = client(base).responses.create(model=model, temperature=0, input=FRANCE, stream=True)
    text, kinds, final = "", [], None
    for e in events:
        kinds.append(e.type)
        if e.type == "response.output_text.delta":
            text += e.delta
        elif e.type == "response.completed":
            final = e.response
    need(final is not None, f"no response.completed in {sorted(set(kinds))}")
    need(final.output_text == text, f"deltas {text!r} != final {final.output_text!r}")
    return f"{len(kinds)} events: " + check_paris(text)


def round_trip(base, model, tool_choice):
    c = client(base)
    items = [{"role": "user", "content": WEATHER_ASK}]
    r = c.responses.create(model=model, temperature=0, input=items, tools=TOOLS, tool_choice=tool_choice)
    calls = [o for o in r.output if o.type == "function_call"]
    if tool_choice == "auto":
        model_check(calls, f"no call under auto, text {r.output_text!r}")
    need(calls, f"no function_call under {tool_choice}: {r.output_text!r}")
    need(len(calls) == 1, f"{len(calls)} calls for one question")
    call = calls[0]
    need(call.name == "get_weather", f"called {call.name}")
    check_city_args(call.arguments)
    items += r.output  # the library's own output items, fed back
    items.append({"type": "function_call_output", "call_id": call.call_id, "output": WEATHER_RESULT})
    r = c.responses.create(model=model, temperature=0, input=items, tools=TOOLS)
    return check_weather_answer(r.output_text)


def structured(base, model):
    r = client(base).responses.parse(model=model, temperature=0, input=CITY_ASK, text_format=City)
    p = r.output_parsed
    need(isinstance(p, City), f"parsed {p!r} from {r.output_text!r}")
    return check_city(p.name, p.country)


def multiturn(base, model):
    c = client(base)
    items = []
    for turn in TURNS:
        items.append({"role": "user", "content": turn})
        r = c.responses.create(model=model, temperature=0, input=items)
        need(r.output_text, f"empty reply to {turn!r}")
        items += r.output  # the library's own output items, fed back
    return check_green(r.output_text)


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
