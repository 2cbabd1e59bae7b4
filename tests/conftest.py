"""Suite-wide settings and fixtures."""

from __future__ import annotations

import gc
import os
from collections.abc import Iterator

import pytest

# One CPU thread per process for torch (and numpy's BLAS), set before any test module imports
# them and inherited by every subprocess and notebook kernel the tests start. pytest-xdist
# already runs one worker per core; a second thread each only contends, and on a busy 2-core
# machine torch's waiting threads made a tiny model's forward passes up to 75x slower (chapter
# 07's grading cases took 6.9 s with two threads and 0.09 s with one). A value already set
# in the environment wins.
os.environ.setdefault("OMP_NUM_THREADS", "1")


@pytest.fixture(autouse=True, scope="module")
def _collect_garbage_after_each_file() -> Iterator[None]:
    """Collect what a test file left to the garbage collector before the next file runs.

    A Jupyter client's zmq sockets warn when the collector closes them. Under pytest-xdist
    (``--dist loadfile``) any file may follow any other in a worker, and a file that turns
    warnings into errors (``filterwarnings("error")``) would fail on another file's
    leftovers; collected here, they warn under the file that made them.

    What survives is then frozen (``gc.freeze``): the modules, caches and fixtures a worker
    keeps all session. Each later collection, this one's and the interpreter's own, scans only
    what was made since, not the half million objects that torch and the rest brought: a
    whole collection took about 0.7 s after every file on a busy machine.
    """
    yield
    gc.collect()
    gc.freeze()


def pytest_sessionfinish() -> None:
    """Unfreeze (see above) so that the interpreter's last collection at exit frees it all:
    frozen, Triton's nanobind objects would be reported as leaked."""
    gc.unfreeze()
