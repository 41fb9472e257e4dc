#!/usr/bin/env python3
"""PyTorch's answer to chains of views, the oracle of tests/tensor/view_fuzz_test.cpp.

Reads `chains.txt` in the given directory: one chain per line, `start <extents...>` then steps
separated by ` | `, each `<op> <integers...>` (permute, transpose, narrow, select, view, reshape,
expand, unsqueeze, squeeze, flatten, contiguous). Starts from torch.arange(numel) viewed as the
start shape (float64) and applies each step as torch does. Writes `torch.txt`: per chain, either
`error <step>` (the 0-based index of the first step torch refuses) or `ok <rank> <extents...> :
<values...>` (the final tensor's shape and its elements in row-major order)."""
import sys
from pathlib import Path

import torch


def apply(t, op, args):
    if op == "permute":
        return t.permute(args)
    if op == "transpose":
        return t.transpose(args[0], args[1])
    if op == "narrow":
        return t.narrow(args[0], args[1], args[2])
    if op == "select":
        return t.select(args[0], args[1])
    if op == "view":
        return t.view(args)
    if op == "reshape":
        return t.reshape(args)
    if op == "expand":
        return t.expand(args)
    if op == "unsqueeze":
        return t.unsqueeze(args[0])
    if op == "squeeze":
        return t.squeeze(args[0])
    if op == "flatten":
        return t.flatten(args[0], args[1])
    if op == "contiguous":
        return t.contiguous()
    raise ValueError(op)


directory = Path(sys.argv[1])
out = []
for line in (directory / "chains.txt").read_text().splitlines():
    parts = [p.split() for p in line.split(" | ")]
    start = [int(x) for x in parts[0][1:]]
    numel = 1
    for e in start:
        numel *= e
    t = torch.arange(numel, dtype=torch.float64).reshape(start)
    failed = None
    for index, step in enumerate(parts[1:]):
        try:
            t = apply(t, step[0], [int(x) for x in step[1:]])
        except (RuntimeError, IndexError, ValueError, TypeError):
            failed = index
            break
    if failed is not None:
        out.append(f"error {failed}")
    else:
        values = " ".join(str(int(v)) for v in t.contiguous().flatten().tolist())
        out.append(f"ok {t.dim()} " + " ".join(str(e) for e in t.shape) + " : " + values)
(directory / "torch.txt").write_text("\n".join(out) + "\n")
