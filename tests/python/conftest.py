"""Fixtures for the strata Python module's tests (run by CTest as python.pytest)."""

import pytest

import strata


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
