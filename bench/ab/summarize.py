"""Medians per (scenario, build) of the JSON lines compare_builds.sh printed,
and new/old ratios: python3 bench/ab/summarize.py < ab.jsonl"""
import json
import statistics
import sys

runs = [json.loads(line) for line in sys.stdin if line.strip()]
by = {}
for r in runs:
    by.setdefault((r["scenario"], r["build"]), []).append(r)
print("| scenario | old samples/s (median, runs) | new samples/s (median, runs) | new/old | old CPU us/batch | new CPU us/batch |")
print("| --- | --- | --- | --- | --- | --- |")
for s in dict.fromkeys(r["scenario"] for r in runs):
    old, new = by.get((s, "old"), []), by.get((s, "new"), [])
    med = lambda rs, k: statistics.median(r[k] for r in rs if r[k] is not None)
    o, n = med(old, "samples_per_s"), med(new, "samples_per_s")
    fmt = lambda rs: ", ".join(f"{r['samples_per_s']:.0f}" for r in rs)
    print(f"| {s} | {o:,.0f} ({fmt(old)}) | {n:,.0f} ({fmt(new)}) | {n / o:.3f} | "
          f"{med(old, 'client_cpu_us_per_batch'):.1f} | {med(new, 'client_cpu_us_per_batch'):.1f} |")
