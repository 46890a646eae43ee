"""The LangChain scenarios, shared by lc_openai.py (ChatOpenAI) and lc_ollama.py (ChatOllama)."""

from common import (
    CITY_ASK,
    FRANCE,
    TURNS,
    WEATHER_ASK,
    WEATHER_RESULT,
    check_city,
    check_city_args,
    check_green,
    check_paris,
    check_weather_answer,
    model_check,
    need,
)
from langchain_core.messages import AIMessage, HumanMessage
from langchain_core.tools import tool
from pydantic import BaseModel, Field


@tool
def get_weather(city: str) -> str:
    """Get the current weather of a city."""
    return WEATHER_RESULT


class City(BaseModel):
    """A city and the country it is in."""

    name: str = Field(description="The city's name")
    country: str = Field(description="The country the city is in")


def scenarios(make):
    """The scenarios over `make(base, model)`, a chat model with greedy sampling."""

    def invoke(base, model):
        r = make(base, model).invoke(FRANCE)
        need(isinstance(r, AIMessage), f"got {type(r).__name__}")
        return check_paris(r.text)

    def stream(base, model):
        chunks = list(make(base, model).stream(FRANCE))
        need(chunks, "no chunks")
        full = chunks[0]
        for c in chunks[1:]:
            full += c
        return f"{len(chunks)} chunks: " + check_paris(full.text)

    def round_trip(base, model, tool_choice):
        llm = make(base, model)
        messages = [HumanMessage(WEATHER_ASK)]
        ai = llm.bind_tools([get_weather], tool_choice=tool_choice).invoke(messages)
        if tool_choice == "auto":
            model_check(ai.tool_calls, f"no call under auto, text {ai.text!r}")
        need(ai.tool_calls, f"no tool call under {tool_choice}: {ai.text!r}")
        need(not ai.invalid_tool_calls, f"invalid tool calls {ai.invalid_tool_calls}")
        need(len(ai.tool_calls) == 1, f"{len(ai.tool_calls)} calls for one question")
        call = ai.tool_calls[0]
        need(call["name"] == "get_weather", f"called {call['name']}")
        check_city_args(call["args"])
        messages.append(ai)  # the library's own message, fed back
        messages.append(get_weather.invoke(call))  # a ToolMessage
        answer = llm.bind_tools([get_weather]).invoke(messages)
        return check_weather_answer(answer.text)

    def structured(base, model):
        p = make(base, model).with_structured_output(City).invoke(CITY_ASK)
        need(isinstance(p, City), f"got {p!r}")
        return check_city(p.name, p.country)

    def multiturn(base, model):
        llm = make(base, model)
        messages = []
        for turn in TURNS:
            messages.append(HumanMessage(turn))
            r = llm.invoke(messages)
            need(r.text, f"empty reply to {turn!r}")
            messages.append(r)  # the library's own message, fed back
        return check_green(r.text)

    return {
        "invoke": invoke,
        "stream": stream,
        "tools_auto": lambda b, m: round_trip(b, m, "auto"),
        "tools_required": lambda b, m: round_trip(b, m, "any"),
        "structured": structured,
        "multiturn": multiturn,
    }
