"""Scaffolding shared by the Python scenario files of the client matrix (tests/clients/matrix.py).

A scenario file is run as `python FILE BASE_URL MODEL [SCENARIO...]` (no SCENARIO: all of them).
It prints one JSON line per library first, `{"version": "..."}`, then one per scenario as soon as
it ends: `{"scenario": NAME, "outcome": PASS|FAIL|MODEL|N/A, "reason": "...", "seconds": S}`.

Outcomes, strictly apart:
- PASS: the library got a well-formed answer and the answer is right.
- MODEL: the protocol worked (the library parsed every reply) but the 0.5B model's answer was
  wrong: a wrong fact, no call where `auto` let it answer in text, a call with nonsensical
  arguments. A scenario raises `ModelAnswer` for these and only these.
- FAIL: everything else: an error status, an exception in the library (its parser of the wire
  format included), an empty reply, a reply of the wrong shape, a timeout (a hang).
- N/A: the library has no such feature (e.g. Ollama has no `tool_choice`).

Every request has a timeout (`$BERTH_CLIENT_TIMEOUT` seconds, default 120) and no retries, so a
hang is a FAIL, never a stuck run, and a retried 5xx is never hidden.
"""

import json
import os
import sys
import time
import traceback

TIMEOUT = float(os.environ.get("BERTH_CLIENT_TIMEOUT", "120"))

SCENARIOS = ["invoke", "stream", "tools_auto", "tools_required", "structured", "multiturn"]

# The prompts every library asks, and what a right answer contains.
FRANCE = "What is the capital of France? Answer in one word."
WEATHER_ASK = "What is the weather like in Paris right now? Use the get_weather tool."
WEATHER_DESCRIPTION = "Get the current weather of a city."
# The tool's own output ends with the nudge the 0.5B model needs: without it, after any tool result
# it repeats the call as bare JSON lines until the context is full (a hang to the client).
WEATHER_RESULT = "sunny, 22 degrees Celsius. Now answer the user in plain text."
CITY_ASK = 'Give the capital of France as JSON with the keys "name" (the city) and "country".'
TURNS = [
    "Remember this: my favourite colour is green. Reply with one short sentence.",
    "What is the capital of France? Answer in one word.",
    "What is my favourite colour? Answer in one word.",
]


def get_weather(city: str) -> str:
    """Get the current weather of a city."""
    return WEATHER_RESULT


WEATHER_SCHEMA = {
    "type": "object",
    "properties": {"city": {"type": "string", "description": "The city, e.g. Paris"}},
    "required": ["city"],
}


class ModelAnswer(Exception):
    """The protocol worked; the model's answer was wrong."""


class NotApplicable(Exception):
    """The library has no such feature."""


def model_check(cond, reason):
    """Raises ModelAnswer(reason) unless cond: for checks of the answer's content only."""
    if not cond:
        raise ModelAnswer(reason)


def need(cond, reason):
    """Raises AssertionError(reason) (a FAIL) unless cond: for the shape of the reply."""
    if not cond:
        raise AssertionError(reason)


def short(x, n=80):
    s = " ".join(str(x).split())
    return s if len(s) <= n else s[: n - 3] + "..."


def check_paris(text, what="answer"):
    need(isinstance(text, str) and text.strip(), f"empty {what}")
    model_check("paris" in text.lower(), f"{what} without Paris: {short(text)!r}")
    return short(text, 40)


def check_city_args(args):
    """A get_weather call's arguments: a dict with a string `city` (shape), naming Paris (model)."""
    if isinstance(args, str):
        try:
            args = json.loads(args)
        except ValueError as e:
            raise AssertionError(f"arguments are not JSON: {args!r}") from e
    need(isinstance(args, dict), f"arguments are not an object: {args!r}")
    need(isinstance(args.get("city"), str), f"no string city in the arguments: {args!r}")
    model_check("paris" in args["city"].lower(), f"get_weather called for {args['city']!r}")
    return args


def check_weather_answer(text):
    need(isinstance(text, str) and text.strip(), "empty answer after the tool result")
    low = text.lower()
    model_check("22" in low or "sunny" in low, f"answer ignores the tool result: {short(text)!r}")
    return short(text, 40)


def check_city(name, country):
    need(isinstance(name, str) and isinstance(country, str), f"not strings: {name!r} {country!r}")
    model_check("paris" in name.lower(), f"name {name!r}")
    model_check("france" in country.lower(), f"country {country!r}")
    return f"{name}, {country}"


def check_green(text):
    need(isinstance(text, str) and text.strip(), "empty answer on the third turn")
    model_check("green" in text.lower(), f"third turn forgot the colour: {short(text)!r}")
    return short(text, 40)


def emit(obj):
    print(json.dumps(obj), flush=True)


def describe(e):
    name = type(e).__name__
    if "timeout" in name.lower() or "timed out" in str(e).lower():
        return f"no answer in {TIMEOUT:.0f} s ({name}): a hang"
    if isinstance(e, AssertionError):
        return short(e, 200)
    return f"{name}: {short(e, 200)}"


def main(version, scenarios):
    """Runs the named scenarios (all without names) of `scenarios`: {name: fn(base, model) -> note},
    or {name: "why it does not apply"}."""
    base, model = sys.argv[1].rstrip("/"), sys.argv[2]
    names = sys.argv[3:] or SCENARIOS
    emit({"version": version})
    for name in names:
        start = time.monotonic()
        fn = scenarios.get(name)
        try:
            if fn is None:
                raise NotApplicable("not a feature of this library")
            if isinstance(fn, str):
                raise NotApplicable(fn)
            outcome, reason = "PASS", fn(base, model) or ""
        except NotApplicable as e:
            outcome, reason = "N/A", str(e)
        except ModelAnswer as e:
            outcome, reason = "MODEL", str(e)
        except BaseException as e:  # noqa: BLE001 -- every other exception is a FAIL
            outcome, reason = "FAIL", describe(e)
            traceback.print_exc(file=sys.stderr)
            if isinstance(e, KeyboardInterrupt):
                raise
        emit(
            {
                "scenario": name,
                "outcome": outcome,
                "reason": short(reason, 200),
                "seconds": round(time.monotonic() - start, 1),
            }
        )


def version_of(dist):
    from importlib.metadata import version

    return version(dist)
