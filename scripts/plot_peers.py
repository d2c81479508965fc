#!/usr/bin/env python3
"""Plots the ratios of docs/benchmarks.md's "Summary"
table as an SVG bar chart (no dependencies): one bar per run (run 1, run 2)
for every row whose ratio is in bold, and a line at 1.0x (parity).

    python3 scripts/plot_peers.py docs/benchmarks.md docs/bench-peers.svg
"""

import re
import sys
from html import escape

ROW = re.compile(
    r"^\| (?P<what>[^|]+?) \| (?P<against>[^|]+?) \|.*\*\*(?P<a>[\d.]+)x / (?P<b>[\d.]+)x\*\*"
)
SECTION = "## Summary"


def rows(text):
    """[(label, run 1 ratio, run 2 ratio)] of the section's table: the
    row's subject and its peer ("same" repeats the row above's)."""
    body = text.split(SECTION, 1)[1].split("\n## ", 1)[0]
    out, peer, seen = [], "", False
    for line in body.splitlines():
        # The section's first table only: the tables of its subsections
        # (a branch's before and after) are not the Summary's rows.
        if seen and not line.startswith("|"):
            break
        seen = seen or line.startswith("|")
        m = ROW.match(line)
        if not m:
            continue
        if m["against"].strip() != "same":
            peer = m["against"].strip()
        label = f"{m['what'].strip()}: vs {peer}"
        out.append((label.replace("`", ""), float(m["a"]), float(m["b"])))
    return out


def svg(data):
    bar, gap, width = 9, 8, 360
    # Room for the longest label (about 6 px a character at 11 px).
    left = max(470, 6 * max(len(label) for label, _, _ in data) + 20)
    top = 40
    height = top + len(data) * (2 * bar + gap) + 40
    scale = width / max(1.2, max(max(a, b) for _, a, b in data) * 1.05)
    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{left + width + 20}" height="{height}" '
        'font-family="sans-serif" font-size="11">',
        '<rect width="100%" height="100%" fill="white"/>',
        f'<text x="10" y="20" font-size="13">tollgate / peer (run 1 dark, run 2 light); '
        "right of the line: tollgate ahead</text>",
    ]
    for i, (label, a, b) in enumerate(data):
        y = top + i * (2 * bar + gap)
        parts.append(f'<text x="{left - 6}" y="{y + bar + 4}" text-anchor="end">{escape(label)}</text>')
        for j, (v, colour) in enumerate(((a, "#2b5c8a"), (b, "#8fb3d9"))):
            parts.append(
                f'<rect x="{left}" y="{y + j * bar}" width="{v * scale:.1f}" height="{bar - 1}" fill="{colour}"/>'
            )
            parts.append(f'<text x="{left + v * scale + 3:.1f}" y="{y + j * bar + bar - 1}" font-size="9">{v:.2f}x</text>')
    x1 = left + scale
    parts.append(f'<line x1="{x1:.1f}" y1="{top - 6}" x2="{x1:.1f}" y2="{height - 30}" stroke="#c33" stroke-dasharray="4 3"/>')
    parts.append(f'<text x="{x1:.1f}" y="{height - 16}" text-anchor="middle" fill="#c33">1.0x</text>')
    parts.append("</svg>")
    return "\n".join(parts) + "\n"


def main():
    src, dst = sys.argv[1], sys.argv[2]
    with open(src, encoding="utf-8") as f:
        data = rows(f.read())
    if not data:
        sys.exit(f"no ratio rows found under {SECTION!r} in {src}")
    with open(dst, "w", encoding="utf-8") as f:
        f.write(svg(data))
    print(f"{len(data)} rows -> {dst}")


if __name__ == "__main__":
    main()
