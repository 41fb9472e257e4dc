#!/usr/bin/env python3
"""Interoperability oracle for Tessera's safetensors checkpoints (tests/io/safetensors_test.cpp).

Uses Python's official `safetensors` package (PyPI) and numpy, never Tessera's code:

  safetensors_interop.py --self-test      the package imports, and its reader decodes the
                                           hand-written file that the C++ test expects Tessera to
                                           write byte for byte
  safetensors_interop.py check DIR        reads DIR/tessera_numpy.safetensors with
                                           safetensors.numpy.load_file and DIR/tessera_bf16.safetensors
                                           with the package's raw reader (numpy has no bfloat16;
                                           safetensors.torch is used too when torch imports) and
                                           compares every tensor, bit for bit, with the table below
  safetensors_interop.py write DIR        writes the same table with safetensors.numpy.save_file
                                           (DIR/python_numpy.safetensors) and bfloat16 tensors with
                                           the package's serializer (DIR/python_bf16.safetensors)

The table (names, dtypes, shapes and values by formula) is written independently in the C++ test;
both sides must agree. Exit status: 0 ok, 1 mismatch, 3 the package is missing.
"""
import os
import sys

try:
    import numpy as np
    import safetensors
    import safetensors.numpy as st_numpy
except ImportError as error:  # the C++ test turns exit code 3 into a failure with this text
    print(f"safetensors_interop.py: {sys.executable} cannot import numpy and Python's "
          f"'safetensors' package ({error}); run: bash cmake/install-deps.sh --test",
          file=sys.stderr)
    sys.exit(3)

METADATA = {"format": "pt", "written_by": "tessera test", "unicode": "\u00e9\u6f22\U0001F600",
            "escapes": "quote\" backslash\\ newline\n tab\t"}


def table():
    """name -> numpy array (bfloat16 arrays as uint16 bit patterns, flagged in BF16_NAMES)."""
    i = lambda n: np.arange(n, dtype=np.int64)  # noqa: E731
    t = {}
    t["f64"] = ((i(6) - 2.5) / 3.0).reshape(2, 3)
    t["f64_special"] = np.array([np.inf, -np.inf, -0.0, 5e-324, np.nan, 1.7976931348623157e308])
    t["f32"] = (((i(12) * 7) % 11 - 5) / 7.0).astype(np.float32).reshape(3, 4)
    t["f16"] = ((i(15) - 7) * 0.125).astype(np.float16).reshape(5, 3)
    t["f16_bits"] = np.array([0x0000, 0x8000, 0x0001, 0x03FF, 0x3C00, 0x7BFF, 0x7C00, 0xFC00,
                              0x7E00], dtype=np.uint16).view(np.float16)
    t["i64"] = np.array([-2**63, -1, 0, 1, 2**63 - 1], dtype=np.int64)
    t["i32"] = ((i(8) - 4) * 123456789).astype(np.int32).reshape(2, 2, 2)
    t["i16"] = np.array([-32768, -1, 0, 1, 12345, 32767], dtype=np.int16)
    t["i8"] = ((i(16) * 37) % 256 - 128).astype(np.int8).reshape(4, 4)
    t["u8"] = ((i(16) * 53) % 256).astype(np.uint8)
    t["bool"] = (i(7) % 3 == 0)
    t["scalar"] = np.array(3.25, dtype=np.float32)
    t["empty"] = np.zeros((0, 3), dtype=np.float32)
    t["empty_i64"] = np.zeros((4, 0), dtype=np.int64)
    return t


def bf16_table():
    """name -> uint16 bit patterns of bfloat16 tensors."""
    return {
        "bf16": np.array([0x0000, 0x8000, 0x3F80, 0xC000, 0x7F80, 0x0001, 0xFF80, 0x7FC0],
                         dtype=np.uint16).reshape(2, 4),
        # (i - 6) * 0.5 in bfloat16: the top 16 bits of the exact float32 values.
        "bf16_values": (((np.arange(12) - 6) * 0.5).astype(np.float32).view(np.uint32) >> 16)
        .astype(np.uint16),
    }


def same_bits(a, b):
    return a.dtype == b.dtype and a.shape == b.shape and a.tobytes() == b.tobytes()


def describe(a):
    return f"dtype {a.dtype}, shape {list(a.shape)}, values {a.reshape(-1)[:16].tolist()}"


