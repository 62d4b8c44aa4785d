"""Shared fixtures: one Ray instance per test session (ray.init takes seconds)."""

from __future__ import annotations

import os

import pytest
import torch

os.environ.setdefault("RAY_DEDUP_LOGS", "0")
os.environ.setdefault("RAY_ENABLE_UV_RUN_RUNTIME_ENV", "0")
# Ray instances of the tests bind to loopback (127.0.0.1), never to the host's network address; the
# two-node cluster test builds its nodes with ray.cluster_utils, which needs no multi-node CLI.
os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
# cuBLAS runs deterministically only with a fixed workspace, set before its first handle: the CUDA gradient
# tests (tests/test_apply.py: Case) turn deterministic algorithms on.
os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")


@pytest.fixture(autouse=True, scope="session")
def one_thread():
    """Measurements in tests run on one intra-op thread: on a shared 2-core machine a second
    OpenMP thread waits for a busy core and a 20 ms step can take a second."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="session")
def ray_session():
    import ray

    # A failed FSDP rank's partners get 10 s, not 30, to answer (tests/test_faults.py waits for it twice); the
    # session's Ray workers inherit this environment.
    os.environ.setdefault("CKPT_SEARCH_RANK_GRACE_S", "10")
    if not ray.is_initialized():
        ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False, ignore_reinit_error=True)
    yield ray
    ray.shutdown()


def pytest_collection_modifyitems(config, items):
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs CUDA")
    for item in items:
        if item.get_closest_marker("gpu"):  # the marker, not a keyword: a folder named gpu is no GPU test
            item.add_marker(skip)
