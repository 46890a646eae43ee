"""Tiny random-weight MiniCPM-V 4.0 and 4.5 reference checkpoints and their outputs.

There is no transformers implementation of MiniCPM-V 4.0 / 4.5 (the checkpoints ship remote
code), so this script assembles the model from transformers parts and a resampler written here:

- Vision tower: transformers' `Idefics2VisionTransformer` modules (patch embedding, position
  table, encoder, post LayerNorm). The embedding step is done here the way MiniCPM-V's own
  `MiniCPMVisionEmbeddings` does it: each slice arrives as a strip `[3, patch, L*patch]`, the
  convolution gives `L` patches, and the position ids come from the slice's target size
  `(h, w)` (`tgt_sizes`) by bucketising `arange(0, 1-1e-6, 1/h)` against
  `arange(1/side, 1, 1/side)` (`right=True`), `id = bh*side + bw`. Slices are batched, padded,
  and padded keys are masked in every encoder layer. `drop_vision_last_layer` removes the last
  encoder layer (the 4.0 pack here sets it and still stores that layer's weights, so a loader
  that ignores the flag gets other numbers).
- Resampler (one per slice): 64 (here `query_num`) learned queries, `num_heads = embed_dim //
  128`, `x = ln_kv(kv_proj(vision))`, `q = ln_q(query)`, `nn.MultiheadAttention(q, k = x +
  pos, v = x)` with padded keys masked, then `ln_post(out) @ proj`. `pos` is the 2-D sincos
  table: `pos[h][w] = [sin(w*om), cos(w*om), sin(h*om), cos(h*om)]`, `om = 1/10000^(arange(D/4)
  /(D/4))`, computed in float32 as numpy does, rows flattened row-major over the slice.
- Language model: transformers' `LlamaForCausalLM` (4.0) or `Qwen3ForCausalLM` (4.5); the
  resampler outputs replace the input embeddings at the `<unk>` positions, in order (overview,
  then the slices row-major).

What is verified and from where:
- Backbones (4.0 Llama, 4.5 Qwen3), `num_heads = embed_dim // 128`, the resampler's layout and
  module names (`query`, `kv_proj` without bias, `attn` = `nn.MultiheadAttention` with
  `in_proj_weight`/`in_proj_bias`/`out_proj`, `ln_q`, `ln_kv`, `ln_post`, `proj`), the module
  tree `llm` / `vpm` / `resampler` (so the tensor names `llm.model.*`, `llm.lm_head.weight`,
  `vpm.embeddings.*`, `vpm.encoder.layers.*`, `vpm.post_layernorm.*`, `resampler.*`), the
  embedding step with `tgt_sizes`, `drop_vision_last_layer`, and the `<unk>` scatter: read
  from a port of MiniCPM-V 4.5's own remote code (a `models/minicpm_v_4_5/modeling_minicpm_v_4_5.py`
  in a transformers tree, with `MiniCPM_V_4_5ForConditionalGeneration`, `MiniCPMVResampler`
  and `MiniCPMVisionEmbeddings`) and vLLM's `minicpmv.py` (`Resampler2_5`, `Resampler4_5`,
  `get_num_image_tokens`). llama.cpp's converters were not read.
- 4.5's k/v placement: MiniCPM-V 4.5's own resampler puts the 2-D position on the keys
  (`v = x; k = x + pos_embed_2d`), as 2.5/4.0 do, and so does current vLLM (`k = x +
  pos_embed_2d; v = x`); an older vLLM `Resampler4_5` had them the other way round
  (`k = x; v = x + pos`). This reference follows the model's own code: keys carry the position.
- Follows vLLM only: 4.0's `LlamaForCausalLM` backbone (no MiniCPM-V 4.0 remote code was
  available; any muP scaling such a backbone might have is not modelled).
- Not verified: the exact `vision_config` keys of the real packs (`model_type` "siglip" is used).

Writes `<out>/minicpmv4_0` and `<out>/minicpmv4_5`: config.json, model.safetensors (bf16),
tokenizer.json (a WordLevel tokenizer with the MiniCPM-V markers as added tokens),
inputs.npz (pixel_values per slice as strips, target_sizes, input_ids) and outputs.npz
(vision_hidden: the tower's valid rows of each slice, concatenated; resampler: [slices,
query_num, hidden]; logits: [tokens, vocab]). Deterministic (seeded).
"""

import json
import sys
from pathlib import Path

