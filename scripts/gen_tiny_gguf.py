#!/usr/bin/env python3
"""Helper for scripts/gen-tiny-gguf: tiny GGUFs made by llama.cpp's own convert_hf_to_gguf.py.

Subcommands (all run inside the venv that scripts/gen-tiny-gguf prepares):

  prepare SRC DST FAMILY   copy config.json, generation_config.json and model.safetensors from SRC
                           (never modified) to DST and add a generated 512-token byte-level BPE
                           tokenizer (tokenizer.json + tokenizer_config.json), because the converter
                           reads the vocabulary with transformers' AutoTokenizer and the tiny models
                           ship none.
  convert LLAMACPP PRE ARGS...
                           run llama.cpp's convert_hf_to_gguf.main() with ARGS, unchanged except for
                           one thing: TextModel.get_vocab_base_pre (which identifies the BPE
                           pre-tokenizer by hashing how a known text tokenizes, and refuses unknown
                           tokenizers) returns PRE. Our stand-in tokenizer cannot hash like the real
                           LFM2/Qwen3.5 ones, so the name is given explicitly.
  report LLAMACPP GGUF_DIR SRC_DIR OUT.md
                           metadata + tensor table of every GGUF and numeric checks of the
                           converter's weight transformations against the HF safetensors.
"""
from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

VOCAB_SIZE = 512

# Pre-tokenizer regexes, as in llama.cpp's src/llama-vocab.cpp for the pre names we write
# ("lfm2" -> LLAMA_VOCAB_PRE_TYPE_LLAMA3, "qwen35" -> LLAMA_VOCAB_PRE_TYPE_QWEN35), so the
# stand-in tokenizer.json and the GGUF's tokenizer.ggml.pre agree.
PRE_REGEX = {
    "lfm2": r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+",
    "qwen35": r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+",
    # o200k (gpt-oss's tokenizer.json regex; llama.cpp's `gpt-4o` pre-tokenizer)
    "gpt-4o": r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+",
}

# family -> (pre name, special tokens as (id, text), tokenizer_config specials, id of first byte token)
# LFM2 configs say pad=0, bos=1, eos=2 (as in the real LFM2 vocabulary); the Qwen3.5 configs have no
# bos/eos/pad, so none are declared (Qwen keeps its specials at the end of the vocabulary).
FAMILIES = {
    "lfm2": dict(
        pre="lfm2",
        specials=[(0, "<|pad|>"), (1, "<|startoftext|>"), (2, "<|endoftext|>")],
        config={"bos_token": "<|startoftext|>", "eos_token": "<|endoftext|>", "pad_token": "<|pad|>"},
        first_byte=3,
        prepend_bos=(1, "<|startoftext|>"),  # real LFM2 tokenizers add BOS (TemplateProcessing)
    ),
    "qwen35": dict(
        pre="qwen35",
        specials=[(509, "<|endoftext|>"), (510, "<|im_start|>"), (511, "<|im_end|>")],
        config={},
        first_byte=0,
        prepend_bos=None,
    ),
    # gpt-oss: the harmony specials at the end, declared as in the real gpt-oss tokenizer_config
    # (bos <|startoftext|>, eos <|return|>, pad <|endoftext|>); no BOS is prepended.
    "gpt-oss": dict(
        pre="gpt-4o",
        specials=[(507, "<|startoftext|>"), (508, "<|endoftext|>"), (509, "<|return|>"), (510, "<|call|>"),
                  (511, "<|end|>")],
        config={"bos_token": "<|startoftext|>", "eos_token": "<|return|>", "pad_token": "<|endoftext|>"},
        first_byte=0,
        prepend_bos=None,
    ),
}
MODEL_FAMILY = {"lfm2": "lfm2", "lfm2_moe": "lfm2", "qwen3_5": "qwen35", "qwen3_5_moe": "qwen35",
                "gpt_oss": "gpt-oss"}

# Fixed training text for the stand-in merges (deterministic; content is irrelevant to the tests).
CORPUS = """
Berth loads tiny random-weight models that were converted by llama.cpp's own converter, and checks
their logits against the reference implementation. The quick brown fox jumps over the lazy dog.
Pack my box with five dozen liquor jugs. How vexingly quick daft zebras jump! Sphinx of black quartz,
judge my vow. The five boxing wizards jump quickly. A tokenizer splits the input text into pieces;
each piece is looked up in the vocabulary, and the model predicts the next token from the previous
ones. Attention layers read the whole context, while recurrent and convolution layers keep a small
state that is updated token by token. Experts are selected by a router, and only the chosen experts
run for each token. The tensors are stored in float32 so that the comparison can use a tight
tolerance. def main(): return [x * 2 for x in range(10)] if __name__ == "__main__": main()
fn main() { let v: Vec<u32> = (0..10).map(|x| x * 2).collect(); println!("{:?}", v); }
1234567890 3.14159 2.71828 0.5 100 2048 4096 65536 -- == != <= >= -> => :: ;; {} [] () <> ""
Hello, world! Hallo Welt. Bonjour le monde. Hola mundo. Ciao mondo. Olá mundo. Hej världen.
the the the and and and of of of to to to in in in is is is it it it that that that for for for
"""


def bytes_to_unicode() -> dict[int, str]:
    """GPT-2's byte -> printable unicode map (the same as transformers' and gguf-py's)."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return dict(zip(bs, (chr(c) for c in cs)))


def train_merges(pre: str, n_merges: int) -> list[tuple[str, str]]:
    """Plain BPE on CORPUS; ties broken by the pair's text, so the result is deterministic."""
    import regex

    b2u = bytes_to_unicode()
    words: dict[tuple[str, ...], int] = {}
    for piece in regex.findall(PRE_REGEX[pre], CORPUS):
        w = tuple(b2u[b] for b in piece.encode("utf-8"))
        words[w] = words.get(w, 0) + 1
    merges: list[tuple[str, str]] = []
    while len(merges) < n_merges:
        counts: dict[tuple[str, str], int] = {}
        for w, c in words.items():
            for p in zip(w[:-1], w[1:]):
                counts[p] = counts.get(p, 0) + c
        if not counts:
            raise SystemExit(f"corpus too small: only {len(merges)} merges of {n_merges}")
        best = min(counts, key=lambda p: (-counts[p], p))
        merges.append(best)
        joined = best[0] + best[1]
        new_words: dict[tuple[str, ...], int] = {}
        for w, c in words.items():
            out: list[str] = []
            i = 0
            while i < len(w):
                if i + 1 < len(w) and (w[i], w[i + 1]) == best:
                    out.append(joined)
                    i += 2
                else:
                    out.append(w[i])
                    i += 1
            new_words[tuple(out)] = new_words.get(tuple(out), 0) + c
        words = new_words
    return merges


