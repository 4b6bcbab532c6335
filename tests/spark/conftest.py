"""One SparkSession for every Spark test (starting one costs ~6 s and ~0.5 GB, so never per test).

The tests are marked ``spark`` and run in a single process (never under xdist: each worker would start its
own JVM). Without pyspark/pyarrow or a Java runtime they skip with the reason, or fail under
SHMBUS_REQUIRE_ALL=1 (``harness.skip_or_fail``).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from typing import Any

import pytest

from tests.harness import skip_or_fail
from tests.harness.spark import TEST_SUBMIT_ARGS, spark_problem

# Every JVM of these tests (this session's, and the jobs the tests start: they inherit the environment) starts
# with the test flags (see TEST_SUBMIT_ARGS); set before any JVM starts, and a PYSPARK_SUBMIT_ARGS of your own wins.
os.environ.setdefault("PYSPARK_SUBMIT_ARGS", TEST_SUBMIT_ARGS)


@pytest.fixture(scope="session")
def spark() -> Iterator[Any]:
    """A local[2] session bound to 127.0.0.1 with the UI off and the "shmbus" format registered."""
    problem = spark_problem()
    if problem:
        skip_or_fail(problem)
    os.environ["PYSPARK_PYTHON"] = sys.executable  # workers must import this interpreter's shmbus/pyarrow
    from shmbus.adapters.spark import spark_session

    session = spark_session("shmbus-tests", "local[2]")
    try:
        yield session
    finally:
        for q in session.streams.active:
            q.stop()
        session.stop()
