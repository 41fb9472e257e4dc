#!/usr/bin/python3
"""Reference for tests/expr/random_expr_test.cpp: random elementwise expression trees in numpy.

Usage: expr_numpy.py DIR (or --self-test). Reads DIR/leaves.txt (the input tensors' values, row-major, with dtype
and shape) and DIR/trees.txt (one tree per line as an s-expression), and writes DIR/numpy.txt:
for every tree its PyTorch result dtype and shape, then lines of values, error bounds and
"undecidable" flags.

Values are computed in float64. The result dtype of every node follows PyTorch's promotion rules
from the small table below (not numpy's, which differ for scalars and integer division), and
that dtype's unit roundoff drives a first-order bound on how far a computation carried out in
that dtype (as Tessera does) can be from the float64 value: each node's bound combines its
operands' bounds through the operation's derivative and adds one rounding (a few ulps for libm
functions). A comparison whose operands are closer than their bounds cannot be decided from
float64 alone; such elements, and everything computed from them, are flagged and not checked.

Tree syntax (mirrors the C++ generator, which builds the same guarded forms):
  (t K) leaf tensor K; (f X) a C++ double; (i N) a C++ int64
  (neg X) (abs X) (relu X) (sin X) (cos X) (tanh X) (sigmoid X)
  (exp X) = exp(minimum(X, 3.0)); (log X) = log(abs(X) + 1); (sqrt X), (rsqrt X) likewise
  (castf X) (castd X): cast to float32 / float64
  (add X Y) (sub X Y) (mul X Y) (max X Y) (min X Y)
  (div X Y) = X / Y for a scalar Y, X / (abs(Y) + 1) otherwise
  (powi X (i K)) = pow(X, K); (powf X (f S)) = pow(abs(X) + 1, S);
  (powt X Y) = pow(abs(X) + 1, minimum(abs(Y), 2.0))
  (lt X Y) (le X Y) (gt X Y) (ge X Y) (eq X Y) (ne X Y); (where C X Y)
"""

import os
import sys

try:
    import numpy as np
except ImportError:
    sys.stderr.write("expr_numpy.py: numpy is required (Debian: apt-get install python3-numpy; "
                     "run with /usr/bin/python3)\n")
    sys.exit(2)

# PyTorch's dtype categories and unit roundoffs (0: integer arithmetic is exact here, since the
# generator keeps magnitudes below 1e7).
CATEGORY = {"bool": 0, "int32": 1, "int64": 1, "float32": 2, "float64": 2}
ROUNDOFF = {"bool": 0.0, "int32": 0.0, "int64": 0.0, "float32": 2.0 ** -24, "float64": 2.0 ** -53}
LIBM_ULPS = 4.0  # exp, log, sin, pow ... of glibc are within a few ulps


class Value:
    """float64 values, an error bound per element, undecidable flags, and the PyTorch dtype
    (None for a C++ number, whose kind is then 'f' or 'i')."""

    def __init__(self, v, e, unsafe, dtype, scalar=None):
        self.v = np.asarray(v, dtype=np.float64)
        self.e = np.asarray(e, dtype=np.float64)
        self.unsafe = np.asarray(unsafe, dtype=bool)
        self.dtype = dtype
        self.scalar = scalar


def number(x, kind):
    return Value(x, 0.0, False, None, kind)


def promote(x, y):
    """torch.result_type for a tensor and a tensor or a wrapped number."""
    if x.scalar and y.scalar:
        raise ValueError("two numbers")
    if x.scalar:
        x, y = y, x
    if y.scalar:
        scalar_category = 2 if y.scalar == "f" else 1
        if scalar_category > CATEGORY[x.dtype]:
            return "float32" if scalar_category == 2 else "int64"
        return x.dtype
    a, b = x.dtype, y.dtype
    if CATEGORY[a] != CATEGORY[b]:
        return a if CATEGORY[a] > CATEGORY[b] else b
    if CATEGORY[a] == 2:
        return "float64" if "float64" in (a, b) else "float32"
    if CATEGORY[a] == 1:
        return "int64" if "int64" in (a, b) else "int32"
    return "bool"


