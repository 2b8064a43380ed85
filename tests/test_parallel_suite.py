"""How ``make test`` runs the suite in parallel (pytest-xdist, ``--dist loadgroup``): the units
handed out whole, and what each worker sees (tests/conftest.py)."""

from __future__ import annotations

import os

import pytest
import torch

RAY_MODULES = ("tests/bench/test_distributed.py", "tests/measure/test_ray_executor.py")


def _starts_the_cluster(item) -> bool:
    """Whether the test calls ``ray_cluster.two_types`` itself (imported at module level or in the test)."""
    code = getattr(getattr(item, "obj", None), "__code__", None)
    return code is not None and "two_types" in code.co_names


def _group(item) -> str:
    mark = item.get_closest_marker("xdist_group")
    assert mark is not None, f"{item.nodeid} has no unit"
    return mark.args[0]


def test_every_test_belongs_to_one_unit_and_shared_set_ups_stay_together(request):
    items = request.session.items
    assert request.node in items
    for item in items:
        module = item.nodeid.split("::", 1)[0].split("@", 1)[0]
        group = _group(item)
        if module.startswith("tests/realmodels/"):
            assert group == "tests/realmodels/", item.nodeid
        elif module.startswith("tests/pipelines/"):
            assert group == "tests/pipelines/", item.nodeid
        elif module in RAY_MODULES:
            assert group == "ray-cluster", item.nodeid
        elif not _starts_the_cluster(item):
            assert group == module, item.nodeid
    assert _group(request.node) == "tests/test_parallel_suite.py"


def test_a_test_that_starts_the_ray_cluster_runs_with_the_others_that_use_it(request):
    from ray_cluster import ON_THE_CLUSTER

    for item in filter(_starts_the_cluster, request.session.items):
        assert _group(item) == ON_THE_CLUSTER.args[0], f"{item.nodeid} starts the cluster outside its unit"


def test_a_worker_sees_the_terminal_variables_of_the_suite_and_its_share_of_the_cores(request):
    worker = getattr(request.config, "workerinput", None)
    if worker is None:
        pytest.skip("not a pytest-xdist worker (make test runs the suite with -n logical)")
    for name, value in worker["terminal_variables"].items():
        assert os.environ.get(name) == value, name  # not readline's COLUMNS=80 inherited by the worker
    assert torch.get_num_threads() == max(1, (os.cpu_count() or 1) // int(worker["workercount"]))
