#!/usr/bin/env python3
"""GGUFs of the real layer shapes (random values) and the report of scripts/bench-families.

`gen DIR [MODEL...]`: writes DIR/<model>.gguf for each family Berth serves that has no weights this
machine can fetch, with llama.cpp's own gguf-py (`gguf` on PyPI) and the metadata keys llama.cpp's
convert_hf_to_gguf.py writes for the architecture (the same keys as tests/fixtures/gguf-tiny/, made
by that converter through scripts/gen-tiny-gguf; see its TENSORS.md). Every tensor has the shape of
the real checkpoint's (config values below, each with its source); values are random. Quantised the
way people run these models, written as valid blocks directly (no F16 intermediate, no
llama-quantize run: minutes and a 16 GB intermediate saved per model), in the mix llama.cpp's
`llama-quantize` picks (src/llama-quant.cpp, llama_tensor_get_type_impl, read at 0c1e57098):
  - Q4_K_M: Q4_K by default; Q6_K for `output` (and for `token_embd` when it is tied to the
    output); Q6_K for attn_v and ffn_down(_exps) on the layers use_more_bits() picks
    (i < n/8, i >= 7n/8, (i - n/8) % 3 == 2, counted over that tensor's own layers); Q5_K for a
    fused attn_qkv; norms, 1-D tensors, routers (ffn_gate_inp), conv kernels (ssm_conv1d,
    shortconv.conv) stay F32; a row length not a multiple of 256 falls back (Q4_K -> Q5_0,
    Q6_K -> Q8_0).
  - gpt-oss as ggml-org ships it (ftype MXFP4_MOE, general.file_type 38): experts MXFP4, every
    other matrix (token_embd and output included) Q8_0, routers, norms, biases, sinks F32.
The scales are sane (block values within about +-0.1, centred), so no NaN or Inf can come out.

The tokenizer is a stand-in: the byte-level BPE of the tiny fixtures (256 byte tokens, their
merges and special tokens) padded with unreachable filler tokens to the REAL vocabulary size, so
the embedding and output head have their real shapes (the head is a real cost at decode). Both
benches feed random token ids, so the tokenizer's quality does not matter.

`report OUT --jsonl FILE ...`: prints the markdown table (Berth, llama.cpp, ik_llama.cpp without and
with -rtr 1; pp and tg tokens/s with each engine's peak RSS) and appends one JSON line per run.
"""
import argparse
import glob
import json
import os
import sys

