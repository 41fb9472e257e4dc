#!/usr/bin/env python3
"""Lists the CUDA kernels an nvcc-compiled object holds, by family and by dtype.

Each kernel nvcc compiles into an object gets a host stub whose name carries the kernel's mangled
name (`__device_stub__Z...`, with local statics named after it); this script reads those names
from `nm`, demangles them with `c++filt`, and counts them by family (the kernel template:
vector_kernel, reduce_all_kernel, multi_update_kernel...) and by dtype (the element type the kernel
writes: its first pointer parameter, or its first template argument that is a dtype).

    python3 bench/cuda_kernels.py unit.o [more.o ...]      # table per object, then totals
    python3 bench/cuda_kernels.py --list unit.o            # also every kernel, demangled
    python3 bench/cuda_kernels.py --count unit.o           # only the number of kernels

Needs binutils' nm and c++filt (no CUDA tool): it runs on the CPU machine.
"""
import argparse
import collections
import re
import subprocess
import sys

STUB = re.compile(r"(\d+)__device_stub__")
DTYPES = [
    ("unsigned char", "uint8"), ("signed char", "int8"), ("__half", "half"),
    ("tessera::half", "half"), ("tessera::bfloat16", "bfloat16"), ("double", "float64"),
    ("float", "float32"), ("long", "int64"), ("int", "int32"), ("bool", "bool"),
]


def kernels_of(path):
    """The mangled names of the kernels in object `path` (each once)."""
    symbols = subprocess.run(["nm", path], capture_output=True, text=True, check=True).stdout
    names = set()
    for line in symbols.splitlines():
        symbol = line.split()[-1] if line.split() else ""
        match = STUB.search(symbol)
        if not match:
            continue
        # The stub's name is an identifier of the given length: "__device_stub__" followed by the
        # kernel's mangled name without its leading underscore.
        length = int(match.group(1))
        start = match.end() - len("__device_stub__")
        identifier = symbol[start:start + length]
        names.add("_" + identifier[len("__device_stub__"):])
    return sorted(names)


def demangle(names):
    if not names:
        return []
    out = subprocess.run(["c++filt"], input="\n".join(names), capture_output=True, text=True,
                         check=True).stdout
    return out.splitlines()


def family(signature):
    name = re.sub(r"^void ", "", signature).split("<")[0].split("(")[0]
    return name.split("::")[-1]


def dtype(signature):
    body = re.sub(r"^void ", "", signature)
    # The first parameter when it is a pointer (the output); else the template arguments.
    params = body[body.rfind("(") + 1:] if "(" in body else ""
    first = params.split(",")[0].strip()
    for text in ([first] if first.endswith("*") else []) + [body]:
        positions = []
        for spelling, label in DTYPES:
            found = re.search(r"(?<![\w:])" + re.escape(spelling) + r"(?![\w])", text)
            if found:
                positions.append((found.start(), label))
        if positions:
            return min(positions)[1]
    return "-"


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("objects", nargs="+")
    parser.add_argument("--list", action="store_true", help="print every kernel, demangled")
    parser.add_argument("--count", action="store_true", help="print only the kernel count")
    args = parser.parse_args()
    total = 0
    for path in args.objects:
        signatures = demangle(kernels_of(path))
        total += len(signatures)
        if args.count:
            continue
        print(f"{path}: {len(signatures)} kernels")
        by_family = collections.Counter(family(s) for s in signatures)
        by_dtype = collections.Counter(dtype(s) for s in signatures)
        width = max([len(f) for f in by_family] + [6])
        for name, count in by_family.most_common():
            print(f"  {name:<{width}} {count:5d}")
        print("  by dtype: " + ", ".join(f"{d} {c}" for d, c in by_dtype.most_common()))
        if args.list:
            for signature in signatures:
                print("    " + signature)
    if args.count:
        print(total)
    elif len(args.objects) > 1:
        print(f"total: {total} kernels")
    return 0


if __name__ == "__main__":
    sys.exit(main())
