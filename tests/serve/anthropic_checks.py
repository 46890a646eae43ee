"""End-to-end checks of `berth serve`'s Messages API with the official `anthropic` Python package.

Usage: python anthropic_checks.py BASE_URL MODEL CHECK...   (checks with the real model:
messages stream tools errors; with the scripted thinking model: thinking stream_error). Each check
prints one line `ok CHECK ...` or raises.
"""

import json
import sys

import anthropic

BASE, MODEL = sys.argv[1], sys.argv[2]
client = anthropic.Anthropic(base_url=BASE, api_key="unused", max_retries=0, timeout=300)

FRANCE = [{"role": "user", "content": "What is the capital of France? Answer in one sentence."}]

WEATHER = {
    "name": "get_weather",
    "description": "Current weather of a city",
    "input_schema": {
        "type": "object",
        "properties": {"city": {"type": "string"}},
        "required": ["city"],
    },
}
WEATHER_ASK = [{"role": "user", "content": "What is the weather like in Paris right now?"}]

# This client has no sampling parameters of its own; the server takes Anthropic's `temperature`.
GREEDY = {"extra_body": {"temperature": 0}}

RAW_EVENTS = {
    "message_start",
    "content_block_start",
    "content_block_delta",
    "content_block_stop",
    "message_delta",
    "message_stop",
}


def text_of(message):
    return "".join(b.text for b in message.content if b.type == "text")


def check_input(block):
    """A tool_use block of get_weather whose input validates against the schema."""
    assert block.type == "tool_use" and block.name == "get_weather", block
    assert block.id.startswith("toolu_"), block.id
    assert isinstance(block.input, dict), block.input
    assert set(block.input) == {"city"}, block.input
    assert isinstance(block.input["city"], str) and block.input["city"], block.input


def check_messages():
    r = client.messages.create(model=MODEL, max_tokens=24, **GREEDY, messages=FRANCE)
    assert r.type == "message" and r.role == "assistant" and r.id.startswith("msg_"), r
    assert [b.type for b in r.content] == ["text"], r.content
    assert "Paris" in r.content[0].text, r.content
    assert r.stop_reason in ("end_turn", "max_tokens") and r.stop_sequence is None, r
    u = r.usage
    assert u.input_tokens > 0 and u.output_tokens > 0, u
    assert u.cache_creation_input_tokens == 0 and u.cache_read_input_tokens is not None, u
    # The same conversation counted: the prompt tokens the request had (cached ones included).
    n = client.messages.count_tokens(model=MODEL, messages=FRANCE).input_tokens
    assert n > 0 and n == u.input_tokens + u.cache_read_input_tokens, (n, u)
    # The system prompt is rendered (it replaces the template's default one): counts differ.
    brief = client.messages.count_tokens(model=MODEL, system="Be brief.", messages=FRANCE).input_tokens
    longer = client.messages.count_tokens(
        model=MODEL, system=[{"type": "text", "text": "Be brief. Be kind. Be exact."}], messages=FRANCE
    ).input_tokens
    assert 0 < brief < longer and brief != n, (brief, longer, n)
    # A stop sequence ends the reply before it and is reported.
    s = client.messages.create(
        model=MODEL, max_tokens=24, **GREEDY, messages=FRANCE, stop_sequences=["Paris"]
    )
    assert s.stop_reason == "stop_sequence" and s.stop_sequence == "Paris", s
    assert "Paris" not in text_of(s), s
    # The token budget.
    m = client.messages.create(model=MODEL, max_tokens=2, **GREEDY, messages=FRANCE)
    assert m.stop_reason == "max_tokens" and m.usage.output_tokens == 2, m
    # The models route answers Anthropic's client too.
    listed = client.models.list()
    assert MODEL in [m.id for m in listed.data], listed
    one = client.models.retrieve(MODEL)
    assert one.id == MODEL and one.type == "model" and one.display_name, one
    print("ok messages", json.dumps(r.content[0].text), "count", n)


