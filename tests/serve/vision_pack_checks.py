"""A real vision pack (random weights) through `berth serve` with the official clients; bad images
(corrupt, unsupported, a URL that 404s, oversized) are 400s naming the part, and serving goes on.

Usage: python vision_pack_checks.py BASE_URL MODEL IMAGE_FILE IMAGE_URL OTHER_FILE CORRUPT_FILE TEXT

IMAGE_URL serves IMAGE_FILE's bytes; OTHER_FILE is a different image; TEXT is the user's text
that follows the image (or stands alone). Random weights answer
gibberish, so only status, structure and usage are checked here; the numbers are printed as one
JSON object per line (`{"case": ..., "prompt_tokens": ..., "cached_tokens": ...}`) for the Rust
test to compare with the placeholder it computes. Raises on any failure.
"""

import base64
import json
import struct
import sys
import zlib

import ollama
import openai

BASE, MODEL, IMAGE, URL, OTHER, CORRUPT, TEXT = sys.argv[1:8]
client = openai.OpenAI(base_url=BASE + "/v1", api_key="unused", max_retries=0, timeout=300)


def data_url(path):
    mime = {"png": "image/png", "jpg": "image/jpeg", "gif": "image/gif", "webp": "image/webp"}
    with open(path, "rb") as f:
        payload = base64.b64encode(f.read()).decode()
    return f"data:{mime.get(path.rsplit('.', 1)[-1], 'image/png')};base64,{payload}"


def report(case, prompt_tokens, cached_tokens=None):
    print(json.dumps({"case": case, "prompt_tokens": prompt_tokens, "cached_tokens": cached_tokens}), flush=True)


def ask(url=None):
    content = TEXT
    if url is not None:
        # The image first, as Ollama puts a message's images before its text.
        content = [{"type": "image_url", "image_url": {"url": url}}, {"type": "text", "text": TEXT}]
    r = client.chat.completions.create(
        model=MODEL, temperature=0, max_tokens=4, messages=[{"role": "user", "content": content}]
    )
    assert r.object == "chat.completion" and len(r.choices) == 1, r
    assert isinstance(r.choices[0].message.content, str), r
    assert r.choices[0].finish_reason in ("stop", "length"), r
    assert 1 <= r.usage.completion_tokens <= 4, r.usage
    assert r.usage.total_tokens == r.usage.prompt_tokens + r.usage.completion_tokens, r.usage
    details = r.usage.prompt_tokens_details
    return r.usage.prompt_tokens, (details.cached_tokens if details else None)


report("text", *ask())
report("data_url", *ask(data_url(IMAGE)))
report("data_url_again", *ask(data_url(IMAGE)))
report("http_url", *ask(URL))
report("other_image", *ask(data_url(OTHER)))

try:
    ask(data_url(CORRUPT))
    raise AssertionError("a corrupt image was accepted")
except openai.BadRequestError as e:
    msg = str(e)
    assert e.status_code == 400 and "messages[0].content[0]" in msg, msg
    report("corrupt_400", None)



def oversized_png():
    """A PNG whose header claims 20000 x 20000 pixels (valid chunks and CRCs, no pixel data)."""
    def chunk(kind, data):
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    ihdr = struct.pack(">IIBBBBB", 20000, 20000, 8, 2, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IDAT", b"") + chunk(b"IEND", b"")


def raw_data_url(data, mime):
    return f"data:{mime};base64,{base64.b64encode(data).decode()}"


# Each of these is a 400 naming the part and what was wrong; none stops the server.
for case, url, words in [
    ("unsupported_400", raw_data_url(b"BM\x3a\0\0\0\0\0\0\0\x36\0\0\0", "image/bmp"), "unsupported"),
    ("missing_url_400", URL.rsplit("/", 1)[0] + "/missing.png", "404"),
    ("oversized_400", raw_data_url(oversized_png(), "image/png"), "too large"),
]:
    try:
        ask(url)
        raise AssertionError(f"{case}: accepted")
    except openai.BadRequestError as e:
        msg = str(e)
        assert e.status_code == 400 and "messages[0].content[0]" in msg and words in msg, (case, msg)
        report(case, None)

# Still serving after the 400s.
report("after_corrupt", *ask(data_url(IMAGE)))

oc = ollama.Client(host=BASE, timeout=300)
r = oc.chat(
    model=MODEL,
    messages=[{"role": "user", "content": TEXT, "images": [IMAGE]}],
    options={"temperature": 0, "num_predict": 4},
)
assert isinstance(r.message.content, str) and r.done, r
assert 1 <= r.eval_count <= 4, r
report("ollama_chat", r.prompt_eval_count)
