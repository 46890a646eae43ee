"""Embedding throughput benchmark (issue 31; a benchmark, not a test): texts/s of Berth's
`berth serve` and of llama.cpp's `llama-server --embeddings` on EmbeddingGemma-300M (f32 on both:
Berth on the sentence-transformers folder, llama.cpp on the GGUF its own convert_hf_to_gguf.py
makes from it), the memory both take, and whether their vectors agree.

For each thread count the shell wrapper (scripts/bench-embeddings) starts one server of each at
that count; `run` then measures, --repeats times, two modes on both, alternately (never at once):
  batch 1    --texts texts, one per request, one request after the other (a kept-alive connection);
  batch 256  the same number of texts as ONE request of --texts inputs.
texts/s = texts / wall time of the whole mode; the table shows the median over the repeats. Each
(repeat, mode) embeds its own set of texts (deterministic English prose of ~100 tokens, different
per text and per set, so that no cache can help either server); both servers get the same set,
the first to go alternating between repeats. Before measuring, each server embeds a warm-up set.
Checks: the cosine between Berth's and llama.cpp's vector for each text (min over every text of
every set; both should compute the same thing), the token count of each text on both
(usage.prompt_tokens; Berth's mean is what "~100 tokens" means), and the CPU time the idle server
used while the other was measured (should be ~0: otherwise they were not measured alone).

Modes:
  run     --berth URL --llama URL --threads T [--berth-pid P --llama-pid P] [--out PART.json]
  memory  --berth URL --berth-pid P --chat-model M [--llama URL --llama-pid P] [--out PART.json]:
          loads the embedding model and the chat model in one `berth serve` by one request each,
          then reads /proc/PID/status (VmRSS, VmHWM, RssAnon, RssFile); the same for a
          llama-server that has embedded one text.
  report  PART.json ... [--json FILE] [--load-before "1.0 0.9 0.8"] [--bandwidth FILE] [--command CMD]
          [--llama-settings S] [--params-from MODEL_DIR]: machine facts and one markdown table.
Only the Python standard library is used.
"""
import argparse
import http.client
import json
import math
import os
import random
import re
import statistics
import struct
import subprocess
import sys
import time
import urllib.parse

TARGET_BATCH = 1.5  # issue 31: Berth >= 1.5x llama.cpp's texts/s at batch 256

# Word stock for the generated prose: each text picks a subject area and builds sentences from
# these, seeded by (set, index), so every text differs and every run gets the same texts.
AREAS = {
    "harbour": (["the harbour master", "a fisherman", "the ferry crew", "an old sailor", "the dock workers",
                 "a young apprentice", "the coast guard"],
                ["boats", "nets", "ropes", "the lighthouse", "the tide tables", "crates of mackerel", "the pier"],
                ["the northern breakwater", "the fish market", "the narrow slipway", "the customs house"]),
    "orchard": (["the orchard keeper", "a beekeeper", "the pickers", "her grandfather", "a visiting botanist",
                 "the neighbours", "the village children"],
                ["apple trees", "pear blossoms", "the cider press", "wooden ladders", "the hives", "fallen fruit",
                 "the pruning shears"],
                ["the southern slope", "the stone barn", "the old well", "the hedgerow by the lane"]),
    "observatory": (["the astronomer", "a graduate student", "the night technician", "the director",
                     "a visiting comet hunter", "the telescope operator"],
                    ["the mirror", "star charts", "the spectrograph", "long exposures", "the dome shutters",
                     "the cooling system", "faint galaxies"],
                    ["the mountain summit", "the control room", "the library of plates", "the catwalk"]),
    "kitchen": (["the head chef", "a pastry cook", "the dishwasher", "the new sous chef", "the owner",
                 "a food critic", "the delivery driver"],
                ["sourdough loaves", "copper pans", "the stockpot", "fresh herbs", "the walk-in fridge",
                 "a basket of mushrooms", "the wood oven"],
                ["the back door", "the pass", "the cellar", "the market across the square"]),
    "railway": (["the signal operator", "a conductor", "the station master", "the engine driver",
                 "a commuter", "the track inspector", "the ticket clerk"],
                ["the timetable", "freight wagons", "the points", "a late express", "the platform clock",
                 "the level crossing", "the signal box"],
                ["the junction", "the goods yard", "the tunnel mouth", "the viaduct over the river"]),
    "library": (["the archivist", "a research student", "the head librarian", "a retired professor",
                 "the night porter", "a bookbinder", "the volunteers"],
                ["rare manuscripts", "the card catalogue", "leather bindings", "the reading lamps",
                 "maps of the county", "a box of letters", "the microfilm reader"],
                ["the east wing", "the basement stacks", "the reading room", "the map cabinet"]),
    "workshop": (["the carpenter", "a welder", "the apprentice", "the foreman", "a customer",
                  "the engineer", "the clockmaker"],
                 ["oak planks", "the lathe", "a broken chair", "steel brackets", "the workbench", "chisels",
                  "a half-built cabinet"],
                 ["the loading bay", "the paint room", "the yard behind the shed", "the tool wall"]),
    "clinic": (["the nurse", "a young doctor", "the receptionist", "the pharmacist", "an anxious parent",
                "the night nurse", "the physiotherapist"],
               ["patient files", "the waiting room", "bandages", "the appointment book", "a thermometer",
                "the medicine cabinet", "test results"],
               ["the corridor", "the front desk", "the treatment room", "the car park"]),
}
VERBS = ["checked", "repaired", "counted", "carried", "studied", "cleaned", "moved", "sorted", "painted",
         "measured", "described", "ignored", "praised", "replaced", "inspected", "borrowed", "returned",
         "photographed", "arranged", "weighed"]