def raw_events(stream):
    """The raw events of a MessageStream (the helper's derived events left out)."""
    return [e for e in stream if e.type in RAW_EVENTS]


def check_order(events):
    """message_start, then blocks (start, deltas, stop) with increasing indexes, then
    message_delta and message_stop."""
    kinds = [e.type for e in events]
    assert kinds[0] == "message_start" and kinds[-2:] == ["message_delta", "message_stop"], kinds
    open_index, next_index = None, 0
    for e in events[1:-2]:
        if e.type == "content_block_start":
            assert open_index is None and e.index == next_index, kinds
            open_index, next_index = e.index, next_index + 1
        elif e.type == "content_block_delta":
            assert e.index == open_index, kinds
        elif e.type == "content_block_stop":
            assert e.index == open_index, kinds
            open_index = None
        else:
            raise AssertionError(kinds)
    assert open_index is None and next_index > 0, kinds


def check_stream():
    plain = client.messages.create(model=MODEL, max_tokens=24, **GREEDY, messages=FRANCE)
    with client.messages.stream(model=MODEL, max_tokens=24, **GREEDY, messages=FRANCE) as stream:
        events = raw_events(stream)
        final = stream.get_final_message()
    check_order(events)
    deltas = "".join(
        e.delta.text for e in events if e.type == "content_block_delta" and e.delta.type == "text_delta"
    )
    assert deltas == text_of(final) == text_of(plain), (deltas, final, plain)
    assert final.stop_reason == plain.stop_reason, (final, plain)
    assert final.usage.output_tokens == plain.usage.output_tokens, (final.usage, plain.usage)
    assert events[0].message.usage.input_tokens > 0, events[0]
    # A streamed tool call: input_json_delta pieces join to the final input.
    with client.messages.stream(
        model=MODEL,
        max_tokens=64,
        **GREEDY,
        messages=WEATHER_ASK,
        tools=[WEATHER],
        tool_choice={"type": "any", "disable_parallel_tool_use": True},
    ) as stream:
        events = raw_events(stream)
        final = stream.get_final_message()
    check_order(events)
    assert final.stop_reason == "tool_use", final
    tool_blocks = [b for b in final.content if b.type == "tool_use"]
    assert tool_blocks, final.content
    for block in tool_blocks:
        check_input(block)
        index = final.content.index(block)
        start = [e for e in events if e.type == "content_block_start" and e.index == index][0]
        assert start.content_block.type == "tool_use" and start.content_block.id == block.id, start
        pieces = [
            e.delta.partial_json
            for e in events
            if e.type == "content_block_delta" and e.index == index and e.delta.type == "input_json_delta"
        ]
        assert pieces and json.loads("".join(pieces)) == block.input, (pieces, block.input)
    print("ok stream", json.dumps(deltas), json.dumps(tool_blocks[0].input))


def check_tools():
    r = client.messages.create(
        model=MODEL,
        max_tokens=64,
        **GREEDY,
        messages=WEATHER_ASK,
        tools=[WEATHER],
        tool_choice={"type": "any", "disable_parallel_tool_use": True},
    )
    assert r.stop_reason == "tool_use", r
    calls = [b for b in r.content if b.type == "tool_use"]
    assert len(calls) == 1, r.content
    for call in calls:
        check_input(call)
    # The round trip: the result goes back as a tool_result block; the answer is text.
    conversation = WEATHER_ASK + [
        {"role": "assistant", "content": [b.model_dump(exclude_none=True) for b in r.content]},
        {
            "role": "user",
            # The results, then a text block after them (the 0.5B model needs the nudge).
            "content": [
                {"type": "tool_result", "tool_use_id": c.id, "content": "Sunny, 22 degrees Celsius."}
                for c in calls
            ]
            + [{"type": "text", "text": "Now describe the weather in Paris in one sentence."}],
        },
    ]
    a = client.messages.create(
        model=MODEL, max_tokens=64, **GREEDY, messages=conversation, tools=[WEATHER]
    )
    assert a.stop_reason == "end_turn", a
    assert [b.type for b in a.content] == ["text"], a.content
    answer = a.content[0].text.lower()
    assert "22" in answer or "sunny" in answer, "the tool result reached the model: " + answer
    assert a.usage.input_tokens + a.usage.cache_read_input_tokens > r.usage.input_tokens, (a.usage, r.usage)
    # A named tool choice (parallel calls allowed: the model may call it more than once).
    n = client.messages.create(
        model=MODEL,
        max_tokens=64,
        **GREEDY,
        messages=WEATHER_ASK,
        tools=[WEATHER],
        tool_choice={"type": "tool", "name": "get_weather"},
    )
    named = [b for b in n.content if b.type == "tool_use"]
    assert named and n.stop_reason in ("tool_use", "max_tokens"), n
    check_input(named[0])
    print("ok tools", json.dumps(calls[0].input), json.dumps(a.content[0].text))


