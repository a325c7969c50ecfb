"""One fuzz worker process per test process, shared by every fuzz test in it."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.fuzz.pool import Worker


@pytest.fixture(scope="session")
def fuzz_worker() -> Iterator[Worker]:
    worker = Worker()
    yield worker
    worker.stop()