def floating(dtype):
    return dtype if CATEGORY[dtype] == 2 else "float32"


def convert(x, dtype):
    """x's values and bound once converted to dtype (a conversion into a float type rounds)."""
    e = x.e
    if x.dtype != dtype and CATEGORY[dtype] == 2:
        e = e + ROUNDOFF[dtype] * np.abs(x.v)
    return x.v, e


def rounding(dtype, v, ulps=1.0):
    return ulps * ROUNDOFF[dtype] * np.abs(v)


def binary(x, y, op):
    c = promote(x, y)
    if op == "div":
        c = floating(c)
    xv, xe = convert(x, c)
    yv, ye = convert(y, c)
    unsafe = x.unsafe | y.unsafe
    with np.errstate(all="ignore"):
        if op == "add":
            v = xv + yv
            e = xe + ye + rounding(c, v)
        elif op == "sub":
            v = xv - yv
            e = xe + ye + rounding(c, v)
        elif op == "mul":
            v = xv * yv
            e = np.abs(xv) * ye + np.abs(yv) * xe + xe * ye + rounding(c, v)
        elif op == "div":
            v = xv / yv
            room = np.abs(yv) - ye
            e = np.where(room > 0, (xe + np.abs(v) * ye) / np.where(room > 0, room, 1.0), np.inf)
            e = e + rounding(c, v)
        elif op == "max":
            v = np.maximum(xv, yv)
            e = np.maximum(xe, ye)  # max is 1-Lipschitz in the larger error
        elif op == "min":
            v = np.minimum(xv, yv)
            e = np.maximum(xe, ye)
        else:
            raise ValueError(op)
    return Value(v, e, unsafe, c)


def compare(x, y, op):
    c = promote(x, y)
    xv, xe = convert(x, c)
    yv, ye = convert(y, c)
    v = {"lt": xv < yv, "le": xv <= yv, "gt": xv > yv, "ge": xv >= yv, "eq": xv == yv,
         "ne": xv != yv}[op]
    margin = xe + ye
    undecidable = (margin > 0) & (np.abs(xv - yv) <= margin)
    return Value(v.astype(np.float64), 0.0, x.unsafe | y.unsafe | undecidable, "bool")


def unary(x, op):
    if op in ("neg", "abs", "relu"):
        v = {"neg": -x.v, "abs": np.abs(x.v), "relu": np.maximum(x.v, 0.0)}[op]
        return Value(v, x.e, x.unsafe, x.dtype)
    c = floating(x.dtype)
    xv, xe = convert(x, c)
    with np.errstate(all="ignore"):
        if op == "exp":
            v = np.exp(xv)
            e = v * np.expm1(xe) + rounding(c, v, LIBM_ULPS)
        elif op == "log":  # operands are >= 1 here
            v = np.log(xv)
            e = np.where(xe < xv, -np.log1p(-xe / xv), np.inf) + rounding(c, v, LIBM_ULPS)
        elif op == "sqrt":
            v = np.sqrt(xv)
            e = v - np.sqrt(np.maximum(xv - xe, 0.0)) + rounding(c, v, LIBM_ULPS)
        elif op == "rsqrt":  # 1 / sqrt(x): two roundings
            v = 1.0 / np.sqrt(xv)
            e = np.where(xe < xv, 1.0 / np.sqrt(xv - xe) - v, np.inf) + rounding(c, v, LIBM_ULPS)
        elif op in ("sin", "cos"):
            v = np.sin(xv) if op == "sin" else np.cos(xv)
            e = np.minimum(xe, 2.0) + ROUNDOFF[c] * LIBM_ULPS
        elif op == "tanh":
            v = np.tanh(xv)
            e = np.minimum(xe, 2.0) + ROUNDOFF[c] * LIBM_ULPS
        elif op == "sigmoid":  # 1 / (1 + exp(-x)): derivative <= 1/4
            v = 1.0 / (1.0 + np.exp(-xv))
            e = np.minimum(0.25 * xe, 1.0) + ROUNDOFF[c] * LIBM_ULPS
        else:
            raise ValueError(op)
    return Value(v, e, x.unsafe, c)


def cast(x, dtype):
    v, e = convert(x, dtype)
    return Value(v, e, x.unsafe, dtype)


