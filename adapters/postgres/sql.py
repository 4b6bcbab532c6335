"""The gem's PostgreSQL storage, as SQL text: its table, its indexes, its statements, and the two server-side
procedures shmbus publishes through (they perform the gem's publish statements in one round trip).

No psycopg here, so the format can be read (and tested) alone. The value column holds the gem's envelope
(``{"data":..,"user_ids":..,"group_ids":..,"client_ids":..}``, the bridge kit's ``wire.encode_envelope``), the
channel column the site-suffixed backend name, and ``pg_notify`` carries the gem's line
``<id>|<id>|<channel>|<value>`` (a channel's ``|`` escaped as ``$$123$$``).
"""

from __future__ import annotations

__all__ = [
    "CREATE_MANY_PROCEDURE",
    "CREATE_PROCEDURE",
    "CREATE_SEAL_KEY",
    "CREATE_TABLE",
    "CREATE_TRIMMED",
    "SELECT_GONE_UPTO",
    "SELECT_HISTORY",
    "DEFAULT_NOTIFY_CHANNEL",
    "INSERT_SEAL_KEY",
    "NOTIFY_LIMIT",
    "PUBLISH",
    "PUBLISH_MANY",
    "SELECT_AFTER",
    "SELECT_PAGE",
    "SELECT_CHANNEL_NEWEST",
    "SELECT_HELD",
    "SELECT_REWRITE",
    "SELECT_SEAL_KEY",
    "SEAL_SUFFIX",
    "SELECT_WRITERS",
    "TRIM_CHANNEL",
    "TRIM_EXPIRE",
    "TRIM_GLOBAL",
]

#: The gem's LISTEN/NOTIFY channel: ``_message_bus_<db>`` with its ``db`` option (0 by default).
DEFAULT_NOTIFY_CHANNEL = "_message_bus_0"
#: PostgreSQL refuses NOTIFY payloads of 8000 bytes or more: longer lines go out as ``<id>|<id>|<channel>|``
#: (no value) and listeners read the row.
NOTIFY_LIMIT = 8000

# The gem's create_table, word for word in effect: the table, the CHECK, both index names.
CREATE_TABLE = (
    "CREATE TABLE IF NOT EXISTS message_bus (id bigserial PRIMARY KEY, channel text NOT NULL, "
    "value text NOT NULL CHECK (octet_length(value) >= 2), added_at timestamp DEFAULT CURRENT_TIMESTAMP NOT NULL)",
    "CREATE INDEX IF NOT EXISTS table_channel_id_index ON message_bus (channel, id)",
    "CREATE INDEX IF NOT EXISTS table_added_at_index ON message_bus (added_at)",
)

#: The seal key (shmbus's own table, one row): a random secret. Tables get no grants to other roles, so only the
#: owner (the role that created the bus's tables), superusers and roles granted SELECT read it: they can seal
#: notices (see the bridge kit's ``seals``); a role with CONNECT only can notify, not seal.
CREATE_SEAL_KEY = (
    "CREATE TABLE IF NOT EXISTS shmbus_seal_key (one boolean PRIMARY KEY DEFAULT true CHECK (one), key text NOT NULL)",
    "REVOKE ALL ON shmbus_seal_key FROM PUBLIC",
)
INSERT_SEAL_KEY = "INSERT INTO shmbus_seal_key (one, key) VALUES (true, %s) ON CONFLICT (one) DO NOTHING"
SELECT_SEAL_KEY = "SELECT key FROM shmbus_seal_key"
#: The seal channel of a notify channel (PostgreSQL channel names have at most 63 bytes: longer, no seals).
SEAL_SUFFIX = "_shmbus_seals"

