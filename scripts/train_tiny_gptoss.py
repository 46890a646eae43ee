"""Trains the tiny gpt-oss model that Berth's harmony end-to-end tests serve.

A random-weight model cannot show that a served gpt-oss pack separates reasoning, answers and tool
calls: it never writes a harmony channel header by itself. This script trains a tiny
`GptOssForCausalLM` (transformers' own model, so the architecture is exactly gpt-oss) to speak
harmony on a small synthetic task: prompts rendered by OpenAI's `openai-harmony` package, with or
without a `get_weather` tool, asking for the weather or a capital; answers reason on the `analysis`
channel, then either call the tool on `commentary to=functions.get_weather` (compact JSON arguments,
as gpt-oss writes them) or answer on `final`, and after a tool result answer from it.

The vocabulary is gpt-oss's real o200k_harmony (201,088 ids). Only the tokens the corpus uses get
trained embedding and output rows; every other row is zero (an unused token's logit is exactly 0),
so the committed file stays small: `tests/fixtures/tiny-gptoss/compact.safetensors` holds the used
ids, their rows and every other tensor; `host/tests/common` expands it into a full pack.

Run once (needs torch + transformers + openai-harmony; not part of CI):
  scripts/harmony-env          # o200k_base.tiktoken from gpt-oss's own tokenizer, no download
  TIKTOKEN_ENCODINGS_BASE=~/.cache/berth/tiktoken ~/.cache/berth/gguf-venv/bin/python \
      scripts/train_tiny_gptoss.py tests/fixtures/tiny-gptoss
"""

import json
import math
import random
import sys
from pathlib import Path

import torch
from openai_harmony import (
    Author,
    Conversation,
    DeveloperContent,
    HarmonyEncodingName,
    Message,
    ReasoningEffort,
    Role,
    SystemContent,
    ToolDescription,
    load_harmony_encoding,
)
from safetensors.torch import save_file
from transformers import GptOssConfig, GptOssForCausalLM

VOCAB = 201088
ENC = load_harmony_encoding(HarmonyEncodingName.HARMONY_GPT_OSS)

WEATHER_TOOL = ToolDescription.new(
    "get_weather",
    "Get the current weather in a city.",
    parameters={
        "type": "object",
        "properties": {"city": {"type": "string", "description": "The city name."}},
        "required": ["city"],
    },
)
CITIES = ["Paris", "London", "Tokyo", "Berlin", "Madrid", "Rome", "Oslo", "Lima", "Cairo", "Seoul"]
CAPITALS = {
    "France": "Paris",
    "Japan": "Tokyo",
    "Germany": "Berlin",
    "Spain": "Madrid",
    "Italy": "Rome",
    "Norway": "Oslo",
    "Peru": "Lima",
    "Egypt": "Cairo",
}
WEATHER_QUESTIONS = ["What is the weather in {}?", "How is the weather in {} today?", "Weather in {}?"]
CAPITAL_QUESTIONS = ["What is the capital of {}?", "Which city is the capital of {}?"]
CONDITIONS = ["sunny", "cloudy", "rainy", "windy"]
INSTRUCTIONS = [None, "You are a helpful assistant.", "Answer briefly."]
EFFORTS = [ReasoningEffort.LOW, ReasoningEffort.MEDIUM, ReasoningEffort.HIGH]


def system(rng):
    day = f"20{rng.randint(25, 30)}-{rng.randint(1, 12):02d}-{rng.randint(1, 28):02d}"
    return Message.from_role_and_content(
        Role.SYSTEM,
        SystemContent.new()
        .with_reasoning_effort(rng.choice(EFFORTS))
        .with_conversation_start_date(day),
    )


def developer(rng, tools):
    content = DeveloperContent.new()
    instructions = rng.choice(INSTRUCTIONS)
    if instructions:
        content = content.with_instructions(instructions)
    if tools:
        content = content.with_function_tools([WEATHER_TOOL])
    if not instructions and not tools:
        return []
    return [Message.from_role_and_content(Role.DEVELOPER, content)]


def analysis(text):
    return Message.from_role_and_content(Role.ASSISTANT, text).with_channel("analysis")