import numpy as np
import torch
from safetensors.torch import save_file
from torch import nn
from transformers import LlamaConfig, LlamaForCausalLM, Qwen3Config, Qwen3ForCausalLM
from transformers.models.idefics2.configuration_idefics2 import Idefics2VisionConfig
from transformers.models.idefics2.modeling_idefics2 import Idefics2VisionTransformer

OUT = Path(sys.argv[1] if len(sys.argv) > 1 else "tests/fixtures/hf-tiny")

PATCH = 14
SIDE = 6  # vision image_size / patch: the position table is SIDE x SIDE
QUERY_NUM = 16
VOCAB = 192
# Overview, then two slices (one row of two): (h, w) in patches. Sizes above SIDE make several
# patches share a position bucket; h = 2 hits a bucket boundary exactly.
TGT_SIZES = [(2, 7), (5, 4), (5, 4)]

# Marker tokens (added tokens of the tiny tokenizer).
MARKERS = ["<image>", "</image>", "<slice>", "</slice>", "<image_id>", "</image_id>"]


def sincos_2d(dim, h, w):
    """The resampler's 2-D sincos table, [h, w, dim], float32 as numpy computes it."""
    q = dim // 4
    omega = np.arange(q, dtype=np.float32)
    omega /= dim / 4.0
    omega = 1.0 / 10000**omega
    gw, gh = np.meshgrid(np.arange(w, dtype=np.float32), np.arange(h, dtype=np.float32))
    ow = np.einsum("hw,d->hwd", gw, omega)
    oh = np.einsum("hw,d->hwd", gh, omega)
    return np.concatenate([np.sin(ow), np.cos(ow), np.sin(oh), np.cos(oh)], axis=-1)


