#!/usr/bin/env python3
"""Tables and the docs/bench/speed.jsonl line of one scripts/bench run (run by scripts/bench).

Reads what scripts/bench left in OUT: berth-<model>.json (`berth bench --json`),
show-<model>.json (`berth show --json`), llama-<model>.json, ik-<model>.json and
ik-rtr-<model>.json (`llama-bench -o json` of llama.cpp and of ik_llama.cpp without and with
`-rtr 1`; each may be missing) and bandwidth.jsonl (kernels/examples/read_bandwidth). Prints
Berth next to each peer with Berth's ratio against it, the roofline, the CPU, the load and the
accuracy last measured; then appends ONE JSON line with every figure to the JSONL file, so that
runs on different machines are compared as ratios within a line, never as absolute numbers.

Usage: bench_report.py OUT --load-before "L1 L5 L15" --load-after "..." --isa native|avx2
       --args '{"p": 512, ...}' [--jsonl docs/bench/speed.jsonl]
"""
import argparse
import glob
import json
import os
import re

from bench_common import append_record, record, table

# Peers in column order: (engine name in the JSON line, file prefix, column title).
PEERS = [
    ("llama.cpp", "llama", "LLAMA.CPP"),
    ("ik_llama.cpp", "ik", "IK_LLAMA.CPP"),
    ("ik_llama.cpp -rtr 1", "ik-rtr", "IK -rtr 1"),
]
# The SIMD flags printed under the tables (the JSON line keeps every flag).
SIMD = ("avx2", "fma", "f16c", "avx512f", "avx512bw", "avx512vl", "avx512_vnni", "avx512_bf16",
        "avx512_fp16", "avx_vnni", "amx_tile", "amx_int8", "amx_bf16")


def llama_bench_rows(path):
    """{(test, threads): entry} of one llama-bench JSON file, and its build commit."""
    rows, commit = {}, None
    if not os.path.exists(path) or os.path.getsize(path) == 0:
        return rows, commit
    for e in json.load(open(path)):
        test = f"pp{e['n_prompt']}" if e["n_prompt"] else f"tg{e['n_gen']}"
        rows[(test, e["n_threads"])] = e
        commit = e.get("build_commit", commit)
    return rows, commit


