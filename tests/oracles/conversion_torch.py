#!/usr/bin/env python3
"""PyTorch's conversions of numbers to integer dtypes, the oracle of tests/expr/conversion_test.cpp.

Reads `values.txt` in the given directory (one number per line, in C's %a hex notation) and
writes `torch.txt`: for each source dtype (float32, float64) and each integer target dtype
(uint8, int8, int16, int32, int64), a line `cast <source> <target> v1 v2 ...` with the values of
`tensor.to(target)`; then, for each target dtype (every dtype), a line `fill <target> r1 r2 ...`
where r is the value `torch.zeros(1, dtype=target).fill_(number)` stores (the number given as a
Python int when it is integral and below 2^62 in magnitude, else as a Python float; the C++ test
passes int64 or double alike), in hex, or `error` when PyTorch refuses it. PyTorch on x86 defines the results that C++ leaves undefined (NaN, out of range)."""
import math
import sys
from pathlib import Path

import torch

directory = Path(sys.argv[1])
values = [float.fromhex(line.strip()) for line in (directory / "values.txt").read_text().split()]
integer_targets = {"uint8": torch.uint8, "int8": torch.int8, "int16": torch.int16,
                   "int32": torch.int32, "int64": torch.int64}
every_target = dict(integer_targets, float16=torch.float16, bfloat16=torch.bfloat16,
                    float32=torch.float32, float64=torch.float64, bool=torch.bool)
lines = []
for source_name, source in (("float32", torch.float32), ("float64", torch.float64)):
    tensor = torch.tensor(values, dtype=torch.float64).to(source)
    for name, target in integer_targets.items():
        converted = tensor.to(target).tolist()
        lines.append(f"cast {source_name} {name} " + " ".join(str(int(v)) for v in converted))
for name, target in every_target.items():
    results = []
    for value in values:
        integral = math.isfinite(value) and value == math.trunc(value) and abs(value) < 2.0**62
        try:
            stored = torch.zeros(1, dtype=target).fill_(int(value) if integral else value).to(torch.float64).item()
            results.append(float(stored).hex())
        except RuntimeError:
            results.append("error")
    lines.append(f"fill {name} " + " ".join(results))
(directory / "torch.txt").write_text("\n".join(lines) + "\n")
