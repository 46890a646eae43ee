"""Tiny vision packs: the random-weight LFM2-VL and MiniCPM-V 4.6 reference models
(`../shared/fixtures/reference-tiny-vision/{lfm2_vl,minicpmv4_6}`, vocabulary 512, no tokenizer)
made into pack sources and imported with `berth import`. Written once for everything that serves
them: the tiny vision pack tests (host/tests/tiny_vision_packs.rs) and the image requests of the
soak (scripts/load-test --soak, through scripts/lib/real-servers.sh). Standard library only, so
any python3 runs it.

Tokenizers: derived from the committed 512-token tiny tokenizer
(`tests/fixtures/tiny-packs/tokenizer.json`, scripts/gen-tiny-tokenizer): the last merges give
their ids to the vision markers the host inserts (so every marker is one token and the vocabulary
stays exactly 512), then the image token swaps ids with whatever holds the config's
`image_token_id`. Templates: no LFM2-VL or MiniCPM-V 4.6 chat template is available, so each pack
gets its backbone's real one (LFM2's `lfm2.jinja`, Qwen3.5's `qwen3_5.jinja`); the host turns
image parts into text before rendering, so any text template carries them.

Usage: tiny_vision_pack.py MODEL NAME --berth BERTH [--src DIR]

MODEL is lfm2_vl or minicpmv4_6. Writes the pack's source (config.json, generation_config.json,
model.safetensors, tokenizer.json, tokenizer_config.json) into DIR (default a temporary directory,
removed afterwards) and runs `BERTH import DIR --name NAME --template TEMPLATE` into the store of
$BERTH_HOME, as any berth command. The model's plugin is the caller's to install. Exits 1 when a
fixture is missing or the import fails, the last line on stderr saying which.
"""
import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
REFERENCE = os.path.join(ROOT, "..", "shared", "fixtures", "reference-tiny-vision")
TINY_PACKS = os.path.join(ROOT, "tests", "fixtures", "tiny-packs")

# Per model: the backbone's chat template, the image token as the model's processor writes it,
# and the markers the host's preprocessing writes around and between image tokens besides the
# image token itself (LFM2-VL's, with tile markers for grids up to 3x3, or MiniCPM-V's).
MODELS = {
    "lfm2_vl": {
        "template": "lfm2.jinja",
        "image_token": "<image>",
        "markers": ["<|image_start|>", "<|image_end|>", "<|img_thumbnail|>"]
        + [f"<|img_row_{r}_col_{c}|>" for r in range(1, 4) for c in range(1, 4)],
    },
    "minicpmv4_6": {
        "template": "qwen3_5.jinja",
        "image_token": "<unk>",
        "markers": ["<image>", "</image>", "<slice>", "</slice>", "<image_id>", "</image_id>"],
    },
}


def vision_tokenizer(tj, image_token, image_id, markers):
    """The tiny tokenizer `tj` (parsed tokenizer.json, changed in place and returned) with
    `markers` and the image token made single tokens and the image token at `image_id`; still
    exactly 512 ids."""
    vocab = tj["model"]["vocab"]
    new = []
    for m in [image_token, *markers]:
        if m not in vocab and m not in new:
            new.append(m)
    size = len(vocab)
    if size != 512:
        raise ValueError(f"the tiny tokenizer has {size} ids, not 512")
    # The last merges (nothing merges their results further) give up their ids.
    merges = tj["model"]["merges"]
    first = size - len(new)
    dropped = merges[len(merges) - len(new):]
    del merges[len(merges) - len(new):]
    for k, (left, right) in enumerate(dropped):
        joined = left + right
        if vocab.pop(joined) != first + k:
            raise ValueError(f"merge {joined} is not among the last ids")
    added = tj["added_tokens"]
    for k, m in enumerate(new):
        vocab[m] = first + k
        added.append({"id": first + k, "content": m, "single_word": False, "lstrip": False,
                      "rstrip": False, "normalized": False, "special": True})
    # The image token swaps ids with the token at `image_id`.
    old = vocab[image_token]
    other = next(k for k, v in vocab.items() if v == image_id)
    vocab[other] = old
    vocab[image_token] = image_id
    for a in added:
        if a["content"] == image_token:
            a["id"] = image_id
        elif a["content"] == other:
            a["id"] = old
    added.sort(key=lambda a: a["id"])
    return tj


def write_source(model, src):
    """The pack's source directory for `berth import`."""
    spec = MODELS[model]
    ref = os.path.join(REFERENCE, model)
    files = ["config.json", "generation_config.json", "model.safetensors"]
    for path in [os.path.join(ref, f) for f in files] + [os.path.join(TINY_PACKS, "tokenizer.json")]:
        if not os.path.isfile(path):
            sys.exit(f"tiny_vision_pack: {os.path.normpath(path)} missing")
    os.makedirs(src, exist_ok=True)
    for f in files:
        shutil.copyfile(os.path.join(ref, f), os.path.join(src, f))
    with open(os.path.join(ref, "config.json")) as f:
        image_id = json.load(f)["image_token_id"]
    with open(os.path.join(TINY_PACKS, "tokenizer.json"), encoding="utf-8") as f:
        tj = json.load(f)
    tj = vision_tokenizer(tj, spec["image_token"], image_id, spec["markers"])
    with open(os.path.join(src, "tokenizer.json"), "w", encoding="utf-8") as f:
        json.dump(tj, f, ensure_ascii=False, separators=(",", ":"))
    shutil.copyfile(os.path.join(TINY_PACKS, "tokenizer_config.json"), os.path.join(src, "tokenizer_config.json"))


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("model", choices=sorted(MODELS))
    ap.add_argument("name", help="the pack's name (berth import --name)")
    ap.add_argument("--berth", required=True, help="the berth binary that imports it")
    ap.add_argument("--src", help="where to write the pack's source (default: a temporary directory)")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="berth-tiny-vision-") as tmp:
        src = args.src or tmp
        write_source(args.model, src)
        template = os.path.join(TINY_PACKS, MODELS[args.model]["template"])
        r = subprocess.run([args.berth, "import", src, "--name", args.name, "--template", template],
                           stdout=subprocess.DEVNULL)
        if r.returncode != 0:
            sys.exit(f"tiny_vision_pack: berth import {args.model} as {args.name} failed ({r.returncode})")


if __name__ == "__main__":
    main()
