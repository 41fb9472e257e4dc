#!/usr/bin/env python3
"""Draws the pipeline experiment's JSON (examples/pipeline.cpp) as the two figures of PyTorch's
model-parallel tutorial: split_size_tradeoff.png (training time against the micro-batch size,
mean and standard deviation of the runs) and pipeline_comparison.png (one device, model
parallel, pipelined at the best split).

    python3 bench/plot.py pipeline_results.json [output_dir]

With --memory, draws a memory timeline written by ts::memory::export_timeline (Chrome trace
JSON) as one PNG: allocated and reserved bytes over time, per device, with refused requests
(out_of_memory) marked.

    python3 bench/plot.py --memory trace.json timeline.png

Needs matplotlib (Debian: python3-matplotlib)."""
import json
import os
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def plot_memory(trace_path, out_path):
    """The counter tracks "<device> allocated" / "<device> reserved" as steps over time."""
    with open(trace_path) as f:
        events = json.load(f)["traceEvents"]
    tracks = {}  # (device, "allocated" | "reserved") -> ([t], [bytes])
    refused = {}  # device -> ([t], [allocated bytes then])
    start = min((e["ts"] for e in events if e.get("ph") in ("C", "i")), default=0)
    for e in events:
        if e.get("ph") == "C":
            device, _, kind = e["name"].rpartition(" ")
            times, values = tracks.setdefault((device, kind), ([], []))
            times.append((e["ts"] - start) / 1e6)
            values.append(e["args"]["bytes"] / 2**20)
        elif e.get("ph") == "i" and e["name"] == "out_of_memory":
            times, values = refused.setdefault(e["args"]["device"], ([], []))
            times.append((e["ts"] - start) / 1e6)
            values.append(e["args"]["allocated"] / 2**20)
    span = max((t for times, _ in tracks.values() for t in times), default=0)
    scale, unit = (1e6, "µs") if span < 1e-3 else (1e3, "ms") if span < 1 else (1, "s")
    for times, _ in list(tracks.values()) + list(refused.values()):
        times[:] = [t * scale for t in times]
    if not tracks:
        sys.exit(f"{trace_path}: no memory counter events (is it from ts::memory::export_timeline?)")
    fig, ax = plt.subplots(figsize=(9, 4.5))
    styles = {"reserved": dict(linestyle="--", alpha=0.8), "allocated": dict(linewidth=1.5)}
    for (device, kind), (times, values) in sorted(tracks.items()):
        ax.step(times, values, where="post", label=f"{device} {kind}", **styles.get(kind, {}))
    for device, (times, values) in sorted(refused.items()):
        ax.plot(times, values, "rx", markersize=8, label=f"{device} refused request")
    ax.set_xlabel(f"time since the first event ({unit})")
    ax.set_ylabel("MiB")
    ax.set_title(f"Memory timeline ({os.path.basename(trace_path)})")
    ax.grid(True, alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(out_path, dpi=110)
    print(f"wrote {out_path}")


def main():
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    if sys.argv[1] == "--memory":
        if len(sys.argv) != 4:
            sys.exit(__doc__)
        plot_memory(sys.argv[2], sys.argv[3])
        return
    with open(sys.argv[1]) as f:
        results = json.load(f)
    out_dir = sys.argv[2] if len(sys.argv) > 2 else os.path.dirname(os.path.abspath(sys.argv[1]))
    runs = results["runs"]
    steps = results["steps"]
    pipelined = results["pipelined"]

    splits = [p["split"] for p in pipelined]
    means = [p["mean"] for p in pipelined]
    stds = [p["std"] for p in pipelined]
    fig, ax = plt.subplots()
    ax.errorbar(splits, means, yerr=stds, marker="o", capsize=4)
    ax.set_xscale("log", base=2)
    ax.set_xticks(splits)
    ax.set_xticklabels([str(s) for s in splits])
    ax.set_xlabel("pipeline split size (samples per micro-batch)")
    ax.set_ylabel(f"time of {steps} training steps (s)")
    model = results.get("model", "")
    ax.set_title(f"Pipeline split size trade-off ({model} batch {results['batch']}, {runs} runs)")
    ax.grid(True, alpha=0.3)
    fig.tight_layout()
    tradeoff = os.path.join(out_dir, "split_size_tradeoff.png")
    fig.savefig(tradeoff)

    best = next(p for p in pipelined if p["split"] == results["best_split"])
    labels = ["one device", "model parallel", f"pipelined (split {best['split']})"]
    values = [results["one_device"]["mean"], results["model_parallel"]["mean"], best["mean"]]
    errors = [results["one_device"]["std"], results["model_parallel"]["std"], best["std"]]
    fig, ax = plt.subplots()
    ax.bar(labels, values, yerr=errors, capsize=6, color=["tab:gray", "tab:blue", "tab:green"])
    ax.set_ylabel(f"time of {steps} training steps (s)")
    ax.set_title("One device, model parallel and pipelined on two devices")
    fig.tight_layout()
    comparison = os.path.join(out_dir, "pipeline_comparison.png")
    fig.savefig(comparison)
    print(f"wrote {tradeoff} and {comparison}")


if __name__ == "__main__":
    main()
