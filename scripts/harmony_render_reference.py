"""Record how OpenAI's openai-harmony renders chat requests as gpt-oss prompts.

Each case is an OpenAI chat-completions request body (messages, tools, reasoning_effort). It is
mapped onto harmony messages here, with the package's own objects, the way OpenAI serves gpt-oss:
  - a `system` message: SystemContent's defaults (identity, knowledge cutoff, channels), the
    request's reasoning effort (default medium) and the conversation date;
  - a `developer` message when there are instructions or tools: the texts of the request's
    system/developer messages (in order, joined by a blank line) as instructions, and the
    request's function tools as the `functions` namespace;
  - user messages as they are;
  - an assistant message as: its reasoning (`reasoning_content`, else `reasoning`, else
    `thinking`) on `analysis`; its content on `final`, or on `commentary` (a preamble) when the
    turn makes tool calls; each call on `commentary` to `functions.NAME` with content type
    `<|constrain|>json` and the arguments text as content;
  - a tool result from `functions.NAME` (NAME from the call whose id it answers) to `assistant`
    on `commentary`.
The conversation is rendered with `render_conversation_for_completion(..., Role.ASSISTANT)` and its
default config (earlier analysis dropped once the last assistant turn ended in `final`).

Writes tests/fixtures/harmony/render/NAME.json:
  {"request": request body, "date": "2026-01-01", "tokens": [ids]}
Usage: scripts/harmony-render-reference (sets up the venv and TIKTOKEN_ENCODINGS_BASE).
"""

import json
import pathlib

import openai_harmony as h

OUT = pathlib.Path(__file__).resolve().parent.parent / "tests" / "fixtures" / "harmony" / "render"
DATE = "2026-01-01"

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Current weather in a city.\nUse the city's English name.",
        "parameters": {
            "type": "object",
            "properties": {
                "location": {"type": "string", "description": "City name, e.g. Zürich"},
                "unit": {"type": "string", "enum": ["celsius", "fahrenheit"], "default": "celsius"},
                "days": {"type": "integer", "description": "Forecast days"},
            },
            "required": ["location"],
        },
    },
}
TIME = {
    "type": "function",
    "function": {
        "name": "get_time",
        "description": "Local time in a time zone",
        "parameters": {
            "type": "object",
            "properties": {"tz": {"type": "string"}},
            "required": ["tz"],
        },
    },
}
# A function without parameters.
COIN = {"type": "function", "function": {"name": "flip_coin", "description": "Heads or tails"}}


def user(text):
    return {"role": "user", "content": text}


def call(id_, name, arguments):
    return {"id": id_, "type": "function", "function": {"name": name, "arguments": arguments}}


CASES = {
    "plain_user": {"messages": [user("What is the capital of France?")]},
    "system_and_developer": {
        "messages": [
            {"role": "system", "content": "You are a terse assistant."},
            {"role": "developer", "content": "Answer in French."},
            user("Hello!"),
        ]
    },
    "tools_declared": {
        "messages": [
            {"role": "system", "content": "Use tools when they help."},
            user("What's the weather in Paris, and heads or tails?"),
        ],
        "tools": [WEATHER, TIME, COIN],
    },
    "tool_round_trip": {
        "messages": [
            user("Weather and time in Paris?"),
            {
                "role": "assistant",
                "content": None,
                "reasoning_content": "Two lookups: weather and local time.",
                "tool_calls": [
                    call("call_w", "get_weather", '{"location":"Paris"}'),
                    call("call_t", "get_time", '{"tz":"Europe/Paris"}'),
                ],
            },
            # Answered out of order: the name comes from the id, not the position.
            {"role": "tool", "tool_call_id": "call_t", "content": '{"time":"14:05"}'},
            {"role": "tool", "tool_call_id": "call_w", "content": '{"sunny":true,"temp_c":21}'},
        ],
        "tools": [WEATHER, TIME],
    },
    "tool_call_with_preamble": {
        "messages": [
            user("Flip a coin for me."),
            {
                "role": "assistant",
                "content": "Flipping now.",
                "reasoning_content": "User wants a coin flip.",
                "tool_calls": [call("c1", "flip_coin", "{}")],
            },
            {"role": "tool", "tool_call_id": "c1", "content": "heads"},
        ],
        "tools": [COIN],
    },
    "reasoning_dropped_after_final": {
        "messages": [
            user("What is 2+2?"),
            {"role": "assistant", "content": "4.", "reasoning_content": "Simple sum."},
            user("And 3+3?"),
            {"role": "assistant", "content": "6.", "thinking": "Another sum."},
            user("Thanks. And 4+4?"),
        ]
    },
    "reasoning_kept_for_tool_call": {
        "messages": [
            user("Hi, what is 2+2?"),
            {"role": "assistant", "content": "4.", "reasoning": "Easy."},
            user("Now the weather in Oslo?"),
            {
                "role": "assistant",
                "content": None,
                "reasoning_content": "Need get_weather for Oslo.",
                "tool_calls": [call("call_1", "get_weather", '{"location":"Oslo","days":1}')],
            },
            {"role": "tool", "tool_call_id": "call_1", "content": '{"snow":true}'},
        ],
        "tools": [WEATHER],
    },
    "effort_low": {"messages": [user("Summarise harmony in one line.")], "reasoning_effort": "low"},
    "effort_medium": {
        "messages": [user("Summarise harmony in one line.")],
        "reasoning_effort": "medium",
    },
    "effort_high": {"messages": [user("Summarise harmony in one line.")], "reasoning_effort": "high"},
}

