"""Record how OpenAI's openai-harmony parses a corpus of gpt-oss assistant completions.

Each completion is harmony text as the model writes it after the prompt's final
`<|start|>assistant`. It is tokenised with the package's own encoding (special tokens allowed)
and parsed twice with the role `assistant`:
  - `parse_messages_from_completion_tokens` (strict, the package's default);
  - `StreamableParser`, token by token, then `process_eos`, keeping the unfinished message the
    parser holds when the tokens end (channel, recipient, content) as a serving stack does.
Either parse may raise; then the error text is recorded instead of the messages.

Writes tests/fixtures/harmony/parse/NAME.json:
  {"completion": text, "tokens": [ids], "tools": [declared function names],
   "messages": [messages as the package returns them] | {"error": text},
   "stream": {"messages": [...], "current": {channel, recipient, content_type, content} | null}
             | {"error": text, "at_token": index, "messages": [...], "current": ...}}
Usage: scripts/harmony-parse-reference (sets up the venv and TIKTOKEN_ENCODINGS_BASE).
"""

import json
import pathlib
import sys

import openai_harmony as h

OUT = pathlib.Path(__file__).resolve().parent.parent / "tests" / "fixtures" / "harmony" / "parse"

# The functions a request declares (the same two in every case).
TOOLS = ["get_weather", "get_time"]

W = '{"location":"Paris"}'
T = '{"tz":"CET"}'
CALL_W = f"<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>{W}<|call|>"

# name -> completion (what follows the prompt's `<|start|>assistant`).
CORPUS = {
    # Regular turns.
    "analysis_then_final": "<|channel|>analysis<|message|>User asks 2+2. Answer 4.<|end|>"
    "<|start|>assistant<|channel|>final<|message|>2 + 2 = 4.<|return|>",
    "final_only": "<|channel|>final<|message|>Hello! How can I help?<|return|>",
    "final_ends_with_end": "<|channel|>final<|message|>Hello! How can I help?<|end|>",
    "final_without_stop": "<|channel|>final<|message|>Hello! How can I help?",
    "analysis_then_call": "<|channel|>analysis<|message|>Need weather; call get_weather.<|end|>"
    f"<|start|>assistant{CALL_W}",
    "call_only": CALL_W,
    "preamble_then_call": "<|channel|>analysis<|message|>Look it up.<|end|>"
    "<|start|>assistant<|channel|>commentary<|message|>Let me check the weather for you.<|end|>"
    f"<|start|>assistant{CALL_W}",
    "two_calls": f"{CALL_W}<|start|>assistant<|channel|>commentary to=functions.get_time "
    f"<|constrain|>json<|message|>{T}<|call|>",
    "two_calls_without_start": f"{CALL_W}<|channel|>commentary to=functions.get_time "
    f"<|constrain|>json<|message|>{T}<|call|>",
    "recipient_before_channel": "<|channel|>analysis<|message|>Time in Paris.<|end|>"
    "<|start|>assistant to=functions.get_time<|channel|>commentary <|constrain|>json"
    f"<|message|>{T}<|call|>",
    "first_header_recipient_before_channel": " to=functions.get_time<|channel|>commentary "
    f"<|constrain|>json<|message|>{T}<|call|>",
    "multiline_content": "<|channel|>analysis<|message|>Line one.\n\nLine two:\n- a\n- b<|end|>"
    "<|start|>assistant<|channel|>final<|message|>Here:\n\n```json\n{\"a\": [1, 2]}\n```\n"
    "Done.<|return|>",
    "empty_analysis": "<|channel|>analysis<|message|><|end|>"
    "<|start|>assistant<|channel|>final<|message|>Ok.<|return|>",
    "unicode": "<|channel|>analysis<|message|>Café ☕ — 東京 🌧️<|end|>"
    "<|start|>assistant<|channel|>final<|message|>Il pleut à 東京 🌧️.<|return|>",
    # Unfinished (generation cut by max_tokens).
    "cut_mid_analysis": "<|channel|>analysis<|message|>The user wants the weather in Par",
    "cut_mid_final": "<|channel|>analysis<|message|>Simple.<|end|>"
    "<|start|>assistant<|channel|>final<|message|>The answer is 4",
    "cut_mid_call_arguments": "<|channel|>analysis<|message|>Call it.<|end|>"
    "<|start|>assistant<|channel|>commentary to=functions.get_weather <|constrain|>json"
    '<|message|>{"location":"Pa',
    "cut_mid_header": "<|channel|>analysis<|message|>Call it.<|end|>"
    "<|start|>assistant<|channel|>commentary to=functions.get_wea",
    "cut_after_start": "<|channel|>analysis<|message|>Hmm.<|end|><|start|>assistant",
    # Irregular output seen from gpt-oss.
    "missing_message": "<|channel|>final Hello there.<|return|>",
    "missing_message_then_final": "<|channel|>analysis<|end|>"
    "<|start|>assistant<|channel|>final<|message|>Hi.<|return|>",
    "unknown_channel": "<|channel|>thoughts<|message|>I think.<|end|>"
    "<|start|>assistant<|channel|>final<|message|>Hi.<|return|>",
    "stray_commentary_prefix": "<|channel|>commentary<|channel|>analysis<|message|>Thinking.<|end|>"
    "<|start|>assistant<|channel|>final<|message|>Done.<|return|>",
    "stray_commentary_to_assistant_prefix": "<|channel|>commentary to=assistant<|channel|>final"
    "<|message|>Done.<|return|>",
    "bare_json_content_type": "<|channel|>commentary to=functions.get_time json"
    f"<|message|>{T}<|call|>",
    "constrain_without_space": "<|channel|>commentary to=functions.get_time<|constrain|>json"
    f"<|message|>{T}<|call|>",
    "call_on_analysis_channel": "<|channel|>analysis to=functions.get_time <|constrain|>json"
    f"<|message|>{T}<|call|>",
    "builtin_browser_search": "<|channel|>analysis<|message|>Search the web.<|end|>"
    "<|start|>assistant<|channel|>analysis to=browser.search code<|message|>"
    '{"query":"weather Paris"}<|call|>',
    "builtin_then_final": "<|channel|>analysis to=python code<|message|>print(2+2)<|call|>"
    "<|start|>assistant<|channel|>final<|message|>4<|return|>",
    "undeclared_function": "<|channel|>commentary to=functions.get_stock <|constrain|>json"
    '<|message|>{"ticker":"X"}<|call|>',
    "invalid_json_arguments": "<|channel|>commentary to=functions.get_weather <|constrain|>json"
    '<|message|>{"location": Paris}<|call|>',
    "text_before_header": "Sure<|channel|>final<|message|>Hi.<|return|>",
    "text_between_messages": "<|channel|>analysis<|message|>a<|end|>oops"
    "<|start|>assistant<|channel|>final<|message|>b<|return|>",
    "no_channel": "<|message|>Hi.<|return|>",
    "content_after_return": "<|channel|>final<|message|>Hi.<|return|>more",
    "start_inside_content": "<|channel|>final<|message|>Done<|start|>is it text? no.<|return|>",
    "end_then_eos": "<|channel|>final<|message|>Hi.<|end|><|endoftext|>",
}


