"""Record image preprocessing fixtures from Hugging Face's own image processors.

Writes synthetic images of awkward sizes and of each supported format under
tests/fixtures/images/, runs transformers' MiniCPM-V 4.6 and LFM2-VL image processors and
processors (placeholder text) on them, and stores what they produced in expected.json:
slice grids, tensor shapes, sums and a strided sample of the exact pixel values, and the
placeholder text. Lossy formats (JPEG, WebP) also get PIL's decoded RGB as <name>.rgb so the
Rust side preprocesses exactly the pixels the Python side saw.
"""

import json
import math
import sys
from pathlib import Path
from types import SimpleNamespace

import numpy as np
from PIL import Image

from transformers.models.lfm2_vl.image_processing_lfm2_vl import Lfm2VlImageProcessor
from transformers.models.lfm2_vl.processing_lfm2_vl import Lfm2VlProcessor
from transformers.models.minicpmv4_6.image_processing_minicpmv4_6 import MiniCPMV4_6ImageProcessor
from transformers.models.minicpmv4_6.image_processing_pil_minicpmv4_6 import MiniCPMV4_6ImageProcessorPil
from transformers.models.minicpmv4_6.processing_minicpmv4_6 import MiniCPMV4_6Processor

OUT = Path(sys.argv[1] if len(sys.argv) > 1 else "tests/fixtures/images")
SAMPLES_PER_SLICE = 384

# Token strings of the MiniCPM-V tokenizer (its `image_token` etc. attributes).
MINICPM_TOKENS = dict(
    image_token="<unk>",
    image_start_token="<image>",
    image_end_token="</image>",
    slice_start_token="<slice>",
    slice_end_token="</slice>",
    image_id_start_token="<image_id>",
    image_id_end_token="</image_id>",
)


def synth(width, height, seed):
    """Deterministic RGB content: gradients plus blocky noise (compresses well as PNG)."""
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:height, 0:width].astype(np.float64)
    r = 255.0 * x / max(width - 1, 1)
    g = 255.0 * y / max(height - 1, 1)
    b = 127.5 + 127.5 * np.sin(x / 7.0 + y / 11.0)
    img = np.stack([r, g, b], axis=-1)
    bh, bw = (height + 7) // 8, (width + 7) // 8
    noise = rng.integers(-40, 41, size=(bh, bw, 3)).repeat(8, 0).repeat(8, 1)[:height, :width]
    return np.clip(np.rint(img) + noise, 0, 255).astype(np.uint8)