def cpu_info():
    """(model name, every flag) from /proc/cpuinfo."""
    cpu = open("/proc/cpuinfo").read()
    model = re.search(r"^model name\s*:\s*(.*)$", cpu, re.M)
    flags = re.search(r"^flags\s*:\s*(.*)$", cpu, re.M)
    return (model.group(1) if model else "?"), sorted(set(flags.group(1).split()) if flags else ())


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out")
    ap.add_argument("--load-before", required=True)
    ap.add_argument("--load-after", required=True)
    ap.add_argument("--isa", required=True)
    ap.add_argument("--args", required=True, help="the run's settings as a JSON object")
    ap.add_argument("--jsonl", default="docs/bench/speed.jsonl")
    a = ap.parse_args()
    out = a.out

    bandwidth = {}
    for line in open(f"{out}/bandwidth.jsonl"):
        b = json.loads(line)
        bandwidth[b["threads"]] = b["read_gb_per_s"]

    rows, roof, results, ratios, models, engines = [], [], [], [], {}, {}
    for f in sorted(glob.glob(f"{out}/berth-*.json")):
        stem = os.path.basename(f)[len("berth-"):-5]
        ours = json.load(open(f))
        show = json.load(open(f"{out}/show-{stem}.json"))
        weights = sum(x["size"] for x in show["manifest"]["files"] if x["role"] == "weights")
        peers = {}
        for engine, prefix, _ in PEERS:
            peers[engine], commit = llama_bench_rows(f"{out}/{prefix}-{stem}.json")
            if commit:
                engines.setdefault(engine.split()[0], {})["build_commit"] = commit
        for o in ours:
            models.setdefault(o["model"], {"weights_bytes": weights})
            results.append({"engine": "berth", "model": o["model"], "test": o["test"], "threads": o["threads"],
                            "tokens_per_second": o["tokens_per_second"], "stddev": o["stddev"],
                            "samples": o["samples"]})
            row = [o["model"], o["test"], str(o["threads"]), f"{o['tokens_per_second']:.2f} ± {o['stddev']:.2f}"]
            best_peer = {}
            for engine, _, _ in PEERS:
                e = peers[engine].get((o["test"], o["threads"]))
                if e is None:
                    row += ["-", "-"]
                    continue
                ratio = o["tokens_per_second"] / e["avg_ts"]
                row += [f"{e['avg_ts']:.2f} ± {e['stddev_ts']:.2f}", f"{ratio:.2f}x"]
                results.append({"engine": engine, "model": o["model"], "test": o["test"], "threads": o["threads"],
                                "tokens_per_second": e["avg_ts"], "stddev": e["stddev_ts"],
                                "samples": e.get("samples_ts")})
                ratios.append({"model": o["model"], "test": o["test"], "threads": o["threads"], "against": engine,
                               "berth_over_peer": round(ratio, 4)})
                family = engine.split()[0]
                best_peer[family] = max(best_peer.get(family, 0.0), e["avg_ts"])
            rows.append(tuple(row))
            if o["test"].startswith("tg") and o["threads"] in bandwidth:
                bw = bandwidth[o["threads"]]

                def share(tps):
                    if not tps:
                        return "-"
                    used = weights * tps / 1e9
                    return f"{used:.2f} GB/s ({100 * used / bw:.0f} %)"

                roof.append((o["model"], o["test"], str(o["threads"]), f"{weights / 1e6:.1f} MB", f"{bw:.2f} GB/s",
                             share(o["tokens_per_second"]), share(best_peer.get("llama.cpp")),
                             share(best_peer.get("ik_llama.cpp"))))

    head = ["MODEL", "TEST", "THREADS", "BERTH t/s"]
    for _, _, title in PEERS:
        head += [f"{title} t/s", "RATIO"]
    table(tuple(head), rows)
    print("\nRATIO is Berth's tokens/s over the peer's to its left. ik_llama.cpp runs with its defaults")
    print("(flash attention, fused MoE) as its CPU users run it, without and with run-time repacking (-rtr 1).")
    print("\nroofline: weights bytes read per generated token x tokens/s, against the read-bandwidth probe")
    print("(kernels/examples/read_bandwidth: best of 7 passes over 1 GiB) at the same thread count")
    table(("MODEL", "TEST", "THREADS", "BYTES/TOKEN", "READ BW", "BERTH", "LLAMA.CPP", "IK_LLAMA.CPP (best -rtr)"),
          roof)

    cpu, flags = cpu_info()
    simd = [f for f in SIMD if f in flags]
    kernels = os.environ.get("BERTH_KERNELS", "(best the CPU has)")
    bw_text = ", ".join(f"{bandwidth[t]:.2f} GB/s at {t} thread{'s' if t > 1 else ''}" for t in sorted(bandwidth))
    print(f"\ncpu: {cpu}; {os.cpu_count()} cores; flags: {' '.join(simd)}")
    print(f"kernels: BERTH_KERNELS={kernels}")
    print(f"read bandwidth: {bw_text}")
    print(f"load average before: {a.load_before}; after: {a.load_after}")
    # The accuracy these kernels were last measured at (scripts/bench-accuracy), so a speed table
    # never travels without it; rerun that after a kernel change.
    acc = sorted(glob.glob("docs/bench/accuracy-*.json"))
    if acc:
        ad = json.load(open(acc[-1]))
        print(f"\naccuracy ({os.path.basename(acc[-1])}; mean KLD from the f32 run, same GGUF; rerun "
              "scripts/bench-accuracy after a kernel change):")
        for r in ad["results"]:
            if r["engine"] in ("Berth default", "llama.cpp") and r.get("kld") is not None:
                print(f"  {r['model']} {r['text']}: {r['engine']} {r['kld']:.5f} ± {r['kld_err']:.5f}")
    else:
        print("\naccuracy: not measured yet (scripts/bench-accuracy)")

    line = record(
        "scripts/bench", cpu, simd, flags, bandwidth, a.load_before, a.load_after,
        isa=a.isa,
        settings=json.loads(a.args),
        engines=engines,
        models=models,
        results=results,
        ratios=ratios,
    )
    append_record(a.jsonl, line)


if __name__ == "__main__":
    main()
