#!/usr/bin/python3
"""Independent safetensors reader for the interop test (json + numpy only).

Usage: read_safetensors.py FILE

Validates FILE against the safetensors format and prints one JSON object:
  {"data_start": int, "metadata": {...},
   "tensors": [{"name", "dtype", "shape", "data_offsets", "values"}, ...]}
with tensors in data order and values flattened in C order. Float values are
exact (every F16/BF16/F32 value is a float64); non-finite ones are the
strings "nan", "inf", "-inf". Exits 1 with a message on stderr for a bad file.
"""
import json
import math
import struct
import sys

import numpy as np

DTYPES = {
    "F64": "<f8", "F32": "<f4", "F16": "<f2", "BF16": "<u2",
    "I64": "<i8", "I32": "<i4", "I16": "<i2", "I8": "i1",
    "U64": "<u8", "U32": "<u4", "U16": "<u2", "U8": "u1", "BOOL": "u1",
}


def fail(message):
    sys.stderr.write("read_safetensors.py: %s\n" % message)
    sys.exit(1)


def no_duplicates(pairs):
    seen = {}
    for key, value in pairs:
        if key in seen:
            fail("duplicate key %r" % key)
        seen[key] = value
    return seen


def to_json_value(dtype, value):
    if dtype == "BOOL":
        return bool(value)
    if dtype in ("F64", "F32", "F16", "BF16"):
        value = float(value)
        if math.isnan(value):
            return "nan"
        if math.isinf(value):
            return "inf" if value > 0 else "-inf"
        return value
    return int(value)


def main():
    if len(sys.argv) != 2:
        fail("usage: read_safetensors.py FILE")
    with open(sys.argv[1], "rb") as f:
        blob = f.read()
    if len(blob) < 8:
        fail("file shorter than 8 bytes")
    (header_len,) = struct.unpack("<Q", blob[:8])
    if header_len > len(blob) - 8:
        fail("header length %d exceeds the file" % header_len)
    header_bytes = blob[8:8 + header_len]
    if not header_bytes.startswith(b"{"):
        fail("header does not start with '{'")
    header = json.loads(header_bytes.decode("utf-8"),
                        object_pairs_hook=no_duplicates)
    if not isinstance(header, dict):
        fail("header is not an object")
    data_start = 8 + header_len
    data = blob[data_start:]
    metadata = header.pop("__metadata__", {})
    if not isinstance(metadata, dict) or not all(
            isinstance(v, str) for v in metadata.values()):
        fail("__metadata__ is not an object of strings")

    tensors = []
    for name, entry in header.items():
        if not isinstance(entry, dict) or set(entry) != {
                "dtype", "shape", "data_offsets"}:
            fail("tensor %r: bad entry %r" % (name, entry))
        dtype, shape = entry["dtype"], entry["shape"]
        begin, end = entry["data_offsets"]
        if dtype not in DTYPES:
            fail("tensor %r: unsupported dtype %r" % (name, dtype))
        if not all(isinstance(d, int) and d >= 0 for d in shape):
            fail("tensor %r: bad shape %r" % (name, shape))
        np_dtype = np.dtype(DTYPES[dtype])
        count = int(np.prod(shape, dtype=object)) if shape else 1
        if not 0 <= begin <= end <= len(data) or \
                end - begin != count * np_dtype.itemsize:
            fail("tensor %r: bad data_offsets %r" % (name, [begin, end]))
        raw = np.frombuffer(data[begin:end], dtype=np_dtype)
        if dtype == "BF16":
            values = (raw.astype("<u4") << 16).view("<f4")
        elif dtype == "BOOL":
            if np.any(raw > 1):
                fail("tensor %r: BOOL byte other than 0 or 1" % name)
            values = raw.astype(bool)
        else:
            values = raw
        tensors.append({
            "name": name, "dtype": dtype, "shape": shape,
            "data_offsets": [begin, end],
            "values": [to_json_value(dtype, v) for v in values.tolist()],
        })

    tensors.sort(key=lambda t: (t["data_offsets"], t["name"]))
    position = 0
    for t in tensors:
        if t["data_offsets"][0] != position:
            fail("tensor %r: overlap or gap at %d" % (t["name"], position))
        position = t["data_offsets"][1]
    if position != len(data):
        fail("data section has %d bytes, tensors cover %d"
             % (len(data), position))

    json.dump({"data_start": data_start, "metadata": metadata,
               "tensors": tensors}, sys.stdout, ensure_ascii=True,
              allow_nan=False)
    sys.stdout.write("\n")


if __name__ == "__main__":
    main()
