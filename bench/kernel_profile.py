#!/usr/bin/env python3
"""Sums an ncu kernel-time CSV by kernel: where a profiled stretch of launches spends its GPU time.

Reads what `ncu --metrics gpu__time_duration.sum --print-units base --csv --log-file F ...` writes
(one row per profiled launch; lines that are not CSV rows, ncu's own "==PROF==" messages, are
skipped) and prints one line per kernel, largest total first: share, total ms, launches, mean us,
and the kernel's name without its parameter list (templates shortened to their first 110 chars).

    python3 bench/kernel_profile.py ncu.csv [--top 25]

bench/device_check.sh runs it on the GPU machine after profiling a ResNet-50 step.
"""
import argparse
import collections
import csv
import io
import sys


def rows_of(path):
    with open(path, encoding="utf-8", errors="replace") as f:
        lines = [line for line in f if line.startswith('"')]
    return list(csv.DictReader(io.StringIO("".join(lines))))


def short_name(name):
    depth = 0
    for i, c in enumerate(name):  # cut at the parameter list: the first "(" outside <...>
        if c == "<":
            depth += 1
        elif c == ">":
            depth -= 1
        elif c == "(" and depth == 0 and i > 0:
            name = name[:i]
            break
    return name if len(name) <= 110 else name[:107] + "..."


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("csv")
    parser.add_argument("--top", type=int, default=25)
    args = parser.parse_args()
    rows = rows_of(args.csv)
    total = collections.Counter()
    count = collections.Counter()
    for row in rows:
        if row.get("Metric Name") != "gpu__time_duration.sum":
            continue
        value = float(row["Metric Value"].replace(",", ""))
        unit = row.get("Metric Unit", "nsecond")
        scale = {"nsecond": 1e-6, "ns": 1e-6, "usecond": 1e-3, "us": 1e-3, "msecond": 1.0,
                 "ms": 1.0, "second": 1e3, "s": 1e3}.get(unit, 1e-6)
        name = short_name(row.get("Kernel Name", "?"))
        total[name] += value * scale
        count[name] += 1
    if not total:
        print(f"kernel_profile: no gpu__time_duration.sum rows in {args.csv}")
        return 1
    whole = sum(total.values())
    print(f"{sum(count.values())} launches, {whole:.2f} ms of kernel time")
    print(f"{'share':>6} {'ms':>8} {'calls':>6} {'mean us':>8}  kernel")
    for name, ms in total.most_common(args.top):
        print(f"{100 * ms / whole:5.1f}% {ms:8.3f} {count[name]:6d} {1000 * ms / count[name]:8.1f}  {name}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