def expect(error_type, status, kind, call, mentions=None):
    """`call` raises the client's typed error with Anthropic's error body."""
    try:
        call()
    except error_type as e:
        assert e.status_code == status, (e.status_code, e)
        assert isinstance(e.body, dict) and e.body.get("type") == "error", e.body
        assert e.body["error"]["type"] == kind, e.body
        message = e.body["error"]["message"]
        assert isinstance(message, str) and message, e.body
        if mentions:
            assert mentions in message, (mentions, message)
        return message
    except anthropic.APIStatusError as e:
        raise AssertionError(f"expected {error_type.__name__}, got {type(e).__name__} {e.status_code}: {e.body}")
    raise AssertionError(f"expected {error_type.__name__}, got no error")


def raw_post(path, **kw):
    return lambda: client.post(path, cast_to=object, **kw)


def check_errors():
    bad = anthropic.BadRequestError
    ok_body = {"model": MODEL, "max_tokens": 8, "messages": FRANCE}
    no_max = {k: v for k, v in ok_body.items() if k != "max_tokens"}
    expect(bad, 400, "invalid_request_error", raw_post("/v1/messages", body=no_max), "max_tokens")
    expect(
        anthropic.NotFoundError,
        404,
        "not_found_error",
        lambda: client.messages.create(model="no-such-model:1b", max_tokens=8, messages=FRANCE),
        "no-such-model:1b",
    )
    expect(
        anthropic.NotFoundError,
        404,
        "not_found_error",
        lambda: client.messages.count_tokens(model="no-such-model:1b", messages=FRANCE),
    )
    expect(
        bad,
        400,
        "invalid_request_error",
        lambda: client.messages.create(
            model=MODEL, max_tokens=8, messages=FRANCE, extra_body={"temperature": "hot"}
        ),
        "temperature",
    )
    expect(
        bad,
        400,
        "invalid_request_error",
        lambda: client.messages.create(model=MODEL, max_tokens="eight", messages=FRANCE),
        "max_tokens",
    )
    expect(
        bad,
        400,
        "invalid_request_error",
        raw_post(
            "/v1/messages",
            content=b'{"model": "x", "max_tokens": ',
            options={"headers": {"content-type": "application/json"}},
        ),
        "JSON",
    )
    expect(
        bad,
        400,
        "invalid_request_error",
        lambda: client.messages.create(
            model=MODEL, max_tokens=8, messages=FRANCE, extra_body={"frobnicate": 1}
        ),
        "frobnicate",
    )
    expect(
        bad,
        400,
        "invalid_request_error",
        lambda: client.messages.create(
            model=MODEL,
            max_tokens=8,
            messages=FRANCE,
            tools=[{"type": "web_search_20250305", "name": "web_search"}],
        ),
        "not supported",
    )
    expect(
        bad,
        400,
        "invalid_request_error",
        lambda: client.messages.create(
            model=MODEL,
            max_tokens=8,
            messages=[{"role": "user", "content": [{"type": "text"}]}],
        ),
        "messages[0].content[0].text",
    )
    # A text-only model refuses an image, before any decoding.
    expect(
        bad,
        400,
        "invalid_request_error",
        lambda: client.messages.create(
            model=MODEL,
            max_tokens=8,
            messages=[
                {
                    "role": "user",
                    "content": [
                        {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "AAAA"}},
                        {"type": "text", "text": "What is this?"},
                    ],
                }
            ],
        ),
        "does not take images",
    )
    # A streamed request's errors come before the stream, as a typed error too.
    expect(
        anthropic.NotFoundError,
        404,
        "not_found_error",
        lambda: list(client.messages.create(model="no-such-model:1b", max_tokens=8, messages=FRANCE, stream=True)),
    )
    print("ok errors")


