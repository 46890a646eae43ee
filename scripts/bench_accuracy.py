"""Runs the accuracy comparison scripts/bench-accuracy describes and writes its table.

Every figure comes from one invocation of `berth perplexity` or `llama-perplexity` on the same
GGUF, text, window size and thread count; the KLD of every row is against the same base file.
"""

import argparse
import datetime
import json
import os
import re
import subprocess
import sys
import tempfile
import time

MODELS = ["qwen2.5-coder:0.5b", "gemma3:270m"]


def sh(cmd, env=None):
    """Runs a command, returns (stdout, stderr); fails loudly with both on a non-zero exit."""
    t0 = time.time()
    p = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if p.returncode != 0:
        sys.exit(f"bench-accuracy: {' '.join(cmd)} failed ({p.returncode}):\n{p.stdout[-3000:]}\n{p.stderr[-3000:]}")
    print(f"bench-accuracy: {' '.join(os.path.basename(c) if i == 0 else c for i, c in enumerate(cmd))} "
          f"({time.time() - t0:.0f} s)", file=sys.stderr)
    return p.stdout, p.stderr


def gguf_of(berth, model):
    show = json.loads(sh([berth, "show", model, "--json"])[0])
    w = [f["path"] for f in show["manifest"]["files"] if f["role"] == "weights"][0]
    return os.path.join(show["path"], w)


def berth_run(args, model, extra, kernels=None):
    env = dict(os.environ)
    if kernels:
        env["BERTH_KERNELS"] = kernels
    out, _ = sh([args.berth, "perplexity", model, "-c", str(args.ctx), "-t", str(args.threads), "--json"]
                + (["--chunks", str(args.chunks)] if args.chunks else []) + extra, env)
    r = json.loads(out)
    row = {"ppl": r["ppl"], "ppl_err": r["ppl_error"], "tps": r["tokens_per_second"], "tokens": r["tokens_scored"]}
    if r.get("kld"):
        k = r["kld"]
        row.update(kld=k["mean"], kld_err=k["mean_error"], kld_p99=k["p99"], kld_max=k["max"],
                   same_top=k["same_top_pct"], same_top_err=k["same_top_error_pct"],
                   rms_dp=k["rms_p_diff_pct"], rms_dp_err=k["rms_p_diff_error_pct"])
    return row


def number(pattern, text, group=1):
    m = re.search(pattern, text, re.M)
    return float(m.group(group)) if m else None


def llama_run(args, gguf, base, text=None, write=False):
    cmd = [args.llama_perplexity, "-m", gguf, "-c", str(args.ctx), "-b", str(args.ctx), "-t", str(args.threads),
           "--kl-divergence-base", base]
    if args.chunks:
        cmd += ["--chunks", str(args.chunks)]
    cmd += ["-f", text] if write else ["--kl-divergence"]
    out, err = sh(cmd)
    log = out + err
    row = {}
    # llama-perplexity prints only the first window's time ("N seconds per pass"), scoring included.
    per_pass = number(r"([\d.]+) seconds per pass", log)
    row["tps"] = args.ctx / per_pass if per_pass else None
    if write:
        row["ppl"] = number(r"Final estimate: PPL = ([\d.]+)", log)
        row["ppl_err"] = number(r"Final estimate: PPL = [\d.]+ \+/- ([\d.]+)", log)
        return row
    pm = re.search(r"Mean PPL\(Q\)\s*:\s*([\d.]+) ± +([\d.]+)", log)
    km = re.search(r"Mean +KLD:\s*([-\d.]+) ± +([\d.]+)", log)
    rm = re.search(r"RMS Δp +:\s*([\d.]+) ± +([\d.]+) %", log)
    sm = re.search(r"Same top p:\s*([\d.]+) ± +([\d.]+) %", log)
    if not (pm and km and rm and sm):
        sys.exit(f"bench-accuracy: could not read llama-perplexity's statistics:\n{log[-3000:]}")
    lr = re.search(r"Mean ln\(PPL\(Q\)/PPL\(base\)\)\s*:\s*([-\d.]+) ± +([\d.]+)", log)
    if lr:
        row.update(ln_ratio=float(lr.group(1)), ln_ratio_err=float(lr.group(2)))
    row.update(ppl=float(pm.group(1)), ppl_err=float(pm.group(2)), kld=float(km.group(1)),
               kld_err=float(km.group(2)), kld_p99=number(r"^99\.0%\s+KLD:\s*([\d.]+)", log),
               kld_max=number(r"^Maximum KLD:\s*([\d.]+)", log), rms_dp=float(rm.group(1)),
               rms_dp_err=float(rm.group(2)), same_top=float(sm.group(1)), same_top_err=float(sm.group(2)))
    return row


