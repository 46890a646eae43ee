"""End-to-end checks of `berth serve`'s Responses API (`/v1/responses`) with the official
`openai` Python package.

Usage: python responses_checks.py BASE_URL MODEL CHECK...   (checks: tools store parse stream
incomplete errors extensions). Each check prints one line `ok CHECK ...` or raises.
"""

import json
import sys
import urllib.error
import urllib.request

import openai
from pydantic import BaseModel

BASE, MODEL = sys.argv[1], sys.argv[2]
client = openai.OpenAI(base_url=BASE + "/v1", api_key="unused", max_retries=0, timeout=300)

WEATHER = {
    "type": "function",
    "name": "get_weather",
    "description": "Current weather of a city",
    "parameters": {
        "type": "object",
        "properties": {"city": {"type": "string"}},
        "required": ["city"],
        "additionalProperties": False,
    },
    "strict": True,
}

QUESTION = "What is the weather in Paris? Use the tool."


def weather_call(**kw):
    """A greedy request that must call get_weather; returns (response, its one function call)."""
    r = client.responses.create(
        model=MODEL,
        input=QUESTION,
        tools=[WEATHER],
        tool_choice="required",
        parallel_tool_calls=False,
        temperature=0,
        max_output_tokens=48,
        **kw,
    )
    assert r.object == "response" and r.id.startswith("resp_"), r
    assert r.status == "completed", r
    calls = [o for o in r.output if o.type == "function_call"]
    assert len(calls) >= 1, r.output
    call = calls[0]
    assert call.name == "get_weather" and call.call_id.startswith("call_"), call
    assert call.id.startswith("fc_") and call.status == "completed", call
    args = json.loads(call.arguments)
    assert set(args) == {"city"} and isinstance(args["city"], str), args
    assert "Paris" in args["city"], args
    u = r.usage
    assert u.input_tokens > 0 and u.output_tokens > 0, u
    assert u.total_tokens == u.input_tokens + u.output_tokens, u
    assert u.input_tokens_details.cached_tokens >= 0 and u.output_tokens_details.reasoning_tokens == 0, u
    assert r.tools[0].name == "get_weather" and r.tool_choice == "required", r
    assert r.parallel_tool_calls is False and len(calls) == 1, r
    return r, call


SUNNY = json.dumps({"city": "Paris", "temperature_c": 21, "sky": "sunny"})


def check_tools():
    r, call = weather_call()
    # The round trip: the whole conversation sent back, the tool's output as an input item.
    follow = client.responses.create(
        model=MODEL,
        input=[
            {"role": "user", "content": QUESTION},
            {"type": "function_call", "call_id": call.call_id, "name": call.name, "arguments": call.arguments},
            {"type": "function_call_output", "call_id": call.call_id, "output": SUNNY},
        ],
        tools=[WEATHER],
        temperature=0,
        max_output_tokens=24,
    )
    text = follow.output_text
    assert text.strip(), follow.output
    msg = [o for o in follow.output if o.type == "message"][0]
    assert msg.id.startswith("msg_") and msg.role == "assistant", msg
    assert msg.content[0].type == "output_text" and msg.content[0].annotations == [], msg
    print("ok tools", json.dumps([call.arguments, text]))


def check_store():
    r, call = weather_call(instructions="You are a weather assistant.")
    assert r.store is True and r.instructions == "You are a weather assistant.", r
    # The stored response comes back whole.
    got = client.responses.retrieve(r.id)
    assert got.id == r.id and got.output[0].model_dump() == r.output[0].model_dump(), got
    # The conversation continues from the stored one: only the tool's output is sent.
    follow = client.responses.create(
        model=MODEL,
        previous_response_id=r.id,
        input=[{"type": "function_call_output", "call_id": call.call_id, "output": SUNNY}],
        tools=[WEATHER],
        temperature=0,
        max_output_tokens=24,
    )
    assert follow.previous_response_id == r.id and follow.output_text.strip(), follow
    # store=false keeps nothing to continue from.
    unstored = client.responses.create(
        model=MODEL, input="Say hi.", store=False, temperature=0, max_output_tokens=4
    )
    try:
        client.responses.retrieve(unstored.id)
        raise AssertionError("an unstored response was retrievable")
    except openai.NotFoundError as e:
        assert e.status_code == 404 and e.body["type"] == "not_found_error", e.body
    # Deleted responses are gone.
    client.responses.delete(follow.id)
    try:
        client.responses.retrieve(follow.id)
        raise AssertionError("a deleted response was retrievable")
    except openai.NotFoundError:
        pass
    print("ok store", json.dumps(follow.output_text))


class Capital(BaseModel):
    country: str
    capital: str


def check_parse():
    r = client.responses.parse(
        model=MODEL,
        input="Give the capital of France as JSON.",
        text_format=Capital,
        temperature=0,
        max_output_tokens=64,
    )
    cap = r.output_parsed
    assert isinstance(cap, Capital) and "Paris" in cap.capital, r
    assert r.text.format.type == "json_schema", r.text
    print("ok parse", cap.model_dump_json())


