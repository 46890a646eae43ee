#!/usr/bin/env python3
"""Records llama.cpp reference fixtures for Berth (run by scripts/llamacpp-reference).

For each model: prompt token ids as llama.cpp tokenizes them, the first 64 pure-argmax
(greedy) generated token ids (stopping early only at an end-of-generation token), the
decoded text, and the top-5 (id, logit) at the first generated step. Plus a tokenizer
oracle (tokenize.json) over ~60 varied strings for both models.

Greedy decoding is done by hand: llm.eval() the tokens, read the last row of logits from
llama.cpp (llama_get_logits_ith(ctx, -1)), take argmax (lowest id on an exact tie, like
numpy), feed it back. No sampler, no penalties. As a cross-check the same prompt is also
run through llm.generate(temp=0, top_k=1, repeat_penalty=1.0) and the agreement recorded.
"""
import argparse
import ctypes
import datetime
import hashlib
import json
import os
import re
import sys

import numpy as np
import jinja2
import llama_cpp
from llama_cpp import Llama

N_GEN = 64
N_THREADS = 2
N_CTX = 2048

QWEN_SYSTEM_DEFAULT = "You are Qwen, created by Alibaba Cloud. You are a helpful assistant."
QWEN_FRANCE = (
    "<|im_start|>system\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant.<|im_end|>\n"
    "<|im_start|>user\nWhat is the capital of France? Answer in one sentence.<|im_end|>\n"
    "<|im_start|>assistant\n"
)
QWEN_FIB = (
    "<|im_start|>system\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant.<|im_end|>\n"
    "<|im_start|>user\nWrite a Python function that returns the nth Fibonacci number.<|im_end|>\n"
    "<|im_start|>assistant\n"
)

# Strings for the tokenizer oracle. Keep them varied: whitespace runs, code, numbers,
# contractions, accented Latin, CJK, Cyrillic, emoji (incl. ZWJ), RTL, special-token text.
TOKENIZE_STRINGS = [
    "",
    " ",
    "  ",
    "   ",
    "\n",
    "\n\n",
    "\t",
    " \t\n ",
    "Hello",
    "Hello world",
    " Hello world",
    "Hello world ",
    "Hello  world",
    "Hello   world!!!",
    "  leading and trailing  ",
    "line one\nline two\n\nline four",
    "col1\tcol2\t\tcol4",
    "\r\nwindows\r\nnewlines",
    "The quick brown fox jumps over the lazy dog.",
    "I'm sure you'll see they've done what we'd said wasn't possible, didn't they?",
    "DON'T SHOUT. I'LL WHISPER",
    "12345678",
    "3.14159 2.71828 -42 +7 1e-9 0x1F 1,000,000",
    "In 2024, 12 of 365 days were 100% sunny.",
    "def fib(n):\n    if n < 2:\n        return n\n    return fib(n - 1) + fib(n - 2)\n",
    "fn main() {\n\tprintln!(\"{}\", x.iter().map(|v| v * 2).sum::<i32>());\n}",
    "for (int i = 0; i < n; ++i) { a[i] += b[i] >> 1; }",
    "    indented code\n        more indented",
    "{\"key\": [1, 2, 3], \"nested\": {\"ok\": true, \"v\": null}}",
    "https://example.com/path?query=1&x=y#frag",
    "user@example.org",
    "café naïve résumé façade",
    "Ångström über Straße jalapeño",
    "Le cœur a ses raisons que la raison ne connaît point.",
    "Zażółć gęślą jaźń",
    "日本語のテキストです。",
    "中文分词测试：你好，世界！",
    "한국어 문장입니다",
    "Привет, мир! Как дела?",
    "Ελληνικά γράμματα",
    "مرحبا بالعالم",
    "שלום עולם",
    "mixed English עברית and العربية text",
    "emoji 😀😃😄 done",
    "👨‍👩‍👧‍👦 family",
    "🏳️‍🌈 flag and 👍🏽 thumbs",
    "❤️ ✔️ ™ © ®",
    "∀x ∈ ℝ: x² ≥ 0 → √(x²) = |x|",
    "<|im_start|>",
    "<|im_end|>",
    "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n",
    "<|endoftext|>",
    "<start_of_turn>",
    "<end_of_turn>",
    "<start_of_turn>user\nhi<end_of_turn>\n<start_of_turn>model\n",
    "<bos>",
    "<eos>",
    "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>",
    "<|fim_prefix|>def f():<|fim_suffix|>\n<|fim_middle|>",
    "text<|im_end|>after",
    "a" * 40,
    "!!!???...,,,;;;",
    "ﬁ ligature and ½ fraction and Ⅻ",
    "null\u0000byte",
    "zero\u200bwidth\u200cjoiner\u200d",
    "x\u0301 combining acute",
]


