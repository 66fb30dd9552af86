"""Draws a `shardctl trace` file as a timeline PNG (one row per position,
spans coloured by kind), for docs/operations.md. A tool, not a test:
needs matplotlib (pip install matplotlib in the tools venv).

Usage: plot_trace.py TRACE.json OUT.png [TITLE]
"""
import json
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.patches import Patch  # noqa: E402

COLOURS = {"forward": "#4c78a8", "backward": "#f58518", "weights": "#eeca3b", "receive": "#d0d0d0", "send": "#54a24b",
           "norm": "#b279a2", "reduce": "#e45756", "optimizer": "#72b7b2", "gather": "#9d755d",
           "flush": "#bab0ac"}


def main():
    if len(sys.argv) not in (3, 4):
        raise SystemExit(__doc__)
    trace = json.load(open(sys.argv[1]))
    names, spans, steps = {}, [], []
    for e in trace["traceEvents"]:
        if e["ph"] == "M" and e["name"] == "process_name":
            names[e["pid"]] = e["args"]["name"]
        elif e["ph"] == "X":
            (steps if e["cat"] == "step" else spans).append(e)
    pids = sorted(names)
    fig, ax = plt.subplots(figsize=(12, 0.7 * len(pids) + 1.4))
    for row, pid in enumerate(reversed(pids)):
        for e in spans:
            if e["pid"] == pid:
                ax.broken_barh([(e["ts"] / 1000, max(e["dur"], 1) / 1000)], (row - 0.35, 0.7),
                               facecolors=COLOURS.get(e["cat"], "black"), linewidth=0)
                if e["cat"] in ("forward", "backward") and e["dur"] > 2500:
                    ax.text((e["ts"] + e["dur"] / 2) / 1000, row, str(e["args"]["micro_batch"]), ha="center",
                            va="center", fontsize=7, color="white")
        for e in steps:
            if e["pid"] == pid:
                ax.axvline(e["ts"] / 1000, color="black", linewidth=0.5, alpha=0.3)
    ax.set_yticks(range(len(pids)))
    ax.set_yticklabels([names[p] for p in reversed(pids)], fontsize=8)
    ax.set_xlabel("ms (each worker's clock)")
    if len(sys.argv) == 4:
        ax.set_title(sys.argv[3], fontsize=10)
    used = sorted({e["cat"] for e in spans}, key=list(COLOURS).index)
    ax.legend(handles=[Patch(color=COLOURS[c], label=c) for c in used], loc="upper center",
              bbox_to_anchor=(0.5, -0.25), ncol=len(used), fontsize=8, frameon=False)
    fig.tight_layout()
    fig.savefig(sys.argv[2], dpi=110)


if __name__ == "__main__":
    main()