def message(m: h.Message) -> dict:
    return m.to_dict()


def strict_parse(enc, tokens):
    try:
        return [message(m) for m in enc.parse_messages_from_completion_tokens(tokens, h.Role.ASSISTANT)]
    except Exception as e:  # the package raises HarmonyError (or ValueError) on malformed input
        return {"error": str(e)}


def stream_parse(enc, tokens):
    p = h.StreamableParser(enc, h.Role.ASSISTANT)

    def current():
        if p.current_role is None and not p.current_content:
            return None
        return {
            "channel": p.current_channel,
            "recipient": p.current_recipient,
            "content_type": p.current_content_type,
            "content": p.current_content,
        }

    for i, t in enumerate(tokens):
        try:
            p.process(t)
        except Exception as e:
            return {"error": str(e), "at_token": i, "messages": [message(m) for m in p.messages], "current": current()}
    cur = current()
    try:
        p.process_eos()
    except Exception as e:
        return {"error": str(e), "at_token": len(tokens), "messages": [message(m) for m in p.messages], "current": cur}
    return {"messages": [message(m) for m in p.messages], "current": cur}


def main() -> None:
    enc = h.load_harmony_encoding(h.HarmonyEncodingName.HARMONY_GPT_OSS)
    OUT.mkdir(parents=True, exist_ok=True)
    only = set(sys.argv[1:])
    for name, text in CORPUS.items():
        if only and name not in only:
            continue
        tokens = enc.encode(text, allowed_special="all")
        assert enc.decode(tokens) == text, name
        record = {
            "completion": text,
            "tokens": tokens,
            "tools": TOOLS,
            "messages": strict_parse(enc, tokens),
            "stream": stream_parse(enc, tokens),
        }
        path = OUT / f"{name}.json"
        text_out = json.dumps(record, ensure_ascii=False, indent=1)
        # The ids on one line (the file stays readable and small).
        text_out = text_out.replace(json.dumps(tokens, indent=1).replace("\n", "\n "), json.dumps(tokens), 1)
        path.write_text(text_out + "\n", encoding="utf-8")
        print(f"{path.relative_to(OUT.parent.parent.parent.parent)}: {json.dumps(record['messages'])[:160]}")


if __name__ == "__main__":
    main()
