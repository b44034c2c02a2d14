"""Fixtures for the strata Python module's tests (run by CTest as python.pytest)."""

import os
import socket

import pytest

import strata


# STRATA_TEST_NO_SKIP=1 (as for the C++ tests, tests/skip.h): a run on a machine that must run
# everything (a GPU box with NCCL), where every skipped test or module fails instead, naming why
# it could not run. CI does not set it.
def skips_fail():
    return os.environ.get("STRATA_TEST_NO_SKIP", "") not in ("", "0")


def _fail_a_skip(report):
    if not skips_fail() or not report.skipped or hasattr(report, "wasxfail"):
        return
    why = report.longrepr[2] if isinstance(report.longrepr, tuple) else str(report.longrepr)
    report.outcome = "failed"
    report.longrepr = f"could not run, and STRATA_TEST_NO_SKIP makes that a failure: {why}"


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    _fail_a_skip(outcome.get_result())


@pytest.hookimpl(hookwrapper=True)
def pytest_make_collect_report(collector):
    outcome = yield
    _fail_a_skip(outcome.get_result())


def free_port():
    """A loopback TCP port that was free a moment ago."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def solo_communicator(runtime=None):
    """A job of one rank whatever the environment says, its rendezvous on a free port (tests
    running at once must not meet on MASTER_PORT's default)."""
    return strata.Communicator.from_environment(
        runtime, rank=None, world_size=None, local_rank=None, master_addr="127.0.0.1",
        master_port=free_port(), comm_backend="gloo", comm_timeout="60s")


@pytest.fixture
def nvme_dir(tmp_path):
    path = tmp_path / "nvme"
    path.mkdir()
    return path


@pytest.fixture
def runtime(nvme_dir):
    """A small host-backend runtime with an NVMe tier in a temporary directory."""
    return strata.Runtime(backend="host", gpu_bytes="32MiB", cpu_bytes="32MiB",
                          nvme_paths=[str(nvme_dir)], nvme_bytes="64MiB",
                          staging_bytes="8MiB")


@pytest.fixture
def comm(runtime):
    """A one-rank communicator on the runtime's device."""
    return solo_communicator(runtime)
