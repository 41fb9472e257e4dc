#!/usr/bin/env python3
"""Sums the call-stack samples bench/host_time.c writes (HOST_TIME_SAMPLES) by function: each
function's share of the samples with it anywhere on the stack (inclusive) and on top (self).

The program's own frames are symbolised with addr2line against the same binary (run it where the
binary is: the CPU machine, for what device_check brought back); shared libraries' frames show
their nearest dynamic symbol, or the library and offset.

  python3 bench/host_profile.py samples.txt --binary build/device/pack/bin/cuda_bench \
      [--within 'Program.*backward'] [--top 40]

--within keeps only the samples whose stack holds a function matching the regular expression,
and reports shares of those (where the time under one call goes).
"""
import argparse
import collections
import re
import subprocess
import sys


def parse(path):
    stacks = []
    with open(path) as f:
        for line in f:
            if line.startswith("S"):
                stacks.append(line.split()[1:])
    return stacks


def symbolise(stacks, binary):
    """Maps each frame string to a function name."""
    names = {}
    own = collections.OrderedDict()
    module = binary.rsplit("/", 1)[-1] if binary else None
    for stack in stacks:
        for frame in stack:
            if frame in names or frame in own:
                continue
            m = re.match(r"(.+?)\+0x([0-9a-f]+)(?:\((.*)\))?$", frame)
            if not m:
                names[frame] = frame
                continue
            lib, offset, symbol = m.group(1), int(m.group(2), 16), m.group(3)
            if module and lib == module:
                own[frame] = offset - 1  # a return address: the call is the byte before
            else:
                names[frame] = f"{symbol} [{lib}]" if symbol else f"{lib}+0x{offset:x}"
    if own:
        query = "\n".join(f"0x{o:x}" for o in own.values())
        out = subprocess.run(["addr2line", "-f", "-C", "-e", binary], input=query,
                             capture_output=True, text=True, check=True).stdout.splitlines()
        for i, frame in enumerate(own):
            names[frame] = out[2 * i] if 2 * i < len(out) else frame
    return names


def shorten(name, width):
    # Template arguments make names unreadable: keep the outer shape.
    depth, kept = 0, []
    for ch in name:
        if ch == "<":
            depth += 1
            if depth == 1:
                kept.append("<…>")
            continue
        if ch == ">":
            depth -= 1
            continue
        if depth == 0:
            kept.append(ch)
    short = "".join(kept)
    return short if len(short) <= width else short[: width - 1] + "…"


def main():
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("samples")
    parser.add_argument("--binary", help="the program the samples came from, for addr2line")
    parser.add_argument("--within", help="only samples with a frame matching this regex")
    parser.add_argument("--top", type=int, default=40)
    parser.add_argument("--width", type=int, default=110)
    args = parser.parse_args()
    stacks = parse(args.samples)
    if not stacks:
        sys.exit(f"{args.samples}: no samples")
    names = symbolise(stacks, args.binary)
    named = [[names[f] for f in s] for s in stacks]
    if args.within:
        pattern = re.compile(args.within)
        named = [s for s in named if any(pattern.search(n) for n in s)]
        if not named:
            sys.exit(f"no sample has a frame matching {args.within!r}")
    inclusive, own = collections.Counter(), collections.Counter()
    for s in named:
        if s:
            own[s[0]] += 1
        for n in set(s):
            inclusive[n] += 1
    total = len(named)
    print(f"{total} samples{' within ' + repr(args.within) if args.within else ''}"
          f" (of {len(stacks)})")
    for title, counts in (("inclusive", inclusive), ("self", own)):
        print(f"\n{title:>9}  function")
        for n, c in counts.most_common(args.top):
            print(f"{100.0 * c / total:8.1f}%  {shorten(n, args.width)}")


if __name__ == "__main__":
    main()
