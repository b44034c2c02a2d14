"""How strata.Communicator meets the rest of its job when something else owns the meeting
point (docs/python.md, "Launching"):

  - torchrun: its agent serves a torch TCPStore on MASTER_ADDR:MASTER_PORT for the job's life
    and says so with TORCHELASTIC_USE_AGENT_STORE=True. strata connects to that store as a
    client (agent_store) instead of binding the port.
  - an initialised torch.distributed (init_process_group already called by the script):
    strata uses its default store (torch_process_group), and torch's rank and world size.

Either way strata's rank 0 serves strata's own rendezvous on a free port and announces it in
that store; the C++ side does the rest (include/strata/comm/launcher_store.h). torch is never
imported here unless the launch needs it: a process without torch.distributed imported has no
process group, and a torchrun worker has torch."""

from __future__ import annotations

import datetime
import os
import sys


def _host_of(store):
    """The host of a TCPStore under any PrefixStores, or None (a FileStore, a HashStore)."""
    seen = 0
    while store is not None and seen < 16:
        host = getattr(store, "host", None)
        if isinstance(host, str) and host:
            return host
        store = getattr(store, "underlying_store", None)
        seen += 1
    return None


def torch_process_group():
    """(store, rank, world_size, backend, host) of torch.distributed's default process group
    when this process has initialised it, else None. `host`: where the ranks reach each other
    (MASTER_ADDR, else the host of torch's TCPStore, else 127.0.0.1)."""
    dist = sys.modules.get("torch.distributed")
    if dist is None or not dist.is_available() or not dist.is_initialized():
        return None
    from torch.distributed import distributed_c10d

    store = distributed_c10d._get_default_store()
    host = os.environ.get("MASTER_ADDR") or _host_of(store) or "127.0.0.1"
    return store, dist.get_rank(), dist.get_world_size(), str(dist.get_backend()), host


def agent_store(host: str, port: int, timeout_ms: int):
    """A client of torchrun's agent store at host:port (the torch TCPStore the agent serves)."""
    try:
        from torch.distributed import TCPStore
    except ImportError as e:
        raise RuntimeError(
            f"TORCHELASTIC_USE_AGENT_STORE=True: torchrun's agent serves a torch TCPStore on "
            f"MASTER_ADDR:MASTER_PORT ({host}:{port}), and strata joins the job through it with "
            f"torch's client, but torch.distributed does not import here ({e}): run the trainer "
            f"with the Python that has torch, or launch with strata-run") from None
    timeout = datetime.timedelta(milliseconds=timeout_ms)
    try:
        return TCPStore(host, port, None, False, timeout, wait_for_workers=False)
    except Exception as e:  # torch's words: a refused or timed-out connection
        raise RuntimeError(
            f"TORCHELASTIC_USE_AGENT_STORE=True: cannot reach torchrun's agent store at "
            f"MASTER_ADDR:MASTER_PORT ({host}:{port}) within STRATA_COMM_TIMEOUT: {e}") from None
