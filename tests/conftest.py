"""Test-session setup shared by every module."""

from __future__ import annotations

import pytest

# The modules that run a whole study (a SLURM cluster, the pipeline, the notebooks) take most of
# the suite's time. Collected first, pytest-xdist hands them out first (one module per worker,
# --dist loadfile), so the short modules fill the other workers meanwhile.
SLOW_FIRST = ("test_slurm.py", "test_pipeline.py", "test_notebooks.py", "test_report_browser.py")


def _rank(item: pytest.Item) -> int:
    name = item.path.name
    return SLOW_FIRST.index(name) if name in SLOW_FIRST else len(SLOW_FIRST)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    items.sort(key=_rank)  # stable: the order within each module stays


@pytest.fixture(scope="module")
def one_thread():
    """Tiny matmuls on a shared 2-core runner are fastest without intra-op threads."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture
def leftovers():
    """Processes the test started (proctree.Leftovers): whatever of them is still running at its
    end, passed or failed, is killed."""
    from proctree import Leftovers

    tracked = Leftovers()
    yield tracked
    tracked.kill_all()