def check_stream():
    prompt = "What is the capital of France? Answer in one sentence."
    kinds, deltas, final = [], "", None
    with client.responses.stream(model=MODEL, input=prompt, temperature=0, max_output_tokens=32) as s:
        seqs = []
        for ev in s:
            kinds.append(ev.type)
            seqs.append(ev.sequence_number)
            if ev.type == "response.output_text.delta":
                deltas += ev.delta
        final = s.get_final_response()
    assert seqs == list(range(len(seqs))), seqs
    expect_head = [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
    ]
    expect_tail = [
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.completed",
    ]
    assert kinds[:4] == expect_head and kinds[-4:] == expect_tail, kinds
    middle = kinds[4:-4]
    assert middle and all(k == "response.output_text.delta" for k in middle), kinds
    assert deltas == final.output_text and "Paris" in deltas, (deltas, final.output_text)
    # The same request unstreamed gives the same text.
    plain = client.responses.create(model=MODEL, input=prompt, temperature=0, max_output_tokens=32)
    assert plain.output_text == deltas, (plain.output_text, deltas)
    # A streamed function call: arguments deltas join to the final arguments.
    args, kinds = "", []
    with client.responses.stream(
        model=MODEL, input=QUESTION, tools=[WEATHER],
        tool_choice="required",
        parallel_tool_calls=False,
        temperature=0,
        max_output_tokens=48,
    ) as s:
        for ev in s:
            kinds.append(ev.type)
            if ev.type == "response.function_call_arguments.delta":
                args += ev.delta
        final = s.get_final_response()
    call = [o for o in final.output if o.type == "function_call"][0]
    assert args == call.arguments and json.loads(args)["city"], (args, call)
    i = kinds.index("response.output_item.added")
    assert kinds[i + 1] == "response.function_call_arguments.delta", kinds
    assert kinds[-3:] == [
        "response.function_call_arguments.done",
        "response.output_item.done",
        "response.completed",
    ], kinds
    print("ok stream", json.dumps(deltas))


def check_incomplete():
    r = client.responses.create(
        model=MODEL, input="Count from 1 to 100, separated by commas.", temperature=0, max_output_tokens=5
    )
    assert r.status == "incomplete" and r.incomplete_details.reason == "max_output_tokens", r
    assert r.usage.output_tokens == 5 and r.output[0].status == "incomplete", r
    assert r.output_text, r
    # Streamed, the last event says the same.
    with client.responses.create(
        model=MODEL, input="Count from 1 to 100.", temperature=0, max_output_tokens=5, stream=True
    ) as s:
        events = list(s)
    assert events[-1].type == "response.incomplete", [e.type for e in events]
    assert events[-1].response.incomplete_details.reason == "max_output_tokens"
    print("ok incomplete", json.dumps(r.output_text))


def check_extensions():
    """The llama.cpp-style sampling extensions reach the sampler: `top_k` 1 and `min_p` 1 leave
    only the likeliest token (the greedy reply, however hot), and a `seed` repeats a hot reply."""
    prompt = "Write one sentence about the sea."
    ask = lambda **kw: client.responses.create(model=MODEL, input=prompt, max_output_tokens=16, **kw).output_text
    greedy = ask(temperature=0)
    for extra in ({"top_k": 1}, {"min_p": 1.0}):
        hot = ask(temperature=1.5, extra_body=extra)
        assert hot == greedy, (extra, hot, greedy)
    seeded = [ask(temperature=1.5, extra_body={"seed": 7, "top_k": 0, "min_p": 0}) for _ in range(2)]
    assert seeded[0] == seeded[1], seeded
    print("ok extensions", json.dumps([greedy, seeded[0]]))


def raw_post(body):
    req = urllib.request.Request(
        BASE + "/v1/responses", data=body.encode(), headers={"content-type": "application/json"}
    )
    try:
        with urllib.request.urlopen(req) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


def check_errors():
    try:
        client.responses.create(model=MODEL, input="hi", previous_response_id="resp_nosuch")
        raise AssertionError("an unknown previous_response_id was accepted")
    except openai.BadRequestError as e:
        assert e.body["param"] == "previous_response_id" and "resp_nosuch" in e.body["message"], e.body
    try:
        client.responses.create(model="no-such-model:1b", input="hi")
        raise AssertionError("unknown model accepted")
    except openai.NotFoundError as e:
        assert e.body["code"] == "model_not_found", e.body
    bad = [
        ({"frobnicate": 1}, "frobnicate"),
        ({"temperature": "hot"}, "temperature"),
        ({"max_output_tokens": -1}, "max_output_tokens"),
        ({"tools": [{"type": "web_search_preview"}]}, "tools[0].type"),
        ({"tools": [{"type": "function", "function": {"name": "f"}}]}, "tools[0].name"),
        ({"tool_choice": "required"}, "tool_choice"),
        ({"text": {"format": {"type": "yaml"}}}, "text.format.type"),
        ({"text": {"format": {"type": "json_schema", "name": "x"}}}, "text.format.schema"),
        ({"reasoning": {"effort": "extreme"}}, "reasoning.effort"),
        # An item_reference naming nothing stored (a known one resolves: serve_sdk_defaults.rs).
        ({"input": [{"type": "item_reference", "id": "msg_1"}]}, "input[0].id"),
        ({"input": [{"role": "wizard", "content": "hi"}]}, "input[0].role"),
        ({"input": [{"type": "function_call_output", "output": "x"}]}, "input[0].call_id"),
        ({"input": 7}, "input"),
    ]
    for extra, param in bad:
        body = {"model": MODEL, "input": "hi", **extra}
        try:
            client.responses.create(**{k: v for k, v in body.items() if k in ("model", "input")},
                                    extra_body={k: v for k, v in body.items() if k not in ("model", "input")})
            raise AssertionError(f"{extra} accepted")
        except openai.BadRequestError as e:
            assert e.status_code == 400 and e.body["param"] == param, (extra, e.body)
            assert e.body["type"] == "invalid_request_error", e.body
    for body in ["{", "[1]", json.dumps({"input": "hi"})]:
        status, err = raw_post(body)
        assert status == 400 and err["error"]["type"] == "invalid_request_error", (body, status, err)
    print("ok errors")


for name in sys.argv[3:]:
    globals()["check_" + name]()
