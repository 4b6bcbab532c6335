"""Reading one sample out of the Prometheus text the metrics endpoint renders (the tests' eyes on it)."""

from __future__ import annotations


def sample(text: str, name: str) -> float:
    """The value of the first sample of metric ``name`` (with labels) in ``text``."""
    for line in text.splitlines():
        if line.startswith(name + "{"):
            return float(line.rsplit(" ", 1)[1])
    raise AssertionError(f"no {name} in {text!r}")