def call(city):
    return (
        Message.from_role_and_content(Role.ASSISTANT, json.dumps({"city": city}, separators=(",", ":")))
        .with_channel("commentary")
        .with_recipient("functions.get_weather")
        .with_content_type("<|constrain|>json")
    )


def final(text):
    return Message.from_role_and_content(Role.ASSISTANT, text).with_channel("final")


def sample(rng):
    """One (prompt tokens, completion tokens) pair."""
    kind = rng.choice(["call", "call", "capital", "capital_with_tools", "after_tool"])
    tools = kind != "capital"
    head = [system(rng)] + developer(rng, tools)
    if kind in ("call", "after_tool"):
        city = rng.choice(CITIES)
        user = Message.from_role_and_content(Role.USER, rng.choice(WEATHER_QUESTIONS).format(city))
        think = analysis(f"The user asks about the weather in {city}. I should call get_weather.")
        if kind == "call":
            history, answer = [user], [think, call(city)]
        else:
            degrees = rng.randint(-5, 35)
            condition = rng.choice(CONDITIONS)
            result = Message.from_author_and_content(
                Author.new(Role.TOOL, "functions.get_weather"),
                json.dumps({"temperature": degrees, "condition": condition}),
            ).with_channel("commentary").with_recipient("assistant")
            history = [user, think, call(city), result]
            answer = [
                analysis("The tool returned the weather. I can answer now."),
                final(f"It is {condition} and {degrees} degrees in {city}."),
            ]
    else:
        country = rng.choice(sorted(CAPITALS))
        user = Message.from_role_and_content(Role.USER, rng.choice(CAPITAL_QUESTIONS).format(country))
        history = [user]
        answer = [
            analysis(f"The user asks for the capital of {country}. No tool is needed."),
            final(f"The capital of {country} is {CAPITALS[country]}."),
        ]
    prompt = ENC.render_conversation_for_completion(Conversation.from_messages(head + history), Role.ASSISTANT)
    return prompt, ENC.encode(completion_text(answer), allowed_special="all")


def completion_text(answer):
    """What gpt-oss writes after `<|start|>assistant`, in the form OpenAI's format guide shows:
    the channel first, then any recipient; messages joined by `<|end|><|start|>assistant`, the
    last ending in `<|call|>` (a call) or `<|return|>` (an answer)."""
    parts = []
    for m in answer:
        header = f"<|channel|>{m.channel}"
        if m.recipient:
            header += f" to={m.recipient} <|constrain|>json"
        parts.append(f"{header}<|message|>{m.content[0].text}")
    end = "<|call|>" if answer[-1].recipient else "<|return|>"
    return "<|end|><|start|>assistant".join(parts) + end