class Resampler(nn.Module):
    """MiniCPM-V's perceiver resampler for images (2.5 / 4.0 / 4.5 without temporal ids)."""

    def __init__(self, num_queries, embed_dim, kv_dim):
        super().__init__()
        self.embed_dim = embed_dim
        self.query = nn.Parameter(torch.zeros(num_queries, embed_dim))
        self.kv_proj = nn.Linear(kv_dim, embed_dim, bias=False)
        self.attn = nn.MultiheadAttention(embed_dim, embed_dim // 128)
        self.ln_q = nn.LayerNorm(embed_dim, eps=1e-6)
        self.ln_kv = nn.LayerNorm(embed_dim, eps=1e-6)
        self.ln_post = nn.LayerNorm(embed_dim, eps=1e-6)
        self.proj = nn.Parameter(torch.zeros(embed_dim, embed_dim))

    def forward(self, x, tgt_sizes):
        bs, max_len, _ = x.shape
        mask = torch.zeros(bs, max_len, dtype=torch.bool)
        pos = torch.zeros(max_len, bs, self.embed_dim)
        for i, (h, w) in enumerate(tgt_sizes):
            pos[: h * w, i] = torch.from_numpy(sincos_2d(self.embed_dim, h, w).reshape(h * w, -1))
            mask[i, h * w :] = True
        x = self.ln_kv(self.kv_proj(x)).permute(1, 0, 2)
        q = self.ln_q(self.query).unsqueeze(1).repeat(1, bs, 1)
        out = self.attn(q, x + pos, x, key_padding_mask=mask)[0]
        return self.ln_post(out.permute(1, 0, 2)) @ self.proj


def vision_forward(vpm, strips, tgt_sizes, n_layers):
    """MiniCPM-V's vision step over padded, batched slices: the tower's post-norm output."""
    emb = vpm.embeddings
    lens = [h * w for h, w in tgt_sizes]
    max_len = max(lens)
    px = torch.zeros(len(strips), 3, PATCH, max_len * PATCH)
    for i, s in enumerate(strips):
        px[i, :, :, : s.shape[-1]] = s
    x = emb.patch_embedding(px).flatten(2).transpose(1, 2)
    side = emb.num_patches_per_side
    boundaries = torch.arange(1 / side, 1.0, 1 / side)
    ids = torch.zeros(len(strips), max_len, dtype=torch.long)
    for i, (h, w) in enumerate(tgt_sizes):
        th, tw = torch.tensor(h, dtype=torch.int32), torch.tensor(w, dtype=torch.int32)
        fh = torch.arange(0, 1 - 1e-6, 1 / th)
        fw = torch.arange(0, 1 - 1e-6, 1 / tw)
        bh = torch.bucketize(fh, boundaries, right=True)
        bw = torch.bucketize(fw, boundaries, right=True)
        ids[i, : h * w] = (bh[:, None] * side + bw).flatten()
    x = x + emb.position_embedding(ids)
    valid = torch.zeros(len(strips), max_len, dtype=torch.bool)
    for i, n in enumerate(lens):
        valid[i, :n] = True
    additive = torch.zeros(len(strips), 1, max_len, max_len)
    additive.masked_fill_(~valid[:, None, None, :], torch.finfo(torch.float32).min)
    for layer in vpm.encoder.layers[:n_layers]:
        x = layer(x, additive)
        x = x[0] if isinstance(x, tuple) else x
    return vpm.post_layernorm(x)


def randomise(module, gen):
    """Weights large enough that every path moves the logits, rounded to bf16."""
    for name, p in module.named_parameters():
        with torch.no_grad():
            if p.dim() == 1 and ("norm" in name or name.startswith("ln_") or ".ln_" in name) and name.endswith(
                "weight"
            ):
                v = 1.0 + 0.2 * torch.randn(p.shape, generator=gen)
            elif p.dim() == 1:
                v = 0.1 * torch.randn(p.shape, generator=gen)
            elif "embed_tokens" in name or name == "query" or "position_embedding" in name:
                v = torch.randn(p.shape, generator=gen)
            else:
                fan_in = p.shape[-1] if p.dim() == 2 else int(np.prod(p.shape[1:]))
                v = torch.randn(p.shape, generator=gen) * (1.2 / fan_in**0.5)
            p.copy_(v.to(torch.bfloat16).float())


def build(version, seed):
    gen = torch.Generator().manual_seed(seed)
    hidden = 128
    llama = version == "4.0"
    unk = 0 if llama else 160
    specials = {"<unk>": unk}
    first = 180
    for i, m in enumerate(MARKERS):
        specials[m] = first + i
    if llama:
        specials.update({"<s>": 1, "</s>": 2})
        llm_fields = dict(
            vocab_size=VOCAB,
            hidden_size=hidden,
            intermediate_size=64,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
            hidden_act="silu",
            max_position_embeddings=2048,
            rms_norm_eps=1e-5,
            rope_theta=10000.0,
            attention_bias=False,
            mlp_bias=False,
            tie_word_embeddings=False,
            bos_token_id=1,
            eos_token_id=2,
        )
        cfg = LlamaConfig(**llm_fields)
        llm = LlamaForCausalLM(cfg)
    else:
        specials.update({"<|im_start|>": 186, "<|im_end|>": 187, "<|endoftext|>": 188})
        llm_fields = dict(
            vocab_size=VOCAB,
            hidden_size=hidden,
            intermediate_size=64,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
            head_dim=32,
            hidden_act="silu",
            max_position_embeddings=4096,
            rms_norm_eps=1e-6,
            rope_theta=1000000.0,
            attention_bias=False,
            tie_word_embeddings=True,
            bos_token_id=188,
            eos_token_id=187,
        )
        cfg = Qwen3Config(**llm_fields)
        llm = Qwen3ForCausalLM(cfg)
    cfg._attn_implementation = "eager"
    llm.eval()
    drop_last = llama
    vision_cfg = dict(
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=3,
        num_attention_heads=2,
        num_channels=3,
        image_size=SIDE * PATCH,
        patch_size=PATCH,
        hidden_act="gelu_pytorch_tanh",
        layer_norm_eps=1e-6,
    )
    vcfg = Idefics2VisionConfig(**vision_cfg)
    vcfg._attn_implementation = "eager"
    vpm = Idefics2VisionTransformer(vcfg).eval()
    resampler = Resampler(QUERY_NUM, hidden, vision_cfg["hidden_size"]).eval()
    for m in (llm, vpm, resampler):
        randomise(m, gen)
    if llm.config.tie_word_embeddings:
        llm.lm_head.weight = llm.model.embed_tokens.weight

    # Inputs: each slice as the processor's strip [3, patch, h*w*patch], values in [-1, 1].
    strips = []
    for h, w in TGT_SIZES:
        v = torch.randint(-128, 129, (3, PATCH, h * w * PATCH), generator=gen).float() / 128.0
        strips.append(v)
    n_layers = vision_cfg["num_hidden_layers"] - (1 if drop_last else 0)

    # Prompt: text, <image_id>0</image_id><image>unk*Q</image><slice>unk*Q</slice><slice>…</slice>, text.
    text_ids = lambda n: torch.randint(3, 150, (n,), generator=gen).tolist()  # noqa: E731
    digit0 = 100
    ids = [specials.get("<s>", specials.get("<|im_start|>"))] + text_ids(5)
    ids += [specials["<image_id>"], digit0, specials["</image_id>"]]
    ids += [specials["<image>"]] + [unk] * QUERY_NUM + [specials["</image>"]]
    for _ in TGT_SIZES[1:]:
        ids += [specials["<slice>"]] + [unk] * QUERY_NUM + [specials["</slice>"]]
    ids += text_ids(6)

    with torch.no_grad():
        vis = vision_forward(vpm, strips, TGT_SIZES, n_layers)
        # The padded batch gives each slice what it gives alone (the key mask works).
        for i, (h, w) in enumerate(TGT_SIZES):
            alone = vision_forward(vpm, [strips[i]], [(h, w)], n_layers)[0]
            assert torch.allclose(alone, vis[i, : h * w], atol=1e-5), "padding leaks into the tower"
        feats = resampler(vis, TGT_SIZES)
        emb = llm.model.embed_tokens(torch.tensor([ids]))
        rows = [i for i, t in enumerate(ids) if t == unk]
        emb[0, rows] = feats.reshape(-1, hidden)
        logits = llm(inputs_embeds=emb, position_ids=torch.arange(len(ids))[None]).logits[0]
    vision_hidden = torch.cat([vis[i, : h * w] for i, (h, w) in enumerate(TGT_SIZES)])

    name = "minicpmv4_0" if llama else "minicpmv4_5"
    out = OUT / name
    out.mkdir(parents=True, exist_ok=True)
    tensors = {}
    for k, v in llm.state_dict().items():
        if k == "lm_head.weight" and llm.config.tie_word_embeddings:
            continue
        tensors[f"llm.{k}"] = v
    for k, v in vpm.state_dict().items():
        tensors[f"vpm.{k}"] = v
    for k, v in resampler.state_dict().items():
        tensors[f"resampler.{k}"] = v
    tensors = {k: v.detach().to(torch.bfloat16).contiguous() for k, v in tensors.items()}
    save_file(tensors, str(out / "model.safetensors"), metadata={"format": "pt"})

    config = {
        "architectures": ["MiniCPMV"],
        "model_type": "minicpmv",
        "version": float(version),
        "query_num": QUERY_NUM,
        "image_size": 448,
        "patch_size": PATCH,
        "drop_vision_last_layer": drop_last,
        "batch_vision_input": True,
        "vision_batch_size": 16,
        "slice_mode": True,
        "use_image_id": True,
        "slice_config": {"max_slice_nums": 9, "model_type": "minicpmv", "patch_size": PATCH, "scale_resolution": 448},
        "vision_config": dict(vision_cfg, model_type="siglip"),
        "torch_dtype": "bfloat16",
    }
    config.update(llm_fields)
    (out / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    write_tokenizer(out / "tokenizer.json", specials)

    np.savez(
        out / "inputs.npz",
        **{f"pixel_values_{i}": s.numpy() for i, s in enumerate(strips)},
        target_sizes=np.array(TGT_SIZES, dtype=np.int64),
        input_ids=np.array(ids, dtype=np.int64),
    )
    np.savez(
        out / "outputs.npz",
        vision_hidden=vision_hidden.numpy().astype(np.float32),
        resampler=feats.numpy().astype(np.float32),
        logits=logits.numpy().astype(np.float32),
    )
    size = sum(p.stat().st_size for p in out.iterdir())
    print(f"{name}: {len(ids)} tokens, {len(rows)} image rows, {size} bytes")


def write_tokenizer(path, specials):
    """A WordLevel tokenizer: `t<i>` for the plain ids (the last ten are the digits), the markers
    as added special tokens."""
    by_id = {v: k for k, v in specials.items()}
    # The digits (the host writes `<image_id>N</image_id>` before each image) take ten plain ids
    # below the markers, so a served prompt with images tokenizes without `<unk>`.
    plain = [i for i in range(VOCAB) if i not in by_id]
    for d, i in enumerate(plain[-10:]):
        by_id[i] = str(d)
    vocab = {by_id.get(i, f"t{i}"): i for i in range(VOCAB)}
    unk = next(k for k, v in specials.items() if k == "<unk>")
    tok = {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": [
            {
                "id": i,
                "content": t,
                "single_word": False,
                "lstrip": False,
                "rstrip": False,
                "normalized": False,
                "special": True,
            }
            for t, i in sorted(specials.items(), key=lambda kv: kv[1])
        ],
        "normalizer": None,
        "pre_tokenizer": {"type": "WhitespaceSplit"},
        "post_processor": None,
        "decoder": None,
        "model": {"type": "WordLevel", "vocab": vocab, "unk_token": unk},
    }
    path.write_text(json.dumps(tok, indent=1) + "\n")


if __name__ == "__main__":
    build("4.0", 40)
    build("4.5", 45)
