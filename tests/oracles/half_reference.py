#!/usr/bin/python3
"""Reference data for tests/core/half_test.cpp, computed by numpy's float16 conversions.

Usage: half_reference.py OUTPUT_DIR. Writes little-endian raw arrays (no header):
  half_to_float.u32        float32 bits of every half bit pattern 0..65535, in order
  float_to_half.in.u32     float32 bits of the inputs ...
  float_to_half.out.u16    ... and numpy's float16 bits for each
  double_to_half.in.u64    float64 bits of the inputs ...
  double_to_half.out.u16   ... and numpy's float16 bits for each (numpy rounds float64 -> float16
                           directly, once, so this checks that Tessera does not round twice)
Run with Debian's /usr/bin/python3 (numpy); the seed is fixed so the data is reproducible.
"""

import os
import sys

import numpy as np

RANDOM_FLOATS = 200_000


def float32_neighbours(values):
    """values and the float32 values one ulp below and above each."""
    values = values.astype(np.float32)
    return np.concatenate([
        values,
        np.nextafter(values, np.float32(-np.inf)),
        np.nextafter(values, np.float32(np.inf)),
    ])


def finite_half_midpoints():
    """Midpoints between consecutive finite halves of either sign (exact in float32 and float64),
    plus 65520, the midpoint between the largest half and 2^16, where rounding goes to inf."""
    positive = np.arange(0, 0x7C00, dtype=np.uint16).view(np.float16).astype(np.float64)
    mids = (positive[:-1] + positive[1:]) / 2
    mids = np.concatenate([mids, [65520.0]])
    return np.concatenate([mids, -mids])


def float_inputs(rng):
    all_halves = np.arange(0, 65536, dtype=np.uint32).astype(np.uint16).view(np.float16)
    parts = [
        all_halves.astype(np.float32),  # round trips (NaNs included)
        float32_neighbours(finite_half_midpoints()),  # ties and their neighbours
        float32_neighbours(np.array([65504.0, 65519.0, 65520.0, 65535.0, 65536.0, 1e5, 3.0e38,
                                     2.0 ** -24, 2.0 ** -25, 2.0 ** -26, 2.0 ** -14, 1.0],
                                    dtype=np.float64)),
        np.array([0x00000000, 0x80000000, 0x7F800000, 0xFF800000, 0x7F7FFFFF, 0xFF7FFFFF,
                  0x00000001, 0x80000001, 0x007FFFFF, 0x00800000,  # float subnormals / min normal
                  0x7F800001, 0xFF800001, 0x7FC00000, 0xFFC00000, 0x7FFFFFFF, 0xFFFFFFFF,
                  0x7FA00000, 0x7F802000, 0x7FC01234, 0xFFA56789],  # NaNs with payloads
                 dtype=np.uint32).view(np.float32),
        rng.integers(0, 2 ** 32, RANDOM_FLOATS, dtype=np.uint64).astype(np.uint32).view(np.float32),
        # Random values inside half's range, where most of the rounding happens.
        (rng.choice([-1.0, 1.0], RANDOM_FLOATS) *
         np.exp2(rng.uniform(-26.0, 16.1, RANDOM_FLOATS))).astype(np.float32),
    ]
    return np.concatenate(parts).astype(np.float32)


def double_inputs(rng):
    mids = finite_half_midpoints()
    ulp_scale = np.ldexp(1.0, -30)  # far below a float ulp: a float detour would land on the tie
    parts = [
        mids,
        np.nextafter(mids, -np.inf),
        np.nextafter(mids, np.inf),
        mids * (1 + ulp_scale),
        mids * (1 - ulp_scale),
        np.array([0.0, -0.0, np.inf, -np.inf, np.nan, 1e300, -1e300, 5e-324, 65520.0,
                  65519.99999999999, 2.0 ** -25, 2.0 ** -25 * (1 + 2.0 ** -40)]),
        rng.integers(0, 2 ** 64, RANDOM_FLOATS, dtype=np.uint64).view(np.float64),
        rng.choice([-1.0, 1.0], RANDOM_FLOATS) * np.exp2(rng.uniform(-26.0, 16.1, RANDOM_FLOATS)),
    ]
    return np.concatenate(parts).astype(np.float64)


def write(directory, name, array, dtype):
    array.astype(dtype.newbyteorder("<")).tofile(os.path.join(directory, name))


def main():
    if len(sys.argv) != 2:
        sys.exit("usage: half_reference.py OUTPUT_DIR")
    directory = sys.argv[1]
    os.makedirs(directory, exist_ok=True)
    rng = np.random.default_rng(20240611)

    # numpy must round float64 -> float16 once: 1 + 2^-11 + 2^-40 is just above the tie between
    # 1 and 1 + 2^-10, but its nearest float32 is the tie itself.
    probe = np.array([1 + 2.0 ** -11 + 2.0 ** -40]).astype(np.float16).view(np.uint16)[0]
    assert probe == 0x3C01, "this numpy rounds float64 -> float16 twice; not a usable oracle"

    all_halves = np.arange(0, 65536, dtype=np.uint32).astype(np.uint16).view(np.float16)
    with np.errstate(all="ignore"):  # overflow to inf is what is being tested
        write(directory, "half_to_float.u32", all_halves.astype(np.float32).view(np.uint32),
              np.dtype(np.uint32))
        floats = float_inputs(rng)
        write(directory, "float_to_half.in.u32", floats.view(np.uint32), np.dtype(np.uint32))
        write(directory, "float_to_half.out.u16", floats.astype(np.float16).view(np.uint16),
              np.dtype(np.uint16))
        doubles = double_inputs(rng)
        write(directory, "double_to_half.in.u64", doubles.view(np.uint64), np.dtype(np.uint64))
        write(directory, "double_to_half.out.u16", doubles.astype(np.float16).view(np.uint16),
              np.dtype(np.uint16))


if __name__ == "__main__":
    main()