# The procedures' seal of a run of lines (consecutive ids ``seal_first``..``{last}``, each short enough to carry its
# value; ``seal_body`` holds each as ``len|line``), after their notices: ``first|last|mac`` on the seal channel,
# mac as the kit's ``seals.mac`` with sha256 and the table's history identity. Never an error after the COMMIT (the
# client would take the publish for failed): no key table, no privilege or a long channel name only mean no seal.
_SEAL_READ = """
  seal_ch := p_notify || '{suffix}';
  IF octet_length(seal_ch) <= 63 AND has_table_privilege(to_regclass('shmbus_seal_key'), 'SELECT') THEN
    SELECT key INTO seal_k FROM shmbus_seal_key;
    seal_h := ((((('message_bus'::regclass)::oid)::bigint << 31)
      # pg_relation_filenode('message_bus'::regclass)::bigint) & 9223372036854775807)::text;
  END IF;
""".replace("{suffix}", SEAL_SUFFIX)
_SEAL_RUN = """
      IF seal_k IS NOT NULL AND seal_body <> '' THEN
        PERFORM pg_notify(seal_ch, seal_first || '|' || {last} || '|' || encode(sha256(convert_to(seal_k
          || encode(sha256(convert_to(seal_k || seal_h || '|' || seal_body, 'UTF8')), 'hex'), 'UTF8')), 'hex'));
      END IF;
      seal_body := '';
"""
_SEAL_DECLARE = "seal_ch text; seal_k text; seal_h text; seal_first bigint; seal_body text := '';"

# One call = the gem's publish, in its order: INSERT ... RETURNING id, COMMIT, then pg_notify of its line in a
# transaction of its own (a procedure, so both take one round trip; PostgreSQL 11 or later). The split matters for
# throughput: a transaction that notifies holds PostgreSQL's cluster-wide notify lock from its pre-commit to its
# end, so an insert and its notice in one transaction serialise every publisher through the WAL flush (no group
# commit); the notice's own transaction writes no WAL and commits without waiting for a flush. Ids may commit out
# of id order (they always could with the gem's writers): the relays wait for a missing id's writers (pg_locks).
# As with the gem, a connection lost between the two leaves a row without a notice: relays read it from the table
# on the next notice (or within seconds when idle). A line short enough to carry its value is also sealed.
CREATE_PROCEDURE = (
    """
CREATE OR REPLACE PROCEDURE shmbus_send(p_channel text, p_value text, p_notify text, p_line_channel text,
    INOUT new_id bigint DEFAULT NULL)
LANGUAGE plpgsql AS $fn$
DECLARE
  line text;
  """
    + _SEAL_DECLARE
    + """
BEGIN
  INSERT INTO message_bus (channel, value) VALUES (p_channel, p_value) RETURNING id INTO new_id;
  COMMIT;
  line := new_id || '|' || new_id || '|' || p_line_channel || '|' || p_value;
  IF octet_length(line) >= 8000 THEN
    PERFORM pg_notify(p_notify, new_id || '|' || new_id || '|' || p_line_channel || '|');
  ELSE
    PERFORM pg_notify(p_notify, line);
    seal_first := new_id;
    seal_body := octet_length(convert_to(line, 'UTF8')) || '|' || line;"""
    + _SEAL_READ
    + _SEAL_RUN.format(last="new_id")
    + """
  END IF;
END
$fn$
"""
)

