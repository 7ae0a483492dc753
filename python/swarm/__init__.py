"""Swarm trainer SDK: run your own training code as a Swarm site's learner.

    import swarm
    site = swarm.connect()                    # socket from the environment
    for task in site.tasks():                 # ends when the job ends
        model.load_state_dict(swarm.torch.to_state_dict(task.model))
        task.report_validation({"accuracy": evaluate(model)})
        train(model, task.params)
        task.submit(swarm.torch.from_state_dict(model.state_dict()),
                    num_samples=len(data))

Tensors are NumPy arrays (mapped from the daemon's file without a copy);
`swarm.torch` converts to and from PyTorch state dicts when torch is
installed.
"""
try:
    from ._version import __version__  # Written by the build or pip install.
except ImportError:  # The bare source tree: no generated files.
    __version__ = "unknown"
from .errors import (AttachRefused, LinkError, ResultRejected, SwarmError,
                     TaskCancelled, TensorMismatch)
from .link import PROTOCOL_VERSION, SOCKET_ENV, Site, Task, connect
from .safetensors import BF16, Raw, bf16_to_float32, float32_to_bf16

__all__ = [
    "AttachRefused", "BF16", "LinkError", "PROTOCOL_VERSION", "Raw",
    "ResultRejected", "SOCKET_ENV", "Site", "SwarmError", "Task",
    "TaskCancelled", "TensorMismatch", "bf16_to_float32", "connect",
    "__version__", "float32_to_bf16", "torch",
]


def __getattr__(name):
    # `swarm.torch` imports torch only when used.
    if name == "torch":
        import importlib
        return importlib.import_module(".torch", __name__)
    raise AttributeError(name)