def make_tokenizer(family: str, dst: Path) -> None:
    fam = FAMILIES[family]
    special_ids = {i for i, _ in fam["specials"]}
    n_merges = VOCAB_SIZE - 256 - len(fam["specials"])
    merges = train_merges(fam["pre"], n_merges)
    b2u = bytes_to_unicode()
    vocab: dict[str, int] = {}
    for i, text in fam["specials"]:
        vocab[text] = i
    next_id = fam["first_byte"]

    def take(tok: str) -> None:
        nonlocal next_id
        while next_id in special_ids:
            next_id += 1
        assert tok not in vocab, tok
        vocab[tok] = next_id
        next_id += 1

    for b in range(256):
        take(b2u[b])
    for a, b in merges:
        take(a + b)
    assert sorted(vocab.values()) == list(range(VOCAB_SIZE)), "vocab ids must be 0..511"

    byte_level = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False, "use_regex": False}
    post_processor: dict = byte_level
    if fam["prepend_bos"] is not None:
        bos_id, bos = fam["prepend_bos"]
        post_processor = {
            "type": "Sequence",
            "processors": [
                byte_level,
                {
                    "type": "TemplateProcessing",
                    "single": [{"SpecialToken": {"id": bos, "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}}],
                    "pair": [{"SpecialToken": {"id": bos, "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}},
                             {"Sequence": {"id": "B", "type_id": 1}}],
                    "special_tokens": {bos: {"id": bos, "ids": [bos_id], "tokens": [bos]}},
                },
            ],
        }
    tok = {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": [
            {"id": i, "content": t, "single_word": False, "lstrip": False, "rstrip": False,
             "normalized": False, "special": True}
            for i, t in fam["specials"]
        ],
        "normalizer": None,
        "pre_tokenizer": {
            "type": "Sequence",
            "pretokenizers": [
                {"type": "Split", "pattern": {"Regex": PRE_REGEX[fam["pre"]]}, "behavior": "Isolated", "invert": False},
                byte_level,
            ],
        },
        "post_processor": post_processor,
        "decoder": byte_level,
        "model": {
            "type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": "",
            "end_of_word_suffix": "", "fuse_unk": False, "byte_fallback": False, "ignore_merges": False,
            "vocab": dict(sorted(vocab.items(), key=lambda kv: kv[1])),
            "merges": [[a, b] for a, b in merges],
        },
    }
    (dst / "tokenizer.json").write_text(json.dumps(tok, ensure_ascii=False, indent=1) + "\n", encoding="utf-8")
    cfg = {"tokenizer_class": "PreTrainedTokenizerFast", "model_max_length": 4096, **fam["config"]}
    (dst / "tokenizer_config.json").write_text(json.dumps(cfg, indent=1) + "\n", encoding="utf-8")


def cmd_prepare(src: str, dst: str, model: str) -> None:
    s, d = Path(src), Path(dst)
    d.mkdir(parents=True, exist_ok=True)
    for f in ("config.json", "generation_config.json", "model.safetensors"):
        shutil.copyfile(s / f, d / f)
    make_tokenizer(MODEL_FAMILY[model], d)
    # sanity: transformers reads it back and round-trips text
    from transformers import AutoTokenizer

    t = AutoTokenizer.from_pretrained(d)
    ids = t.encode("The quick brown fox, 3.14!", add_special_tokens=False)
    assert t.decode(ids) == "The quick brown fox, 3.14!", t.decode(ids)
    with_special = t.encode("fox")
    bos = FAMILIES[MODEL_FAMILY[model]]["prepend_bos"]
    assert with_special[: 1 if bos else 0] == ([bos[0]] if bos else []), with_special
    assert len(t.get_vocab()) == VOCAB_SIZE


def cmd_convert(llamacpp: str, pre: str, args: list[str]) -> None:
    sys.path.insert(0, llamacpp)
    sys.argv = [str(Path(llamacpp) / "convert_hf_to_gguf.py"), *args]
    import convert_hf_to_gguf  # noqa: E402  (llama.cpp's converter, unmodified)
    from conversion.base import TextModel

    def forced_pre(self, tokenizer) -> str:  # noqa: ARG001
        return pre

    TextModel.get_vocab_base_pre = forced_pre
    convert_hf_to_gguf.main()



NOTES = """
## What the converter does (llama.cpp@0c1e57098, read from conversion/lfm2.py, conversion/qwen.py, conversion/gpt_oss.py, conversion/base.py)

Every claim below about a tensor is checked numerically in the per-file tables further down
(`Δundo` column: 0 for plain copies and permutations, ~6e-8 = float32 rounding of (w+1)-1 and of
log(-(-exp(a)))).

### All LFM2 and Qwen3.5 files
- Output type f32: every tensor is F32 (`general.file_type` 0). No tensor is transposed: HF
  `W[out, in]` is stored as ne `{in, out}` with identical bytes; stacked experts are `[E, out, in]`,
  ne `{in, out, E}`, expert e = the e-th `[out, in]` slab.
- No RoPE permutation of q/k (neither family goes through LlamaModel's permute). llama.cpp's rope
  type is fixed per arch: LFM2/LFM2MoE = NEOX (rotate-half, as HF); QWEN35/QWEN35MOE = IMROPE with
  `rope.dimension_sections` [2,1,1,0]. For text all position components are equal, so IMROPE is
  plain rotate-half (pairs i, i+n_rot/2; ggml uses the NEOX pairing for IMROPE) over the first
  `rope.dimension_count` = 8 dims of each head (head_dim 32 x partial_rotary_factor 0.25).
- Tied embeddings: no `output.weight` in lfm2, lfm2_moe, qwen3_5 (use `token_embd.weight`);
  qwen3_5_moe (tie_word_embeddings false) has `output.weight` = `lm_head.weight`.
- Tokenizer: a generated stand-in (see README.md); not the real LFM2/Qwen vocabulary.

### LFM2 and LFM2-MoE (LFM2Model, LFM2MoeModel)
- Layer kinds: `<arch>.attention.head_count_kv` is a per-layer INT32 array: 0 = short-conv
  layer, >0 = attention layer (llama.cpp: is_recr(il) = head_count_kv[il] == 0). From HF
  `layer_types` ["conv","conv","full_attention","conv"] -> [0, 0, 2, 0]. No other layer-type key.
- `feed_forward_length`: LFM2 writes it twice; the final value is the auto-adjusted dim
  (block_auto_adjust_ff_dim: int(2*192/3) = 128, x block_ffn_dim_multiplier 1.0, rounded up to
  block_multiple_of 16 -> 128 = rows of w1). LFM2-MoE: 128 (dense leading layer), experts 32.
- Norms: LFM2's RMSNorm is x*w, so NO +1 on any norm. `token_embd_norm.weight` is HF
  `model.embedding_norm`, which HF applies AFTER the last layer: it is the final norm (there is
  no `output_norm`). eps = norm_eps 1e-5 for all norms (incl. q/k layernorm).
- Short conv (`shortconv.*`): `in_proj` rows [B | C | x], 3 chunks of n_embd (llama.cpp views
  chunk 0 = B, 1 = C, 2 = x); `conv.conv.weight` HF [n_embd, 1, L] -> squeeze(1) -> [n_embd, L],
  ne {L, n_embd}; element [c, k] = HF weight[c, 0, k]. L = `shortconv.l_cache` = conv_L_cache 3.
  conv_bias false: no bias tensors.
- Attention layers: q/k/v/out_proj copied (`attn_q/k/v/output`); q_layernorm/k_layernorm ->
  `attn_q_norm`/`attn_k_norm` ([head_dim 16], no +1). head_dim = n_embd / n_head (no key_length
  key). `rope.freq_base` 1e6. No sliding window key.
- Dense FFN: w1 -> `ffn_gate`, w3 -> `ffn_up`, w2 -> `ffn_down` (down(silu(gate x) * up x)).
- LFM2-MoE: `leading_dense_block_count` 1 (= num_dense_layers): layer 0 has dense ffn_gate/up/down,
  layers >= 1 are MoE. Router `feed_forward.gate.weight` [E, n_embd] -> `ffn_gate_inp`.
  `feed_forward.expert_bias` [E] -> `blk.N.exp_probs_b.bias` (values unchanged; the converter
  renames `.expert_bias` to `.expert_bias.bias` so the tensor map finds it). Experts
  `experts.{e}.w1/w3/w2` -> torch.stack(dim 0) -> `ffn_gate_exps`/`ffn_up_exps`/`ffn_down_exps`.
  `expert_gating_func` 2 = SIGMOID; `expert_used_count` 2. NOT written: norm_topk_prob (true) and
  routed_scaling_factor (1.0); llama.cpp's LFM2 graph always normalises the top-k weights and
  applies no scale (expert_weights_scale absent = 0 -> skipped). HF semantics the GGUF encodes:
  p = sigmoid(router x); experts chosen by top-k of p + expert_bias; weights = p[chosen] (bias
  not included), divided by their sum (HF adds 1e-6 to the sum; llama.cpp clamps the sum >= 6.1e-5).

### Qwen3.5 and Qwen3.5-MoE (Qwen3_5TextModel / Qwen3_5MoeTextModel = _Qwen35MRopeMixin + _LinearAttentionVReorderBase + Qwen3NextModel (+ _QwenMtpMixin, Qwen2MoeModel))
- Converted with `--no-mtp` (these configs have no MTP layers; without the flag the converter
  asserts). So no `nextn_predict_layers` key and block_count = num_hidden_layers = 4.
- Layer kinds: `<arch>.attention.recurrent_layers` BOOL array, true = linear_attention (Gated
  DeltaNet), false = full_attention, from HF `layer_types` -> [true, true, true, false].
  `full_attention_interval` 4 is also written (config default; llama.cpp uses it only when
  recurrent_layers is absent: recurrent iff (il+1) % interval != 0).
- Norms with +1 (HF Qwen3_5RMSNorm computes x*(1+w); GGUF = w+1, so apply x*w_gguf): every HF
  tensor whose name ends in `norm.weight` except `linear_attn.norm.weight`, i.e.
  `input_layernorm` -> `attn_norm`, `post_attention_layernorm` -> `post_attention_norm` (the pre-FFN
  norm; note the GGUF name), `model.norm` -> `output_norm`, `self_attn.q_norm` -> `attn_q_norm`,
  `self_attn.k_norm` -> `attn_k_norm`. `linear_attn.norm.weight` -> `ssm_norm` WITHOUT +1 (HF
  Qwen3_5RMSNormGated is x*w), shape [head_v_dim 16], shared by all value heads. eps 1e-6.
- Gated full attention: `q_proj` [n_head*2*head_dim, n_embd] is kept whole as `attn_q`
  (ne {64, 256}), NOT split. Row h*2*hd + i is query dim i of head h for i < hd and gate dim
  (i - hd) of head h for hd <= i < 2*hd (HF: view(.., n_head, 2*hd) then chunk(2); llama.cpp: the
  same two strided views). out = o_proj(attn * sigmoid(gate)). `attn_k`/`attn_v`/`attn_output`
  copies. head_dim from `attention.key_length` = `value_length` = 32 (NOT n_embd/n_head = 16).
  `attn_q_norm`/`attn_k_norm` [32] (+1). `rope.freq_base` 1e7.
- Gated DeltaNet metadata: `ssm.conv_kernel` = linear_conv_kernel_dim 4; `ssm.state_size` =
  linear_key_head_dim dk 16; `ssm.group_count` = linear_num_key_heads n_k 2; `ssm.time_step_rank`
  = linear_num_value_heads n_v 4; `ssm.inner_size` = n_v*dv 64 (llama.cpp takes head_v_dim =
  inner_size / time_step_rank).
- Gated DeltaNet tensors: in_proj_qkv -> `attn_qkv`; in_proj_z -> `attn_gate`; in_proj_a ->
  `ssm_alpha`; in_proj_b -> `ssm_beta`; A_log -> `ssm_a` (no `.weight` suffix) with value
  -exp(A_log); dt_bias -> `ssm_dt.bias` (renamed via `.dt_proj.bias`); conv1d.weight [C, 1, K] ->
  squeeze -> `ssm_conv1d.weight` [C, K], ne {K, C}, C = 2*n_k*dk + n_v*dv = 128; norm ->
  `ssm_norm`; out_proj -> `ssm_out`. Semantics (HF = llama.cpp): beta = sigmoid(ssm_beta x);
  g = ssm_a * softplus(ssm_alpha x + ssm_dt.bias) (= -exp(A_log) * softplus(..)); causal depthwise
  conv over the [q | k | v] channels then SiLU; q, k L2-normalised per head; per-head delta rule;
  out = ssm_out(rmsnorm(o) * ssm_norm * silu(z)).
- q and k are NOT reordered; `attn_qkv` rows [0, n_k*dk) = q heads, [n_k*dk, 2*n_k*dk) = k heads,
  as in HF (Qwen3-Next's in_proj_qkvz de-interleave does not apply: Qwen3.5 has separate
  in_proj_qkv / in_proj_z).
- V-head reorder (because n_v 4 != n_k 2; r = n_v / n_k = 2). HF keeps value heads grouped by key
  head (value head h uses key head h // r, HF repeat_interleave). The GGUF keeps them tiled:
  GGUF value-head slot p holds HF value head  h(p) = (p % n_k) * r + p // n_k,
  and HF head h sits in slot  p(h) = (h % r) * n_k + h // r.
  Here slots p = 0,1,2,3 hold HF heads 0,2,1,3. In GGUF order slot p uses key head p % n_k (what
  ggml_repeat gives). Applied to (everything else in the layer is untouched):
  - `attn_qkv` rows and `ssm_conv1d` channels: index 2*n_k*dk + p*dv + i (i < dv) holds HF index
    2*n_k*dk + h(p)*dv + i; the q and k parts are unchanged;
  - `attn_gate` (z) rows: p*dv + i <- HF h(p)*dv + i;
  - `ssm_alpha`, `ssm_beta` rows and `ssm_a`, `ssm_dt.bias` elements: p <- HF h(p);
  - `ssm_out` COLUMNS (input dim): p*dv + i <- HF h(p)*dv + i;
  - `ssm_norm`: not reordered (per-dim, shared by heads).
  The permuted model computes the same function. A loader that implements HF semantics must undo
  this with h(p) (or keep GGUF order and pair slot p with key head p % n_k instead of p // r).
- FFN: dense Qwen3.5: mlp.gate_proj/up_proj/down_proj -> `ffn_gate`/`ffn_up`/`ffn_down`.
  Qwen3.5-MoE (every layer MoE, no dense FFN, no `feed_forward_length` key): router mlp.gate.weight
  [E, n_embd] -> `ffn_gate_inp`; per-expert mlp.experts.{e}.gate_proj/up_proj/down_proj ->
  torch.stack(dim 0) -> `ffn_gate_exps`/`ffn_up_exps`/`ffn_down_exps` (a checkpoint with fused
  `mlp.experts.gate_up_proj` [E, 2*ff, n_embd] would be split rows [0, ff) -> gate, [ff, 2ff) -> up;
  not the case here). No expert bias. Shared expert: mlp.shared_expert.{gate,up,down}_proj ->
  `ffn_{gate,up,down}_shexp` (copies); mlp.shared_expert_gate.weight [1, n_embd] ->
  `ffn_gate_inp_shexp`, ne {64, 1}; out = moe(x) + sigmoid(ffn_gate_inp_shexp . x) * shexp(x).
  `expert_feed_forward_length` 32, `expert_shared_feed_forward_length` 32, `expert_count` 8,
  `expert_used_count` 2. No gating-func key: llama.cpp QWEN35MOE hardcodes softmax over all
  experts, top-k, renormalise (= HF Qwen3_5MoeTopKRouter).

### gpt-oss (GptOssModel; `general.architecture` = `gpt-oss`)
- Output type f32 from f32 experts (the MXFP4 path, `*_blocks` / `*_scales` repacked, is not
  used: the tiny model has no `quantization_config`; see scripts/gen-tiny-mxfp4).
- Copies: `token_embd`, `output` (= `lm_head`, untied), `output_norm` (= `model.norm`; plain x*w,
  no +1), `attn_norm` (= `input_layernorm`), `post_attention_norm` (= `post_attention_layernorm`,
  the pre-FFN norm), `attn_q/k/v/output` weights AND biases (`attention_bias` true),
  `ffn_gate_inp.weight/.bias` (= `mlp.router.weight/.bias`). `self_attn.sinks` [n_head] becomes
  `attn_sinks.weight` (the converter appends `.weight`).
- Experts (HF `x @ W` layout, transposed against a Linear): `mlp.experts.gate_up_proj`
  [E, n_embd, 2*ff] is transposed to [E, 2*ff, n_embd] and split by rows, even rows (HF columns
  `::2`) -> `ffn_gate_exps`, odd rows (`1::2`) -> `ffn_up_exps`, ne {n_embd, ff, E} each;
  `gate_up_proj_bias` [E, 2*ff] -> `ffn_gate_exps.bias` (`::2`) / `ffn_up_exps.bias` (`1::2`),
  ne {ff, E}; `down_proj` [E, ff, n_embd] transposed -> `ffn_down_exps` ne {ff, n_embd, E};
  `down_proj_bias` -> `ffn_down_exps.bias` ne {n_embd, E}.
- Metadata: `attention.sliding_window` 4; no sliding-window pattern key, so llama.cpp uses its
  gpt-oss default (`set_swa_pattern(2)`: even layers slide, odd layers are full) = HF
  `layer_types`. `expert_count` 4, `expert_used_count` 2, `expert_feed_forward_length` 32;
  `attention.key_length` 16. RoPE: `rope.freq_base` 150000, `rope.scaling.type` yarn,
  `rope.scaling.factor` 32, `rope.scaling.original_context_length` 4096,
  `rope.scaling.yarn_beta_fast` 32, `rope.scaling.yarn_beta_slow` 1. NOT written: HF's
  `truncate` (false for gpt-oss; ggml always rounds the YaRN correction range with floor/ceil,
  which for head_dim 16 changes pairs 3 and 4) and `swiglu_alpha` / `swiglu_limit` (llama.cpp
  hard-codes 1.702 and 7.0). Router semantics (llama.cpp SOFTMAX_WEIGHT = HF): top-k of the
  biased logits, softmax over the k.
- Tokenizer stand-in: `tokenizer.ggml.pre` gpt-4o; specials 507 `<|startoftext|>` (bos),
  508 `<|endoftext|>` (pad), 509 `<|return|>` (eos), 510 `<|call|>`, 511 `<|end|>`; no BOS added.
"""

# ----------------------------------------------------------------------------------------------
# report: metadata, tensors, and numeric checks of the converter's transformations
# ----------------------------------------------------------------------------------------------

def _tile_to_grouped(x, axis: int, n_k: int, r: int, d: int):
    """Undo llama.cpp's _LinearAttentionVReorderBase._reorder_v_heads along `axis`.

    HF (grouped) order of value heads: h = g * r + j  (g = key head 0..n_k-1, j = 0..r-1).
    GGUF (tiled) order:                p = j * n_k + g.
    So GGUF block p holds HF head h = (p % n_k) * r + p // n_k, and HF head h sits at GGUF block
    p = (h % r) * n_k + h // r; each block is `d` contiguous elements along `axis`.
    """
    import numpy as np

    x = np.moveaxis(x, axis, 0)
    rest = x.shape[1:]
    x = x.reshape(r, n_k, d, *rest).swapaxes(0, 1).reshape(r * n_k * d, *rest)
    return np.moveaxis(x, 0, axis)


def _grouped_to_tiled(x, axis: int, n_k: int, r: int, d: int):
    import numpy as np

    x = np.moveaxis(x, axis, 0)
    rest = x.shape[1:]
    x = x.reshape(n_k, r, d, *rest).swapaxes(0, 1).reshape(r * n_k * d, *rest)
    return np.moveaxis(x, 0, axis)


def _rules(family: str, cfg: dict):
    """GGUF name -> (HF names, undo(gguf_array) -> HF-shaped array, description)."""
    import re

    import numpy as np

    ident = lambda x: x  # noqa: E731
    minus1 = lambda x: x - 1.0  # noqa: E731

    if family == "gpt-oss":
        return _gpt_oss_rules(cfg)
    if family == "lfm2":
        top = {
            "token_embd.weight": ("model.embed_tokens.weight", ident, "copy", "copy"),
            "token_embd_norm.weight": ("model.embedding_norm.weight", ident,
                                       "copy (no +1). HF applies `embedding_norm` AFTER the last layer: it is the final norm", "copy"),
            "output.weight": ("lm_head.weight", ident, "copy", "copy"),
        }
        blk = {
            "attn_norm.weight": ("operator_norm.weight", ident, "copy (no +1; LFM2 RMSNorm is x*w)", "copy"),
            "ffn_norm.weight": ("ffn_norm.weight", ident, "copy (no +1)", "copy"),
            "shortconv.conv.weight": ("conv.conv.weight", lambda x: x[:, None, :],
                                      "HF [C,1,L] squeezed to [C,L] (ne {L, C})", "reshape"),
            "shortconv.in_proj.weight": ("conv.in_proj.weight", ident, "copy; rows = [B | C | x], 3 chunks of n_embd", "copy"),
            "shortconv.out_proj.weight": ("conv.out_proj.weight", ident, "copy", "copy"),
            "attn_q.weight": ("self_attn.q_proj.weight", ident, "copy (no rope permutation; NEOX rope)", "copy"),
            "attn_k.weight": ("self_attn.k_proj.weight", ident, "copy (no rope permutation)", "copy"),
            "attn_v.weight": ("self_attn.v_proj.weight", ident, "copy", "copy"),
            "attn_output.weight": ("self_attn.out_proj.weight", ident, "copy", "copy"),
            "attn_q_norm.weight": ("self_attn.q_layernorm.weight", ident, "copy (no +1)", "copy"),
            "attn_k_norm.weight": ("self_attn.k_layernorm.weight", ident, "copy (no +1)", "copy"),
            "ffn_gate.weight": ("feed_forward.w1.weight", ident, "copy", "copy"),
            "ffn_up.weight": ("feed_forward.w3.weight", ident, "copy", "copy"),
            "ffn_down.weight": ("feed_forward.w2.weight", ident, "copy", "copy"),
            "ffn_gate_inp.weight": ("feed_forward.gate.weight", ident, "copy (router, [n_expert, n_embd])", "copy"),
            "exp_probs_b.bias": ("feed_forward.expert_bias", ident,
                                 "copy; HF `expert_bias` renamed (converter maps it via `.expert_bias.bias`)", "copy"),
        }
        exps = {"ffn_gate_exps.weight": "w1", "ffn_up_exps.weight": "w3", "ffn_down_exps.weight": "w2"}
        exp_tmpl = "model.layers.{b}.feed_forward.experts.{e}.{w}.weight"
    else:
        n_k, n_v = cfg["linear_num_key_heads"], cfg["linear_num_value_heads"]
        dk, dv = cfg["linear_key_head_dim"], cfg["linear_value_head_dim"]
        r = n_v // n_k
        qk = 2 * n_k * dk
        if n_v != n_k:
            vperm = f"V heads grouped->tiled (see formula; n_k={n_k}, r={r})"
        else:
            vperm = "no reorder (n_v == n_k)"
        untile = (lambda x, axis, d: _tile_to_grouped(x, axis, n_k, r, d)) if n_v != n_k else (lambda x, axis, d: x)

        top = {
            "token_embd.weight": ("model.embed_tokens.weight", ident, "copy", "copy"),
            "output.weight": ("lm_head.weight", ident, "copy (absent when tie_word_embeddings)", "copy"),
            "output_norm.weight": ("model.norm.weight", minus1, "GGUF = HF + 1", "value"),
        }
        blk = {
            "attn_norm.weight": ("input_layernorm.weight", minus1, "GGUF = HF + 1", "value"),
            "post_attention_norm.weight": ("post_attention_layernorm.weight", minus1, "GGUF = HF + 1 (pre-FFN norm)", "value"),
            "attn_q.weight": ("self_attn.q_proj.weight", ident,
                              "copy; q and gate NOT split: row h*2*hd + i is q (i<hd) or gate (i>=hd, i-hd) of head h", "copy"),
            "attn_k.weight": ("self_attn.k_proj.weight", ident, "copy (no rope permutation)", "copy"),
            "attn_v.weight": ("self_attn.v_proj.weight", ident, "copy", "copy"),
            "attn_output.weight": ("self_attn.o_proj.weight", ident, "copy", "copy"),
            "attn_q_norm.weight": ("self_attn.q_norm.weight", minus1, "GGUF = HF + 1", "value"),
            "attn_k_norm.weight": ("self_attn.k_norm.weight", minus1, "GGUF = HF + 1", "value"),
            "attn_qkv.weight": ("linear_attn.in_proj_qkv.weight",
                                lambda x: np.concatenate([x[:qk], untile(x[qk:], 0, dv)], 0),
                                f"rows [q {n_k*dk} | k {n_k*dk} | v {n_v*dv}]; q,k copied, v rows: {vperm}", "perm"),
            "attn_gate.weight": ("linear_attn.in_proj_z.weight", lambda x: untile(x, 0, dv), f"z rows: {vperm}", "perm"),
            "ssm_alpha.weight": ("linear_attn.in_proj_a.weight", lambda x: untile(x, 0, 1), f"rows: {vperm}", "perm"),
            "ssm_beta.weight": ("linear_attn.in_proj_b.weight", lambda x: untile(x, 0, 1), f"rows: {vperm}", "perm"),
            "ssm_a": ("linear_attn.A_log", lambda x: untile(np.log(-x.astype(np.float64)), 0, 1),
                      f"GGUF = -exp(A_log), {vperm}; no .weight suffix", "value"),
            "ssm_dt.bias": ("linear_attn.dt_bias", lambda x: untile(x, 0, 1), f"dt_bias renamed to ssm_dt.bias, {vperm}", "perm"),
            "ssm_conv1d.weight": ("linear_attn.conv1d.weight",
                                  lambda x: np.concatenate([x[:qk], untile(x[qk:], 0, dv)], 0)[:, None, :],
                                  f"HF [C,1,K] squeezed to [C,K] (ne {{K, C}}); channels [q|k|v], v channels: {vperm}", "perm"),
            "ssm_norm.weight": ("linear_attn.norm.weight", ident, "copy (NO +1: gated RMSNorm is x*w)", "copy"),
            "ssm_out.weight": ("linear_attn.out_proj.weight", lambda x: untile(x, 1, dv), f"columns (input dim): {vperm}", "perm"),
            "ffn_gate.weight": ("mlp.gate_proj.weight", ident, "copy", "copy"),
            "ffn_up.weight": ("mlp.up_proj.weight", ident, "copy", "copy"),
            "ffn_down.weight": ("mlp.down_proj.weight", ident, "copy", "copy"),
            "ffn_gate_inp.weight": ("mlp.gate.weight", ident, "copy (router, [n_expert, n_embd])", "copy"),
            "ffn_gate_shexp.weight": ("mlp.shared_expert.gate_proj.weight", ident, "copy", "copy"),
            "ffn_up_shexp.weight": ("mlp.shared_expert.up_proj.weight", ident, "copy", "copy"),
            "ffn_down_shexp.weight": ("mlp.shared_expert.down_proj.weight", ident, "copy", "copy"),
            "ffn_gate_inp_shexp.weight": ("mlp.shared_expert_gate.weight", ident,
                                          "copy; HF [1, n_embd] -> ne {n_embd, 1} (2-D)", "copy"),
        }
        exps = {"ffn_gate_exps.weight": "gate_proj", "ffn_up_exps.weight": "up_proj", "ffn_down_exps.weight": "down_proj"}
        exp_tmpl = "model.layers.{b}.mlp.experts.{e}.{w}.weight"

    n_exp = cfg.get("num_experts", 0)

    def explain(name: str):
        if name in top:
            hf, undo, desc, kind = top[name]
            return [hf], undo, desc, kind
        m = re.match(r"blk\.(\d+)\.(.+)$", name)
        if not m:
            return None
        b, rest = int(m.group(1)), m.group(2)
        if rest in blk:
            hf, undo, desc, kind = blk[rest]
            return [f"model.layers.{b}.{hf}"], undo, desc, kind
        if rest in exps:
            names = [exp_tmpl.format(b=b, e=e, w=exps[rest]) for e in range(n_exp)]
            return names, ident, f"torch.stack over experts e=0..{n_exp-1} (dim 0): [E, out, in] (ne {{in, out, E}})", "copy"
        return None

    return explain


def _gpt_oss_rules(cfg: dict):
    """gpt-oss: like _rules, plus an optional 5th element `select(hf_array)` for GGUF tensors that
    hold part of an HF tensor (gate / up halves of the fused, interleaved gate_up_proj)."""
    import re

    ident = lambda x: x  # noqa: E731
    swap = lambda x: x.transpose(0, 2, 1)  # noqa: E731
    even = lambda x: x[..., ::2]  # noqa: E731
    odd = lambda x: x[..., 1::2]  # noqa: E731
    top = {
        "token_embd.weight": ("model.embed_tokens.weight", ident, "copy", "copy"),
        "output.weight": ("lm_head.weight", ident, "copy (untied)", "copy"),
        "output_norm.weight": ("model.norm.weight", ident, "copy (no +1)", "copy"),
    }
    blk = {
        "attn_norm.weight": ("input_layernorm.weight", ident, "copy (no +1)", "copy"),
        "post_attention_norm.weight": ("post_attention_layernorm.weight", ident, "copy (no +1; pre-FFN norm)", "copy"),
        "attn_sinks.weight": ("self_attn.sinks", ident, "copy; `.weight` appended", "copy"),
        "ffn_gate_inp.weight": ("mlp.router.weight", ident, "copy (router, [n_expert, n_embd])", "copy"),
        "ffn_gate_inp.bias": ("mlp.router.bias", ident, "copy", "copy"),
        "ffn_gate_exps.weight": ("mlp.experts.gate_up_proj", swap,
                                 "HF [E, n_embd, 2ff] columns ::2 (gate), transposed to [E, ff, n_embd]", "perm", even),
        "ffn_up_exps.weight": ("mlp.experts.gate_up_proj", swap,
                               "HF [E, n_embd, 2ff] columns 1::2 (up), transposed to [E, ff, n_embd]", "perm", odd),
        "ffn_down_exps.weight": ("mlp.experts.down_proj", swap, "HF [E, ff, n_embd] transposed to [E, n_embd, ff]", "perm"),
        "ffn_gate_exps.bias": ("mlp.experts.gate_up_proj_bias", ident, "HF [E, 2ff] columns ::2 (gate)", "copy", even),
        "ffn_up_exps.bias": ("mlp.experts.gate_up_proj_bias", ident, "HF [E, 2ff] columns 1::2 (up)", "copy", odd),
        "ffn_down_exps.bias": ("mlp.experts.down_proj_bias", ident, "copy", "copy"),
    }
    for p, hf in (("q", "q_proj"), ("k", "k_proj"), ("v", "v_proj"), ("output", "o_proj")):
        for kind in ("weight", "bias"):
            blk[f"attn_{p}.{kind}"] = (f"self_attn.{hf}.{kind}", ident, "copy (no rope permutation; NEOX rope)"
                                       if p in ("q", "k") and kind == "weight" else "copy", "copy")

    def explain(name: str):
        if name in top:
            hf, *rest = top[name]
            return [hf], *rest
        m = re.match(r"blk\.(\d+)\.(.+)$", name)
        if not m or m.group(2) not in blk:
            return None
        hf, *rest = blk[m.group(2)]
        return [f"model.layers.{m.group(1)}.{hf}"], *rest

    return explain


def _cell(text: str) -> str:
    """Make text safe inside a markdown table cell (also inside code spans)."""
    return text.replace("|", "\\|")


def _fmt_value(field) -> tuple[str, str]:
    from gguf import GGUFValueType

    t = field.types
    if not t:
        return "?", "?"
    if t[0] == GGUFValueType.ARRAY:
        tname = f"[{t[-1].name}]"
        vals = field.contents()
        n = len(vals)
        if t[-1] == GGUFValueType.STRING:
            show = ", ".join(repr(v) for v in vals[:6])
        else:
            show = ", ".join(str(v) for v in vals[:8])
        more = f", ... ({n} items)" if n > (6 if t[-1] == GGUFValueType.STRING else 8) else ""
        return tname, f"[{show}{more}]"
    v = field.contents()
    if t[0] == GGUFValueType.STRING:
        v = repr(v)
        if len(v) > 120:
            v = v[:120] + "...'"
    return t[0].name, str(v)


def _formula_check(w, reader, hf: dict, cfg: dict) -> None:
    """Check the V-head index formula h(p) = (p % n_k) * r + p // n_k element by element."""
    import numpy as np

    n_k, n_v = cfg["linear_num_key_heads"], cfg["linear_num_value_heads"]
    dk, dv = cfg["linear_key_head_dim"], cfg["linear_value_head_dim"]
    r, qk = n_v // n_k, 2 * n_k * dk
    hp = [(p % n_k) * r + p // n_k for p in range(n_v)]
    T = {t.name: np.asarray(t.data, dtype=np.float32).reshape([int(x) for x in t.shape][::-1]) for t in reader.tensors}
    worst = worst_a = 0.0
    n = 0
    for b, kind in enumerate(cfg["layer_types"]):
        if kind != "linear_attention":
            continue
        g = lambda k: T[f"blk.{b}.{k}"]  # noqa: E731
        H = lambda k: hf[f"model.layers.{b}.linear_attn.{k}"]  # noqa: E731
        for p in range(n_v):
            h = hp[p]
            pairs = [
                (g("attn_qkv.weight")[qk + p * dv: qk + (p + 1) * dv], H("in_proj_qkv.weight")[qk + h * dv: qk + (h + 1) * dv]),
                (g("ssm_conv1d.weight")[qk + p * dv: qk + (p + 1) * dv], H("conv1d.weight")[qk + h * dv: qk + (h + 1) * dv, 0]),
                (g("attn_gate.weight")[p * dv:(p + 1) * dv], H("in_proj_z.weight")[h * dv:(h + 1) * dv]),
                (g("ssm_alpha.weight")[p], H("in_proj_a.weight")[h]),
                (g("ssm_beta.weight")[p], H("in_proj_b.weight")[h]),
                (g("ssm_dt.bias")[p], H("dt_bias")[h]),
                (g("ssm_out.weight")[:, p * dv:(p + 1) * dv], H("out_proj.weight")[:, h * dv:(h + 1) * dv]),
            ]
            worst_a = max(worst_a, abs(float(g("ssm_a")[p]) - float(-np.exp(np.float64(H("A_log")[h])))))
            for a, c in pairs:
                worst = max(worst, float(np.max(np.abs(np.asarray(a, np.float64) - np.asarray(c, np.float64)))))
                n += 1
        worst = max(worst, float(np.max(np.abs(g("attn_qkv.weight")[:qk] - H("in_proj_qkv.weight")[:qk]))))
    w("")
    w(f"Explicit index check of the V-head formula h(p) = (p % n_k) * r + p // n_k (n_k={n_k}, r={r}:"
      f" slots 0..{n_v-1} hold HF heads {hp}) on attn_qkv v rows, ssm_conv1d v channels, attn_gate rows,"
      f" ssm_alpha/ssm_beta rows, ssm_dt.bias, ssm_out columns, and q/k rows unchanged: {n} comparisons,"
      f" max |Δ| = {worst:.3g}; ssm_a[p] vs -exp(A_log[h(p)]) (exp in float64, so float32 rounding only):"
      f" max |Δ| = {worst_a:.3g}.")


def cmd_report(llamacpp: str, gguf_dir: str, src_dir: str, out_md: str) -> None:
    import hashlib
    import re

    import numpy as np

    sys.path.insert(0, str(Path(llamacpp) / "gguf-py"))
    import gguf
    from gguf import GGUFReader
    from safetensors.numpy import load_file

    gdir, sdir = Path(gguf_dir), Path(src_dir)
    L: list[str] = []
    w = L.append
    w("# Tiny GGUFs: metadata, tensors, and what the converter did to each weight\n")
    w("Generated by `scripts/gen-tiny-gguf` (`scripts/gen_tiny_gguf.py report`); regenerate, do not edit.")
    gver = re.search(r'^version = "([^"]+)"', (Path(llamacpp) / "gguf-py" / "pyproject.toml").read_text(), re.M)
    w(f"Read with gguf-py {gver.group(1) if gver else '?'} from `{llamacpp.split('/src/')[-1]}`.\n")
    w(NOTES)
    w("Conventions: `ne` is GGUF/ggml order (ne[0] = fastest-varying = the last PyTorch dim), so the")
    w("row-major array in the file has numpy/PyTorch shape `ne[::-1]`; for a Linear weight `ne = {in, out}`")
    w("and HF `W[out, in]` is the same bytes. `Δundo` = max |undo(GGUF) - HF| computed in numpy (float64 for")
    w("the log in `ssm_a`), where undo is the inverse of the transformation in the `transform` column;")
    w("`Δraw` = max |GGUF - HF| with no undo (shown only where the transformation is not a plain copy and the")
    w("shapes allow it) to prove that the transformation is really there.\n")

    models = [("lfm2", "lfm2"), ("lfm2_moe", "lfm2"), ("qwen3_5", "qwen35"), ("qwen3_5_moe", "qwen35"),
              ("lfm2.q8_0", "lfm2"), ("gpt_oss", "gpt-oss")]
    summary: list[str] = []
    for fname, family in models:
        path = gdir / f"{fname}.gguf"
        if not path.exists():
            continue
        model = fname.split(".")[0]
        cfg = json.loads((sdir / model / "config.json").read_text())
        hf = load_file(str(sdir / model / "model.safetensors"))
        explain = _rules(family, cfg)
        reader = GGUFReader(str(path))
        data = path.read_bytes()
        sha = hashlib.sha256(data).hexdigest()
        w(f"\n## {path.name}\n")
        w(f"- source: `{sdir.name}/{model}` ({cfg['architectures'][0]}), size {len(data)} bytes, sha256 `{sha}`")
        w(f"- {len(reader.fields)} metadata fields (incl. 3 GGUF header pseudo-fields), {len(reader.tensors)} tensors\n")
        w("### Metadata\n")
        w("| key | type | value |")
        w("|---|---|---|")
        for field in reader.fields.values():
            if field.name.startswith("GGUF."):
                continue
            tname, val = _fmt_value(field)
            w(f"| `{field.name}` | {tname} | `{_cell(val)}` |")
        w("\n### Tensors\n")
        w("| GGUF name | ne | type | HF source | transform | Δundo | Δraw |")
        w("|---|---|---|---|---|---|---|")
        used: set[str] = set()
        worst = 0.0
        for t in reader.tensors:
            ne = [int(x) for x in t.shape]
            ttype = t.tensor_type.name
            if t.tensor_type in (gguf.GGMLQuantizationType.F32,):
                arr = np.asarray(t.data, dtype=np.float32).reshape(ne[::-1])
            else:
                arr = gguf.quants.dequantize(t.data, t.tensor_type).reshape(ne[::-1]).astype(np.float32)
            ex = explain(t.name)
            if ex is None:
                w(f"| `{t.name}` | {ne} | {ttype} | ? | UNEXPLAINED | | |")
                worst = float("inf")
                continue
            names, undo, desc, kind, *select = ex
            if len(names) == 1:
                ref = hf[names[0]]
                src = f"`{names[0]}` {list(ref.shape)}"
                if select:
                    ref = select[0](ref)
            else:
                ref = np.stack([hf[n] for n in names])
                tmpl = names[0].replace(".experts.0.", ".experts.{e}.")
                src = f"`{tmpl}` (e=0..{len(names)-1}) each {list(hf[names[0]].shape)}"
            used.update(names)
            got = np.asarray(undo(arr))
            if got.shape != ref.shape:
                d_undo = f"SHAPE {list(got.shape)} != {list(ref.shape)}"
                worst = float("inf")
            else:
                dd = float(np.max(np.abs(got.astype(np.float64) - ref.astype(np.float64))))
                worst = max(worst, dd)
                d_undo = f"{dd:.3g}"
            d_raw = ""
            if kind in ("value", "perm"):
                if arr.size == ref.size:
                    d_raw = f"{float(np.max(np.abs(arr.reshape(ref.shape).astype(np.float64) - ref))):.3g}"
            w(f"| `{t.name}` | {ne} | {ttype} | {src} | {_cell(desc)} | {d_undo} | {d_raw} |")
        if family == "qwen35":
            _formula_check(w, reader, hf, cfg)
        unused = sorted(set(hf) - used)
        w("")
        tied = cfg.get("tie_word_embeddings")
        w(f"HF tensors not in this GGUF: {', '.join('`'+u+'`' for u in unused) if unused else 'none'}"
          f" (tie_word_embeddings={tied}; a missing `output.weight` means: use `token_embd.weight`).")
        summary.append(f"| {path.name} | {len(reader.tensors)} | {len(hf)} | {worst:.3g} | {len(unused)} |")
        hf.clear()

    w("\n## Summary of the numeric checks\n")
    w("| file | GGUF tensors | HF tensors | max Δundo over all tensors (q8_0: quantisation error) | HF tensors unused |")
    w("|---|---|---|---|---|")
    L.extend(summary)
    Path(out_md).write_text("\n".join(L) + "\n", encoding="utf-8")
    print("\n".join(["report:"] + summary))


if __name__ == "__main__":
    cmd = sys.argv[1] if len(sys.argv) > 1 else ""
    if cmd == "prepare":
        cmd_prepare(*sys.argv[2:5])
    elif cmd == "convert":
        cmd_convert(sys.argv[2], sys.argv[3], sys.argv[4:])
    elif cmd == "report":
        cmd_report(*sys.argv[2:6])
    else:
        sys.exit(__doc__)