ADVERBS = ["carefully", "slowly", "quietly", "quickly", "patiently", "reluctantly", "cheerfully",
           "methodically", "once again", "without a word"]
TIMES = ["before dawn", "late in the afternoon", "on a wet Tuesday", "during the first frost", "after the storm",
         "in the middle of the night", "at the start of spring", "on the busiest day of the year",
         "just before the holidays", "while the others slept"]
ADJECTIVES = ["heavy", "fragile", "unexpected", "familiar", "ancient", "brand new", "damp", "crooked",
              "beautiful", "forgotten", "noisy", "remarkable"]
CLAUSES = ["because nobody else had the time", "although the weather was turning", "as the bells rang",
           "so that the work could go on", "while a dog barked somewhere", "as if nothing had happened",
           "and then sat down to rest", "before anyone noticed", "which surprised everyone",
           "and wrote it all down in a notebook"]
REMARKS = ["Nobody could remember a year like it.", "It was, everyone agreed, a small miracle.",
           "The rest of the day passed without incident.", "Some said it would never be finished.",
           "By evening the news had reached the next village.", "It cost more than anyone expected.",
           "Later that week the same thing happened again.", "There was still a great deal left to do."]
NUMBERS = ["two", "three", "four", "five", "seven", "nine", "eleven", "twelve", "twenty", "forty"]


def text_for(set_id, i, words):
    """One paragraph of about `words` words, a function of (set_id, i) only."""
    r = random.Random(f"berth-embeddings/{set_id}/{i}")
    area = r.choice(sorted(AREAS))
    people, things, places = AREAS[area]
    out, n = [], 0
    while n < words:
        kind = r.randrange(7)
        if kind in (0, 4):
            s = (f"{r.choice(TIMES).capitalize()}, {r.choice(people)} {r.choice(ADVERBS)} {r.choice(VERBS)} "
                 f"{r.choice(things)} near {r.choice(places)}.")
        elif kind in (1, 5):
            s = (f"{r.choice(people).capitalize()} {r.choice(VERBS)} {r.choice(NUMBERS)} {r.choice(ADJECTIVES)} "
                 f"{re.sub(r'^(the|a|an) ', '', r.choice(things))} {r.choice(CLAUSES)}.")
        elif kind in (2, 6):
            s = (f"Near {r.choice(places)}, {r.choice(people)} found that {r.choice(things)} looked "
                 f"{r.choice(ADJECTIVES)}, {r.choice(CLAUSES)}.")
        else:  # kind 3
            s = r.choice([x for x in REMARKS if x not in out])
        out.append(s)
        n += len(s.split())
    return " ".join(out)


def texts_for(set_id, count, words):
    return [text_for(set_id, i, words) for i in range(count)]


