"""PyTorch helpers (import torch only when used: `swarm.torch.*`)."""
from __future__ import annotations

import warnings
from typing import Dict, Mapping

import numpy as np
import torch as _torch

from .safetensors import BF16, Raw, TensorValue


def to_state_dict(model: Mapping[str, np.ndarray],
                  dtypes: Mapping[str, str] = None) -> Dict[str, _torch.Tensor]:
    """Task tensors -> a state dict of CPU tensors sharing the arrays' memory
    (no copy; load_state_dict then copies into the module). BF16 tensors
    (raw uint16; named in `dtypes`, by default task.model.dtypes) become
    bfloat16."""
    out: Dict[str, _torch.Tensor] = {}
    if dtypes is None:
        dtypes = getattr(model, "dtypes", None)
    with warnings.catch_warnings():
        # The arrays are read-only mappings; torch warns but only reads them.
        warnings.simplefilter("ignore", UserWarning)
        for name, array in model.items():
            if isinstance(array, Raw):
                dtype, array = array.dtype, array.bits
            else:
                dtype = (dtypes or {}).get(name)
            array = np.asarray(array)
            if dtype == "BF16":
                tensor = _torch.from_numpy(array.view(np.int16)).view(
                    _torch.bfloat16)
            else:
                tensor = _torch.from_numpy(array)
            out[name] = tensor
    return out


def from_state_dict(state: Mapping[str, _torch.Tensor]
                    ) -> Dict[str, TensorValue]:
    """A state dict -> task tensors (CPU tensors are shared, not copied;
    bfloat16 goes as raw BF16 bits)."""
    out: Dict[str, TensorValue] = {}
    for name, tensor in state.items():
        tensor = tensor.detach().cpu()
        if tensor.dtype == _torch.bfloat16:
            out[name] = BF16(tensor.contiguous().view(_torch.int16).numpy()
                             .view(np.uint16))
        else:
            out[name] = tensor.contiguous().numpy()
    return out