def sample(arr):
    flat = np.asarray(arr, dtype=np.float32).reshape(-1)
    stride = max(1, flat.size // SAMPLES_PER_SLICE)
    # An odd stride so the sample does not keep hitting the same channel / patch column.
    if stride > 1 and stride % 2 == 0:
        stride += 1
    return {
        "shape": list(np.asarray(arr).shape),
        "sum": float(flat.astype(np.float64).sum()),
        "sum_sq": float((flat.astype(np.float64) ** 2).sum()),
        "stride": stride,
        "samples": [float(v) for v in flat[::stride]],
    }


def minicpm_processor(image_processor):
    proc = object.__new__(MiniCPMV4_6Processor)
    proc.image_processor = image_processor
    proc.slice_mode = image_processor.slice_mode
    for k, v in MINICPM_TOKENS.items():
        setattr(proc, k, v)
    return proc


def run_minicpm(rgb, ip):
    img = Image.fromarray(rgb)
    out = ip(img)
    proc = minicpm_processor(ip)
    repl = proc.replace_image_token(out, image_idx=0, image_token_divisor=16)
    # The user text holds one image token; the processor prepends the local id.
    placeholder = proc._prepend_local_ids(["x" + MINICPM_TOKENS["image_token"]], [repl], MINICPM_TOKENS["image_token"])[0]
    pv = np.asarray(out["pixel_values"][0])  # [3, patch, total]
    ts = np.asarray(out["target_sizes"])
    p = ip.patch_size
    slices, off = [], 0
    for h, w in ts:
        n = int(h) * int(w) * p
        slices.append(sample(pv[:, :, off : off + n]))
        off += n
    return {
        "grid": [int(v) for v in out["grids"][0]],
        "target_sizes": ts.tolist(),
        "slices": slices,
        "placeholder": placeholder,
    }


def run_lfm2(rgb, ip):
    img = Image.fromarray(rgb)
    out = ip(img, return_row_col_info=True)
    proc = object.__new__(Lfm2VlProcessor)
    proc.image_processor = ip
    proc.image_token = "<image>"
    proc.image_start_token = "<|image_start|>"
    proc.image_end_token = "<|image_end|>"
    proc.image_thumbnail_token = "<|img_thumbnail|>"
    placeholder = proc.replace_image_token(out, image_idx=0, use_image_special_tokens=True)
    pv = out["pixel_values"].numpy()
    mask = out["pixel_attention_mask"].numpy()
    shapes = out["spatial_shapes"].numpy()
    tiles = []
    for i in range(pv.shape[0]):
        valid = int(mask[i].sum())
        t = sample(pv[i, :valid])
        t["spatial_shape"] = shapes[i].tolist()
        tiles.append(t)
    return {
        "rows": int(out["image_rows"][0]),
        "cols": int(out["image_cols"][0]),
        "image_size": [int(v) for v in out["image_sizes"][0]],
        "pixel_values_shape": list(pv.shape),
        "mask_valid": [int(v) for v in mask.sum(-1)],
        "tiles": tiles,
        "placeholder": placeholder,
    }


def main():
    OUT.mkdir(parents=True, exist_ok=True)
    images = []
    for name, (w, h), seed in [
        ("tiny", (3, 5), 1),
        ("wide", (1000, 40), 2),
        ("tall", (40, 1000), 3),
        ("odd", (333, 517), 4),
        ("large", (1500, 1100), 5),
        ("square", (448, 448), 6),
    ]:
        Image.fromarray(synth(w, h, seed)).save(OUT / f"{name}.png", optimize=True)
        images.append((f"{name}.png", "png"))
    fmt = synth(64, 48, 7)
    Image.fromarray(fmt).save(OUT / "fmt.jpg", quality=90)
    Image.fromarray(fmt).save(OUT / "fmt.webp", quality=90)
    Image.fromarray(fmt).save(OUT / "fmt.png")
    # A two-frame GIF (256 colours at most, so it is lossless); the first frame counts.
    pal = Image.fromarray(fmt).quantize(colors=64, dither=Image.Dither.NONE)
    second = Image.fromarray(255 - fmt).quantize(colors=64, dither=Image.Dither.NONE)
    pal.save(OUT / "fmt.gif", save_all=True, append_images=[second], duration=100, loop=0)
    images += [("fmt.jpg", "jpeg"), ("fmt.webp", "webp"), ("fmt.png", "png"), ("fmt.gif", "gif")]
    (OUT / "corrupt.png").write_bytes((OUT / "fmt.png").read_bytes()[:60])

    pil_ip = MiniCPMV4_6ImageProcessorPil()
    tv_ip = MiniCPMV4_6ImageProcessor()
    lfm_ip = Lfm2VlImageProcessor()
    records = []
    for fname, kind in images:
        with Image.open(OUT / fname) as im:
            rgb = np.asarray(im.convert("RGB"))
        rec = {"file": fname, "format": kind, "width": rgb.shape[1], "height": rgb.shape[0]}
        if kind in ("jpeg", "webp"):
            (OUT / (fname + ".rgb")).write_bytes(rgb.tobytes())
            rec["decoded_rgb"] = fname + ".rgb"
        rec["decoded"] = sample(rgb)
        # Both backends: PIL (Pillow's resize) and torchvision (torch's uint8 resize, the
        # default when torchvision is installed).
        rec["minicpmv4_6"] = run_minicpm(rgb, pil_ip)
        rec["minicpmv4_6_torchvision"] = run_minicpm(rgb, tv_ip)
        rec["lfm2_vl"] = run_lfm2(rgb, lfm_ip)
        records.append(rec)
        print(fname, rec["minicpmv4_6"]["grid"],
              rec["lfm2_vl"]["rows"], rec["lfm2_vl"]["cols"], rec["lfm2_vl"]["image_size"])
    params = {
        "minicpmv4_6": {k: getattr(pil_ip, k) for k in ["max_slice_nums", "scale_resolution", "patch_size", "downsample_mode", "image_mean", "image_std"]},
        "lfm2_vl": {k: getattr(lfm_ip, k) for k in ["downsample_factor", "min_tiles", "max_tiles", "use_thumbnail", "min_image_tokens", "max_image_tokens", "encoder_patch_size", "tile_size", "max_pixels_tolerance", "image_mean", "image_std"]},
    }
    for v in params.values():
        v["image_mean"] = list(v["image_mean"])
        v["image_std"] = list(v["image_std"])
    (OUT / "expected.json").write_text(json.dumps({"params": params, "images": records}, indent=1) + "\n")


if __name__ == "__main__":
    main()