class Client:
    """One kept-alive HTTP connection to a server; POSTs JSON and returns (reply, seconds)."""

    def __init__(self, url):
        u = urllib.parse.urlparse(url)
        self.host, self.port = u.hostname, u.port or 80
        self.conn = None

    def get(self, path):
        conn = http.client.HTTPConnection(self.host, self.port, timeout=60)
        conn.request("GET", path)
        resp = conn.getresponse()
        raw = resp.read()
        conn.close()
        if resp.status != 200:
            raise SystemExit(f"{self.host}:{self.port}{path}: HTTP {resp.status}: {raw[:500]!r}")
        return json.loads(raw)

    def post(self, path, body):
        data = json.dumps(body).encode()
        for attempt in (0, 1):
            if self.conn is None:
                self.conn = http.client.HTTPConnection(self.host, self.port, timeout=3600)
            try:
                t0 = time.perf_counter()
                self.conn.request("POST", path, data, {"Content-Type": "application/json"})
                resp = self.conn.getresponse()
                raw = resp.read()
                secs = time.perf_counter() - t0
            except (http.client.HTTPException, OSError):
                self.conn.close()
                self.conn = None
                if attempt:
                    raise
                continue
            if resp.status != 200:
                raise SystemExit(f"{self.host}:{self.port}{path}: HTTP {resp.status}: {raw[:500]!r}")
            return json.loads(raw), secs
        raise AssertionError("unreachable")


def embed(client, model, inputs):
    """Vectors (in input order) and prompt tokens of one /v1/embeddings request."""
    reply, secs = client.post("/v1/embeddings", {"model": model, "input": inputs, "encoding_format": "float"})
    data = sorted(reply["data"], key=lambda d: d["index"])
    if len(data) != (len(inputs) if isinstance(inputs, list) else 1):
        raise SystemExit(f"asked for {len(inputs)} vectors, got {len(data)}")
    return [d["embedding"] for d in data], reply.get("usage", {}).get("prompt_tokens"), secs


def cosine(a, b):
    dot = sum(x * y for x, y in zip(a, b))
    na, nb = math.sqrt(sum(x * x for x in a)), math.sqrt(sum(y * y for y in b))
    return dot / (na * nb) if na and nb else 0.0


def cpu_seconds(pid):
    """utime + stime of a process, in seconds (None without a pid)."""
    if not pid:
        return None
    try:
        f = open(f"/proc/{pid}/stat").read()
    except OSError:
        return None
    fields = f[f.rindex(")") + 2:].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def memory_of(pid):
    """VmRSS, VmHWM, RssAnon and RssFile of a process, in MiB."""
    out = {}
    for line in open(f"/proc/{pid}/status"):
        k, _, v = line.partition(":")
        if k in ("VmRSS", "VmHWM", "RssAnon", "RssFile"):
            out[k] = int(v.split()[0]) / 1024
    return out


def measure(client, model, mode, texts):
    """texts/s of one mode on one server; the vectors and per-text token counts."""
    t0 = time.perf_counter()
    if mode == "batch1":
        vectors, tokens = [], []
        for t in texts:
            v, n, _ = embed(client, model, t)
            vectors += v
            tokens.append(n)
    else:
        vectors, total, _ = embed(client, model, texts)
        tokens = [None] * len(texts) if total is None else [total / len(texts)] * len(texts)
    secs = time.perf_counter() - t0
    return len(texts) / secs, secs, vectors, tokens