# Many messages in one call (one round trip): every row in one transaction, ids in array order, then every notice.
CREATE_MANY_PROCEDURE = (
    """
CREATE OR REPLACE PROCEDURE shmbus_send_many(p_channels text[], p_values text[], p_notify text,
    p_line_channels text[], INOUT new_ids bigint[] DEFAULT NULL)
LANGUAGE plpgsql AS $fn$
DECLARE
  i int;
  n int := coalesce(array_length(p_channels, 1), 0);
  new_id bigint;
  line text;
  """
    + _SEAL_DECLARE
    + """
BEGIN
  new_ids := '{}';
  FOR i IN 1 .. n LOOP
    INSERT INTO message_bus (channel, value) VALUES (p_channels[i], p_values[i]) RETURNING id INTO new_id;
    new_ids := new_ids || new_id;
  END LOOP;
  COMMIT;"""
    + _SEAL_READ
    + """
  FOR i IN 1 .. n LOOP
    line := new_ids[i] || '|' || new_ids[i] || '|' || p_line_channels[i] || '|' || p_values[i];
    IF octet_length(line) >= 8000 OR (seal_body <> '' AND new_ids[i] <> new_ids[i - 1] + 1) THEN"""
    + _SEAL_RUN.format(last="new_ids[i - 1]")
    + """
    END IF;
    IF octet_length(line) >= 8000 THEN
      PERFORM pg_notify(p_notify, new_ids[i] || '|' || new_ids[i] || '|' || p_line_channels[i] || '|');
    ELSE
      PERFORM pg_notify(p_notify, line);
      IF seal_body = '' THEN
        seal_first := new_ids[i];
      END IF;
      seal_body := seal_body || octet_length(convert_to(line, 'UTF8')) || '|' || line;
    END IF;
  END LOOP;"""
    + _SEAL_RUN.format(last="new_ids[n]")
    + """
END
$fn$
"""
)

# The gem's three trims (its clear_global_backlog, expire and clear_channel_backlog statements), which a relay runs
# every ``trim_interval`` instead of inside every publish: after each pass the table holds what the gem's
# per-publish trims leave. The global one takes a lower bound (the previous pass's) so it never walks the index
# entries of rows deleted before; the others are the gem's statements as they are.
#
# Each trim records the newest id it deleted in ``shmbus_trimmed`` (one row, with the table's history identity), so
# a relay that finds an id missing at or below it knows the message existed and is gone: lost for a host that had
# not read it, never mistaken for a rolled-back id; and, per channel, in ``shmbus_trimmed_channels``, so a channel's
# backlog knows whether its history from the start is whole (ids are global: a channel's first id says nothing).
# (The gem's own trims, from a Ruby app, do not record.)
#: The table's history identity: its oid and storage file (TRUNCATE, a recreated table change it; publishes never).
HISTORY_EXPR = (
    "(SELECT ((c.oid::bigint << 31) # pg_relation_filenode(c.oid)::bigint) & 9223372036854775807 "
    "FROM pg_class c WHERE c.oid = 'message_bus'::regclass)"
)
CREATE_TRIMMED = (
    "CREATE TABLE IF NOT EXISTS shmbus_trimmed (one boolean PRIMARY KEY DEFAULT true CHECK (one), "
    "upto bigint NOT NULL, history bigint NOT NULL)",
    "CREATE TABLE IF NOT EXISTS shmbus_trimmed_channels (channel text PRIMARY KEY, "
    "upto bigint NOT NULL, history bigint NOT NULL)",
)


def _keep_newest(table: str) -> str:
    """An upsert's update: the greater bound within one history of the table, the new one after a change."""
    return (
        f"DO UPDATE SET upto = CASE WHEN {table}.history = EXCLUDED.history "
        f"THEN GREATEST({table}.upto, EXCLUDED.upto) ELSE EXCLUDED.upto END, history = EXCLUDED.history"
    )


def _recording(delete: str) -> str:
    """``delete`` that records what it deleted. Both aggregates need every deleted row first, and the unreferenced
    channel upsert runs after the main one: a pass locks ``shmbus_trimmed``'s one row before any channel's, so
    concurrent passes of several hosts queue on that row instead of deadlocking on the channels' rows."""
    return (
        f"WITH d AS ({delete} RETURNING id, channel), "
        "c AS (INSERT INTO shmbus_trimmed_channels (channel, upto, history) "
        f"SELECT channel, max(id), {HISTORY_EXPR} FROM d GROUP BY channel ORDER BY channel "
        f"ON CONFLICT (channel) {_keep_newest('shmbus_trimmed_channels')}) "
        "INSERT INTO shmbus_trimmed (one, upto, history) "
        f"SELECT true, max(id), {HISTORY_EXPR} FROM d HAVING max(id) IS NOT NULL "
        f"ON CONFLICT (one) {_keep_newest('shmbus_trimmed')}"
    )


