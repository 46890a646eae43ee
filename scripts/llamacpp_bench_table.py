#!/usr/bin/env python3
"""Turns llama-bench's `-o json` output (+ the .txt of load/CPU notes written next to it by
scripts/llamacpp-reference bench) into a markdown table on stdout."""
import json
import os
import sys


def main():
    path = sys.argv[1]
    rows = json.load(open(path))
    notes = open(path + ".txt").read().strip() if os.path.exists(path + ".txt") else ""
    print(f"### {os.path.basename(path)}\n")
    print("| model | test | threads | tokens/s | ± stddev |")
    print("| --- | --- | ---: | ---: | ---: |")
    for r in rows:
        test = f"pp{r['n_prompt']}" if r["n_prompt"] and not r["n_gen"] else f"tg{r['n_gen']}"
        model = os.path.basename(r["model_filename"])
        print(f"| {model} ({r['model_type']}) | {test} | {r['n_threads']} | "
              f"{r['avg_ts']:.2f} | {r['stddev_ts']:.2f} |")
    r0 = rows[0]
    print(f"\nllama.cpp build {r0.get('build_commit')} ({r0.get('build_number')}), "
          f"backend {r0.get('backends')}, cpu_info `{r0.get('cpu_info')}`, "
          f"{r0.get('n_batch')}/{r0.get('n_ubatch')} batch/ubatch, type_k {r0.get('type_k')}, "
          f"repetitions {len(r0.get('samples_ts', []))}.\n")
    if notes:
        print("```\n" + notes + "\n```")


if __name__ == "__main__":
    main()