def run(args):
    servers = {"berth": (Client(args.berth), args.model, args.berth_pid),
               "llama": (Client(args.llama), args.llama_model, args.llama_pid)}
    warm = texts_for("warm-up", 16, args.words)
    for name, (c, m, _) in servers.items():
        embed(c, m, warm)
        for t in warm[:4]:
            embed(c, m, t)
    modes = ("batch1", "batch")
    rates = {(s, m): [] for s in servers for m in modes}
    secs_all = {(s, m): [] for s in servers for m in modes}
    cpu_all = {(s, m): [] for s in servers for m in modes}
    cos_min = {m: 1.0 for m in modes}
    cos_all = []
    tokens = {"berth": [], "llama": []}
    token_mismatch = 0
    idle_cpu = {s: 0.0 for s in servers}
    for rep in range(args.repeats):
        for mode in modes:
            texts = texts_for(f"{rep}/{mode}", args.texts, args.words)
            order = ["berth", "llama"] if rep % 2 == 0 else ["llama", "berth"]
            got = {}
            for s in order:
                other = next(o for o in servers if o != s)
                c0, m0 = cpu_seconds(servers[other][2]), cpu_seconds(servers[s][2])
                rate, secs, vectors, toks = measure(servers[s][0], servers[s][1], mode, texts)
                c1, m1 = cpu_seconds(servers[other][2]), cpu_seconds(servers[s][2])
                if c0 is not None and c1 is not None:
                    idle_cpu[other] += c1 - c0
                if m0 is not None and m1 is not None:
                    cpu_all[(s, mode)].append(m1 - m0)
                rates[(s, mode)].append(rate)
                secs_all[(s, mode)].append(secs)
                got[s] = (vectors, toks)
                label = "batch 1" if mode == "batch1" else f"batch {args.texts}"
                print(f"  threads {args.threads} {label} {s}: {rate:.2f} texts/s ({secs:.2f} s)", flush=True)
            cs = [cosine(a, b) for a, b in zip(got["berth"][0], got["llama"][0])]
            cos_min[mode] = min(cos_min[mode], min(cs))
            cos_all += cs
            if mode == "batch1":
                for s in servers:
                    tokens[s] += [t for t in got[s][1] if t is not None]
                token_mismatch += sum(1 for a, b in zip(got["berth"][1], got["llama"][1])
                                      if a is not None and b is not None and a != b)
    mem = {s: memory_of(p) for s, (_, _, p) in servers.items() if p}
    row = {
        "threads": args.threads, "texts": args.texts, "repeats": args.repeats,
        "rates": {f"{s}/{m}": v for (s, m), v in rates.items()},
        "seconds": {f"{s}/{m}": v for (s, m), v in secs_all.items()},
        "median": {f"{s}/{m}": statistics.median(v) for (s, m), v in rates.items()},
        "cpu_seconds": {f"{s}/{m}": v for (s, m), v in cpu_all.items()},
        "cosine_min": cos_min, "cosine_mean": statistics.fmean(cos_all),
        "tokens_berth": {"mean": statistics.fmean(tokens["berth"]), "min": min(tokens["berth"]),
                         "max": max(tokens["berth"])} if tokens["berth"] else None,
        "tokens_llama_mean": statistics.fmean(tokens["llama"]) if tokens["llama"] else None,
        "token_count_mismatches": token_mismatch,
        "idle_cpu_seconds": idle_cpu,
        "memory_after": mem,
    }
    for mode in modes:
        b, l = row["median"][f"berth/{mode}"], row["median"][f"llama/{mode}"]
        print(f"threads {args.threads} {mode}: Berth {b:.2f}, llama.cpp {l:.2f} texts/s, ratio {b / l:.3f}, "
              f"min cosine {cos_min[mode]:.7f}", flush=True)
    with open(args.out, "w") as f:
        json.dump({"kind": "run", **row}, f, indent=1)
    return 0


def memory(args):
    b = Client(args.berth)
    embed(b, args.model, "Load the embedding model with one short text.")
    try:
        reply, _ = b.post("/v1/chat/completions", {"model": args.chat_model, "max_tokens": 8, "temperature": 0,
                                                    "messages": [{"role": "user", "content": "Say hi."}]})
        answer = reply["choices"][0]["message"].get("content")
    except SystemExit as e:  # a pack without a chat template still completes
        print(f"chat failed ({e}); loading {args.chat_model} by /v1/completions", file=sys.stderr)
        reply, _ = b.post("/v1/completions", {"model": args.chat_model, "max_tokens": 8, "temperature": 0,
                                               "prompt": "Say hi."})
        answer = reply["choices"][0]["text"]
    ps = Client(args.berth).get("/api/ps")
    out = {"kind": "memory", "berth": memory_of(args.berth_pid), "berth_models": [args.model, args.chat_model],
           "loaded": [m.get("name") for m in ps.get("models", [])],
           "chat_reply": answer}
    if args.llama:
        embed(Client(args.llama), args.llama_model, "Load the embedding model with one short text.")
        out["llama"] = memory_of(args.llama_pid)
    print(json.dumps(out, indent=1))
    with open(args.out, "w") as f:
        json.dump(out, f, indent=1)
    return 0


