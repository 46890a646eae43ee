"""Renders chat-template fixture cases with transformers' `apply_chat_template` (see
scripts/gen-template-fixtures, which sets up the environment and calls this).

Each case's `messages` are in the OpenAI API's shape, as a Berth request carries them: an assistant
call's `function.arguments` is a JSON string. transformers expects the arguments as a dict, so the
string is decoded (key order kept) before rendering; Berth's renderer must do the same.
"""

import argparse
import hashlib
import json

import gguf
import jinja2
import tokenizers
import transformers
from tokenizers import Tokenizer, models
from transformers import PreTrainedTokenizerFast

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Current weather in a city (°C)",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"type": "string", "description": "City name, e.g. Zürich"},
                "days": {"type": "integer", "minimum": 1},
                "units": {"type": "string", "enum": ["metric", "imperial"]},
            },
            "required": ["city"],
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


def call(id_, name, arguments):
    return {"id": id_, "type": "function", "function": {"name": name, "arguments": arguments}}


CASES = [
    {
        "name": "plain_chat",
        "messages": [
            {"role": "user", "content": "Hi!"},
            {"role": "assistant", "content": "Hello! How can I help?"},
            {"role": "user", "content": "Say \"ok\" twice.\nThanks."},
        ],
        "add_generation_prompt": True,
    },
    {
        "name": "plain_chat_with_system",
        "messages": [
            {"role": "system", "content": "Be brief."},
            {"role": "user", "content": "What is 2+2?"},
        ],
        "add_generation_prompt": True,
    },
    {
        "name": "tools",
        "messages": [
            {"role": "system", "content": "You help with travel."},
            {"role": "user", "content": "Weather in Zürich?"},
        ],
        "tools": [WEATHER, TIME],
        "add_generation_prompt": True,
    },
    {
        "name": "tools_default_system",
        "messages": [{"role": "user", "content": "What time is it in Tokyo?"}],
        "tools": [TIME],
        "add_generation_prompt": True,
    },
    {
        "name": "tool_call_round_trip",
        "messages": [
            {"role": "user", "content": "Weather in Zürich and the time in Tokyo?"},
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    call("call_0", "get_weather", '{"city": "Zürich", "days": 2}'),
                    call("call_1", "get_time", '{"tz":"Asia/Tokyo"}'),
                ],
            },
            {"role": "tool", "tool_call_id": "call_0", "content": '{"temp": 21, "sky": "sunny"}'},
            {"role": "tool", "tool_call_id": "call_1", "content": "09:30"},
            {"role": "assistant", "content": "Zürich: 21 °C and sunny. Tokyo: 09:30."},
        ],
        "tools": [WEATHER, TIME],
        "add_generation_prompt": False,
    },
    {
        "name": "tool_result_then_generation_prompt",
        "messages": [
            {"role": "system", "content": "You help with travel."},
            {"role": "user", "content": "Weather in Paris?"},
            {
                "role": "assistant",
                "content": "Let me check.",
                "tool_calls": [call("call_0", "get_weather", '{"units": "metric", "city": "Paris"}')],
            },
            {"role": "tool", "tool_call_id": "call_0", "content": "rain"},
        ],
        "tools": [WEATHER],
        "add_generation_prompt": True,
    },
]


QWEN3_CASES = [
    {
        "name": "thinking_default",
        "messages": [{"role": "user", "content": "Hi!"}],
        "add_generation_prompt": True,
    },
    {
        "name": "thinking_off_by_kwargs",
        "messages": [{"role": "user", "content": "Hi!"}],
        "add_generation_prompt": True,
        "kwargs": {"enable_thinking": False},
    },
    {
        "name": "reasoning_and_tool_call_round_trip",
        "messages": [
            {"role": "system", "content": "You help with travel."},
            {"role": "user", "content": "Weather in Zürich?"},
            {
                "role": "assistant",
                "content": "",
                "reasoning_content": "The user wants the weather.",
                "tool_calls": [call("call_0", "get_weather", '{"city": "Zürich"}')],
            },
            {"role": "tool", "tool_call_id": "call_0", "content": "sunny"},
            {"role": "assistant", "content": "Sunny.", "reasoning_content": "Report it."},
        ],
        "tools": [WEATHER],
        "add_generation_prompt": False,
        "kwargs": {"enable_thinking": True},
    },
]

MODELS = {"qwen2.5-coder-0.5b": CASES, "qwen3": QWEN3_CASES}


def read_gguf_template(path):
    reader = gguf.GGUFReader(path)
    field = reader.fields["tokenizer.chat_template"]
    return bytes(field.parts[field.data[0]]).decode("utf-8")


def for_transformers(messages):
    """The API shape -> transformers' shape: call arguments decoded to dicts (order kept)."""
    out = []
    for m in messages:
        m = json.loads(json.dumps(m))
        for c in m.get("tool_calls") or []:
            args = c["function"]["arguments"]
            if isinstance(args, str):
                try:
                    decoded = json.loads(args)
                except ValueError:
                    decoded = None
                if isinstance(decoded, dict):
                    c["function"]["arguments"] = decoded
        out.append(m)
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--gguf", help="read the template from this GGUF")
    ap.add_argument("--config", help="read the template from this tokenizer_config.json")
    ap.add_argument("--name", required=True, choices=sorted(MODELS))
    ap.add_argument("--out", required=True)
    args = ap.parse_args()

    if args.gguf:
        template = read_gguf_template(args.gguf)
    else:
        with open(args.config, encoding="utf-8") as f:
            template = json.load(f)["chat_template"]
    eos = "<|im_end|>"
    vocab = {"<unk>": 0, eos: 1}
    tok = PreTrainedTokenizerFast(
        tokenizer_object=Tokenizer(models.WordLevel(vocab, unk_token="<unk>")),
        eos_token=eos,
    )
    tok.chat_template = template

    cases = []
    for case in MODELS[args.name]:
        kwargs = dict(case.get("kwargs") or {})
        prompt = tok.apply_chat_template(
            for_transformers(case["messages"]),
            tools=case.get("tools"),
            add_generation_prompt=case["add_generation_prompt"],
            tokenize=False,
            **kwargs,
        )
        cases.append({**case, "prompt": prompt})

    fixture = {
        "about": "Chat template renders by transformers' apply_chat_template; generated by "
        "scripts/gen-template-fixtures. Messages are in the OpenAI API shape (call arguments "
        "are JSON strings).",
        "model": args.name,
        "generator": {
            "transformers": transformers.__version__,
            "jinja2": jinja2.__version__,
            "tokenizers": tokenizers.__version__,
        },
        "eos_token": eos,
        "bos_token": "",
        "template_sha256": hashlib.sha256(template.encode("utf-8")).hexdigest(),
        "template": template,
        "cases": cases,
    }
    with open(args.out, "w", encoding="utf-8") as f:
        json.dump(fixture, f, ensure_ascii=False, indent=2)
        f.write("\n")
    print(f"wrote {len(cases)} cases to {args.out}")


if __name__ == "__main__":
    main()