def blocks(message):
    """A message's content blocks as (type, text, thinking, signature) tuples."""
    fields = ("text", "thinking", "signature")
    return [(b.type, *(getattr(b, f, None) for f in fields)) for b in message.content]


THINK = {"type": "enabled", "budget_tokens": 1024}


def check_thinking():
    """A scripted thinking model: `<think>...</think>` becomes a thinking block (streamed as
    thinking_delta), and `thinking: disabled` reaches the template's switch."""
    ask = [{"role": "user", "content": "What is 2 + 2?"}]
    on = client.messages.create(
        model=MODEL, max_tokens=2048, messages=ask, thinking=THINK, **GREEDY
    )
    assert [b.type for b in on.content] == ["thinking", "text"], on.content
    assert on.content[0].thinking == "Two and two." and on.content[0].signature == "", on.content
    assert on.content[1].text == "The answer is 4." and on.stop_reason == "end_turn", on
    off = client.messages.create(model=MODEL, max_tokens=64, messages=ask, thinking={"type": "disabled"}, **GREEDY)
    assert [b.type for b in off.content] == ["text"] and off.content[0].text == "The answer is 4.", off
    # The thinking turn goes back as a thinking block; the conversation renders and answers.
    again = client.messages.create(
        model=MODEL,
        max_tokens=64,
        messages=ask
        + [
            {"role": "assistant", "content": [b.model_dump(exclude_none=True) for b in on.content]},
            {"role": "user", "content": "And 3 + 3?"},
        ],
        **GREEDY,
    )
    assert again.content[-1].type == "text", again
    with client.messages.stream(
        model=MODEL, max_tokens=2048, messages=ask, thinking=THINK, **GREEDY
    ) as stream:
        events = raw_events(stream)
        final = stream.get_final_message()
    check_order(events)
    starts = [e.content_block.type for e in events if e.type == "content_block_start"]
    assert starts == ["thinking", "text"], starts
    thought = "".join(
        e.delta.thinking for e in events if e.type == "content_block_delta" and e.delta.type == "thinking_delta"
    )
    assert thought == "Two and two." and blocks(final) == blocks(on), (thought, final.content, on.content)
    assert final.stop_reason == on.stop_reason and final.usage.output_tokens == on.usage.output_tokens
    print("ok thinking", json.dumps(thought))


def check_stream_error():
    """An engine error after the stream began arrives as an `error` event in Anthropic's shape,
    which the client raises."""
    seen = []
    try:
        with client.messages.stream(
            model=MODEL, max_tokens=16, messages=[{"role": "user", "content": "Crash ~ now."}], **GREEDY
        ) as stream:
            for e in stream:
                seen.append(e.type)
    except anthropic.APIStatusError as e:
        assert seen[:1] == ["message_start"], seen
        assert isinstance(e.body, dict) and e.body.get("type") == "error", e.body
        assert e.body["error"]["type"] == "api_error" and e.body["error"]["message"], e.body
        print("ok stream_error", json.dumps(e.body["error"]["message"]))
        return
    raise AssertionError(f"no error raised; events {seen}")


for name in sys.argv[3:]:
    globals()["check_" + name]()
