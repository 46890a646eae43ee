#!/usr/bin/env python3
"""Helper for scripts/gen-tiny-mxfp4: the tiny gpt-oss model with MXFP4 experts, as GGUF and as HF.

Subcommands (run inside the venv that scripts/gen-tiny-gguf prepares, with gguf-py installed):

  build F32_GGUF SRC_DIR REPO_ROOT
      F32_GGUF is llama.cpp's own conversion (--outtype f32) of SRC_DIR (the transformers tiny
      random gpt_oss model). Writes
        tests/fixtures/gguf-tiny/gpt_oss_mxfp4.gguf          the expert tensors (ffn_gate_exps,
            ffn_up_exps, ffn_down_exps) quantised to MXFP4 by gguf-py, all else unchanged;
        tests/fixtures/gguf-tiny/gpt_oss_mxfp4_dequant.gguf  the same with those MXFP4 values
            dequantised back to f32 (so both files hold the same model);
        tests/fixtures/hf-tiny/gpt_oss_mxfp4/                config.json (+ quantization_config
            {"quant_method": "mxfp4"} as the real gpt-oss checkpoints have it) and model.safetensors
            with the experts as HF `gate_up_proj_blocks/_scales` and `down_proj_blocks/_scales`
            holding the same MXFP4 values, everything else as in SRC_DIR.
      and checks that transformers' own MXFP4 dequantisation of the HF tensors equals gguf-py's of
      the GGUF tensors, value for value.

  testvec
      prints the input and gguf-py's MXFP4 quantisation of a small fixed vector as Rust arrays
      (kernels/src/quant.rs test `mxfp4_quantizer_matches_gguf_py`).
"""
from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import numpy as np

EXPERT_TENSORS = ("ffn_gate_exps", "ffn_up_exps", "ffn_down_exps")
QK = 32
BLOCK = 17  # GGUF MXFP4 block: E8M0 exponent byte + 16 code bytes
LLAMA_FTYPE_MOSTLY_MXFP4_MOE = 38