# The families. Shapes from the real config.json; `layers` is how many are written (fewer than
# `real_layers` only where the file would pass ~5 GB: this machine has 23 GB shared by several
# jobs), always a prefix of the real layer pattern.
MODELS = {
    # LiquidAI/LFM2-1.2B: hidden 2048, 16 layers (10 short-conv + 6 GQA: transformers docs,
    # docs/source/en/model_doc/lfm2.md; attention at 2,5,8,10,12,14 = `full_attn_idxs` in the
    # LFM2 configs quoted by public ports, e.g. the LFM2-350M config in mlx ports), 32 heads,
    # 8 KV heads, block_ff_dim 12288 auto-adjusted to int(2*12288/3) = 8192 (multiple of 256),
    # vocab 65536, tied embeddings, rope_theta 1e6, norm_eps 1e-5, conv_L_cache 3.
    "lfm2-1.2b": dict(arch="lfm2", hidden=2048, layers=16, real_layers=16, heads=32, kv_heads=8, ff=8192,
                      vocab=65536, attn_layers=[2, 5, 8, 10, 12, 14], tied=True, ctx=128000),
    # LiquidAI/LFM2-8B-A1B: transformers Lfm2MoeConfig (configuration_lfm2_moe.py: "defaults yield
    # LFM2-8B-A1B": hidden 2048, intermediate 7168, moe_intermediate 1792, 32 heads, 8 KV heads,
    # 2 dense layers, 32 experts, 4 per token, vocab 65536, tied, norm_eps 1e-5) with the real
    # checkpoint's 24 layers and layer_types (attention at 2,6,10,14,18,21), as quoted from its
    # config.json by public ports' tests (e.g. LFM2_8B_MOE_CONFIG in mlx-rs ports).
    "lfm2-8b-a1b": dict(arch="lfm2moe", hidden=2048, layers=24, real_layers=24, heads=32, kv_heads=8, ff=7168,
                        expert_ff=1792, experts=32, experts_used=4, dense_lead=2, vocab=65536,
                        attn_layers=[2, 6, 10, 14, 18, 21], tied=True, ctx=128000),
    # Qwen/Qwen3.5-0.8B, the smallest public Qwen3.5: text_config hidden 1024, 24 layers
    # ([3 x linear_attention, full_attention] x 6), intermediate 3584, 8 heads, 2 KV heads,
    # head_dim 256, gated attention (attn_output_gate), linear_num_key_heads 16,
    # linear_num_value_heads 16, linear_key_head_dim 128, linear_value_head_dim 128,
    # linear_conv_kernel_dim 4, partial_rotary_factor 0.25, mrope_section [11, 11, 10],
    # rope_theta 1e7, eps 1e-6, vocab 248320, tied (THUDM/slime scripts/models/qwen3.5-0.8B.sh,
    # and the config.json mirrored in public inference ports' tests).
    "qwen3.5-0.8b": dict(arch="qwen35", hidden=1024, layers=24, real_layers=24, heads=8, kv_heads=2, head_dim=256,
                         ff=3584, vocab=248320, lin_k_heads=16, lin_v_heads=16, lin_k_dim=128, lin_v_dim=128,
                         conv_kernel=4, tied=True, ctx=262144),
    # Qwen/Qwen3-30B-A3B: hidden 2048, 48 layers, 32 heads, 4 KV heads, head_dim 128,
    # moe_intermediate 768, 128 experts, 8 per token, vocab 151936, untied, rope 1e6, eps 1e-6
    # (THUDM/slime scripts/models/qwen3-30B-A3B.sh). 10 of 48 layers: 48 would be ~17 GB at Q4_K_M.
    "qwen3-30b-a3b": dict(arch="qwen3moe", hidden=2048, layers=10, real_layers=48, heads=32, kv_heads=4,
                          head_dim=128, ff=6144, expert_ff=768, experts=128, experts_used=8, vocab=151936,
                          tied=False, ctx=40960),
    # openai/gpt-oss-20b: hidden 2880, 24 layers (even ones sliding, window 128), 64 heads, 8 KV heads,
    # head_dim 64, 32 experts, 4 per token, expert intermediate 2880, vocab 201088, untied,
    # q/k/v/o biases, sinks, rope 150000 with YaRN x32 from 4096 (/work/shared/specs/model-families.md
    # 4.5, from transformers' gpt_oss configuration and the 20b config JSON). 8 of 24 layers: 24 would
    # be ~12 GB (ggml-org's MXFP4 file is 12.1 GB).
    "gpt-oss-20b": dict(arch="gpt-oss", hidden=2880, layers=8, real_layers=24, heads=64, kv_heads=8, head_dim=64,
                        expert_ff=2880, experts=32, experts_used=4, vocab=201088, tied=False, ctx=131072,
                        sliding_window=128),
}
# Bumped when what gen writes changes, so cached files are rebuilt.
FORMAT_VERSION = 1
# ggml block formats written: (elements, bytes) per block.
QUANT_BLOCK = {"Q4_K": (256, 144), "Q5_K": (256, 176), "Q6_K": (256, 210), "Q8_0": (32, 34), "Q5_0": (32, 22),
               "Q5_1": (32, 24), "Q4_0": (32, 18), "MXFP4": (32, 17)}

# Which tiny fixture's stand-in tokenizer each architecture starts from, and its pre-tokenizer name.
TOKENIZER = {
    "lfm2": ("lfm2.gguf", "lfm2"),
    "lfm2moe": ("lfm2_moe.gguf", "lfm2"),
    "qwen35": ("qwen3_5.gguf", "qwen35"),
    "qwen3moe": ("qwen3_5.gguf", "qwen2"),
    "gpt-oss": ("gpt_oss_mxfp4.gguf", "gpt-4o"),
}


def use_more_bits(i, n):
    """llama-quantize's choice of the layers that get more bits in the _M mixes."""
    return i < n // 8 or i >= 7 * n // 8 or (i - n // 8) % 3 == 2


