"""The kit's relay options are read and built by name only: a tuple unpacked by position lets two floats swap."""

from __future__ import annotations

import dataclasses

import pytest

from shmbus.adapters.bridge import RelayOptions
from shmbus.adapters.bridge.keywords import relay_options


def test_relay_options_are_built_by_name_only() -> None:
    with pytest.raises(TypeError):
        RelayOptions(True, 0.25, 1.0, 1.0, True)  # type: ignore[misc]  # by position: refused
    opts = relay_options({"election_interval": 0.5, "local_wait": 2.0})
    assert (opts.relay, opts.election_interval, opts.reconnect_max, opts.local_wait) == (True, 0.5, 1.0, 2.0)
    with pytest.raises(TypeError):
        _relay, _interval, *_ = opts  # type: ignore[misc]  # not a tuple: nothing unpacks it by position
    with pytest.raises(dataclasses.FrozenInstanceError):
        opts.relay = False  # type: ignore[misc]
