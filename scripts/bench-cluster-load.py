#!/usr/bin/env python3
"""Cluster fan-out latency against the machine's load (docs/performance.md, "Cluster mode").

The cross-node target (p99 within 2 ms of the single node's at 200 events/s) is measured with
every node, Redis and the load tool on one machine. This runs scripts/bench-cluster.sh
(ONLY=fanout, no hop pair) at several subscriber counts, each round with the embedded single
node and 1, 2 and 3 nodes on Redis, subscribers spread over the nodes; it waits for a quiet
machine before each run (less than --quiet of the CPU busy over 2 s). Then it prints, per
subscriber count, each configuration's p99 minus the embedded node's p99 of the same round
(adjacent in time), the median of those differences, and the CPU the servers and the load tool
used (of the machine's cores), so the miss can be read against how busy the machine was.
Runs whose `other_cpu_cores` (CPU of everything but the servers and the load tool, Redis
included) exceeded --max-other are left out.

Usage: scripts/bench-cluster-load.py [--subs 300,600,1000] [--rounds 3] [--out DIR]
       scripts/bench-cluster-load.py --report DIR      (only the summary of an earlier run)
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
CONFIGS = ["cluster-1", "cluster-2", "cluster-3"]


def run(a):
    for r in range(a.rounds):
        for subs in a.subs.split(","):
            while busy() >= a.quiet:
                pass
            out = os.path.join(a.out, f"s{subs}", f"r{r}")
            print(f"{time.strftime('%T')} round {r}, {subs} subscribers", flush=True)
            env = dict(os.environ, ONLY="fanout", HOP="0", SUBS=subs, OUT=out,
                       NODE_COUNTS="1 2 3", EMBEDDED="1")
            subprocess.run(["scripts/bench-cluster.sh"], cwd=ROOT, env=env,
                           stdout=subprocess.DEVNULL, check=False)


def load(f):
    with open(f) as fh:
        return dict(json.loads(fh.readlines()[-1])["metrics"])


def report(out, max_other):
    print("| subscribers | configuration | median Δp99 | trials (Δp99, ms) | embedded p99 | "
          "servers + load tool CPU (cores) |")
    print("|---:|---|---:|---|---:|---:|")
    for sdir in sorted(glob.glob(os.path.join(out, "s*")), key=lambda d: int(d.split("s")[-1])):
        subs = os.path.basename(sdir)[1:]
        deltas, embedded, cpu = {}, [], {}
        for rdir in sorted(glob.glob(os.path.join(sdir, "r*"))):
            ef = os.path.join(rdir, "fanout-embedded.jsonl")
            if not os.path.exists(ef):
                continue
            e = load(ef)
            if e.get("other_cpu_cores", 9) > max_other:
                continue
            embedded.append(e["latency_p99_ms"])
            cpu.setdefault("embedded", []).append(e["server_cpu_cores"] + e["bench_cpu_cores"])
            for c in CONFIGS:
                f = os.path.join(rdir, f"fanout-{c}.jsonl")
                if not os.path.exists(f):
                    continue
                m = load(f)
                if m.get("other_cpu_cores", 9) > max_other:
                    continue
                deltas.setdefault(c, []).append(m["latency_p99_ms"] - e["latency_p99_ms"])
                cpu.setdefault(c, []).append(m["server_cpu_cores"] + m["bench_cpu_cores"])
        if not embedded:
            continue
        e99 = statistics.median(embedded)
        ecpu = statistics.median(cpu["embedded"])
        print(f"| {subs} | embedded single node | – | – | {e99:.1f} | {ecpu:.2f} |")
        for c in CONFIGS:
            x = deltas.get(c)
            if not x:
                continue
            print(f"| {subs} | {c.replace('cluster-', '')} node(s) on Redis | "
                  f"{statistics.median(x):+.1f} | {', '.join(f'{d:+.1f}' for d in x)} | | "
                  f"{statistics.median(cpu[c]):.2f} |")


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--subs", default="300,600,1000")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--out", default=os.path.join(
        ROOT, "bench", "results", time.strftime("cluster-load-%Y%m%d-%H%M%S")))
    p.add_argument("--quiet", type=float, default=0.12)
    p.add_argument("--max-other", type=float, default=0.25)
    p.add_argument("--report")
    a = p.parse_args()
    if a.report:
        report(a.report, a.max_other)
        return
    run(a)
    report(a.out, a.max_other)


if __name__ == "__main__":
    main()
