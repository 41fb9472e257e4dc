#!/usr/bin/python3
"""Writes digits.safetensors beside this script: scikit-learn's load_digits data set (1797 8x8
images of handwritten digits, the UCI "optdigits" test set, pixel values 0..16) as
"images" (uint8 [1797, 8, 8]) and "labels" (int64 [1797]), for ts::data::load_digits
(include/tessera/data/datasets.hpp). Run with Debian's python3 and python3-sklearn,
python3-numpy and the `safetensors` package (cmake/install-deps.sh --test installs them):

    /usr/bin/python3 examples/data/make_digits.py
"""

import os

import numpy as np
from safetensors.numpy import save_file
from sklearn.datasets import load_digits

digits = load_digits()
images = digits.images.astype(np.uint8)
assert (images == digits.images).all()  # whole numbers 0..16
labels = digits.target.astype(np.int64)
path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "digits.safetensors")
save_file({"images": np.ascontiguousarray(images), "labels": labels}, path,
          metadata={"source": "sklearn.datasets.load_digits (UCI optdigits test set)",
                    "license": "scikit-learn (BSD-3-Clause); data: UCI ML repository, CC BY 4.0"})
print("wrote %s: %d images" % (path, len(labels)))
