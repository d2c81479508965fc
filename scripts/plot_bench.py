#!/usr/bin/env python3
"""Plots the load tool's output (crates/tollgate-bench, as written by
scripts/bench_sweep.sh): decisions per second and latency against
concurrency, for the library path and the bare redis client.

    python3 scripts/plot_bench.py docs/bench-sweep.txt docs/bench-sweep.png

Needs matplotlib (pip install matplotlib). The input is the tool's text
output, run after run; each run starts with its "backend ..." line.
"""

import re
import sys

RUN = re.compile(r"^backend (.+?), strategy (\w+), concurrency (\d+), keys (\d+)")
PATH = re.compile(
    r"^(library|bare)\s+([\d.]+) decisions/s\s+p50\s+(\d+) µs\s+p99\s+(\d+) µs\s+errors (\d+)"
)
RATIO = re.compile(r"^ratio library/bare: ([\d.]+)")


def parse(text):
    """[{concurrency, library: (rate, p50, p99, errors), bare: ..., ratio}]"""
    runs = []
    for line in text.splitlines():
        line = line.strip()
        if m := RUN.match(line):
            runs.append({"concurrency": int(m[3]), "keys": int(m[4]), "strategy": m[2]})
        elif (m := PATH.match(line)) and runs:
            runs[-1][m[1]] = (float(m[2]), int(m[3]), int(m[4]), int(m[5]))
        elif (m := RATIO.match(line)) and runs:
            runs[-1]["ratio"] = float(m[1])
    runs = [r for r in runs if "library" in r]
    if not runs:
        sys.exit("no load-tool runs found in the input")
    return sorted(runs, key=lambda r: r["concurrency"])


def main():
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    src, dst = sys.argv[1], sys.argv[2]
    with open(src, encoding="utf-8") as f:
        header = f.readline().lstrip("# ").strip()
        runs = parse(header + "\n" + f.read())

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    conc = [r["concurrency"] for r in runs]
    fig, (tput, lat) = plt.subplots(1, 2, figsize=(11, 4.2))
    styles = {"library": ("tab:blue", "o", "tollgate RedisBackend"),
              "bare": ("tab:gray", "s", "bare redis client, same script")}
    for path, (color, marker, label) in styles.items():
        pts = [(r["concurrency"], r[path]) for r in runs if path in r]
        if not pts:
            continue
        xs = [c for c, _ in pts]
        tput.plot(xs, [v[0] / 1000 for _, v in pts], marker=marker, color=color, label=label)
        lat.plot(xs, [v[1] / 1000 for _, v in pts], marker=marker, color=color,
                 label=f"{path} p50")
        lat.plot(xs, [v[2] / 1000 for _, v in pts], marker=marker, color=color,
                 linestyle="--", label=f"{path} p99")
    for r in runs:
        if "ratio" in r:
            y = max(r["library"][0], r.get("bare", r["library"])[0]) / 1000
            tput.annotate(f'{r["ratio"]:.2f}x', (r["concurrency"], y),
                          textcoords="offset points", xytext=(0, 8), ha="center",
                          fontsize=8, color="tab:blue")
    tput.set_xscale("log", base=2)
    tput.set_xticks(conc, [str(c) for c in conc])
    tput.set_xlabel("concurrent tasks")
    tput.set_ylabel("decisions / s (thousands)")
    tput.set_title("Throughput (label: library / bare)")
    tput.grid(alpha=0.3)
    tput.legend(loc="lower right", fontsize=8)
    lat.set_xscale("log", base=2)
    lat.set_yscale("log")
    lat.set_xticks(conc, [str(c) for c in conc])
    lat.set_xlabel("concurrent tasks")
    lat.set_ylabel("latency per decision (ms)")
    lat.set_title("Latency")
    lat.grid(alpha=0.3, which="both")
    lat.legend(fontsize=8)
    top = max(v[0] for r in runs for p, v in r.items() if p in styles)
    tput.set_ylim(0, top / 1000 * 1.2)
    keys = runs[0]["keys"]
    when = header.split(":", 1)[-1].strip()
    fig.suptitle(f"tollgate-bench: token bucket, {keys:,} keys, one loopback redis-server"
                 f" ({when})", fontsize=9)
    fig.tight_layout()
    fig.savefig(dst, dpi=110)
    print(f"wrote {dst} from {len(runs)} run(s)")


if __name__ == "__main__":
    main()
