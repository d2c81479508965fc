#!/usr/bin/env python3
"""Plots a Harvester run: the adapted rate against the source's hidden limit.

    cargo run -p harvester -- --csv harvester.csv
    python3 examples/harvester/plot.py harvester.csv docs/harvester-rate.png

Needs matplotlib (pip install matplotlib).
"""

import csv
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def main(src: str, out: str) -> None:
    with open(src, newline="") as f:
        rows = [{k: float(v) for k, v in row.items()} for row in csv.DictReader(f)]
    t = [r["t"] for r in rows]

    # Pages served per second, over the trailing second.
    served = []
    for i, r in enumerate(rows):
        j = i
        while j > 0 and r["t"] - rows[j - 1]["t"] <= 1.0:
            j -= 1
        span = r["t"] - rows[j]["t"]
        served.append((r["served"] - rows[j]["served"]) / span if span > 0 else 0.0)
    refusals = [rows[i]["t"] for i in range(1, len(rows)) if rows[i]["refused"] > rows[i - 1]["refused"]]

    fig, ax = plt.subplots(figsize=(9, 4.5), dpi=110)
    ax.step(t, [r["limit"] for r in rows], where="post", color="black", linestyle="--", label="source's hidden limit")
    ax.plot(t, [r["rate"] for r in rows], color="tab:blue", linewidth=2, label="Harvester's adapted rate")
    ax.plot(t, served, color="tab:green", alpha=0.6, label="pages served per second")
    ax.plot(refusals, [0.5] * len(refusals), "v", color="tab:red", label="429 with Retry-After: 1")
    ax.set_xlabel("time (s)")
    ax.set_ylabel("requests per second")
    ax.set_ylim(bottom=0)
    ax.set_xlim(0, max(t))
    ax.grid(alpha=0.3)
    ax.legend(loc="upper left")
    ax.set_title("AIMD: +2/s per 0.5 s window of success, x0.75 per refusal, one cut per window")
    fig.tight_layout()
    fig.savefig(out)


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    main(sys.argv[1], sys.argv[2])