def check(directory):
    failures = []
    expected = table()
    loaded = st_numpy.load_file(os.path.join(directory, "tessera_numpy.safetensors"))
    if set(loaded) != set(expected):
        failures.append(f"names differ: file has {sorted(loaded)}, expected {sorted(expected)}")
    for name, want in expected.items():
        got = loaded.get(name)
        if got is not None and not same_bits(got, want):
            failures.append(f"{name}: read {describe(got)}; expected {describe(want)}")
    with safetensors.safe_open(os.path.join(directory, "tessera_numpy.safetensors"),
                               framework="np") as f:
        if f.metadata() != METADATA:
            failures.append(f"metadata {f.metadata()!r}, expected {METADATA!r}")

    path = os.path.join(directory, "tessera_bf16.safetensors")
    with open(path, "rb") as f:
        raw = {name: info for name, info in safetensors.deserialize(f.read())}
    want_bf16 = bf16_table()
    if set(raw) != set(want_bf16):
        failures.append(f"bf16 names differ: {sorted(raw)} vs {sorted(want_bf16)}")
    for name, want in want_bf16.items():
        info = raw.get(name)
        if info is None:
            continue
        got = np.frombuffer(bytes(info["data"]), dtype="<u2")
        if info["dtype"] != "BF16" or list(info["shape"]) != list(want.shape) or \
                got.tolist() != want.reshape(-1).tolist():
            failures.append(f"{name}: read {info['dtype']} {info['shape']} bits "
                            f"{[hex(b) for b in got.tolist()]}; expected BF16 {list(want.shape)} "
                            f"{[hex(b) for b in want.reshape(-1).tolist()]}")
    try:
        import torch
        import safetensors.torch as st_torch
    except ImportError:
        torch = None
    if torch is not None:
        tensors = st_torch.load_file(path)
        for name, want in want_bf16.items():
            got = tensors[name]
            if got.dtype != torch.bfloat16 or \
                    got.view(torch.int16).numpy().view(np.uint16).tolist() != want.tolist():
                failures.append(f"{name}: safetensors.torch read {got}")
    for failure in failures:
        print("MISMATCH " + failure)
    print(f"check: {len(expected) + len(want_bf16)} tensors compared"
          f"{' (and with safetensors.torch)' if torch is not None else ''}; "
          f"{len(failures)} mismatches")
    return 1 if failures else 0


def serialize_bf16(tensors):
    """The package's own serializer for raw bfloat16 bytes (its API changed in 0.6)."""
    if hasattr(safetensors, "TensorSpec"):
        specs = {name: safetensors.TensorSpec(dtype="bfloat16", shape=list(bits.shape),
                                              data_ptr=bits.ctypes.data, data_len=bits.nbytes)
                 for name, bits in tensors.items()}
        return bytes(safetensors.serialize(specs, metadata=None))
    return bytes(safetensors.serialize(
        {name: {"dtype": "bfloat16", "shape": list(bits.shape), "data": bits.tobytes()}
         for name, bits in tensors.items()}, metadata=None))


def write(directory):
    st_numpy.save_file(table(), os.path.join(directory, "python_numpy.safetensors"),
                       metadata=METADATA)
    tensors = {name: np.ascontiguousarray(bits) for name, bits in bf16_table().items()}
    with open(os.path.join(directory, "python_bf16.safetensors"), "wb") as f:
        f.write(serialize_bf16(tensors))
    print(f"write: {len(table()) + len(tensors)} tensors written with safetensors "
          f"{safetensors.__version__}")
    return 0


# The file that tests/io/safetensors_test.cpp ("exact bytes") expects Tessera to write.
EXPECTED_SMALL_FILE = (
    b"\x90\x00\x00\x00\x00\x00\x00\x00"
    b'{"__metadata__":{"format":"pt"},'
    b'"w":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},'
    b'"b":{"dtype":"I8","shape":[3],"data_offsets":[8,11]}}'
    b"      "
    b"\x00\x00\x80\x3f\x00\x00\x00\xc0"
    b"\x01\xff\x7f")


def self_test():
    parsed = dict(safetensors.deserialize(EXPECTED_SMALL_FILE))
    assert set(parsed) == {"w", "b"}, parsed
    assert parsed["w"]["dtype"] == "F32" and list(parsed["w"]["shape"]) == [2]
    assert np.frombuffer(bytes(parsed["w"]["data"]), "<f4").tolist() == [1.0, -2.0]
    assert parsed["b"]["dtype"] == "I8" and list(parsed["b"]["shape"]) == [3]
    assert np.frombuffer(bytes(parsed["b"]["data"]), "i1").tolist() == [1, -1, 127]
    assert len(EXPECTED_SMALL_FILE) == 8 + 0x90 + 11 and 0x90 % 8 == 0
    # The official reader refuses a gap in the data region, as Tessera's does.
    try:
        safetensors.deserialize(EXPECTED_SMALL_FILE + b"\x00")
    except Exception:  # noqa: BLE001 - SafetensorError's module moved between versions
        pass
    else:
        raise AssertionError("the official reader accepted trailing bytes")
    print(f"self-test: safetensors {safetensors.__version__} reads the expected small file")
    return 0


def main(argv):
    if argv[1:] == ["--self-test"]:
        return self_test()
    if len(argv) == 3 and argv[1] == "check":
        return check(argv[2])
    if len(argv) == 3 and argv[1] == "write":
        return write(argv[2])
    print(__doc__, file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv))
