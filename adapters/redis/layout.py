"""The gem's Redis layout: key names, the global backlog's pointers, the Lua scripts.

The line ``gid|cid|chan|envelope`` and the envelope are every bridge's (the kit's ``wire``); what is here is where
Redis keeps them. Everything follows message_bus's Redis backend so a Ruby app and a Python app on one Redis share
a bus.
"""

from __future__ import annotations

import hashlib
import math
from typing import Any

from shmbus.channels import backend_name
from shmbus.codecs import Codec
from shmbus.engines import Envelope

from ..bridge.wire import encode_envelope, line_tail

__all__ = [
    "GLOBAL_BACKLOG_KEY",
    "GLOBAL_ID_KEY",
    "PUBLISH_SCRIPT",
    "PUBLISH_SHA",
    "SEAL_KEY",
    "backlog_id_key",
    "backlog_key",
    "parse_pointer",
    "script_args",
    "seal_channel",
]

GLOBAL_ID_KEY = "__mb_global_id_n"
GLOBAL_BACKLOG_KEY = "__mb_global_backlog_n"

#: The seal key (shmbus's own: the gem never reads it): a random secret a relay sets when missing (a FLUSHDB
#: drops it with the history). Whoever may read it can seal notices (see the bridge kit's ``seals``): give
#: pub/sub-only ACL users no access to it.
SEAL_KEY = "__mb_shmbus_seal"


def seal_lua(key: str, history: str, channel: str, *, run: bool) -> str:
    """Lua that PUBLISHes the seal of the lines just published as ``first|last|mac`` on the seal channel (the kit's
    ``seals.mac`` with sha1); none while the key or the history key is missing. ``run``: the Lua table ``lines``,
    ids ``first``..``gid`` (the batch script); else the one ``line``, id ``gid``, in one concatenation (a table and
    a loop cost a single publish ~2 µs more in Redis; the bytes sealed are the same). ``sh``, the history the lines
    went into ('0' after a FLUSHDB, until a relay names the new one), is returned to the publisher, which lands its
    messages on its host only in the history its segment recorded."""
    if run:
        first, body = "first", "table.concat(body)"
        prepare = """
  local body = {}
  for j = 1, #lines do
    body[j] = string.format('%d|', #lines[j]) .. lines[j]
  end"""
    else:
        first, body, prepare = "gid", "string.format('%d|', #line) .. line", ""
    return f"""
local sk = redis.call('GET', {key})
local sh = redis.call('GET', {history})
if sk and sh then{prepare}
  redis.call('PUBLISH', {channel}, string.format('%d|%d|', {first}, gid)
    .. redis.sha1hex(sk .. redis.sha1hex(sk .. sh .. '|' .. {body})))
end
"""


def seal_channel(pubsub_channel: str) -> str:
    """The pub/sub channel of the seals, next to the gem's (only shmbus relays subscribe to it)."""
    return f"{pubsub_channel}_shmbus_seals"


# Same keys, arguments and effects as the gem's LUA_PUBLISH (own text): ids, backlogs, TTLs, PUBLISH, trim.
# The differences: it returns {global_id, channel_id, history} (the gem's returns the channel id), which the bridge
# needs to store the message locally with Redis's ids; and it PUBLISHes the line's seal on the seal channel.
PUBLISH_SCRIPT = (
    """
local gid = redis.call('INCR', KEYS[1])
local cid = redis.call('INCR', KEYS[2])
local line = string.format('%d|%d|', gid, cid) .. ARGV[1]  -- not %s: Lua 5.1 cuts it at a NUL byte
local age = tonumber(ARGV[2])
local size = tonumber(ARGV[3])
local gsize = tonumber(ARGV[4])
redis.call('ZADD', KEYS[3], cid, line)
redis.call('EXPIRE', KEYS[3], age)
redis.call('ZADD', KEYS[4], gid, string.format('%d|%s', cid, ARGV[5]))
redis.call('EXPIRE', KEYS[4], age)
redis.call('PUBLISH', KEYS[5], line)
"""
    + seal_lua("KEYS[6]", "KEYS[7]", "ARGV[6]", run=False)
    + """
redis.call('EXPIRE', KEYS[2], age)
if cid > size then
  redis.call('ZREMRANGEBYSCORE', KEYS[3], 1, cid - size)
end
if gid > gsize then
  redis.call('ZREMRANGEBYSCORE', KEYS[4], 1, gid - gsize)
end
return {gid, cid, sh or '0'}
"""
)
PUBLISH_SHA = hashlib.sha1(PUBLISH_SCRIPT.encode()).hexdigest()

