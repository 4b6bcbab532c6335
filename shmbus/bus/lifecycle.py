"""The bus's life in this process (:class:`BusLifecycle`, the base of :class:`~.core.Bus`): turned off and on,
re-armed after fork, reset, closed, destroyed. Each step tells the parts the bus owns, in the order they need."""

from __future__ import annotations

from ..metrics import Metrics
from ..perprocess import Birth
from ..presence import stop_hub
from .attachment import Attachment
from .engine_table import EngineTable
from .listener import Listener
from .names import Names
from .publishing import Publisher
from .subscribing import Subscriber
from .subscriptions import SubscriptionTable

__all__ = ["BusLifecycle"]


class BusLifecycle:
    """Off/on, fork, reset, close and destroy of a bus (the parts are the :class:`~.core.Bus`'s: it builds them)."""

    _birth: Birth
    _attachment: Attachment
    _names: Names
    _publisher: Publisher
    _subscriber: Subscriber
    engines: EngineTable
    subscriptions: SubscriptionTable
    metrics: Metrics
    listener: Listener

    @property
    def is_off(self) -> bool:
        return self._subscriber.off

    def off(self, disable_publish: bool = True) -> None:
        """Stop new subscriptions and, by default, turn ``publish`` into a no-op (returns None)."""
        self._subscriber.off = True
        self._publisher.off = disable_publish

    def on(self) -> None:
        """Undo ``off()``, ``close()`` and ``destroy()`` (the next use attaches again, creating the bus if needed)."""
        self._subscriber.off = False
        self._publisher.off = False
        self._attachment.reopen()

    def after_fork(self) -> None:
        """Re-arm this bus in a forked child: a new listener thread (threads do not survive fork), a process-
        table slot of its own, fresh locks. Called automatically (``os.register_at_fork``); idempotent."""
        if self._birth.here:
            return
        self._birth.renew()
        self.subscriptions.after_fork()
        self.listener.after_fork()
        self.metrics.after_fork()
        self._attachment.after_fork()
        self.engines.after_fork()
        if self._attachment.current is not None and self.subscriptions:
            self.listener.ensure()

    def reset(self) -> int:
        """Empty the bus for every process and give it a new epoch (clients re-read from the start); returns
        the epoch. The iodine draft's ``reset(engine)`` is :meth:`~shmbus.Bus.reset_engine`."""
        epoch = self._attachment.segment.reset()
        self._names.forget_channels()
        return epoch

    def stop_listener(self, timeout: float = 5.0) -> None:
        """Stop this process's listener thread and wait for it (a clean shutdown)."""
        self.listener.stop(timeout)

    def close(self) -> None:
        """Detach this process: stop the listener, close engines, unmap the segment (others keep it).

        Afterwards every operation that needs the segment raises :class:`~shmbus.errors.BusClosed` (it used to
        re-attach silently) until :meth:`on` is called.
        """
        stop_hub(self)
        self._attachment.closed = True
        self.listener.stop()
        self.metrics.flush()  # the last figures stay in the slot (host totals count them)
        self.engines.close()
        self._attachment.detach()
        self._publisher.rearm()

    def destroy(self) -> None:
        """Close and remove the segment itself (all history, for every process). Idempotent; for tests and
        for tearing a bus down for good."""
        self.close()
        self._attachment.destroy()
