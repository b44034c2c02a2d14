"""strata: a heterogeneous memory runtime for deep-learning training.

    import strata
    rt = strata.Runtime(backend="host", gpu_bytes="64MiB")   # STRATA_* variables, overridden
    t = rt.create("w", (1024, 1024), "float32", home="nvme")
    with t.acquire("gpu", "w") as view:                     # zero-copy DLPack view
        torch.from_dlpack(view).fill_(1.0)                  # views must not outlive the block
    rt.stats()                                              # a dict

strata.torch (imported on first use, it imports torch) puts an nn.Module's parameters in
strata and trains it with the ZeRO-Offload optimizer. strata.Communicator and strata.ZeroEngine
train data-parallel over several ranks (ZeRO-DP stages 1 and 2). See docs/python.md.
"""



def _add_torch_nccl_to_search_path():
    """Appends the lib/ directories of torch's NCCL wheel (nvidia-nccl-cu*) found on sys.path
    to STRATA_NCCL_SEARCH_PATH, without importing torch, so that strata loads the NCCL torch
    uses. The C++ loader reads the variable when NCCL is first needed (docs/comm.md)."""
    import os
    import sys

    name = "STRATA_NCCL_SEARCH_PATH"
    dirs = [d for d in os.environ.get(name, "").split(":") if d]
    for entry in sys.path:
        lib = os.path.join(entry or os.getcwd(), "nvidia", "nccl", "lib")
        if os.path.isfile(os.path.join(lib, "libnccl.so.2")) and lib not in dirs:
            dirs.append(lib)
    if dirs:
        os.environ[name] = ":".join(dirs)


_add_torch_nccl_to_search_path()
del _add_torch_nccl_to_search_path

from ._strata import (  # noqa: F401
    Acquisition,
    ActivationStash,
    AlreadyExistsError,
    Communicator,
    Error,
    FailedPreconditionError,
    InvalidArgumentError,
    NotFoundError,
    OffloadOptimizer,
    ResourceExhaustedError,
    Runtime,
    Tensor,
    ZeroEngine,
    parse_size,
)
from ._strata import (  # noqa: F401
    AdamGroup,
    LossScaling,
    OffloadOptimizerOptions,
    OverlapOptions,
    ZeroOptions,
)


# KeyError quotes its message (repr) in str(); strata's NotFoundError reads like the others.
NotFoundError.__str__ = Exception.__str__

__all__ = [
    "Acquisition",
    "ActivationStash",
    "AlreadyExistsError",
    "Communicator",
    "Error",
    "FailedPreconditionError",
    "InvalidArgumentError",
    "NotFoundError",
    "OffloadOptimizer",
    "ResourceExhaustedError",
    "Runtime",
    "Tensor",
    "ZeroEngine",
    "parse_size",
    "AdamGroup",
    "LossScaling",
    "OffloadOptimizerOptions",
    "OverlapOptions",
    "ZeroOptions",
    "torch",
]


def __getattr__(name):
    # `strata.torch` without importing torch when only the core is used.
    if name == "torch":
        import importlib

        module = importlib.import_module(".torch", __name__)
        globals()["torch"] = module
        return module
    raise AttributeError(f"module 'strata' has no attribute {name!r}")