def matmul_params(model_dir):
    """Weights of the matrix products one token goes through (the transformer's linear layers and
    the two Dense projections; not the embedding table, which is a lookup), from the safetensors
    headers; None when the folder is not there."""
    total = 0
    for rel in ("model.safetensors", "2_Dense/model.safetensors", "3_Dense/model.safetensors"):
        p = os.path.join(model_dir, rel)
        if not os.path.exists(p):
            return None
        with open(p, "rb") as f:
            (n,) = struct.unpack("<Q", f.read(8))
            header = json.loads(f.read(n))
        for name, t in header.items():
            if name == "__metadata__" or "embed_tokens" in name or len(t["shape"]) != 2:
                continue
            total += t["shape"][0] * t["shape"][1]
    return total


def machine(load_before, bandwidth_file):
    cpu = open("/proc/cpuinfo").read()
    model = re.search(r"^model name\s*:\s*(.*)$", cpu, re.M)
    flags = set((re.search(r"^flags\s*:\s*(.*)$", cpu, re.M) or re.search("()", "")).group(1).split())
    simd = [f for f in ("avx2", "fma", "f16c", "avx512f", "avx512bw", "avx512vl", "avx512_vnni", "avx512_bf16",
                        "avx512_fp16", "avx_vnni", "amx_tile", "amx_int8", "amx_bf16") if f in flags]
    run_ = lambda *c: subprocess.run(c, capture_output=True, text=True).stdout.strip()  # noqa: E731
    bandwidth = {}
    if bandwidth_file and os.path.exists(bandwidth_file):
        for line in open(bandwidth_file):
            if line.strip():
                b = json.loads(line)
                bandwidth[str(b["threads"])] = b["read_gb_per_s"]
    mem_total = re.search(r"^MemTotal:\s*(\d+)", open("/proc/meminfo").read(), re.M)
    # The numbers are the binary's, not necessarily HEAD's: say when it was built and which commit
    # was HEAD then (others may commit while a run goes on).
    built = {}
    for name in ("berth", "libberth_gemma.so"):
        path = os.path.join("target", "release", name)
        if os.path.exists(path):
            built[name] = int(os.path.getmtime(path))
    head_time = run_("git", "log", "-1", "--format=%ct")
    oldest = min(built.values()) if built else None
    return {
        "cpu": model.group(1) if model else "?", "cores": os.cpu_count(), "simd": simd,
        "mem_total_gib": int(mem_total.group(1)) / 2**20 if mem_total else None,
        "kernels": os.environ.get("BERTH_KERNELS", "(best the CPU has)"),
        "read_bandwidth_gb_s": bandwidth,
        "load_before": load_before, "uptime_after": run_("uptime"), "commit": run_("git", "rev-parse", "--short", "HEAD"),
        "dirty": bool(run_("git", "status", "--porcelain", "--untracked-files=no")),
        "binaries_built": {k: time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(v)) for k, v in built.items()},
        "commit_at_build": run_("git", "log", "-1", f"--before=@{oldest}", "--format=%h") if oldest else "",
        "binary_older_than_head": bool(oldest and head_time and oldest < int(head_time)),
    }


def mib(m, k):
    return f"{m[k]:.0f}" if m and k in m else "?"


