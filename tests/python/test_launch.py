"""strata.Communicator's launches inside one process (docs/python.md, "Launching"): joining an
initialised torch.distributed (from_torch, and from_environment noticing it), the errors that
name what disagrees, and torchrun's agent store out of reach. Jobs of several processes, with a
real torchrun-like agent store, restarts and srun's variables, are CTest's
examples.torch_trainer_launch_* (tests/python/launchers.py)."""

import datetime
import os
import socket

import numpy as np
import pytest

import strata

torch = pytest.importorskip("torch")
dist = pytest.importorskip("torch.distributed")

LAUNCH = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT",
          "TORCHELASTIC_USE_AGENT_STORE", "TORCHELASTIC_RESTART_COUNT", "TORCHELASTIC_RUN_ID")


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def clean_launch(monkeypatch):
    for name in LAUNCH:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("STRATA_COMM_BACKEND", "gloo")
    yield monkeypatch


@pytest.fixture
def torch_group(clean_launch, tmp_path):
    """torch.distributed initialised as a job of one rank (a FileStore: no port)."""
    dist.init_process_group("gloo", init_method=f"file://{tmp_path}/store", rank=0, world_size=1)
    yield clean_launch
    dist.destroy_process_group()


def test_from_torch_without_torch_distributed_says_what_to_do(clean_launch):
    assert not dist.is_initialized()
    with pytest.raises(strata.FailedPreconditionError,
                       match=r"torch.distributed is not initialised in this process: call "
                             r"torch.distributed.init_process_group"):
        strata.Communicator.from_torch()


def test_from_torch_joins_torchs_job(torch_group):
    comm = strata.Communicator.from_torch(comm_timeout="20s")
    assert (comm.rank, comm.size) == (0, 1)
    assert comm.all_reduce(np.array([3.0]))[0] == 3.0
    assert "timeout 20 s" in repr(comm)
    del comm


def test_from_environment_notices_an_initialised_torch_distributed(torch_group):
    # MASTER_PORT names a port someone else holds: strata must not try to bind it (it would
    # fail with "in use"), since torch's store is the meeting point.
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        torch_group.setenv("MASTER_PORT", str(held.getsockname()[1]))
        comm = strata.Communicator.from_environment()
        assert (comm.rank, comm.size) == (0, 1)
        del comm


def test_rank_and_world_size_must_agree_with_torchs(torch_group):
    torch_group.setenv("RANK", "1")
    torch_group.setenv("WORLD_SIZE", "2")
    with pytest.raises(strata.FailedPreconditionError,
                       match=r"RANK=1 but torch.distributed says this process is rank 0 of 1"):
        strata.Communicator.from_torch()
    with pytest.raises(strata.FailedPreconditionError, match=r"RANK=1 but torch.distributed"):
        strata.Communicator.from_environment()


def test_from_torch_takes_no_launch_keywords(torch_group):
    with pytest.raises(strata.InvalidArgumentError,
                       match=r"from_torch\(rank=\.\.\.\): the job is torch.distributed's"):
        strata.Communicator.from_torch(rank=0)


def test_launch_keywords_make_a_job_of_their_own(torch_group):
    # The one-process reference of a test, beside the job torch.distributed describes.
    comm = strata.Communicator.from_environment(rank=None, world_size=None,
                                                master_addr="127.0.0.1", master_port=free_port())
    assert (comm.rank, comm.size) == (0, 1)
    del comm


def test_torchrun_agent_store_out_of_reach_is_an_error_naming_it(clean_launch):
    port = free_port()  # nothing listens there
    for name, value in (("RANK", "1"), ("WORLD_SIZE", "2"), ("MASTER_ADDR", "127.0.0.1"),
                        ("MASTER_PORT", str(port)), ("TORCHELASTIC_USE_AGENT_STORE", "True")):
        clean_launch.setenv(name, value)
    with pytest.raises(strata.Error,
                       match=rf"cannot reach torchrun's agent store at MASTER_ADDR:MASTER_PORT "
                             rf"\(127.0.0.1:{port}\)"):
        strata.Communicator.from_environment(comm_timeout="1s")


def test_torchrun_rank0_never_announced_is_an_error_naming_the_store(clean_launch):
    # The agent's store is up, but rank 0 never comes: rank 1 fails within the timeout.
    port = free_port()
    store = dist.TCPStore("127.0.0.1", port, None, True, datetime.timedelta(seconds=30),
                          wait_for_workers=False)
    for name, value in (("RANK", "1"), ("WORLD_SIZE", "2"), ("MASTER_ADDR", "127.0.0.1"),
                        ("MASTER_PORT", str(port)), ("TORCHELASTIC_USE_AGENT_STORE", "True"),
                        ("TORCHELASTIC_RUN_ID", "lonely"), ("TORCHELASTIC_RESTART_COUNT", "2")):
        clean_launch.setenv(name, value)
    with pytest.raises(strata.Error,
                       match=r"rank 1 of 2: rank 0 did not announce strata's rendezvous in "
                             rf"torchrun's agent store at 127.0.0.1:{port} under "
                             r"'strata/rendezvous/lonely/attempt_2/0' within STRATA_COMM_TIMEOUT"):
        strata.Communicator.from_environment(comm_timeout="1s")
    del store
