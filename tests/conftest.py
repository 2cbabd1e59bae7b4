"""Suite-wide fixtures."""

from __future__ import annotations

import gc
from collections.abc import Iterator

import pytest


@pytest.fixture(autouse=True, scope="module")
def _collect_garbage_after_each_file() -> Iterator[None]:
    """Collect what a test file left to the garbage collector before the next file runs.

    A Jupyter client's zmq sockets warn when the collector closes them. Under pytest-xdist
    (``--dist loadfile``) any file may follow any other in a worker, and a file that turns
    warnings into errors (``filterwarnings("error")``) would fail on another file's
    leftovers; collected here, they warn under the file that made them.
    """
    yield
    gc.collect()