def print_report(runs, mem, facts, extra):
    if facts:
        bw = facts["read_bandwidth_gb_s"]
        print(f"cpu: {facts['cpu']}; {facts['cores']} cores; {facts['mem_total_gib']:.1f} GiB; "
              f"flags: {' '.join(facts['simd']) or '(none of avx2/avx512)'}")
        print(f"read bandwidth (kernels/examples/read_bandwidth, best of 7 passes over 1 GiB): "
              + (", ".join(f"{bw[t]:.2f} GB/s at {t} thread(s)" for t in sorted(bw, key=int)) if bw
                 else "not measured (cargo build --release -p berth-kernels --example read_bandwidth)"))
        print(f"kernels: BERTH_KERNELS={facts['kernels']}; commit {facts['commit']}"
              + (" (with uncommitted changes)" if facts["dirty"] else ""))
        if facts["binaries_built"]:
            print("release build: " + ", ".join(f"{k} {v}" for k, v in facts["binaries_built"].items())
                  + (f"; OLDER than HEAD's commit: these numbers are of the tree at about {facts['commit_at_build']} "
                     "(rebuild to measure HEAD)" if facts["binary_older_than_head"] else " (newer than HEAD's commit)"))
        print(f"load average before: {facts['load_before'] or '?'}; after: {facts['uptime_after']}")
        if extra.get("llama_settings"):
            print(f"llama-server: {extra['llama_settings']}")
        if extra.get("weights"):
            print(f"weights on both servers: {extra['weights']}")
        print()
    n = runs[0]["texts"] if runs else 256
    print(f"| threads | mode | Berth texts/s | llama.cpp texts/s | ratio | target |")
    print("|---:|---|---:|---:|---:|---|")
    misses = []
    for r in sorted(runs, key=lambda r: r["threads"]):
        for mode, label in (("batch1", "batch 1"), ("batch", f"batch {r['texts']} (one request)")):
            b, l = r["median"][f"berth/{mode}"], r["median"][f"llama/{mode}"]
            ratio = b / l if l else 0.0
            target = ""
            if mode == "batch":
                ok = ratio >= TARGET_BATCH
                target = f">= {TARGET_BATCH} {'ok' if ok else '**MISS**'}"
                if not ok:
                    misses.append(f"{r['threads']} thread(s)")
            print(f"| {r['threads']} | {label} | {b:.2f} | {l:.2f} | {ratio:.2f}x | {target} |")
    print()
    print(f"texts/s: the median of {runs[0]['repeats'] if runs else '?'} repeats (each: {n} texts, "
          "a fresh set per repeat and mode, the same set for both servers, alternating which goes first).")
    params = extra.get("matmul_params")
    for r in sorted(runs, key=lambda r: r["threads"]):
        tb = r["tokens_berth"]
        cos = r["cosine_min"]
        print(f"\n{r['threads']} thread(s): tokens per text (Berth usage.prompt_tokens) mean {tb['mean']:.1f}, "
              f"min {tb['min']}, max {tb['max']}; llama.cpp mean {r['tokens_llama_mean'] or 0:.1f}; texts whose "
              f"counts differ: {r['token_count_mismatches']}")
        print(f"  cosine Berth vs llama.cpp, per text: min {cos['batch1']:.7f} (batch 1), {cos['batch']:.7f} "
              f"(batch {r['texts']}); mean {r['cosine_mean']:.7f}")
        if params:
            flops = 2 * params * tb["mean"]
            print(f"  matrix work: {params / 1e6:.1f} M weights x 2 FLOP x {tb['mean']:.1f} tokens = "
                  f"{flops / 1e9:.1f} GFLOP per text -> batch {r['texts']}: Berth "
                  f"{flops * r['median']['berth/batch'] / 1e9:.1f}, llama.cpp "
                  f"{flops * r['median']['llama/batch'] / 1e9:.1f} GFLOP/s (attention not counted)")
        busy = []
        for s, name in (("berth", "Berth"), ("llama", "llama.cpp")):
            cpu, wall = r.get("cpu_seconds", {}).get(f"{s}/batch"), r["seconds"][f"{s}/batch"]
            if cpu:
                busy.append(f"{name} {sum(cpu) / sum(wall):.2f} ({r['texts'] * len(cpu) / sum(cpu):.2f} texts per CPU-second)")
        if busy:
            print(f"  cores busy during batch {r['texts']} (server CPU time / wall time; the threads asked: "
                  f"{r['threads']}): " + ", ".join(busy))
        idle = r["idle_cpu_seconds"]
        print(f"  CPU time the idle server used while the other was measured: Berth {idle['berth']:.2f} s, "
              f"llama.cpp {idle['llama']:.2f} s")
        ma = r.get("memory_after", {})
        if ma:
            print(f"  after the run: Berth VmRSS {mib(ma.get('berth'), 'VmRSS')} MiB, VmHWM "
                  f"{mib(ma.get('berth'), 'VmHWM')} MiB; llama-server VmRSS {mib(ma.get('llama'), 'VmRSS')} MiB, "
                  f"VmHWM {mib(ma.get('llama'), 'VmHWM')} MiB")
    if mem:
        b, l = mem["berth"], mem.get("llama")
        print(f"\nmemory, one `berth serve` with {' and '.join(mem['berth_models'])} both loaded (one request "
              f"each; /api/ps lists {', '.join(mem.get('loaded') or ['?'])}): VmRSS {mib(b, 'VmRSS')} MiB (anon {mib(b, 'RssAnon')}, file {mib(b, 'RssFile')}), "
              f"VmHWM {mib(b, 'VmHWM')} MiB")
        if l:
            print(f"memory, llama-server with the embedding GGUF only (one request): VmRSS {mib(l, 'VmRSS')} MiB "
                  f"(anon {mib(l, 'RssAnon')}, file {mib(l, 'RssFile')}), VmHWM {mib(l, 'VmHWM')} MiB")
    print(f"\ntarget (Berth >= {TARGET_BATCH}x llama.cpp's texts/s at batch {n}): "
          + ("met" if runs and not misses else "missed at " + ", ".join(misses) if misses else "no runs"))
    return 0