EFFORT = {
    "low": h.ReasoningEffort.LOW,
    "medium": h.ReasoningEffort.MEDIUM,
    "high": h.ReasoningEffort.HIGH,
}


def text_of(content):
    if content is None:
        return None
    if isinstance(content, str):
        return content
    return "".join(part["text"] for part in content)


def conversation(request):
    effort = EFFORT[request.get("reasoning_effort", "medium")]
    system = h.SystemContent.new().with_reasoning_effort(effort).with_conversation_start_date(DATE)
    messages = [h.Message.from_role_and_content(h.Role.SYSTEM, system)]

    instructions = [
        text_of(m["content"])
        for m in request["messages"]
        if m["role"] in ("system", "developer") and text_of(m.get("content"))
    ]
    tools = [
        h.ToolDescription.new(
            t["function"]["name"],
            t["function"].get("description", ""),
            parameters=t["function"].get("parameters"),
        )
        for t in request.get("tools", [])
    ]
    if instructions or tools:
        developer = h.DeveloperContent.new()
        if instructions:
            developer = developer.with_instructions("\n\n".join(instructions))
        if tools:
            developer = developer.with_function_tools(tools)
        messages.append(h.Message.from_role_and_content(h.Role.DEVELOPER, developer))

    call_names = {}
    for m in request["messages"]:
        role = m["role"]
        if role == "user":
            messages.append(h.Message.from_role_and_content(h.Role.USER, text_of(m["content"])))
        elif role == "assistant":
            reasoning = next(
                (m[k] for k in ("reasoning_content", "reasoning", "thinking") if m.get(k)), None
            )
            if reasoning:
                messages.append(
                    h.Message.from_role_and_content(h.Role.ASSISTANT, reasoning).with_channel(
                        "analysis"
                    )
                )
            calls = m.get("tool_calls") or []
            content = text_of(m.get("content"))
            if calls and content:
                messages.append(
                    h.Message.from_role_and_content(h.Role.ASSISTANT, content).with_channel(
                        "commentary"
                    )
                )
            elif not calls and content is not None:
                messages.append(
                    h.Message.from_role_and_content(h.Role.ASSISTANT, content).with_channel("final")
                )
            for c in calls:
                name = c["function"]["name"]
                call_names[c["id"]] = name
                messages.append(
                    h.Message.from_role_and_content(h.Role.ASSISTANT, c["function"]["arguments"])
                    .with_channel("commentary")
                    .with_recipient(f"functions.{name}")
                    .with_content_type("<|constrain|>json")
                )
        elif role == "tool":
            name = call_names[m["tool_call_id"]]
            author = h.Author.new(h.Role.TOOL, f"functions.{name}")
            messages.append(
                h.Message.from_author_and_content(author, text_of(m["content"]))
                .with_channel("commentary")
                .with_recipient("assistant")
            )
    return h.Conversation.from_messages(messages)


def main():
    encoding = h.load_harmony_encoding(h.HarmonyEncodingName.HARMONY_GPT_OSS)
    OUT.mkdir(parents=True, exist_ok=True)
    for name, request in CASES.items():
        tokens = encoding.render_conversation_for_completion(
            conversation(request), h.Role.ASSISTANT
        )
        # The request readable, the tokens on one line.
        text = (
            f'{{"request": {json.dumps(request, ensure_ascii=False, indent=1)},\n'
            f' "date": "{DATE}",\n "tokens": {json.dumps(tokens)}}}\n'
        )
        path = OUT / f"{name}.json"
        path.write_text(text, encoding="utf-8")
        print(f"{path.relative_to(OUT.parent.parent.parent.parent)}: {len(tokens)} tokens")


if __name__ == "__main__":
    main()