def power(base, exponent):
    """pow(base, exponent) for a tensor base and a tensor or number exponent."""
    c = promote(base, exponent)
    bv, be = convert(base, c)
    xv, xe = convert(exponent, c)
    unsafe = base.unsafe | exponent.unsafe
    with np.errstate(all="ignore"):
        v = np.power(bv, xv)
        if CATEGORY[c] < 2:
            return Value(v, 0.0, unsafe, c)  # integer pow is exact
        if exponent.scalar == "i":
            # x^k, k integral: |(x+d)^k - x^k| <= k (|x| + |d|)^(k-1) |d|.
            k = float(xv)
            e = k * np.power(np.abs(bv) + be, k - 1) * be
        else:
            # A positive base (abs(x) + 1): x^y = exp(y log x) is monotone in each argument
            # over the error box, so its corners bound the deviation.
            low = bv - be
            corners = [np.power(b, y) for b in (np.maximum(low, 1e-300), bv + be)
                       for y in (xv - xe, xv + xe)]
            e = np.max(np.abs(np.array(corners) - v), axis=0)
            e = np.where(low > 0, e, np.inf)
        e = e + rounding(c, v, LIBM_ULPS)
    return Value(v, e, unsafe, c)


def where(c, x, y):
    dtype = promote(x, y)
    xv, xe = convert(x, dtype)
    yv, ye = convert(y, dtype)
    chosen = c.v != 0
    return Value(np.where(chosen, xv, yv), np.where(chosen, xe, ye),
                 c.unsafe | np.where(chosen, x.unsafe, y.unsafe), dtype)


ONE = ("i", 1)


def evaluate(tree, leaves):
    head = tree[0]
    if head == "t":
        return leaves[int(tree[1])]
    if head == "f":
        return number(float(tree[1]), "f")
    if head == "i":
        return number(float(int(tree[1])), "i")
    args = [evaluate(t, leaves) for t in tree[1:]]
    plus_one = lambda x: binary(unary(x, "abs"), number(1.0, "i"), "add")
    if head in ("neg", "abs", "relu", "sin", "cos", "tanh", "sigmoid"):
        return unary(args[0], head)
    if head == "exp":
        return unary(binary(args[0], number(3.0, "f"), "min"), "exp")
    if head in ("log", "sqrt", "rsqrt"):
        return unary(plus_one(args[0]), head)
    if head == "castf":
        return cast(args[0], "float32")
    if head == "castd":
        return cast(args[0], "float64")
    if head in ("add", "sub", "mul", "max", "min"):
        return binary(args[0], args[1], head)
    if head == "div":
        x, y = args
        return binary(x, y if y.scalar else plus_one(y), "div")
    if head == "powi":
        return power(args[0], args[1])
    if head == "powf":
        return power(plus_one(args[0]), args[1])
    if head == "powt":
        return power(plus_one(args[0]),
                     binary(unary(args[1], "abs"), number(2.0, "f"), "min"))
    if head in ("lt", "le", "gt", "ge", "eq", "ne"):
        return compare(args[0], args[1], head)
    if head == "where":
        return where(*args)
    raise ValueError("unknown node " + head)


def parse(text):
    tokens = text.replace("(", " ( ").replace(")", " ) ").split()
    position = 0

    def node():
        nonlocal position
        assert tokens[position] == "("
        position += 1
        items = []
        while tokens[position] != ")":
            if tokens[position] == "(":
                items.append(node())
            else:
                items.append(tokens[position])
                position += 1
        position += 1
        return items

    tree = node()
    assert position == len(tokens), text
    return tree


def read_leaves(path):
    with open(path) as f:
        lines = f.read().split("\n")
    count = int(lines[0])
    leaves = []
    for k in range(count):
        header = lines[1 + 2 * k].split()
        dtype, rank = header[0], int(header[1])
        shape = tuple(int(d) for d in header[2:2 + rank])
        values = np.array([float(v) for v in lines[2 + 2 * k].split()], dtype=np.float64)
        leaves.append(Value(values.reshape(shape), np.zeros(shape), np.zeros(shape, dtype=bool),
                            dtype))
    return leaves


