"""pydantic-ai's `Agent` with `OpenAIChatModel` on /v1/chat/completions (see common.py).

Structured output is pydantic-ai's default `output_type=City`: a `final_result` tool the model
must call (`tool_choice: required`), no `max_tokens`. A static `tool_choice='required'` in the
settings is refused by pydantic-ai itself (it would forbid the final answer): that scenario does
not apply; `required` is exercised by the structured one.
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
from openai import AsyncOpenAI
from pydantic import BaseModel
from pydantic_ai import Agent
from pydantic_ai.messages import ToolCallPart
from pydantic_ai.models.openai import OpenAIChatModel
from pydantic_ai.providers.openai import OpenAIProvider

GREEDY = {"temperature": 0}


class City(BaseModel):
    name: str
    country: str


def chat_model(base, model):
    client = AsyncOpenAI(base_url=f"{base}/v1", api_key="unused", timeout=TIMEOUT, max_retries=0)
    return OpenAIChatModel(model, provider=OpenAIProvider(openai_client=client))


def invoke(base, model):
    r = Agent(chat_model(base, model), model_settings=GREEDY).run_sync(FRANCE)
    return check_paris(r.output)


def stream(base, model):
    agent = Agent(chat_model(base, model), model_settings=GREEDY)
    r = agent.run_stream_sync(FRANCE)
    deltas = list(r.stream_text(delta=True))
    need(deltas, "no text deltas")
    return f"{len(deltas)} deltas: " + check_paris("".join(deltas))


def calls_in(messages):
    return [p for m in messages for p in getattr(m, "parts", []) if isinstance(p, ToolCallPart)]


def tools_auto(base, model):
    agent = Agent(chat_model(base, model), model_settings=GREEDY, tools=[get_weather])
    r = agent.run_sync(WEATHER_ASK)
    calls = calls_in(r.all_messages())
    model_check(calls, f"no call, text {r.output!r}")
    need(all(c.tool_name == "get_weather" for c in calls), f"called {[c.tool_name for c in calls]}")
    check_city_args(calls[0].args_as_dict())
    model_check(len(calls) == 1, f"{len(calls)} calls for one question")
    return check_weather_answer(r.output)


def structured(base, model):
    r = Agent(chat_model(base, model), model_settings=GREEDY, output_type=City).run_sync(CITY_ASK)
    need(isinstance(r.output, City), f"output {r.output!r}")
    calls = calls_in(r.all_messages())
    need(len(calls) == 1, f"{len(calls)} calls: {[c.tool_name for c in calls]}")
    return check_city(r.output.name, r.output.country)


def multiturn(base, model):
    agent = Agent(chat_model(base, model), model_settings=GREEDY)
    history = None
    for turn in TURNS:
        r = agent.run_sync(turn, message_history=history)
        need(r.output, f"empty reply to {turn!r}")
        history = r.all_messages()  # the library's own messages, fed back
    return check_green(r.output)


if __name__ == "__main__":
    main(
        version_of("pydantic-ai-slim"),
        {
            "invoke": invoke,
            "stream": stream,
            "tools_auto": tools_auto,
            "tools_required": "pydantic-ai refuses a static tool_choice='required' (see structured)",
            "structured": structured,
            "multiturn": multiturn,
        },
    )
