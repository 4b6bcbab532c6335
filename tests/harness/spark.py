"""Whether Spark can run here (pyspark >= 4.2, pyarrow, a Java runtime): shared by the Spark conftest and the
tests that start a pipeline of their own (a module, not the conftest: ``from conftest import`` picks whichever
folder's conftest was imported first)."""

from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess

# The tests' JVMs compile with C1 only and collect with the serial GC: a JVM's start then costs about half the
# CPU (6 s instead of 12 s measured on 2 cores: C2's compiler threads are what the start waited for), and the
# tests' micro-batches of a few thousand rows are too short for C2's code to pay back. Behaviour is the same.
TEST_SUBMIT_ARGS = "--driver-java-options '-XX:TieredStopAtLevel=1 -XX:+UseSerialGC' pyspark-shell"

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