def fmt(row, key, err=None, digits=4):
    v = row.get(key)
    if v is None:
        return "-"
    s = f"{v:.{digits}f}"
    if err and row.get(err) is not None:
        s += f" ± {row[err]:.{digits}f}"
    return s


def slice_fixture(args, path):
    """Measures the CI check's slice (the prose text, the first `--chunks` windows) for both
    models and writes the reference figures host/tests/perplexity_real.rs holds Berth to."""
    text = dict(line.split(maxsplit=1) for line in args.texts.strip().splitlines())["prose"]
    out = {"generator": f"scripts/bench-accuracy -s {path} -c {args.ctx} -n {args.chunks}",
           "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%MZ"),
           "cpu": cpu_line(), "text": os.path.basename(text), "context": args.ctx, "chunks": args.chunks,
           "bounds": "f32_ppl_bound: the f32 run's ln PPL may move by 0.001 (float summation order "
                     "between kernel sets; the logits hold 1e-3 to transformers). ppl_bound: the default "
                     "kernels' ln PPL may move by llama.cpp's printed uncertainty of ln(PPL(Q)/PPL(base)) on "
                     "this slice (a smaller move is within what the slice can tell apart). KLD: at most "
                     "llama.cpp's mean KLD from the same kind of f32 base plus both printed uncertainties.",
           "models": {}}
    with tempfile.TemporaryDirectory() as tmp:
        for model in MODELS:
            base = os.path.join(tmp, "base.bin")
            f32 = berth_run(args, model, ["-f", text, "--dequantize", "--kl-divergence-base", base])
            ours = berth_run(args, model, ["--kl-divergence", "--kl-divergence-base", base])
            peer = llama_run(args, gguf_of(args.berth, model), base)
            out["tokens_scored"] = ours["tokens"]
            out["models"][model] = {
                "f32_ppl": f32["ppl"], "f32_ppl_bound": 0.001, "ppl": ours["ppl"],
                "ppl_bound": peer["ln_ratio_err"], "berth_kld": ours["kld"], "berth_kld_error": ours["kld_err"],
                "berth_same_top_pct": ours["same_top"], "llama_cpp_ppl": peer["ppl"], "llama_cpp_kld": peer["kld"],
                "llama_cpp_kld_error": peer["kld_err"], "llama_cpp_same_top_pct": peer["same_top"],
                "llama_cpp_same_top_error_pct": peer["same_top_err"]}
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as f:
        json.dump(out, f, indent=1)
        f.write("\n")
    print(json.dumps(out, indent=1))