def tensors(name, c):
    """[(tensor name, numpy shape (outer first), kind)], kind a quant type name or an F32 init."""
    arch, h, n = c["arch"], c["hidden"], c["layers"]
    out = [("token_embd.weight", (c["vocab"], h), "Q6_K" if c["tied"] else "Q4_K")]
    if arch == "gpt-oss":
        out[0] = ("token_embd.weight", (c["vocab"], h), "Q8_0")
    attn_layers = [i for i in range(n) if layer_is_attention(c, i)]
    for i in range(n):
        p = f"blk.{i}."
        if arch in ("lfm2", "lfm2moe"):
            out.append((p + "attn_norm.weight", (h,), "norm"))
            if i in c["attn_layers"]:
                hd = h // c["heads"]
                iv = attn_layers.index(i)
                out += [(p + "attn_q.weight", (c["heads"] * hd, h), "Q4_K"),
                        (p + "attn_k.weight", (c["kv_heads"] * hd, h), "Q4_K"),
                        (p + "attn_v.weight", (c["kv_heads"] * hd, h),
                         "Q6_K" if use_more_bits(iv, len(attn_layers)) else "Q4_K"),
                        (p + "attn_output.weight", (h, c["heads"] * hd), "Q4_K"),
                        (p + "attn_q_norm.weight", (hd,), "norm"),
                        (p + "attn_k_norm.weight", (hd,), "norm")]
            else:
                out += [(p + "shortconv.conv.weight", (h, 3), "conv"),
                        (p + "shortconv.in_proj.weight", (3 * h, h), "Q4_K"),
                        (p + "shortconv.out_proj.weight", (h, h), "Q4_K")]
            out.append((p + "ffn_norm.weight", (h,), "norm"))
            down = "Q6_K" if use_more_bits(i, n) else "Q4_K"
            if arch == "lfm2" or i < c["dense_lead"]:
                out += [(p + "ffn_gate.weight", (c["ff"], h), "Q4_K"), (p + "ffn_up.weight", (c["ff"], h), "Q4_K"),
                        (p + "ffn_down.weight", (h, c["ff"]), down)]
            else:
                e, f = c["experts"], c["expert_ff"]
                out += [(p + "ffn_gate_inp.weight", (e, h), "router"), (p + "exp_probs_b.bias", (e,), "small"),
                        (p + "ffn_gate_exps.weight", (e, f, h), "Q4_K"), (p + "ffn_up_exps.weight", (e, f, h), "Q4_K"),
                        (p + "ffn_down_exps.weight", (e, h, f), down)]
        elif arch == "qwen35":
            out.append((p + "attn_norm.weight", (h,), "norm"))
            if layer_is_attention(c, i):
                hd = c["head_dim"]
                iv = attn_layers.index(i)
                out += [(p + "attn_q.weight", (2 * c["heads"] * hd, h), "Q4_K"),
                        (p + "attn_k.weight", (c["kv_heads"] * hd, h), "Q4_K"),
                        (p + "attn_v.weight", (c["kv_heads"] * hd, h),
                         "Q6_K" if use_more_bits(iv, len(attn_layers)) else "Q4_K"),
                        (p + "attn_output.weight", (h, c["heads"] * hd), "Q4_K"),
                        (p + "attn_q_norm.weight", (hd,), "norm"), (p + "attn_k_norm.weight", (hd,), "norm")]
            else:
                nk, nv, dk, dv = c["lin_k_heads"], c["lin_v_heads"], c["lin_k_dim"], c["lin_v_dim"]
                conv_ch = 2 * nk * dk + nv * dv
                out += [(p + "attn_qkv.weight", (conv_ch, h), "Q5_K"),
                        (p + "attn_gate.weight", (nv * dv, h), "Q4_K"),
                        (p + "ssm_alpha.weight", (nv, h), "Q4_K"), (p + "ssm_beta.weight", (nv, h), "Q4_K"),
                        (p + "ssm_a", (nv,), "ssm_a"), (p + "ssm_dt.bias", (nv,), "small"),
                        (p + "ssm_conv1d.weight", (conv_ch, c["conv_kernel"]), "conv"),
                        (p + "ssm_norm.weight", (dv,), "norm"),
                        (p + "ssm_out.weight", (h, nv * dv), "Q4_K")]
            out += [(p + "post_attention_norm.weight", (h,), "norm"),
                    (p + "ffn_gate.weight", (c["ff"], h), "Q4_K"), (p + "ffn_up.weight", (c["ff"], h), "Q4_K"),
                    (p + "ffn_down.weight", (h, c["ff"]), "Q6_K" if use_more_bits(i, n) else "Q4_K")]
        elif arch == "qwen3moe":
            hd, e, f = c["head_dim"], c["experts"], c["expert_ff"]
            more = use_more_bits(i, n)
            out += [(p + "attn_norm.weight", (h,), "norm"),
                    (p + "attn_q.weight", (c["heads"] * hd, h), "Q4_K"),
                    (p + "attn_k.weight", (c["kv_heads"] * hd, h), "Q4_K"),
                    (p + "attn_v.weight", (c["kv_heads"] * hd, h), "Q6_K" if more else "Q4_K"),
                    (p + "attn_output.weight", (h, c["heads"] * hd), "Q4_K"),
                    (p + "attn_q_norm.weight", (hd,), "norm"), (p + "attn_k_norm.weight", (hd,), "norm"),
                    (p + "ffn_norm.weight", (h,), "norm"),
                    (p + "ffn_gate_inp.weight", (e, h), "router"),
                    (p + "ffn_gate_exps.weight", (e, f, h), "Q4_K"), (p + "ffn_up_exps.weight", (e, f, h), "Q4_K"),
                    (p + "ffn_down_exps.weight", (e, h, f), "Q6_K" if more else "Q4_K")]
        elif arch == "gpt-oss":
            hd, e, f = c["head_dim"], c["experts"], c["expert_ff"]
            q, kv = c["heads"] * hd, c["kv_heads"] * hd
            out += [(p + "attn_norm.weight", (h,), "norm"),
                    (p + "attn_q.weight", (q, h), "Q8_0"), (p + "attn_q.bias", (q,), "small"),
                    (p + "attn_k.weight", (kv, h), "Q8_0"), (p + "attn_k.bias", (kv,), "small"),
                    (p + "attn_v.weight", (kv, h), "Q8_0"), (p + "attn_v.bias", (kv,), "small"),
                    (p + "attn_output.weight", (h, q), "Q8_0"), (p + "attn_output.bias", (h,), "small"),
                    (p + "attn_sinks.weight", (c["heads"],), "small"),
                    (p + "post_attention_norm.weight", (h,), "norm"),
                    (p + "ffn_gate_inp.weight", (e, h), "router"), (p + "ffn_gate_inp.bias", (e,), "small"),
                    (p + "ffn_gate_exps.weight", (e, f, h), "MXFP4"), (p + "ffn_gate_exps.bias", (e, f), "small"),
                    (p + "ffn_up_exps.weight", (e, f, h), "MXFP4"), (p + "ffn_up_exps.bias", (e, f), "small"),
                    (p + "ffn_down_exps.weight", (e, h, f), "MXFP4"), (p + "ffn_down_exps.bias", (e, h), "small")]
    if arch in ("lfm2", "lfm2moe"):
        # LFM2's final norm is `token_embd_norm` (HF embedding_norm, applied after the last layer).
        out.append(("token_embd_norm.weight", (h,), "norm"))
    else:
        out.append(("output_norm.weight", (h,), "norm"))
    if not c["tied"]:
        out.append(("output.weight", (c["vocab"], h), "Q8_0" if arch == "gpt-oss" else "Q6_K"))
    # A row length the K-quants cannot take falls back as llama-quantize does.
    fixed = []
    for name, shape, kind in out:
        if kind in ("Q4_K", "Q5_K", "Q6_K") and shape[-1] % 256:
            kind = {"Q4_K": "Q5_0", "Q5_K": "Q5_1", "Q6_K": "Q8_0"}[kind]
        fixed.append((name, shape, kind))
    return fixed


