"""The OpenAI Agents SDK (`openai-agents`) with `OpenAIChatCompletionsModel` on
/v1/chat/completions, the SDK's documented way to use another provider (see common.py).

Tracing is off: it would upload to OpenAI.
"""

import asyncio

from agents import (
    Agent,
    AsyncOpenAI,
    ModelSettings,
    OpenAIChatCompletionsModel,
    Runner,
    function_tool,
    set_tracing_disabled,
)
from common import (
    CITY_ASK,
    FRANCE,
    TIMEOUT,
    TURNS,
    WEATHER_ASK,
    WEATHER_RESULT,
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

set_tracing_disabled(True)
INSTRUCTIONS = "You are a helpful assistant."


@function_tool
def get_weather(city: str) -> str:
    """Get the current weather of a city.

    Args:
        city: The city, e.g. Paris.
    """
    return WEATHER_RESULT


class City(BaseModel):
    name: str
    country: str


def agent(base, model, **kw):
    client = AsyncOpenAI(base_url=f"{base}/v1", api_key="unused", timeout=TIMEOUT, max_retries=0)
    settings = kw.pop("model_settings", ModelSettings(temperature=0))
    return Agent(
        name="Assistant",
        instructions=INSTRUCTIONS,
        model=OpenAIChatCompletionsModel(model=model, openai_client=client),
        model_settings=settings,
        **kw,
    )


def invoke(base, model):
    r = Runner.run_sync(agent(base, model), FRANCE)
    return check_paris(r.final_output)


def stream(base, model):
    async def go():
        r = Runner.run_streamed(agent(base, model), FRANCE)
        deltas = []
        async for e in r.stream_events():
            if e.type == "raw_response_event" and e.data.type == "response.output_text.delta":
                deltas.append(e.data.delta)
        return deltas, r.final_output

    deltas, final = asyncio.run(go())
    need(deltas, "no text deltas")
    need("".join(deltas) == final, f"deltas {''.join(deltas)!r} != final {final!r}")
    return f"{len(deltas)} deltas: " + check_paris(final)


def tools(base, model, tool_choice):
    a = agent(base, model, tools=[get_weather], model_settings=ModelSettings(temperature=0, tool_choice=tool_choice))
    r = Runner.run_sync(a, WEATHER_ASK)
    calls = [i.raw_item for i in r.new_items if i.type == "tool_call_item"]
    if tool_choice == "auto":
        model_check(calls, f"no call under auto, text {r.final_output!r}")
    need(calls, f"no tool call under {tool_choice}: {r.final_output!r}")
    need(all(c.name == "get_weather" for c in calls), f"called {[c.name for c in calls]}")
    check_city_args(calls[0].arguments)
    model_check(len(calls) == 1, f"{len(calls)} calls for one question")
    return check_weather_answer(r.final_output)


def structured(base, model):
    r = Runner.run_sync(agent(base, model, output_type=City), CITY_ASK)
    need(isinstance(r.final_output, City), f"final_output {r.final_output!r}")
    return check_city(r.final_output.name, r.final_output.country)


def multiturn(base, model):
    a = agent(base, model)
    items = []
    for turn in TURNS:
        r = Runner.run_sync(a, items + [{"role": "user", "content": turn}])
        need(r.final_output, f"empty reply to {turn!r}")
        items = r.to_input_list()  # the library's own items, fed back
    return check_green(r.final_output)


if __name__ == "__main__":
    main(
        version_of("openai-agents"),
        {
            "invoke": invoke,
            "stream": stream,
            "tools_auto": lambda b, m: tools(b, m, "auto"),
            "tools_required": lambda b, m: tools(b, m, "required"),
            "structured": structured,
            "multiturn": multiturn,
        },
    )
