"""One SparkSession for every Spark test (starting one costs ~6 s and ~0.5 GB, so never per test).

The tests are marked ``spark`` and run in a single process (never under xdist: each worker would start its
own JVM). Without pyspark/pyarrow or a Java runtime they skip with the reason, or fail under
SHMBUS_REQUIRE_ALL=1 (``harness.skip_or_fail``).
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import pytest
from harness import skip_or_fail

_HOW = (
    "pip install -e '.[spark]' (pyspark>=4.2, pyarrow) and a Java 17+ runtime (apt-get install openjdk-17-jre-headless)"
)


def spark_problem() -> str | None:
    """Why Spark cannot run here, or None."""
    for mod in ("pyspark", "pyarrow"):
        if importlib.util.find_spec(mod) is None:
            return f"Python module {mod!r} is not installed ({_HOW})"
    import pyspark

    major, minor = (int(x) for x in pyspark.__version__.split(".")[:2])
    if (major, minor) < (4, 2):
        return f"pyspark {pyspark.__version__} is too old; the shmbus source needs >= 4.2 ({_HOW})"
    java = shutil.which("java") or (
        os.path.join(os.environ["JAVA_HOME"], "bin", "java") if os.environ.get("JAVA_HOME") else None
    )
    if not java or not os.access(java, os.X_OK):
        return f"no Java runtime: 'java' is not on PATH and JAVA_HOME is unset ({_HOW})"
    try:
        subprocess.run([java, "-version"], capture_output=True, timeout=30, check=True)
    except (OSError, subprocess.SubprocessError) as exc:
        return f"'{java} -version' failed: {exc} ({_HOW})"
    return None


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
