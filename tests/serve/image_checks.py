"""Images through `berth serve` with the official `openai` and `ollama` Python packages.

Usage: python image_checks.py BASE_URL MODEL IMAGE_FILE IMAGE_URL CORRUPT_FILE
Sends the image as a data URL and as IMAGE_URL (OpenAI) and as `images` (Ollama), each expecting
a reply; then the corrupt file, expecting a 400 naming the part. Prints `ok ...` lines or raises.
"""

import base64
import sys

import ollama
import openai

BASE, MODEL, IMAGE, URL, CORRUPT = sys.argv[1:6]
client = openai.OpenAI(base_url=BASE + "/v1", api_key="unused", max_retries=0, timeout=60)


def data_url(path):
    with open(path, "rb") as f:
        return "data:image/png;base64," + base64.b64encode(f.read()).decode()


def ask(url):
    return client.chat.completions.create(
        model=MODEL,
        temperature=0,
        max_tokens=8,
        messages=[{"role": "user", "content": [
            {"type": "text", "text": "what is this?"},
            {"type": "image_url", "image_url": {"url": url}},
        ]}],
    )


r = ask(data_url(IMAGE))
assert r.choices[0].message.content == "done", r
assert r.usage.prompt_tokens > 20, r.usage
print("ok openai data url", r.usage.prompt_tokens)

r = ask(URL)
assert r.choices[0].message.content == "done", r
print("ok openai http url")

try:
    ask(data_url(CORRUPT))
    raise AssertionError("a corrupt image was accepted")
except openai.BadRequestError as e:
    msg = str(e)
    assert e.status_code == 400 and "messages[0].content[1]" in msg and "corrupt" in msg, msg
print("ok openai corrupt image is a 400")

oc = ollama.Client(host=BASE)
r = oc.chat(model=MODEL, messages=[{"role": "user", "content": "and this?", "images": [IMAGE]}])
assert r.message.content == "done", r
print("ok ollama images")