def cpu_line():
    cpu = open("/proc/cpuinfo").read()
    m = re.search(r"^model name\s*:\s*(.*)$", cpu, re.M)
    flags = set(re.search(r"^flags\s*:\s*(.*)$", cpu, re.M).group(1).split())
    simd = [f for f in ("avx2", "avx512f", "avx512_vnni", "avx512_bf16") if f in flags]
    return f"{m.group(1) if m else '?'}; {' '.join(simd)}"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--berth", required=True)
    ap.add_argument("--llama-perplexity", default="")
    ap.add_argument("--texts", required=True, help="scripts/fetch-texts output: 'kind path' lines")
    ap.add_argument("--ctx", type=int, default=512)
    ap.add_argument("--chunks", type=int, default=16)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out", default="docs/bench")
    ap.add_argument("--slice-fixture", default="", help="write the CI check's reference figures here instead")
    args = ap.parse_args()
    if args.slice_fixture:
        if not args.llama_perplexity:
            sys.exit("bench-accuracy: the slice fixture needs llama.cpp (no -L)")
        return slice_fixture(args, args.slice_fixture)
    texts = [line.split(maxsplit=1) for line in args.texts.strip().splitlines()]
    load_before = open("/proc/loadavg").read().split()[:3]
    cpu = open("/proc/cpuinfo").read()
    cpu_model = re.search(r"^model name\s*:\s*(.*)$", cpu, re.M)
    flags = set(re.search(r"^flags\s*:\s*(.*)$", cpu, re.M).group(1).split())
    simd = [f for f in ("avx2", "fma", "f16c", "avx512f", "avx512bw", "avx512vl", "avx512_vnni", "avx512_bf16",
                        "avx_vnni", "amx_tile") if f in flags]
    results = []
    with tempfile.TemporaryDirectory() as tmp:
        for model in MODELS:
            gguf = gguf_of(args.berth, model)
            for kind, text in texts:
                base = os.path.join(tmp, f"{model.replace(':', '_')}-{kind}-f32.bin")
                rows = {}
                rows["Berth f32 (base)"] = berth_run(args, model, ["-f", text, "--dequantize",
                                                                    "--kl-divergence-base", base])
                rows["Berth default"] = berth_run(args, model, ["--kl-divergence", "--kl-divergence-base", base])
                if "avx512_vnni" in flags:
                    rows["Berth avx2"] = berth_run(args, model, ["--kl-divergence", "--kl-divergence-base", base],
                                                   kernels="avx2")
                if args.llama_perplexity:
                    rows["llama.cpp"] = llama_run(args, gguf, base)
                    lbase = os.path.join(tmp, f"{model.replace(':', '_')}-{kind}-llama.bin")
                    llama_run(args, gguf, lbase, text=text, write=True)
                    cross = berth_run(args, model, ["--kl-divergence", "--kl-divergence-base", lbase])
                    rows["Berth default vs llama.cpp's base"] = cross
                for name, row in rows.items():
                    results.append({"model": model, "text": kind, "engine": name, **row})
                os.remove(base)
    load_after = open("/proc/loadavg").read().split()[:3]

    head = ["model", "text", "engine", "PPL", "mean KLD", "KLD p99", "same top %", "RMS Δp %", "tokens/s"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in results:
        lines.append("| " + " | ".join([
            r["model"], r["text"], r["engine"], fmt(r, "ppl", "ppl_err", 3), fmt(r, "kld", "kld_err", 5),
            fmt(r, "kld_p99", None, 4), fmt(r, "same_top", "same_top_err", 2), fmt(r, "rms_dp", "rms_dp_err", 3),
            fmt(r, "tps", None, 1)]) + " |")
    date = datetime.date.today().isoformat()
    tokens = results[0]["tokens"] if results else 0
    notes = [
        f"Measured {datetime.datetime.now(datetime.timezone.utc).strftime('%Y-%m-%dT%H:%MZ')} by "
        f"`scripts/bench-accuracy -c {args.ctx} -n {args.chunks} -t {args.threads}`: windows of {args.ctx} tokens, "
        f"{args.chunks or 'all'} windows per text ({tokens} tokens scored), {args.threads} threads.",
        "KLD, same top and Δp of every row are against the same base: Berth with every weight dequantised "
        "to f32 and f32 activations (`berth perplexity --dequantize`), written in llama.cpp's base-file "
        "format and read by both engines. The last row of each block compares Berth's default kernels with "
        "a base file written by llama-perplexity from its own quantised run on the same GGUF.",
        "tokens/s: Berth's is tokens fed per second of model time over the whole run; llama.cpp's is its "
        "first window only (`N seconds per pass`, scoring included), the one timing llama-perplexity prints. "
        "Speed is compared by `scripts/bench`, not here.",
        f"cpu: {cpu_model.group(1) if cpu_model else '?'}; {os.cpu_count()} cores; flags: {' '.join(simd)}; "
        f"load average before {' '.join(load_before)}, after {' '.join(load_after)}.",
    ]
    table = "\n".join(lines)
    print(table)
    print("\n" + "\n".join(notes))
    os.makedirs(args.out, exist_ok=True)
    md = os.path.join(args.out, f"accuracy-{date}.md")
    with open(md, "w") as f:
        f.write(f"# Accuracy: Berth's kernels next to llama.cpp ({date})\n\n" + table + "\n\n"
                + "\n\n".join(notes) + "\n")
    with open(os.path.join(args.out, f"accuracy-{date}.json"), "w") as f:
        json.dump({"args": vars(args), "cpu": cpu_model.group(1) if cpu_model else None, "flags": simd,
                   "results": results}, f, indent=1)
    print(f"bench-accuracy: wrote {md}", file=sys.stderr)


if __name__ == "__main__":
    main()
