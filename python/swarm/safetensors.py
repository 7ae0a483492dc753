"""Minimal safetensors reading (memory-mapped, no copy) and writing with NumPy.

Format: 8-byte little-endian header length N, N bytes of JSON
({name: {"dtype", "shape", "data_offsets"}, "__metadata__": {...}}), then the
raw little-endian tensor bytes.

Dtypes map to NumPy as F64/F32/F16 -> float64/float32/float16, I8..I64,
U8..U64, BOOL -> bool. BF16 has no NumPy dtype: it is read and written as raw
uint16 (see `bf16_to_float32` / `float32_to_bf16`); F8 types as raw uint8.
"""
from __future__ import annotations

import json
import os
import struct
from typing import Dict, Mapping, Optional, Tuple, Union

import numpy as np

_NUMPY = {
    "F64": np.float64, "F32": np.float32, "F16": np.float16,
    "I64": np.int64, "I32": np.int32, "I16": np.int16, "I8": np.int8,
    "U64": np.uint64, "U32": np.uint32, "U16": np.uint16, "U8": np.uint8,
    "BOOL": np.bool_,
    # No NumPy type: raw bits.
    "BF16": np.uint16, "F8_E4M3": np.uint8, "F8_E5M2": np.uint8,
}
_FROM_NUMPY = {
    np.dtype(np.float64): "F64", np.dtype(np.float32): "F32",
    np.dtype(np.float16): "F16", np.dtype(np.int64): "I64",
    np.dtype(np.int32): "I32", np.dtype(np.int16): "I16",
    np.dtype(np.int8): "I8", np.dtype(np.uint64): "U64",
    np.dtype(np.uint32): "U32", np.dtype(np.uint16): "U16",
    np.dtype(np.uint8): "U8", np.dtype(np.bool_): "BOOL",
}


class Raw:
    """A tensor whose dtype NumPy lacks (e.g. BF16): `bits` holds the raw
    little-endian elements (uint16 for BF16)."""

    def __init__(self, dtype: str, bits: np.ndarray):
        if dtype not in _NUMPY:
            raise ValueError(f"unknown safetensors dtype {dtype!r}")
        self.dtype = dtype
        self.bits = np.asarray(bits, dtype=_NUMPY[dtype])

    @property
    def shape(self) -> Tuple[int, ...]:
        return tuple(self.bits.shape)


def BF16(bits: np.ndarray) -> Raw:
    """Marks a uint16 array as BF16 bits."""
    return Raw("BF16", bits)


def bf16_to_float32(bits: np.ndarray) -> np.ndarray:
    """BF16 bits (uint16) -> float32 (exact)."""
    return (np.asarray(bits, dtype=np.uint16).astype(np.uint32) << 16).view(
        np.float32)


def float32_to_bf16(values: np.ndarray) -> np.ndarray:
    """float32 -> BF16 bits (uint16), rounded to nearest even; NaN stays NaN."""
    v = np.ascontiguousarray(values, dtype=np.float32).view(np.uint32)
    rounded = v + (0x7FFF + ((v >> 16) & 1))
    out = (rounded >> 16).astype(np.uint16)
    nan = np.isnan(np.asarray(values, dtype=np.float32))
    out[nan] = ((v[nan] >> 16) | 0x40).astype(np.uint16)
    return out


TensorValue = Union[np.ndarray, Raw]


def read(path: str) -> Tuple[Dict[str, np.ndarray], Dict[str, str],
                             Dict[str, str]]:
    """Maps `path` read-only. Returns (arrays, dtypes, metadata): each array is
    a read-only view of the mapping (no copy), in file order."""
    with open(path, "rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(n))
    metadata = header.pop("__metadata__", {}) or {}
    start = 8 + n
    size = os.path.getsize(path)
    mapped = (np.memmap(path, dtype=np.uint8, mode="r")
              if size > start else np.zeros(1, np.uint8))
    arrays: Dict[str, np.ndarray] = {}
    dtypes: Dict[str, str] = {}
    for name, info in sorted(header.items(),
                             key=lambda kv: kv[1]["data_offsets"][0]):
        begin, end = info["data_offsets"]
        dtype = _NUMPY[info["dtype"]]
        array = np.ndarray(tuple(info["shape"]), dtype=dtype, buffer=mapped,
                           offset=start + begin)
        if array.nbytes != end - begin:
            raise ValueError(f"{path}: tensor {name!r}: data_offsets do not "
                             f"match its shape and dtype")
        array.flags.writeable = False
        arrays[name] = array
        dtypes[name] = info["dtype"]
    return arrays, dtypes, metadata


def dtype_of(value: TensorValue) -> str:
    if isinstance(value, Raw):
        return value.dtype
    dtype = np.asarray(value).dtype
    if dtype not in _FROM_NUMPY:
        raise TypeError(f"NumPy dtype {dtype} has no safetensors equivalent")
    return _FROM_NUMPY[dtype]


def write(path: str, tensors: Mapping[str, TensorValue],
          dtypes: Optional[Mapping[str, str]] = None,
          metadata: Optional[Mapping[str, str]] = None) -> None:
    """Writes `tensors` (in mapping order) to `path`: one copy of the data,
    straight from each array into the file (never converted). `dtypes` may
    name the safetensors dtype of raw arrays (e.g. "BF16" for a uint16
    array)."""
    header: Dict[str, object] = {}
    blocks = []
    offset = 0
    for name, value in tensors.items():
        if isinstance(value, Raw):
            dtype, array = value.dtype, value.bits
        else:
            array = np.asarray(value)
            dtype = dtype_of(array)
            named = (dtypes or {}).get(name)
            if named and named != dtype and \
                    np.dtype(_NUMPY[named]) == array.dtype:
                dtype = named  # Raw bits (e.g. uint16 for a BF16 tensor).
        if not array.flags.c_contiguous:  # (ascontiguousarray makes 0-d 1-d)
            array = array.copy(order="C")
        if array.dtype.byteorder == ">":
            array = array.astype(array.dtype.newbyteorder("<"))
        nbytes = array.nbytes
        header[name] = {"dtype": dtype, "shape": list(array.shape),
                        "data_offsets": [offset, offset + nbytes]}
        blocks.append(array)
        offset += nbytes
    if metadata:
        header["__metadata__"] = {str(k): str(v) for k, v in metadata.items()}
    encoded = json.dumps(header, separators=(",", ":")).encode()
    encoded += b" " * ((8 - (8 + len(encoded)) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(encoded)))
        f.write(encoded)
        for array in blocks:
            if array.size:
                f.write(memoryview(array.reshape(-1)).cast("B"))
