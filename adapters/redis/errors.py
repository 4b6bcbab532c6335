"""The Redis bridge's typed errors (apart, so the backend and the engine share them without a cycle)."""

from __future__ import annotations

from shmbus.errors import EngineError

__all__ = ["RedisBridgeError", "RedisReadOnly", "RedisUnavailable"]


class RedisBridgeError(EngineError):
    """The Redis bridge could not carry out a publish; the message was not stored."""


class RedisUnavailable(RedisBridgeError):
    """Redis could not be reached, or refused the command's bytes: the publish was not sent. (A connection lost
    once it was sent is :class:`~shmbus.errors.PublishOutcomeUnknown`.)"""


class RedisReadOnly(RedisBridgeError):
    """Redis answered READONLY: the bridge points at a replica (e.g. right after a failover)."""
