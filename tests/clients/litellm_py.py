"""LiteLLM's `completion` with its `openai/` provider on /v1/chat/completions (see common.py)."""

import json
import os

# LiteLLM fetches its model price list from GitHub at import unless told to use the bundled one
# (CI has no internet beyond the package registries).
os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

import litellm  # noqa: E402
from common import (  # noqa: E402
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
from pydantic import BaseModel  # noqa: E402

TOOLS = [
    {
        "type": "function",
        "function": {"name": "get_weather", "description": WEATHER_DESCRIPTION, "parameters": WEATHER_SCHEMA},
    }
]


class City(BaseModel):
    name: str
    country: str


def complete(base, model, **kw):
    return litellm.completion(
        model=f"openai/{model}",
        api_base=f"{base}/v1",
        api_key="unused",
        temperature=0,
        timeout=TIMEOUT,
        num_retries=0,
        **kw,
    )


def invoke(base, model):
    r = complete(base, model, messages=[{"role": "user", "content": FRANCE}])
    need(r.choices[0].finish_reason == "stop", f"finish_reason {r.choices[0].finish_reason}")
    return check_paris(r.choices[0].message.content)


def stream(base, model):
    chunks = list(complete(base, model, stream=True, messages=[{"role": "user", "content": FRANCE}]))
    need(chunks, "no chunks")
    r = litellm.stream_chunk_builder(chunks)
    need(r.choices[0].finish_reason == "stop", f"finish_reason {r.choices[0].finish_reason}")
    return f"{len(chunks)} chunks: " + check_paris(r.choices[0].message.content)


def round_trip(base, model, tool_choice):
    messages = [{"role": "user", "content": WEATHER_ASK}]
    r = complete(base, model, messages=messages, tools=TOOLS, tool_choice=tool_choice)
    msg = r.choices[0].message
    if tool_choice == "auto":
        model_check(msg.tool_calls, f"no call under auto, text {msg.content!r}")
    need(msg.tool_calls, f"no tool call under {tool_choice}: {msg.content!r}")
    need(len(msg.tool_calls) == 1, f"{len(msg.tool_calls)} calls for one question")
    call = msg.tool_calls[0]
    need(call.function.name == "get_weather", f"called {call.function.name}")
    check_city_args(call.function.arguments)
    messages.append(msg)  # the library's own message, fed back
    messages.append({"role": "tool", "tool_call_id": call.id, "content": WEATHER_RESULT})
    r = complete(base, model, messages=messages, tools=TOOLS)
    return check_weather_answer(r.choices[0].message.content)


def structured(base, model):
    r = complete(base, model, messages=[{"role": "user", "content": CITY_ASK}], response_format=City)
    content = r.choices[0].message.content
    need(content, "empty content")
    p = City.model_validate(json.loads(content))
    return check_city(p.name, p.country)


def multiturn(base, model):
    messages = []
    for turn in TURNS:
        messages.append({"role": "user", "content": turn})
        r = complete(base, model, messages=messages)
        need(r.choices[0].message.content, f"empty reply to {turn!r}")
        messages.append(r.choices[0].message)  # the library's own message, fed back
    return check_green(r.choices[0].message.content)


if __name__ == "__main__":
    main(
        version_of("litellm"),
        {
            "invoke": invoke,
            "stream": stream,
            "tools_auto": lambda b, m: round_trip(b, m, "auto"),
            "tools_required": lambda b, m: round_trip(b, m, "required"),
            "structured": structured,
            "multiturn": multiturn,
        },
    )
