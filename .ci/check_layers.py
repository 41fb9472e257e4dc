#!/usr/bin/env python3
"""Checks how include/tessera's headers include each other (issue 44, item 3), run by .ci/run:

- layers: a folder includes only its own layer and the layers below it, in the order the code
  has them (docs/architecture.md): core < memory, tools < backend < tensor < expr, io < autograd,
  data < nn < optim < parallel, distributed < the umbrella headers (tessera/*.hpp) < models;
- no include cycle between headers;
- no header over 800 lines without a line at its top that says why ("Long file: ...").

The arrows and cycles that exist today are listed in KNOWN (issue 44's debts): they are reported,
and a new one fails the check, as does a known one that is gone (so the list shrinks with the
code). `python3 .ci/check_layers.py [include dir]`; `--self-test` checks the checker on made-up
graphs. Exit status 0 when the tree passes.
"""
import os
import re
import sys

LAYERS = {
    "core": 0, "memory": 1, "tools": 1, "backend": 2, "tensor": 3, "expr": 4, "io": 4, "autograd": 5,
    "data": 5, "nn": 6, "optim": 7, "parallel": 8, "distributed": 8, "(umbrella)": 9, "models": 10,
}
LONG = 800
# Issue 44's debts, as (from, to) header pairs for arrows up and cycle edges, and header paths
# for long files. Remove an entry when its debt is paid (the check then insists).
KNOWN = {
    "up": set(),
    "cycle": set(),
    "long": set(),
}
INCLUDE = re.compile(r'^\s*#\s*include\s+"tessera/([^"]+)"')


def folder(header):
    return header.split("/")[0] if "/" in header else "(umbrella)"


def read_tree(root):
    """{header: (set of included headers, line count, first 40 lines)} under root/tessera."""
    base = os.path.join(root, "tessera")
    tree = {}
    for directory, _, files in os.walk(base):
        for name in files:
            if not name.endswith((".hpp", ".cuh", ".h")):
                continue
            path = os.path.join(directory, name)
            with open(path, encoding="utf-8", errors="replace") as f:
                lines = f.readlines()
            includes = {m.group(1) for m in map(INCLUDE.match, lines) if m}
            tree[os.path.relpath(path, base)] = (includes, len(lines), "".join(lines[:40]))
    return tree


def find(tree):
    """The arrows up, the edges of include cycles, and the long headers without a reason."""
    up = set()
    for header, (includes, _, _) in tree.items():
        for target in includes:
            a, b = folder(header), folder(target)
            if a in LAYERS and b in LAYERS and LAYERS[b] > LAYERS[a]:
                up.add((header, target))
    # Edges on a cycle: those whose target reaches the source again.
    graph = {h: {t for t in inc if t in tree} for h, (inc, _, _) in tree.items()}
    reach = {}

    def reachable(start):
        if start not in reach:
            seen, stack = set(), [start]
            while stack:
                for nxt in graph.get(stack.pop(), ()):
                    if nxt not in seen:
                        seen.add(nxt)
                        stack.append(nxt)
            reach[start] = seen
        return reach[start]

    cycle = {(h, t) for h, targets in graph.items() for t in targets if h in reachable(t)}
    long = {h for h, (_, n, top) in tree.items() if n > LONG and "Long file:" not in top}
    return {"up": up, "cycle": cycle, "long": long}


def check(found, known):
    """Lines to print and whether the tree passes."""
    out, ok = [], True
    names = {"up": "arrow up a layer", "cycle": "include cycle edge", "long": "long header (no reason at its top)"}
    for kind in ("up", "cycle", "long"):
        for item in sorted(found[kind] - known[kind]):
            out.append(f"NEW {names[kind]}: {item}")
            ok = False
        for item in sorted(found[kind] & known[kind]):
            out.append(f"known {names[kind]} (issue 44): {item}")
        for item in sorted(known[kind] - found[kind]):
            out.append(f"GONE {names[kind]}: {item} -- remove it from KNOWN in .ci/check_layers.py")
            ok = False
    return out, ok


def self_test():
    tree = {
        "core/a.hpp": (set(), 10, ""),
        "expr/e.hpp": ({"core/a.hpp"}, 10, ""),
        "core/b.hpp": ({"expr/e.hpp"}, 900, ""),  # up, and long without a reason
        "memory/m.hpp": ({"memory/d.hpp"}, 10, ""),
        "memory/d.hpp": ({"memory/m.hpp"}, 900, "// Long file: one parser."),
    }
    found = find(tree)
    assert found["up"] == {("core/b.hpp", "expr/e.hpp")}, found["up"]
    assert found["cycle"] == {("memory/m.hpp", "memory/d.hpp"), ("memory/d.hpp", "memory/m.hpp")}
    assert found["long"] == {"core/b.hpp"}, found["long"]
    empty = {"up": set(), "cycle": set(), "long": set()}
    assert not check(found, empty)[1]
    assert check(found, found)[1]
    gone = {k: set(v) for k, v in found.items()}
    gone["long"].add("nn/x.hpp")
    assert not check(found, gone)[1]
    print("check_layers self-test: ok")


def main(argv):
    if "--self-test" in argv:
        self_test()
        return 0
    root = next((a for a in argv[1:] if not a.startswith("-")),
                os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "include"))
    tree = read_tree(root)
    lines, ok = check(find(tree), KNOWN)
    for line in lines:
        print(line)
    print(f"check_layers: {len(tree)} headers, {'ok' if ok else 'FAILED'}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv))