def report(args):
    runs, mem = [], None
    for p in args.parts:
        with open(p) as f:
            d = json.load(f)
        if d["kind"] == "memory":
            mem = d
        else:
            runs.append(d)
    facts = machine(args.load_before, args.bandwidth)
    extra = {"weights": args.weights, "llama_settings": args.llama_settings, "command": args.command,
             "matmul_params": matmul_params(args.params_from) if args.params_from else None}
    code = print_report(runs, mem, facts, extra)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"machine": facts, "target_batch_ratio": TARGET_BATCH, **extra, "runs": runs, "memory": mem},
                      f, indent=1)
    return code


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="mode", required=True)
    r = sub.add_parser("run", help="measure one thread count's pair of servers")
    r.add_argument("--berth", required=True, help="Berth's URL")
    r.add_argument("--llama", required=True, help="llama-server's URL")
    r.add_argument("--berth-pid", type=int)
    r.add_argument("--llama-pid", type=int)
    r.add_argument("--model", default="embeddinggemma:300m", help="Berth's name of the embedding model")
    r.add_argument("--llama-model", default="embeddinggemma", help="the model field sent to llama-server")
    r.add_argument("--threads", type=int, required=True, help="the servers' thread count (for the table)")
    r.add_argument("--texts", type=int, default=256)
    r.add_argument("--words", type=int, default=78, help="words per generated text (78: ~100 tokens)")
    r.add_argument("--repeats", type=int, default=3)
    r.add_argument("--out", required=True)
    m = sub.add_parser("memory", help="RSS with the embedding and the chat model loaded")
    m.add_argument("--berth", required=True)
    m.add_argument("--berth-pid", type=int, required=True)
    m.add_argument("--model", default="embeddinggemma:300m")
    m.add_argument("--chat-model", default="qwen2.5-coder:0.5b")
    m.add_argument("--llama")
    m.add_argument("--llama-pid", type=int)
    m.add_argument("--llama-model", default="embeddinggemma")
    m.add_argument("--out", required=True)
    p = sub.add_parser("report", help="machine facts and one table of the parts")
    p.add_argument("parts", nargs="+")
    p.add_argument("--json", help="also write machine facts and results as JSON here")
    p.add_argument("--load-before", default="")
    p.add_argument("--bandwidth", help="read_bandwidth's JSON lines")
    p.add_argument("--llama-settings", default="", help="llama-server's flags, for the record")
    p.add_argument("--weights", default="f32", help="f32, or q8_0 on both servers")
    p.add_argument("--command", default="", help="the command line that made these numbers")
    p.add_argument("--params-from", help="the sentence-transformers folder (for the GFLOP/s line)")
    t = sub.add_parser("texts", help="print the texts of one set (for inspection)")
    t.add_argument("--set", default="0/batch")
    t.add_argument("--texts", type=int, default=4)
    t.add_argument("--words", type=int, default=78)
    args = ap.parse_args()
    if args.mode == "texts":
        for x in texts_for(args.set, args.texts, args.words):
            print(x, end="\n\n")
        return
    sys.exit({"run": run, "memory": memory, "report": report}[args.mode](args))


if __name__ == "__main__":
    main()
