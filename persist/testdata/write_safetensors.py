#!/usr/bin/python3
"""Independent safetensors writer for the interop test (json + numpy only).

Usage: write_safetensors.py FILE

Writes the fixed tensors below; safetensors_interop_test.cc expects exactly
these values. The data section is laid out in the reverse of the header's key
order, to check that readers go by data_offsets.
"""
import json
import struct
import sys

import numpy as np


def tensors():
    big = np.arange(1000, dtype="<f4") * np.float32(0.25) - np.float32(100)
    return [
        ("f32", "F32", np.array([[1.5, -0.0, np.inf], [-np.inf, 1e-40,
                                  3.4028235e38]], dtype="<f4")),
        ("f32_nan", "F32",
         np.array([0x7FC00001, 0xFFC00000], dtype="<u4").view("<f4")),
        ("f16", "F16", np.array([1.0, -2.0, 65504.0, 2.0**-24, -0.0],
                                dtype="<f2")),
        ("f64", "F64", np.array([[np.pi, -1e308], [5e-324, 0.1]],
                                dtype="<f8")),
        ("i64", "I64", np.array([-2**63, 2**63 - 1, 0, -1], dtype="<i8")),
        ("i32", "I32", np.array([[1, -2, 3], [2**31 - 1, -2**31, 0]],
                                dtype="<i4")),
        ("u8", "U8", np.array([0, 255, 7], dtype="u1")),
        ("bool", "BOOL", np.array([True, False, True, True], dtype="?")),
        # NumPy has no bfloat16: the raw bits, labelled BF16.
        ("bf16", "BF16", np.array([0x3F80, 0xC000, 0x7F80, 0x0001],
                                  dtype="<u2")),
        ("scalar", "F32", np.array(2.5, dtype="<f4")),
        ("empty", "F32", np.zeros((0, 3), dtype="<f4")),
        ("w\u00e9ight.big", "F32", big.reshape(10, 100)),
    ]


def main():
    if len(sys.argv) != 2:
        sys.exit("usage: write_safetensors.py FILE")
    items = tensors()
    header = {"__metadata__": {"job": "interop", "round": "3",
                               "note": "\u00fcn\u00efcode \u2713"}}
    for name, dtype, array in items:
        header[name] = {"dtype": dtype, "shape": list(array.shape)}
    data = b""
    for name, dtype, array in reversed(items):
        raw = np.ascontiguousarray(array).tobytes()
        header[name]["data_offsets"] = [len(data), len(data) + len(raw)]
        data += raw
    text = json.dumps(header, ensure_ascii=False,
                      separators=(",", ":")).encode("utf-8")
    text += b" " * (-len(text) % 8)
    with open(sys.argv[1], "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text + data)


if __name__ == "__main__":
    main()