# The same effects for many messages in one call (the pipelined/batch path): one script run per group instead of
# one per message cuts Redis's per-call overhead. KEYS: global id, global backlog, pub/sub channel, seal key,
# history key, then per message its id key and backlog key; ARGV: n, gsize, seal channel, then per message line
# tail, age, size, backend channel.
# The global backlog is trimmed once at the end, which leaves the same set as trimming after every message. The
# group's ids are consecutive (the script is atomic): ONE seal after its last line vouches for all of them.
PUBLISH_MANY_SCRIPT = (
    """
local n = tonumber(ARGV[1])
local gsize = tonumber(ARGV[2])
local out = {}
local gid = 0
local first = 0
local lines = {}
for i = 0, n - 1 do
  local idk = KEYS[6 + 2 * i]
  local blk = KEYS[7 + 2 * i]
  local a = 4 + 4 * i
  local age = tonumber(ARGV[a + 1])
  local size = tonumber(ARGV[a + 2])
  gid = redis.call('INCR', KEYS[1])
  local cid = redis.call('INCR', idk)
  local line = string.format('%d|%d|', gid, cid) .. ARGV[a]
  redis.call('ZADD', blk, cid, line)
  redis.call('EXPIRE', blk, age)
  redis.call('ZADD', KEYS[2], gid, string.format('%d|', cid) .. ARGV[a + 3])
  redis.call('EXPIRE', KEYS[2], age)
  redis.call('PUBLISH', KEYS[3], line)
  if first == 0 then
    first = gid
  end
  lines[#lines + 1] = line
  redis.call('EXPIRE', idk, age)
  if cid > size then
    redis.call('ZREMRANGEBYSCORE', blk, 1, cid - size)
  end
  out[#out + 1] = gid
  out[#out + 1] = cid
end
if gid > gsize then
  redis.call('ZREMRANGEBYSCORE', KEYS[2], 1, gid - gsize)
end
"""
    + seal_lua("KEYS[4]", "KEYS[5]", "ARGV[3]", run=True)
    + """
out[#out + 1] = sh or '0'
return out
"""
)
PUBLISH_MANY_SHA = hashlib.sha1(PUBLISH_MANY_SCRIPT.encode()).hexdigest()


def many_script_args(single_args: list[list[Any]]) -> list[Any]:
    """EVALSHA arguments (after the sha) of PUBLISH_MANY_SCRIPT for messages given as ``script_args`` lists."""
    first = single_args[0]
    keys: list[Any] = [first[1], first[4], first[5], first[6], first[7]]
    argv: list[Any] = [len(single_args), first[11], first[13]]
    for a in single_args:
        keys += (a[2], a[3])
        argv += (a[8], a[9], a[10], a[12])
    return [len(keys), *keys, *argv]


def backlog_key(chan: str) -> str:
    return f"{BACKLOG_KEY_PREFIX}{chan}"


def backlog_id_key(chan: str) -> str:
    return f"__mb_backlog_id_n_{chan}"


def parse_pointer(member: bytes) -> tuple[int, str]:
    """A global backlog member ``cid|chan`` (channel not escaped) -> ``(cid, backend channel)``."""
    i = member.index(b"|")
    return int(member[:i]), member[i + 1 :].decode()


def script_args(env: Envelope, codec: Codec, gsize: int, pubsub_channel: str) -> list[Any]:
    """EVALSHA arguments after the sha: numkeys, the seven keys, the six arguments."""
    chan = backend_name(env.channel, env.site_id)
    age = max(1, math.ceil(env.max_backlog_age))
    return [
        7,
        GLOBAL_ID_KEY,
        backlog_id_key(chan),
        backlog_key(chan),
        GLOBAL_BACKLOG_KEY,
        pubsub_channel,
        SEAL_KEY,
        HISTORY_KEY,
        line_tail(chan, encode_envelope(codec, env.payload, env.meta)),
        age,
        max(1, env.max_backlog_size),
        max(1, gsize),
        chan,
        seal_channel(pubsub_channel),
    ]


#: The identity of the history in this Redis database (shmbus's own key: the gem never writes it). Missing after a
#: FLUSHDB or a restart without persistence, when the next relay sets a new random one: a different value than the
#: one a segment recorded means that segment holds another history.
HISTORY_KEY = "__mb_shmbus_history"
#: Get it, or set a new one; 0 (unknown) on a read-only replica that has none yet. The same for the seal key
#: (false: none). Returns {history, seal key}.
HISTORY_SCRIPT = """
local function get_or_set(key, fresh)
  local v = redis.call('GET', key)
  if v then
    return v
  end
  local ok = redis.pcall('SET', key, fresh)
  if type(ok) == 'table' and ok.err then
    return false
  end
  return fresh
end
return {get_or_set(KEYS[1], ARGV[1]) or 0, get_or_set(KEYS[2], ARGV[2])}
"""

#: The relay's read, in one round trip: the history key, the newest id, then for up to ARGV[2] global backlog
#: entries after ARGV[1]: the global id, the pointer (``cid|chan``) and the channel's line (nil once trimmed from
#: the channel). Read-only; the channel keys are derived from the pointers, as the gem's own reads do.
READ_AFTER_SCRIPT = """
local out = {redis.call('GET', KEYS[1]) or '', redis.call('GET', KEYS[2]) or '0'}
local ptrs = redis.call('ZRANGEBYSCORE', KEYS[3], '(' .. ARGV[1], '+inf', 'WITHSCORES', 'LIMIT', 0, ARGV[2])
for i = 1, #ptrs, 2 do
  local p = ptrs[i]
  local bar = string.find(p, '|', 1, true)
  local cid = string.sub(p, 1, bar - 1)
  local line = redis.call('ZRANGEBYSCORE', ARGV[3] .. string.sub(p, bar + 1), cid, cid)
  out[#out + 1] = ptrs[i + 1]
  out[#out + 1] = p
  out[#out + 1] = line[1] or ''
end
return out
"""
READ_AFTER_SHA = hashlib.sha1(READ_AFTER_SCRIPT.encode()).hexdigest()
BACKLOG_KEY_PREFIX = "__mb_backlog_n_"