TRIM_GLOBAL = _recording("DELETE FROM message_bus WHERE (id <= %s) AND (id > %s)")
TRIM_EXPIRE = _recording(
    "DELETE FROM message_bus WHERE added_at < CURRENT_TIMESTAMP - (%s::text || ' seconds')::interval"
)
TRIM_CHANNEL = _recording(
    "DELETE FROM message_bus WHERE ((channel = %s) AND (id <= (SELECT id FROM message_bus "
    "WHERE ((channel = %s) AND (id <= %s)) ORDER BY id DESC LIMIT 1 OFFSET %s)))"
)
#: The newest id a trim deleted from this history of the table (0: none recorded).
SELECT_GONE_UPTO = f"SELECT coalesce((SELECT upto FROM shmbus_trimmed WHERE history = {HISTORY_EXPR}), 0)"
#: The history identity, the newest id (a backward probe of the primary key), and the server's role.
SELECT_HISTORY = (
    f"SELECT {HISTORY_EXPR}, (SELECT max(id) FROM message_bus), pg_is_in_recovery(), "
    "current_setting('transaction_read_only') = 'on'"
)

PUBLISH = "CALL shmbus_send(%s, %s, %s, %s)"
PUBLISH_MANY = "CALL shmbus_send_many(%s, %s, %s, %s)"
# The gem's global_backlog / channel_backlog statements, bounded (a relay reads in pages).
SELECT_AFTER = "SELECT id, channel, value FROM message_bus WHERE (id > %s) ORDER BY id LIMIT %s"
# The relay's read: the same rows, with the table's history identity (one InitPlan; TRUNCATE takes an ACCESS
# EXCLUSIVE lock, so the rows and the identity a statement returns always belong together).
SELECT_PAGE = (
    f"SELECT id, channel, value, {HISTORY_EXPR} AS history FROM message_bus WHERE (id > %s) ORDER BY id LIMIT %s"
)
# A channel's newest rows in a range (gap fills).
SELECT_CHANNEL_NEWEST = (
    "SELECT id, value FROM message_bus WHERE ((channel = %s) AND (id > %s) AND (id <= %s)) ORDER BY id DESC LIMIT %s"
)
# Nothing of a channel after a client's position was trimmed: no recorded trim deleted a row of it above the
# position (from 0: none ever did), or a row at or before the position remains (trims remove a channel's oldest
# rows first). Parameters: channel, position, channel, position.
SELECT_HELD = (
    "SELECT coalesce((SELECT upto FROM shmbus_trimmed_channels WHERE channel = %s "
    f"AND history = {HISTORY_EXPR}), 0) <= %s "
    "OR EXISTS (SELECT 1 FROM message_bus WHERE ((channel = %s) AND (id <= %s)))"
)
# The open transactions of other backends holding RowExclusiveLock on the table (every INSERT or DELETE in
# progress), as virtual transaction ids: a relay that sees a hole waits for these to end (see writers.WriterWait).
SELECT_WRITERS = (
    "SELECT virtualtransaction FROM pg_locks WHERE locktype = 'relation' AND relation = 'message_bus'::regclass "
    "AND mode = 'RowExclusiveLock' AND pid IS DISTINCT FROM pg_backend_pid()"
)
# The table's storage file (TRUNCATE gives it a new one) and the newest row at or below an id (a backward probe
# of the primary key from that id: it never walks the dead entries that trims leave at the index's low end).
SELECT_REWRITE = (
    "SELECT pg_relation_filenode('message_bus'::regclass), (SELECT max(id) FROM message_bus WHERE id <= %s)"
)
