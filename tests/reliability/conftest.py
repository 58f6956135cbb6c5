"""The reliability tests' fixtures."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.conftest import forget_delta_logs


@pytest.fixture(autouse=True)
def _forget_each_tests_delta_logs() -> Iterator[None]:
    """After each test, not only each module: a soak runs hundreds of cases of one module,
    each on new lakes. Without it, ``SESSIONLAKE_TEST_SEEDS=0-300`` of the random streams
    had the JVM's heap full by its 120th case, with 731 full collections taking 1,663 s."""
    yield
    forget_delta_logs()
