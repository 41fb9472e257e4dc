#!/usr/bin/python3
"""scikit-learn's load_digits, the oracle of tests/data/digits_test.cpp: writes FILE with the
number of images, then the labels, then every image's 64 pixel values (row by row), one line
each. Needs Debian's python3-sklearn (cmake/install-deps.sh --test)."""

import sys

try:
    from sklearn.datasets import load_digits
except ImportError:
    sys.stderr.write("digits_sklearn.py: scikit-learn is not importable by %s; install it with "
                     "`bash cmake/install-deps.sh --test` (Debian's python3-sklearn)\n" % sys.executable)
    sys.exit(2)

digits = load_digits()
with open(sys.argv[1], "w") as out:
    out.write("%d\n" % len(digits.target))
    out.write(" ".join(str(int(v)) for v in digits.target) + "\n")
    for image in digits.images:
        out.write(" ".join(str(int(v)) for v in image.reshape(-1)) + "\n")