def sha256(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def text_of(b: bytes):
    """JSON-friendly form of a byte string: text, and hex when it is not valid UTF-8."""
    try:
        return {"text": b.decode("utf-8")}
    except UnicodeDecodeError:
        return {"text": b.decode("utf-8", errors="replace"), "hex": b.hex()}


def last_logits(llm):
    ptr = llama_cpp.llama_get_logits_ith(llm._ctx.ctx, -1)
    return np.ctypeslib.as_array(ptr, shape=(llm.n_vocab(),)).copy()


def eog_ids(llm):
    vocab = llama_cpp.llama_model_get_vocab(llm._model.model)
    return [t for t in range(llm.n_vocab()) if llama_cpp.llama_vocab_is_eog(vocab, t)]


def greedy(llm, prompt_ids, eog):
    llm.reset()
    llm.eval(prompt_ids)
    gen, margins, top5 = [], [], None
    stop = {"reason": "max_tokens", "token": None}
    for step in range(N_GEN):
        logits = last_logits(llm)
        order = np.argsort(-logits, kind="stable")
        tok = int(np.argmax(logits))
        assert tok == int(order[0])
        if step == 0:
            top5 = [[int(i), float(logits[i])] for i in order[:5]]
        margins.append(round(float(logits[order[0]] - logits[order[1]]), 5))
        gen.append(tok)
        if tok in eog:
            stop = {"reason": "eog", "token": tok}
            break
        llm.eval([tok])
    return gen, top5, margins, stop


def sampler_greedy(llm, prompt_ids, eog):
    out = []
    llm.reset()  # n_tokens = 0: no KV prefix reuse, the prompt is evaluated as one batch like greedy()
    for tok in llm.generate(prompt_ids, top_k=1, top_p=1.0, min_p=0.0, temp=0.0,
                            repeat_penalty=1.0, reset=True):
        out.append(int(tok))
        if tok in eog or len(out) >= N_GEN:
            break
    return out


def record_model(path, name, prompts, meta_common):
    llm = Llama(model_path=path, n_ctx=N_CTX, n_threads=N_THREADS, logits_all=False, verbose=False)
    md = llm.metadata
    eog = eog_ids(llm)
    gguf_add_bos = md.get("tokenizer.ggml.add_bos_token")
    cases = []
    for label, text, add_bos in prompts:
        ids = llm.tokenize(text.encode("utf-8"), add_bos=add_bos, special=True)
        gen, top5, margins, stop = greedy(llm, ids, set(eog))
        cross = sampler_greedy(llm, ids, set(eog))
        body = gen[:-1] if stop["reason"] == "eog" else gen
        cases.append({
            "name": label,
            "prompt": text,
            "add_bos": add_bos,
            "prompt_ids": ids,
            "generated_ids": gen,
            "stop": stop,
            "generated_text": text_of(llm.detokenize(body))["text"],
            "generated_text_special": text_of(llm.detokenize(gen, special=True))["text"],
            "first_step_top5": top5,
            "step_top1_top2_margin": margins,
            "sampler_cross_check": {
                "method": "llm.generate(temp=0, top_k=1, top_p=1, min_p=0, repeat_penalty=1)",
                "agrees": cross == gen,
                **({} if cross == gen else {"sampler_ids": cross}),
            },
        })
        print(f"{name}/{label}: {len(ids)} prompt ids, {len(gen)} generated, stop={stop}, "
              f"cross_check={'ok' if cross == gen else 'DIFFERS'}", file=sys.stderr)
    out = {
        **meta_common,
        "model": {
            "file": os.path.basename(path),
            "sha256": sha256(path),
            "architecture": md.get("general.architecture"),
            "n_vocab": llm.n_vocab(),
            "bos_id": llm.token_bos(),
            "eos_id": llm.token_eos(),
            "eog_ids": eog,
            "gguf_add_bos_token": gguf_add_bos,
        },
        "params": {"n_ctx": N_CTX, "n_threads": N_THREADS, "logits_all": False, "n_gen": N_GEN,
                   "decoding": "argmax of last-position logits each step; stop only at an EOG token "
                               "(included as the last generated id)",
                   "tokenize": "llm.tokenize(text.encode(), add_bos=add_bos, special=True)",
                   "generated_text": "llm.detokenize(generated_ids without the final EOG)",
                   "step_top1_top2_margin": "logit(top1) - logit(top2) at each generated step; steps with a "
                                            "margin of ~0.01 or less are near-ties that flip under tiny numeric "
                                            "differences (even between llama.cpp's own batch-of-1 and "
                                            "batched prompt evaluation), so an engine may legitimately "
                                            "diverge there"},
        "cases": cases,
    }
    return llm, out


def check_qwen_template(path):
    from gguf import GGUFReader
    r = GGUFReader(path)
    tmpl = r.fields["tokenizer.chat_template"].contents()
    env = jinja2.Environment(trim_blocks=True, lstrip_blocks=True)  # HF-style rendering
    t = env.from_string(tmpl)
    for literal, q in ((QWEN_FRANCE, "What is the capital of France? Answer in one sentence."),
                       (QWEN_FIB, "Write a Python function that returns the nth Fibonacci number.")):
        rendered = t.render(messages=[{"role": "user", "content": q}], add_generation_prompt=True,
                            tools=None)
        if rendered != literal:
            sys.exit(f"Qwen template renders differently:\n{rendered!r}\nvs literal\n{literal!r}")
    assert QWEN_SYSTEM_DEFAULT in tmpl
    return hashlib.sha256(tmpl.encode()).hexdigest()


def tokenize_oracle(llm):
    rows = []
    for s in TOKENIZE_STRINGS:
        ids = llm.tokenize(s.encode("utf-8"), add_bos=False, special=True)
        rows.append({
            "text": s,
            "ids": ids,
            "detokenized": text_of(llm.detokenize(ids)),
            "detokenized_special": text_of(llm.detokenize(ids, special=True)),
        })
    return rows


def dumps(obj):
    """Indented JSON with every list of plain numbers / number pairs kept on one line."""
    text = json.dumps(obj, ensure_ascii=False, indent=1)
    num = r"-?[0-9][0-9.eE+-]*"
    pair = rf"\[\s*{num},\s*{num}\s*\]"
    flat = re.compile(rf"\[(\s*(?:{num}|{pair})(?:,\s*(?:{num}|{pair}))*\s*)\]")
    return flat.sub(lambda m: "[" + re.sub(r"\s+", " ", m.group(1)).strip().replace("[ ", "[").replace(" ]", "]") + "]", text)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--qwen", required=True)
    ap.add_argument("--gemma", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--version", required=True)
    ap.add_argument("--changelog")
    a = ap.parse_args()

    commit = None
    if a.changelog and os.path.exists(a.changelog):
        # The first "update llama.cpp to ggml-org/llama.cpp@<sha>" under the version heading.
        text = open(a.changelog, encoding="utf-8").read()
        sec = text.split(f"## [{a.version}]", 1)
        if len(sec) == 2:
            m = re.search(r"llama\.cpp@([0-9a-f]{7,40})", sec[1].split("\n## [", 1)[0])
            commit = m.group(1) if m else None
    meta_common = {
        "generator": "scripts/llamacpp-reference (scripts/llamacpp_reference.py)",
        "llama_cpp_python_version": llama_cpp.__version__,
        "llama_cpp_commit": commit,
        "llama_cpp_system_info": llama_cpp.llama_print_system_info().decode(),
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "n_threads": N_THREADS,
    }
    os.makedirs(a.out, exist_ok=True)
    tmpl_sha = check_qwen_template(a.qwen)

    qwen_prompts = [
        ("chat_france", QWEN_FRANCE, False),
        ("chat_fibonacci", QWEN_FIB, False),
        ("raw_quicksort", "def quicksort(arr):", False),
    ]
    qllm, qout = record_model(a.qwen, "qwen2.5-coder-0.5b", qwen_prompts, meta_common)
    qout["chat_template_sha256"] = tmpl_sha
    qout["chat_template_note"] = ("chat prompts are the GGUF's tokenizer.chat_template rendered for one "
                                  "user message with add_generation_prompt=True (default system prompt); "
                                  "checked against that rendering when the fixture was made")
    gemma_bos = True  # tokenizer.ggml.add_bos_token = true in the GGUF
    gemma_prompts = [
        ("eiffel", "The Eiffel Tower is located in the city of", gemma_bos),
        ("france", "The capital of France is", gemma_bos),
        ("once", "Once upon a time", gemma_bos),
    ]
    gllm, gout = record_model(a.gemma, "gemma3-270m", gemma_prompts, meta_common)
    assert gout["model"]["gguf_add_bos_token"] in ("true", True), gout["model"]["gguf_add_bos_token"]

    tok = {
        **meta_common,
        "params": {"tokenize": "llm.tokenize(text.encode(), add_bos=False, special=True)",
                   "detokenized": "llm.detokenize(ids)", "detokenized_special": "llm.detokenize(ids, special=True)",
                   "hex": "present only when the detokenized bytes are not valid UTF-8"},
        "models": {
            "qwen2.5-coder-0.5b": {"file": qout["model"]["file"], "sha256": qout["model"]["sha256"],
                                   "cases": tokenize_oracle(qllm)},
            "gemma3-270m": {"file": gout["model"]["file"], "sha256": gout["model"]["sha256"],
                            "cases": tokenize_oracle(gllm)},
        },
    }
    for fname, obj in (("qwen2.5-coder-0.5b.json", qout), ("gemma3-270m.json", gout), ("tokenize.json", tok)):
        p = os.path.join(a.out, fname)
        with open(p, "w", encoding="utf-8") as f:
            f.write(dumps(obj) + "\n")
        print(f"wrote {p}", file=sys.stderr)


if __name__ == "__main__":
    main()