def self_test():
    """The promotion table against results PyTorch gives (torch.result_type), and a few trees
    against values worked out by hand."""
    t = lambda dtype: Value(np.ones(2), 0.0, False, dtype)
    f, i = number(2.5, "f"), number(2.0, "i")
    expected = [
        (t("float32"), t("float64"), "float64"), (t("int32"), t("float32"), "float32"),
        (t("int32"), t("int64"), "int64"), (t("bool"), t("int32"), "int32"),
        (t("bool"), t("float32"), "float32"), (t("float32"), f, "float32"),
        (t("float64"), f, "float64"), (t("int32"), f, "float32"), (t("int32"), i, "int32"),
        (t("int64"), i, "int64"), (t("bool"), i, "int64"), (t("bool"), f, "float32"),
        (f, t("int32"), "float32"), (i, t("bool"), "int64"),
    ]
    for x, y, dtype in expected:
        assert promote(x, y) == dtype, (x.dtype, x.scalar, y.dtype, y.scalar, dtype)
    leaves = [Value(np.array([1.0, -2.0, 3.0]), 0.0, False, "int32"),
              Value(np.array([[0.5], [-1.5]]), 0.0, False, "float32")]
    cases = [
        ("(div (t 0) (i 2))", "float32", [0.5, -1.0, 1.5]),
        ("(div (t 0) (t 0))", "float32", [0.5, -2.0 / 3.0, 0.75]),
        ("(add (t 0) (t 1))", "float32", [[1.5, -1.5, 3.5], [-0.5, -3.5, 1.5]]),
        ("(powi (t 0) (i 3))", "int32", [1.0, -8.0, 27.0]),
        ("(powf (t 0) (f 0.5))", "float32", [2.0 ** 0.5, 3.0 ** 0.5, 2.0]),
        ("(where (lt (t 0) (i 2)) (t 0) (f 0.5))", "float32", [1.0, -2.0, 0.5]),
        ("(mul (t 0) (i -1))", "int32", [-1.0, 2.0, -3.0]),
        ("(castd (t 1))", "float64", [[0.5], [-1.5]]),
        ("(gt (t 1) (f 0.0))", "bool", [[1.0], [0.0]]),
        ("(log (t 1))", "float32", [[np.log(1.5)], [np.log(2.5)]]),
    ]
    for text, dtype, values in cases:
        r = evaluate(parse(text), leaves)
        assert r.dtype == dtype, (text, r.dtype)
        assert np.allclose(r.v, values, rtol=1e-15, atol=0), (text, r.v)
    # A comparison of values closer than their error bounds is flagged, an exact one is not.
    close = [Value(np.array([1.0]), 1e-7, False, "float32"), Value(np.array([1.0 + 1e-8]), 0.0,
                                                                   False, "float32")]
    assert compare(close[0], close[1], "lt").unsafe.all()
    assert not compare(close[1], close[1], "eq").unsafe.any()
    print("expr_numpy.py: self-test passed")
    return 0


def main():
    if len(sys.argv) == 2 and sys.argv[1] == "--self-test":
        return self_test()
    if len(sys.argv) != 2:
        sys.stderr.write("usage: expr_numpy.py DIR | --self-test\n")
        return 2
    directory = sys.argv[1]
    leaves = read_leaves(os.path.join(directory, "leaves.txt"))
    with open(os.path.join(directory, "trees.txt")) as f:
        trees = [line for line in f.read().split("\n") if line]
    out = []
    for text in trees:
        r = evaluate(parse(text), leaves)
        shape = r.v.shape
        e = np.broadcast_to(r.e, shape)
        unsafe = np.broadcast_to(r.unsafe, shape) | ~np.isfinite(r.v) | ~np.isfinite(e)
        out.append(" ".join([r.dtype, str(len(shape))] + [str(d) for d in shape]))
        out.append(" ".join(repr(float(v)) for v in r.v.ravel()))
        out.append(" ".join(repr(float(v)) for v in e.ravel()))
        out.append(" ".join("1" if u else "0" for u in unsafe.ravel()))
    with open(os.path.join(directory, "numpy.txt"), "w") as f:
        f.write("\n".join(out) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
