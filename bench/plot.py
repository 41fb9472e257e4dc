#!/usr/bin/env python3
"""Draws the pipeline experiment's JSON (examples/pipeline.cpp) as the two figures of PyTorch's
model-parallel tutorial: split_size_tradeoff.png (training time against the micro-batch size,
mean and standard deviation of the runs) and pipeline_comparison.png (one device, model
parallel, pipelined at the best split).

    python3 bench/plot.py pipeline_results.json [output_dir]

Needs matplotlib (Debian: python3-matplotlib)."""
import json
import os
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def main():
    if len(sys.argv) < 2:
        sys.exit(__doc__)
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
