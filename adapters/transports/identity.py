"""Who a transport connection is, for targeting: the middleware's lookups (same names and meaning) resolved once
per connection, from the ASGI scope (:meth:`LookupOptions.identity`) or the WSGI environ
(:meth:`LookupOptions.identity_sync`); and what it may read (``subscribe_allowed``: :meth:`LookupOptions.gate`)."""

from __future__ import annotations

import inspect
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, TypedDict

from ..asgi_support import Scope, maybe_await
from ..http import Lookups, MessageBusProtocol, Waiter
from ..http.options import presence_grace, presence_rule
from ..http.subscribe import RequestInfo, SubscribeAllowed, check_subscribe_allowed
from .gate import ChannelGate
from .validation import check_client_id

Lookup = Callable[[Any], Any]


@dataclass
class Identity:
    """Who a connection is, for targeting: resolved once per connection with the middleware's lookups."""

    client_id: str | None
    lookups: Lookups
    #: the app's ``presence`` rule and ``presence_grace`` (None: presence off), for the sink's SinkPresence
    presence: tuple[bool | tuple[str, ...], float] | None = None

    def checker(self, epoch: int) -> Waiter:
        """A :class:`~shmbus.adapters.http.Waiter` used only for its ``allowed`` check (the middleware's targeting
        rules)."""
        return Waiter(self.client_id or "", 0, self.lookups, (), True, epoch)


class LookupKeywords(TypedDict, total=False):
    """:class:`LookupOptions` as keywords, for a constructor's ``**options: Unpack[...]``."""

    user_id_lookup: Lookup | None
    group_ids_lookup: Lookup | None
    site_id_lookup: Lookup | None
    client_id_lookup: Lookup | None
    subscribe_allowed: SubscribeAllowed | None
    presence: bool | Sequence[str]
    presence_grace: float


@dataclass
class LookupOptions:
    """The middleware's lookups (same names and meaning), plus ``client_id_lookup`` (default: ``?client_id=``),
    and the middleware's ``subscribe_allowed(info, channel)`` (plain, or ``async`` on ASGI); ``presence`` and
    ``presence_grace`` as the middleware's (docs/presence.md): a connection is present on the exact channels it
    subscribes while it holds them, and ``presence_grace`` seconds after."""

    user_id_lookup: Lookup | None = None
    group_ids_lookup: Lookup | None = None
    site_id_lookup: Lookup | None = None
    client_id_lookup: Lookup | None = None
    subscribe_allowed: SubscribeAllowed | None = None
    presence: bool | Sequence[str] = False
    presence_grace: float = 5.0

    def __post_init__(self) -> None:
        self.presence = presence_rule(self.presence)
        self.presence_grace = presence_grace(self.presence_grace)
        for name in ("user_id_lookup", "group_ids_lookup", "site_id_lookup", "client_id_lookup"):
            v = getattr(self, name)
            if v is not None and not callable(v):
                raise TypeError(f"{name} must be callable, got {v!r}")
        check_subscribe_allowed(self.subscribe_allowed)

    def gate(self, identity: Identity, request: Any) -> ChannelGate | None:
        """The connection's :class:`ChannelGate` (None without ``subscribe_allowed``: every channel may be read)."""
        if self.subscribe_allowed is None:
            return None
        lookups = identity.lookups
        info = RequestInfo(request, identity.client_id, lookups.user_id, lookups.group_ids, lookups.site_id)
        return ChannelGate(self.subscribe_allowed, info)

    def _presence(self) -> tuple[bool | tuple[str, ...], float] | None:
        rule = self.presence
        return (rule if isinstance(rule, (bool, tuple)) else tuple(rule), self.presence_grace) if rule else None

    async def identity(self, scope: Scope, query: dict[str, list[str]]) -> Identity:
        if self.client_id_lookup is not None:
            cid = await maybe_await(self.client_id_lookup(scope))
        else:
            values = query.get("client_id")
            cid = values[-1] if values else None
        cid = check_client_id(cid if cid is None else str(cid))
        lookups = MessageBusProtocol.lookups(
            await maybe_await(self.user_id_lookup(scope)) if self.user_id_lookup else None,
            await maybe_await(self.group_ids_lookup(scope)) if self.group_ids_lookup else None,
            await maybe_await(self.site_id_lookup(scope)) if self.site_id_lookup else None,
        )
        return Identity(cid, lookups, self._presence())

    def identity_sync(self, environ: Any, query: dict[str, list[str]]) -> Identity:
        """:meth:`identity` for WSGI: the lookups are called with the environ and must be plain functions."""

        def call(lookup: Lookup | None) -> Any:
            if lookup is None:
                return None
            value = lookup(environ)
            if inspect.isawaitable(value):
                if inspect.iscoroutine(value):
                    value.close()
                raise TypeError(f"{lookup!r} returned an awaitable: WSGI apps need plain (not async) lookups")
            return value

        if self.client_id_lookup is not None:
            cid = call(self.client_id_lookup)
        else:
            values = query.get("client_id")
            cid = values[-1] if values else None
        cid = check_client_id(cid if cid is None else str(cid))
        lookups = MessageBusProtocol.lookups(
            call(self.user_id_lookup), call(self.group_ids_lookup), call(self.site_id_lookup)
        )
        return Identity(cid, lookups, self._presence())
