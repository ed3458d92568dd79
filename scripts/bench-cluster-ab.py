#!/usr/bin/env python3
"""Before/after fan-out latency of cluster mode on a shared machine (docs/performance.md,
"Cluster mode").

Runs scripts/bench-cluster.sh (ONLY=fanout) one configuration at a time -- the embedded single
node (e), 1, 2 (with the hop-alone pair) and 3 nodes -- alternating an old and a new gapless
binary, each trial started only when the rest of the machine is quiet (less than --quiet of the
CPU busy over 2 s), under `nice -n -19`. Then prints, per round and binary, each
configuration's p99 and its difference to the embedded node's p99 of the same round and
binary (adjacent in time, so a slower or faster period of the machine cancels out), and the
median difference; trials whose `other_cpu_cores` (CPU used by everything but the servers and
the load tool, Redis included) exceeded --max-other are left out.

Usage: scripts/bench-cluster-ab.py --old OLD/gapless --new target/release/gapless
           [--rounds 3] [--configs e,1,2,3] [--out bench/results/cluster-ab-DATE]
       scripts/bench-cluster-ab.py --report DIR      (only the summary of an earlier run)
"""
import argparse
import glob
import json
import os
import statistics
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "scripts", "lib"))
from quiet import busy  # noqa: E402
NAMES = ["cluster-1", "cluster-2", "hop-local", "hop-remote", "cluster-3"]


def run(a):
    bins = {"before": os.path.abspath(a.old), "after": os.path.abspath(a.new)}
    for r in range(a.rounds):
        for c in a.configs.split(","):
            for v in ["before", "after"] if r % 2 == 0 else ["after", "before"]:
                while busy() >= a.quiet:
                    pass
                env = dict(os.environ, GAPLESS_BIN=bins[v], ONLY="fanout",
                           OUT=os.path.join(a.out, f"r{r}", f"{v}-{c}"))
                if c == "e":
                    env.update(NODE_COUNTS="", EMBEDDED="1")
                else:
                    env.update(NODE_COUNTS=c, EMBEDDED="0")
                print(f"{time.strftime('%T')} round {r} {v} {c}", flush=True)
                subprocess.run(["nice", "-n", "-19", "scripts/bench-cluster.sh"], cwd=ROOT,
                               env=env, stdout=subprocess.DEVNULL, check=False)


def report(out, max_other):
    data = {}
    for f in glob.glob(os.path.join(out, "r*", "*", "fanout-*.jsonl")):
        rnd = f.split(os.sep)[-3]
        v = f.split(os.sep)[-2].split("-")[0]
        with open(f) as fh:
            m = dict(json.loads(fh.readlines()[-1])["metrics"])
        data[(rnd, v, os.path.basename(f)[len("fanout-"):-len(".jsonl")])] = m
    quiet = lambda m: m is not None and m.get("other_cpu_cores", 9) <= max_other
    deltas = {}
    print("| round | binary | embedded p99 | " + " | ".join(f"{n} p99 (Δ)" for n in NAMES) + " |")
    print("|---|---|---:|" + "---:|" * len(NAMES))
    for rnd in sorted({k[0] for k in data}):
        for v in ("before", "after"):
            e = data.get((rnd, v, "embedded"))
            if not quiet(e):
                continue
            cells = []
            for n in NAMES:
                m = data.get((rnd, v, n))
                if not quiet(m):
                    cells.append("–")
                    continue
                d = m["latency_p99_ms"] - e["latency_p99_ms"]
                deltas.setdefault((n, v), []).append(d)
                cells.append(f"{m['latency_p99_ms']:.1f} ({d:+.1f})")
            print(f"| {rnd} | {v} | {e['latency_p99_ms']:.1f} | " + " | ".join(cells) + " |")
    print()
    for n in NAMES:
        for v in ("before", "after"):
            x = sorted(deltas.get((n, v), []))
            if x:
                print(f"{n:11} {v:6} median Δp99 {statistics.median(x):+.1f} ms over {len(x)}: "
                      + ", ".join(f"{d:+.1f}" for d in x))


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--old")
    p.add_argument("--new")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--configs", default="e,1,2,3")
    p.add_argument("--out", default=os.path.join(
        ROOT, "bench", "results", time.strftime("cluster-ab-%Y%m%d-%H%M%S")))
    p.add_argument("--quiet", type=float, default=0.12)
    p.add_argument("--max-other", type=float, default=0.25)
    p.add_argument("--report")
    a = p.parse_args()
    if a.report:
        report(a.report, a.max_other)
        return
    if not (a.old and a.new):
        p.error("--old and --new are required (or --report DIR)")
    run(a)
    report(a.out, a.max_other)


if __name__ == "__main__":
    main()