def main():
    out = Path(sys.argv[1])
    out.mkdir(parents=True, exist_ok=True)
    rng = random.Random(1234)
    torch.manual_seed(1234)
    data = [sample(rng) for _ in range(600)]
    held_out = [sample(rng) for _ in range(40)]
    used = sorted({t for p, c in data + held_out for t in p + c})
    index = {t: i for i, t in enumerate(used)}
    print(f"{len(data)} samples, {len(used)} distinct tokens, longest {max(len(p) + len(c) for p, c in data)}")

    config = GptOssConfig(
        vocab_size=VOCAB,
        hidden_size=64,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        num_local_experts=4,
        num_experts_per_tok=2,
        sliding_window=128,
        layer_types=["sliding_attention", "full_attention"],
        max_position_embeddings=4096,
        rope_parameters={
            "rope_type": "yarn",
            "rope_theta": 150000.0,
            "factor": 32.0,
            "beta_fast": 32.0,
            "beta_slow": 1.0,
            "original_max_position_embeddings": 4096,
            "truncate": False,
        },
        tie_word_embeddings=False,
        eos_token_id=[200002, 199999, 200012],
        pad_token_id=199999,
        bos_token_id=199998,
    )
    config._attn_implementation = "eager"
    body = GptOssForCausalLM(config).model.float()
    body.embed_tokens = None  # replaced by the used rows below
    embed = torch.nn.Parameter(torch.randn(len(used), 64) * 0.5)
    head = torch.nn.Parameter(torch.randn(len(used), 64) * 0.02)
    params = [p for p in body.parameters()] + [embed, head]
    opt = torch.optim.AdamW(params, lr=1e-2, weight_decay=0.0)
    # Unused tokens' logits are exactly 0: their exp-sum is a constant in every softmax.
    unused = math.log(VOCAB - len(used))

    def loss_of(batch):
        # Right-padded batch: causal attention keeps padding out of every real position.
        longest = max(len(p) + len(c) for p, c in batch)
        ids = torch.zeros(len(batch), longest, dtype=torch.long)
        rows, cols, targets = [], [], []
        for b, (prompt, completion) in enumerate(batch):
            seq = [index[t] for t in prompt + completion]
            ids[b, : len(seq)] = torch.tensor(seq)
            for j, t in enumerate(completion):
                rows.append(b)
                cols.append(len(prompt) - 1 + j)
                targets.append(index[t])
        hidden = body(inputs_embeds=embed[ids]).last_hidden_state
        logits = hidden[torch.tensor(rows), torch.tensor(cols)] @ head.T
        lse = torch.logaddexp(torch.logsumexp(logits, -1), torch.tensor(unused))
        picked = logits.gather(1, torch.tensor(targets)[:, None])[:, 0]
        return (lse - picked).mean()

    steps = int(sys.argv[2]) if len(sys.argv) > 2 else 1600
    for step in range(steps):
        lr = 1e-2 * min(1.0, (step + 1) / 30) * (0.5 * (1 + math.cos(math.pi * step / steps)))
        for g in opt.param_groups:
            g["lr"] = lr
        batch = rng.sample(data, 8)
        loss = loss_of(batch)
        opt.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        if step % 25 == 0 or step == steps - 1:
            print(f"step {step} loss {loss.item():.4f}", flush=True)

    # Round to what the pack stores (embedding and output rows in bf16, the rest f32) and check
    # that greedy decoding reproduces every held-out answer exactly.
    with torch.no_grad():
        embed.copy_(embed.bfloat16().float())
        head.copy_(head.bfloat16().float())
        exact = 0
        for prompt, completion in held_out:
            ids = [index[t] for t in prompt]
            got = []
            for _ in range(len(completion) + 4):
                hidden = body(inputs_embeds=embed[torch.tensor(ids)][None]).last_hidden_state[0, -1]
                logits = hidden @ head.T
                best = int(logits.argmax())
                if logits[best] <= 0:
                    got.append(-1)  # an unused token (logit 0) would win
                    break
                got.append(used[best])
                ids.append(best)
                if used[best] in (200002, 200012):
                    break
            exact += got == completion
            if got != completion and exact + 3 > held_out.index((prompt, completion)):
                print("MISMATCH", ENC.decode(completion), "\n   GOT", ENC.decode([t for t in got if t >= 0]))
        print(f"held-out exact greedy answers: {exact}/{len(held_out)}")

    tensors = {k: v.detach().float().contiguous() for k, v in body.state_dict().items()}
    tensors = {f"model.{k}": v for k, v in tensors.items()}
    tensors["berth.used_ids"] = torch.tensor(used, dtype=torch.int32)
    tensors["berth.embed_rows"] = embed.detach().bfloat16().contiguous()
    tensors["berth.lm_head_rows"] = head.detach().bfloat16().contiguous()
    save_file(tensors, str(out / "compact.safetensors"))
    cfg = config.to_dict()
    cfg.pop("_attn_implementation", None)
    cfg["architectures"] = ["GptOssForCausalLM"]
    cfg["dtype"] = "float32"
    (out / "config.json").write_text(json.dumps(cfg, indent=2, sort_keys=True) + "\n")
    (out / "generation_config.json").write_text(
        json.dumps({"bos_token_id": 199998, "eos_token_id": [200002, 199999, 200012], "pad_token_id": 199999}, indent=2)
        + "\n"
    )
    print("wrote", out)


if __name__ == "__main__":
    main()