def layer_is_attention(c, i):
    """Whether layer i of the model is a (full or sliding) attention layer, not a recurrent one."""
    if c["arch"] in ("lfm2", "lfm2moe"):
        return i in c["attn_layers"]
    if c["arch"] == "qwen35":
        return (i + 1) % 4 == 0
    return True


def metadata(w, c, model):
    """The KV pairs convert_hf_to_gguf.py writes for the architecture (tiny fixtures' key set)."""
    a, n = c["arch"], c["layers"]
    w.add_string("general.type", "model")
    reduced = "" if n == c["real_layers"] else f", {n} of {c['real_layers']} layers"
    w.add_string("general.name", f"{model} (random weights, real shapes{reduced})")
    w.add_uint32(f"{a}.block_count", n)
    w.add_uint32(f"{a}.context_length", c["ctx"])
    w.add_uint32(f"{a}.embedding_length", c["hidden"])
    w.add_uint32(f"{a}.attention.head_count", c["heads"])
    if a in ("lfm2", "lfm2moe"):
        w.add_uint32(f"{a}.feed_forward_length", c["ff"])
        w.add_array(f"{a}.attention.head_count_kv", [c["kv_heads"] if i in c["attn_layers"] else 0 for i in range(n)])
        w.add_float32(f"{a}.rope.freq_base", 1e6)
        w.add_float32(f"{a}.attention.layer_norm_rms_epsilon", 1e-5)
        if a == "lfm2moe":
            w.add_uint32(f"{a}.expert_count", c["experts"])
            w.add_uint32(f"{a}.expert_used_count", c["experts_used"])
            w.add_uint32(f"{a}.expert_feed_forward_length", c["expert_ff"])
            w.add_uint32(f"{a}.leading_dense_block_count", c["dense_lead"])
            w.add_uint32(f"{a}.expert_gating_func", 2)  # sigmoid
        w.add_uint32(f"{a}.vocab_size", c["vocab"])
        w.add_uint32(f"{a}.shortconv.l_cache", 3)
        w.add_uint32("general.file_type", 15)  # MOSTLY_Q4_K_M
    elif a == "qwen35":
        w.add_uint32(f"{a}.feed_forward_length", c["ff"])
        w.add_uint32(f"{a}.attention.head_count_kv", c["kv_heads"])
        w.add_array(f"{a}.rope.dimension_sections", [11, 11, 10, 0])
        w.add_float32(f"{a}.rope.freq_base", 1e7)
        w.add_float32(f"{a}.attention.layer_norm_rms_epsilon", 1e-6)
        w.add_uint32(f"{a}.attention.key_length", c["head_dim"])
        w.add_uint32(f"{a}.attention.value_length", c["head_dim"])
        w.add_uint32(f"{a}.ssm.conv_kernel", c["conv_kernel"])
        w.add_uint32(f"{a}.ssm.state_size", c["lin_k_dim"])
        w.add_uint32(f"{a}.ssm.group_count", c["lin_k_heads"])
        w.add_uint32(f"{a}.ssm.time_step_rank", c["lin_v_heads"])
        w.add_uint32(f"{a}.ssm.inner_size", c["lin_v_heads"] * c["lin_v_dim"])
        w.add_array(f"{a}.attention.recurrent_layers", [not layer_is_attention(c, i) for i in range(n)])
        w.add_uint32(f"{a}.full_attention_interval", 4)
        w.add_uint32(f"{a}.rope.dimension_count", c["head_dim"] // 4)  # partial_rotary_factor 0.25
        w.add_uint32("general.file_type", 15)
    elif a == "qwen3moe":
        # convert_hf_to_gguf.py's Qwen3MoeModel (Qwen2MoeModel + TextModel) key set.
        w.add_uint32(f"{a}.feed_forward_length", c["ff"])
        w.add_uint32(f"{a}.attention.head_count_kv", c["kv_heads"])
        w.add_float32(f"{a}.rope.freq_base", 1e6)
        w.add_float32(f"{a}.attention.layer_norm_rms_epsilon", 1e-6)
        w.add_uint32(f"{a}.expert_used_count", c["experts_used"])
        w.add_uint32(f"{a}.attention.key_length", c["head_dim"])
        w.add_uint32(f"{a}.attention.value_length", c["head_dim"])
        w.add_uint32(f"{a}.expert_count", c["experts"])
        w.add_uint32(f"{a}.expert_feed_forward_length", c["expert_ff"])
        w.add_uint32("general.file_type", 15)
    elif a == "gpt-oss":
        w.add_uint32(f"{a}.feed_forward_length", c["expert_ff"])
        w.add_uint32(f"{a}.attention.head_count_kv", c["kv_heads"])
        w.add_string(f"{a}.rope.scaling.type", "yarn")
        w.add_float32(f"{a}.rope.scaling.factor", 32.0)
        w.add_uint32(f"{a}.rope.scaling.original_context_length", 4096)
        w.add_float32(f"{a}.rope.scaling.yarn_beta_fast", 32.0)
        w.add_float32(f"{a}.rope.scaling.yarn_beta_slow", 1.0)
        w.add_float32(f"{a}.rope.freq_base", 150000.0)
        w.add_float32(f"{a}.attention.layer_norm_rms_epsilon", 1e-5)
        w.add_uint32(f"{a}.expert_count", c["experts"])
        w.add_uint32(f"{a}.expert_used_count", c["experts_used"])
        w.add_uint32(f"{a}.attention.key_length", c["head_dim"])
        w.add_uint32(f"{a}.attention.value_length", c["head_dim"])
        w.add_uint32("general.file_type", 38)  # MOSTLY_MXFP4_MOE
        w.add_uint32(f"{a}.attention.sliding_window", c["sliding_window"])
        w.add_uint32(f"{a}.expert_feed_forward_length", c["expert_ff"])
    w.add_uint32("general.quantization_version", 2)


def tokenizer(w, gguf, c, fixtures):
    """The tiny fixture's byte-level BPE, padded with unreachable tokens to the real vocabulary."""
    fixture, pre = TOKENIZER[c["arch"]]
    r = gguf.GGUFReader(os.path.join(fixtures, fixture))

    def strings(key):
        f = r.fields[key]
        return [bytes(f.parts[i]).decode("utf-8") for i in f.data]

    toks = strings("tokenizer.ggml.tokens")
    f = r.fields["tokenizer.ggml.token_type"]
    types = [int(f.parts[i][0]) for i in f.data]
    merges = strings("tokenizer.ggml.merges")
    have = set(toks)
    extra = [t for t in (f"[filler {i}]" for i in range(len(toks), c["vocab"])) if t not in have]
    assert len(toks) + len(extra) == c["vocab"]
    w.add_string("tokenizer.ggml.model", "gpt2")
    w.add_string("tokenizer.ggml.pre", pre)
    w.add_array("tokenizer.ggml.tokens", toks + extra)
    w.add_array("tokenizer.ggml.token_type", types + [1] * len(extra))
    w.add_array("tokenizer.ggml.merges", merges)
    for key in ("bos_token_id", "eos_token_id", "padding_token_id"):
        full = f"tokenizer.ggml.{key}"
        if full in r.fields:
            w.add_uint32(full, int(r.fields[full].contents()))
    for key in ("add_bos_token", "add_eos_token"):
        full = f"tokenizer.ggml.{key}"
        if full in r.fields:
            w.add_bool(full, bool(r.fields[full].contents()))


def block_bytes(np, rng, kind, n_blocks):
    """n_blocks random blocks of a ggml quant type with sane scales, as a flat uint8 array."""
    f16 = lambda lo, hi: rng.uniform(lo, hi, n_blocks).astype(np.float16).view(np.uint8).reshape(n_blocks, 2)
    size = QUANT_BLOCK[kind][1]
    b = np.frombuffer(rng.bytes(n_blocks * size), dtype=np.uint8).reshape(n_blocks, size).copy()
    if kind == "Q4_K":
        # x = d * sc * q - dmin * m, q in 0..15, sc and m 6-bit: dmin = 7.5 d centres the values.
        d = rng.uniform(0.5e-4, 1.5e-4, n_blocks)
        b[:, 0:2] = d.astype(np.float16).view(np.uint8).reshape(n_blocks, 2)
        b[:, 2:4] = (7.5 * d).astype(np.float16).view(np.uint8).reshape(n_blocks, 2)
    elif kind == "Q5_K":
        d = rng.uniform(0.25e-4, 0.75e-4, n_blocks)
        b[:, 0:2] = d.astype(np.float16).view(np.uint8).reshape(n_blocks, 2)
        b[:, 2:4] = (15.5 * d).astype(np.float16).view(np.uint8).reshape(n_blocks, 2)
    elif kind == "Q6_K":
        # x = d * sc * (q - 32), sc int8: keep the sub-scales in 1..32 and d small.
        b[:, 192:208] = rng.integers(1, 33, (n_blocks, 16), dtype=np.uint8)
        b[:, 208:210] = f16(0.5e-4, 1.0e-4)
    elif kind == "Q8_0":
        b[:, 0:2] = f16(0.5e-3, 1.0e-3)
    elif kind in ("Q5_0", "Q4_0"):
        b[:, 0:2] = f16(2e-3, 6e-3)
    elif kind == "Q5_1":
        b[:, 0:2] = f16(2e-3, 6e-3)
        b[:, 2:4] = f16(-0.05, -0.03)
    elif kind == "MXFP4":
        # x = E2M1 doubled value (up to 12) * 2^(e - 128): e 119..121 keeps |x| below ~0.1.
        b[:, 0] = rng.integers(119, 122, n_blocks, dtype=np.uint8)
    return b


def f32_values(np, rng, kind, shape):
    """Random F32 values of a plausible range for the tensor's role."""
    if kind == "norm":
        return rng.uniform(0.9, 1.1, shape).astype(np.float32)
    if kind == "conv":
        return rng.uniform(-0.3, 0.3, shape).astype(np.float32)
    if kind == "ssm_a":
        return -rng.uniform(0.5, 4.0, shape).astype(np.float32)
    if kind == "router":
        return rng.normal(0.0, 0.02, shape).astype(np.float32)
    return rng.uniform(-0.05, 0.05, shape).astype(np.float32)



def gen(a):
    """Writes the GGUFs that are missing or were made by another FORMAT_VERSION."""
    import gguf
    import numpy as np

    os.makedirs(a.dir, exist_ok=True)
    for model in a.models or MODELS:
        c = MODELS[model]
        path = os.path.join(a.dir, f"{model}.gguf")
        stamp = path + ".json"
        spec = {"format": FORMAT_VERSION, "config": c}
        if os.path.exists(path) and os.path.exists(stamp) and json.load(open(stamp)) == spec:
            print(f"bench-families: {path} is up to date", file=sys.stderr)
            continue
        for p in (path, stamp):
            if os.path.exists(p):
                os.remove(p)
        ts = tensors(model, c)
        rng = np.random.default_rng(sum(map(ord, model)))  # the same bytes every run
        tmp = path + ".tmp"
        w = gguf.GGUFWriter(tmp, c["arch"])
        metadata(w, c, model)
        tokenizer(w, gguf, c, a.fixtures)
        qtype = {k: getattr(gguf.GGMLQuantizationType, k) for k in QUANT_BLOCK}
        for name, shape, kind in ts:
            if kind in QUANT_BLOCK:
                elems, size = QUANT_BLOCK[kind]
                byte_shape = (*shape[:-1], shape[-1] // elems * size)
                w.add_tensor_info(name, byte_shape, np.dtype(np.uint8), int(np.prod(byte_shape)), raw_dtype=qtype[kind])
            else:
                w.add_tensor_info(name, shape, np.dtype(np.float32), int(np.prod(shape)) * 4)
        w.write_header_to_file()
        w.write_kv_data_to_file()
        w.write_ti_data_to_file()
        total = 0
        for name, shape, kind in ts:
            if kind in QUANT_BLOCK:
                elems, size = QUANT_BLOCK[kind]
                n_blocks = int(np.prod(shape)) // elems
                # Whole tensors: the largest (gpt-oss's Q8_0 output) is 615 MB.
                w.write_tensor_data(block_bytes(np, rng, kind, n_blocks).reshape(*shape[:-1], shape[-1] // elems * size))
            else:
                w.write_tensor_data(f32_values(np, rng, kind, shape))
            total += 1
        w.close()
        os.replace(tmp, path)
        json.dump(spec, open(stamp, "w"))
        print(f"bench-families: wrote {path} ({os.path.getsize(path) / 1e9:.2f} GB, {total} tensors)", file=sys.stderr)



# Engines in column order: (name in the JSON line, file prefix in OUT, column title).
ENGINES = [
    ("berth", "berth", "Berth"),
    ("llama.cpp", "llama", "llama.cpp"),
    ("ik_llama.cpp", "ik", "ik_llama.cpp"),
    ("ik_llama.cpp -rtr 1", "ik-rtr", "ik -rtr 1"),
]


def engine_rows(out, prefix, model):
    """{(test, threads): (t/s, stddev, samples)} of one engine on one model, and a build commit."""
    path = f"{out}/{prefix}-{model}.json"
    rows, commit = {}, None
    if not os.path.exists(path) or os.path.getsize(path) == 0:
        return rows, commit
    data = json.load(open(path))
    if prefix == "berth":
        for o in data:
            rows[(o["test"], o["threads"])] = (o["tokens_per_second"], o["stddev"], o["samples"])
        return rows, commit
    from bench_report import llama_bench_rows

    entries, commit = llama_bench_rows(path)
    for key, e in entries.items():
        rows[key] = (e["avg_ts"], e["stddev_ts"], e.get("samples_ts"))
    return rows, commit


def why_missing(out, prefix, model):
    """The last line an engine printed before failing on a model, or None when it did not run."""
    path = f"{out}/{prefix}-{model}.failed"
    if not os.path.exists(path):
        return None
    lines = [x.strip() for x in open(path) if x.strip()]
    return lines[-1] if lines else "failed"


def report(a):
    """Prints the markdown tables and appends the run's JSON line."""
    from bench_common import append_record, record
    from bench_report import cpu_info

    out = a.out
    settings = json.loads(a.args)
    bandwidth = {}
    for line in open(f"{out}/bandwidth.jsonl"):
        b = json.loads(line)
        bandwidth[b["threads"]] = b["read_gb_per_s"]
    models = [os.path.basename(f)[len("spec-"):-5] for f in sorted(glob.glob(f"{out}/spec-*.json"))]
    models.sort(key=lambda m: list(MODELS).index(m) if m in MODELS else 99)
    results, ratios, rss, failures, model_info, engines = [], [], [], [], {}, {}
    head = "| model | test | threads | " + " | ".join(f"{t} t/s" for _, _, t in ENGINES) + \
        " | Berth / llama.cpp | Berth / best ik |"
    print(head)
    print("|" + "---|" * (head.count("|") - 1))
    for m in models:
        spec = json.load(open(f"{out}/spec-{m}.json"))["config"]
        size = int(open(f"{out}/size-{m}.txt").read())
        model_info[m] = {"arch": spec["arch"], "file_bytes": size, "layers": spec["layers"],
                         "real_layers": spec["real_layers"], "vocab": spec["vocab"], "hidden": spec["hidden"]}
        per = {}
        for engine, prefix, _ in ENGINES:
            per[engine], commit = engine_rows(out, prefix, m)
            if commit:
                engines.setdefault(engine.split()[0], {})["build_commit"] = commit
            rss_file = f"{out}/{prefix}-{m}.rss"
            if per[engine] and os.path.exists(rss_file):
                kb = [x for x in open(rss_file).read().split() if x.isdigit()]
                if kb:
                    rss.append({"engine": engine, "model": m, "peak_rss_bytes": int(kb[-1]) * 1024})
            why = why_missing(out, prefix, m)
            if why:
                failures.append({"engine": engine, "model": m, "why": why})
        keys = sorted({k for rows in per.values() for k in rows}, key=lambda k: (k[0][:2] != "pp", k[1]))
        for test, threads in keys:
            cells, got = [], {}
            for engine, _, _ in ENGINES:
                v = per[engine].get((test, threads))
                if v is None:
                    cells.append("-")
                    continue
                got[engine] = v[0]
                cells.append(f"{v[0]:.2f} ± {v[1]:.2f}")
                results.append({"engine": engine, "model": m, "test": test, "threads": threads,
                                "tokens_per_second": v[0], "stddev": v[1], "samples": v[2]})
            ours = got.get("berth")
            vs_llama = f"{ours / got['llama.cpp']:.2f}x" if ours and got.get("llama.cpp") else "-"
            best_ik = max([got[e] for e in ("ik_llama.cpp", "ik_llama.cpp -rtr 1") if e in got], default=None)
            vs_ik = f"{ours / best_ik:.2f}x" if ours and best_ik else "-"
            for peer, tps in (("llama.cpp", got.get("llama.cpp")), ("ik_llama.cpp best -rtr", best_ik)):
                if ours and tps:
                    ratios.append({"model": m, "test": test, "threads": threads, "against": peer,
                                   "berth_over_peer": round(ours / tps, 4)})
            print(f"| {m} | {test} | {threads} | " + " | ".join(cells) + f" | {vs_llama} | {vs_ik} |")

    print("\nPeak resident memory of each engine's process (VmHWM, GB; mapped file pages count) and the file:\n")
    print("| model | arch | layers written (real) | file GB | " + " | ".join(f"{t} RSS" for _, _, t in ENGINES) + " |")
    print("|---|---|---|---|" + "---|" * len(ENGINES))
    for m in models:
        i = model_info[m]
        cells = []
        for engine, _, _ in ENGINES:
            v = [x["peak_rss_bytes"] for x in rss if x["engine"] == engine and x["model"] == m]
            cells.append(f"{v[0] / 1e9:.2f}" if v else "-")
        layers = f"{i['layers']}" + ("" if i["layers"] == i["real_layers"] else f" ({i['real_layers']}) reduced")
        print(f"| {m} | {i['arch']} | {layers} | {i['file_bytes'] / 1e9:.2f} | " + " | ".join(cells) + " |")
    if failures:
        print("\nNot run or failed (the engine's last line):")
        for f in failures:
            print(f"- {f['engine']} on {f['model']}: {f['why']}")
    reduced = [m for m in models if model_info[m]["layers"] != model_info[m]["real_layers"]]
    if reduced:
        print("\nReduced shapes: " + "; ".join(
            f"{m} has {model_info[m]['layers']} of its {model_info[m]['real_layers']} layers (every layer at its "
            "real shape; the full file would not fit this machine's memory share, ~5 GB a model)" for m in reduced))
    print("\nWeights are random with the real shapes; the tokenizer is a stand-in padded to the real vocabulary "
          "(scripts/bench_families.py). Ratios compare engines in this run only.")

    cpu, flags = cpu_info()
    from bench_report import SIMD

    simd = [f for f in SIMD if f in flags]
    bw_text = ", ".join(f"{bandwidth[t]:.2f} GB/s at {t} thread{'s' if t > 1 else ''}" for t in sorted(bandwidth))
    print(f"\ncpu: {cpu}; {os.cpu_count()} cores; flags: {' '.join(simd)}")
    print(f"kernels: BERTH_KERNELS={os.environ.get('BERTH_KERNELS', '(best the CPU has)')}")
    print(f"read bandwidth: {bw_text}")
    print(f"load average before: {a.load_before}; after: {a.load_after}")

    line = record(
        "scripts/bench-families", cpu, simd, flags, bandwidth, a.load_before, a.load_after,
        settings=settings,
        generator={"format": FORMAT_VERSION, "weights": "random, real shapes", "tokenizer": "stand-in"},
        engines=engines,
        models=model_info,
        results=results,
        peak_rss=rss,
        failures=failures,
        ratios=ratios,
    )
    append_record(a.jsonl, line)

def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    g = sub.add_parser("gen")
    g.add_argument("dir")
    g.add_argument("models", nargs="*")
    g.add_argument("--fixtures", default="tests/fixtures/gguf-tiny")
    sub.add_parser("list")
    rp = sub.add_parser("report")
    rp.add_argument("out")
    rp.add_argument("--load-before", required=True)
    rp.add_argument("--load-after", required=True)
    rp.add_argument("--args", required=True, help="the run's settings as a JSON object")
    rp.add_argument("--jsonl", default="docs/bench/families.jsonl")
    a = ap.parse_args()
    if a.cmd == "gen":
        for m in a.models:
            if m not in MODELS:
                sys.exit(f"bench-families: unknown model {m} (known: {', '.join(MODELS)})")
        gen(a)
    elif a.cmd == "list":
        for m, c in MODELS.items():
            print(m, c["arch"], c["layers"], c["real_layers"])
    elif a.cmd == "report":
        report(a)


if __name__ == "__main__":
    main()