def gguf_blocks_to_hf(q: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """GGUF MXFP4 rows (uint8 [..., n_blocks * 17]) to HF (blocks [..., n_blocks, 16], scales [..., n_blocks]).

    GGUF code byte j holds value j (low nibble) and value j + 16 (high nibble); HF byte j holds
    value 2j (low) and value 2j + 1 (high). The codes themselves are the same E2M1 codes.
    """
    lead = q.shape[:-1]
    b = q.reshape(*lead, -1, BLOCK)
    scales = b[..., 0].copy()
    codes = b[..., 1:]
    vals = np.concatenate([codes & 0x0F, codes >> 4], axis=-1)  # [..., 32] in value order
    blocks = (vals[..., 0::2] | (vals[..., 1::2] << 4)).astype(np.uint8)
    return blocks, scales


def copy_fields(reader, writer, file_type: int | None) -> None:
    import gguf

    for field in reader.fields.values():
        name = field.name
        if name.startswith("GGUF.") or name == gguf.Keys.General.ARCHITECTURE:
            continue
        if name == gguf.Keys.General.FILE_TYPE and file_type is not None:
            writer.add_file_type(file_type)
            continue
        vtype = field.types[0]
        sub = field.types[-1] if vtype == gguf.GGUFValueType.ARRAY else None
        writer.add_key_value(name, field.contents(), vtype, sub_type=sub)


def write_gguf(reader, path: Path, experts: dict[str, tuple[np.ndarray, object]], file_type: int | None) -> None:
    import gguf

    arch = reader.fields[gguf.Keys.General.ARCHITECTURE].contents()
    writer = gguf.GGUFWriter(str(path), arch)
    copy_fields(reader, writer, file_type)
    for t in reader.tensors:
        if t.name in experts:
            data, raw = experts[t.name]
            writer.add_tensor(t.name, data, raw_dtype=raw)
        else:
            writer.add_tensor(t.name, np.array(t.data), raw_dtype=t.tensor_type)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def cmd_build(f32_gguf: str, src_dir: str, repo_root: str) -> None:
    import gguf
    from gguf.quants import dequantize, quantize
    from safetensors.numpy import load_file, save_file

    root = Path(repo_root)
    out_gguf = root / "tests/fixtures/gguf-tiny"
    out_hf = root / "tests/fixtures/hf-tiny/gpt_oss_mxfp4"
    reader = gguf.GGUFReader(f32_gguf)
    mx = gguf.GGMLQuantizationType.MXFP4
    quantised: dict[str, np.ndarray] = {}
    for t in reader.tensors:
        if any(t.name.endswith(f"{e}.weight") for e in EXPERT_TENSORS):
            assert t.tensor_type == gguf.GGMLQuantizationType.F32, (t.name, t.tensor_type)
            w = np.array(t.data, dtype=np.float32)  # [E, out, in]
            assert w.ndim == 3 and w.shape[-1] % QK == 0, (t.name, w.shape)
            quantised[t.name] = quantize(w, mx)  # [E, out, in/32*17]
    assert len(quantised) == 3 * 2, sorted(quantised)
    dequantised = {n: dequantize(q, mx).astype(np.float32) for n, q in quantised.items()}

    write_gguf(reader, out_gguf / "gpt_oss_mxfp4.gguf", {n: (q, mx) for n, q in quantised.items()},
               LLAMA_FTYPE_MOSTLY_MXFP4_MOE)
    write_gguf(reader, out_gguf / "gpt_oss_mxfp4_dequant.gguf",
               {n: (d, gguf.GGMLQuantizationType.F32) for n, d in dequantised.items()}, None)

    # HF: the same MXFP4 codes and exponents in the checkpoint layout.
    src = Path(src_dir)
    tensors = load_file(str(src / "model.safetensors"))
    cfg = json.loads((src / "config.json").read_text())
    cfg["quantization_config"] = {"modules_to_not_convert": [], "quant_method": "mxfp4"}
    out: dict[str, np.ndarray] = {}
    for name, v in tensors.items():
        if name.endswith("mlp.experts.gate_up_proj") or name.endswith("mlp.experts.down_proj"):
            continue
        out[name] = v
    for layer in range(cfg["num_hidden_layers"]):
        g = quantised[f"blk.{layer}.ffn_gate_exps.weight"]
        u = quantised[f"blk.{layer}.ffn_up_exps.weight"]
        d = quantised[f"blk.{layer}.ffn_down_exps.weight"]
        # gate_up rows interleave gate (even) and up (odd), as the converter splits them.
        gu = np.empty((g.shape[0], 2 * g.shape[1], g.shape[2]), dtype=np.uint8)
        gu[:, 0::2], gu[:, 1::2] = g, u
        p = f"model.layers.{layer}.mlp.experts"
        for proj, q in (("gate_up_proj", gu), ("down_proj", d)):
            blocks, scales = gguf_blocks_to_hf(q)
            out[f"{p}.{proj}_blocks"] = np.ascontiguousarray(blocks)
            out[f"{p}.{proj}_scales"] = np.ascontiguousarray(scales)
        # Cross-check with transformers' dequantisation (its output is [E, in, out]).
        import torch
        from transformers.integrations.mxfp4 import convert_moe_packed_tensors

        for proj, want in (("gate_up_proj", None), ("down_proj", dequantised[f"blk.{layer}.ffn_down_exps.weight"])):
            got = convert_moe_packed_tensors(torch.from_numpy(out[f"{p}.{proj}_blocks"]),
                                             torch.from_numpy(out[f"{p}.{proj}_scales"]),
                                             dtype=torch.float32).numpy().transpose(0, 2, 1)
            if want is None:
                want = np.empty_like(got)
                want[:, 0::2] = dequantised[f"blk.{layer}.ffn_gate_exps.weight"]
                want[:, 1::2] = dequantised[f"blk.{layer}.ffn_up_exps.weight"]
            assert got.shape == want.shape and np.array_equal(got, want), (layer, proj)
    if out_hf.exists():
        shutil.rmtree(out_hf)
    out_hf.mkdir(parents=True)
    (out_hf / "config.json").write_text(json.dumps(cfg, indent=2, sort_keys=True) + "\n")
    save_file(dict(sorted(out.items())), str(out_hf / "model.safetensors"))
    (out_hf / "model.safetensors").chmod(0o644)

    for name, q in sorted(quantised.items()):
        w = np.array(next(t.data for t in reader.tensors if t.name == name), dtype=np.float32)
        err = np.abs(dequantised[name] - w).max() / np.abs(w).max()
        print(f"{name}: {list(q.shape)} MXFP4, max|dequant - f32| / max|f32| = {err:.3g}")


def testvec() -> tuple[np.ndarray, np.ndarray]:
    """Four blocks: exact code points and ties, zeros, small normal values, large mixed values."""
    rng = np.random.default_rng(20250611)
    ties = np.array([0.0, 0.25, 0.5, 0.75, 1.0, 1.25, 1.5, 1.75, 2.0, 2.5, 3.0, 3.5, 4.0, 5.0, 6.0, -0.25,
                     -0.75, -1.25, -1.75, -2.5, -3.5, -5.0, -6.0, 0.1, -0.1, 2.2, -4.4, 5.9, 0.6, -0.6, 1.1, -3.0],
                    dtype=np.float32)
    zeros = np.zeros(QK, dtype=np.float32)
    small = (rng.standard_normal(QK) * 0.03).astype(np.float32)
    large = (rng.standard_normal(QK) * 100.0).astype(np.float32)
    large[7] = -1000.0
    x = np.concatenate([ties, zeros, small, large])
    from gguf.quants import quantize
    import gguf

    return x, quantize(x.reshape(1, -1), gguf.GGMLQuantizationType.MXFP4).reshape(-1)


def cmd_testvec() -> None:
    x, q = testvec()
    bits = x.view(np.uint32)
    print(f"// {len(x)} f32 inputs (bit patterns), made by scripts/gen_tiny_mxfp4.py testvec")
    print("const INPUT_BITS: [u32; %d] = [" % len(x))
    for i in range(0, len(bits), 8):
        print("    " + ", ".join(f"0x{b:08x}" for b in bits[i:i + 8]) + ",")
    print("];")
    from importlib.metadata import version

    print(f"// gguf-py {version('gguf')}: gguf.quants.quantize(inputs, MXFP4)")
    print("const EXPECTED: [u8; %d] = [" % len(q))
    for i in range(0, len(q), BLOCK):
        print("    " + ", ".join(str(int(b)) for b in q[i:i + BLOCK]) + ",")
    print("];")


if __name__ == "__main__":
    cmd = sys.argv[1] if len(sys.argv) > 1 else ""
    if cmd == "build":
        cmd_build(*sys.argv[2:5])
    elif cmd == "testvec":
        cmd_testvec()
    else:
        sys.exit(__doc__)
