"""instructor over the official `openai` package on /v1/chat/completions (see common.py).

instructor runs in its own venv (scripts/client-deps): it pins `jiter<0.15`, which the current
`openai` excludes. Its default mode for an OpenAI client is TOOLS: the response model becomes a
function the model is forced to call. It returns validated objects, not messages, so the tool
and multi-turn scenarios do not apply.
"""

import instructor
from common import CITY_ASK, FRANCE, TIMEOUT, check_city, check_paris, main, need, version_of
from openai import OpenAI
from pydantic import BaseModel


class City(BaseModel):
    name: str
    country: str


def client(base):
    return instructor.from_openai(OpenAI(base_url=f"{base}/v1", api_key="unused", timeout=TIMEOUT, max_retries=0))


def invoke(base, model):
    # No response model: instructor passes the completion through.
    r = client(base).chat.completions.create(
        model=model, temperature=0, response_model=None, messages=[{"role": "user", "content": FRANCE}]
    )
    return check_paris(r.choices[0].message.content)


def stream(base, model):
    partials = list(
        client(base).chat.completions.create_partial(
            model=model, temperature=0, response_model=City, messages=[{"role": "user", "content": CITY_ASK}]
        )
    )
    need(partials, "no partial objects")
    last = partials[-1]
    return f"{len(partials)} partials: " + check_city(last.name, last.country)


def structured(base, model):
    p = client(base).chat.completions.create(
        model=model, temperature=0, response_model=City, messages=[{"role": "user", "content": CITY_ASK}]
    )
    need(isinstance(p, City), f"got {p!r}")
    return check_city(p.name, p.country)


if __name__ == "__main__":
    main(
        f"{version_of('instructor')} (openai {version_of('openai')})",
        {
            "invoke": invoke,
            "stream": stream,
            "tools_auto": "instructor forces its own tool (see structured)",
            "tools_required": "instructor forces its own tool (see structured)",
            "structured": structured,
            "multiturn": "instructor returns objects, not messages",
        },
    )
