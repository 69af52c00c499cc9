"""The heartbeat function records facts; rule 3b's degraded run is decided in policy.

Until now `rig_record_heartbeats` (migration 0014) decided rule 3b's run itself: it kept
`degraded_since` with the rule's breaks built in (a healthy heartbeat ends the run, a silence
does not; an agent's run counts only its heartbeats that name no consumer), so changing what
breaks a run meant a new copy of the function. Now each row records what was heard and since
when, and `rig_conductor.policy.degraded.run_start` decides the run from that:

- `consumer_heartbeats.status_since`: receipt time of the first of the heartbeats naming the
  consumer since which every one has reported the row's `degraded` (healthy or degraded alike),
  whatever the gaps between them. A heartbeat with the other value starts it anew, also when
  the value changed and changed back within one batch (all beats of a batch share its time).
- `agent_heartbeats.anonymous_at`, `anonymous_degraded`, `anonymous_since`: the same for the
  agent's heartbeats that name no consumer (NULL: none heard). The row's own `degraded` stays
  the latest heartbeat of the agent of any kind.

Beside them the rows keep their open liveness interval (`heard_since`, `beats`, migration
0013) and `liveness` the closed ones, unchanged. Those alone do not tell the run: an interval
ends at a silence longer than the break, which a run outlives (it spans every interval since
the last healthy heartbeat, however many, and `liveness` is not indexed by owner), an agent's
intervals mix its heartbeats naming a consumer with those naming none, and a change and a
change back within one batch ends no interval.

Expand-safe for a rolling upgrade (N-1 replicas beside N): the columns are new and nullable,
and the function keeps its signature `rig_record_heartbeats(text, jsonb, interval) RETURNS
timestamptz`, so N-1's intake calls it unchanged and writes the new facts as well. N-1 reads
`degraded_since` to judge rule 3b; the function keeps writing it, for those readers only and
with the meaning they know: for a consumer `status_since` while it is degraded, for an agent
`anonymous_since` while its anonymous heartbeats are degraded, NULL otherwise. This release
does not read it; a later migration, once no N-1 remains, may drop it.

The existing rows get the facts they imply: a degraded consumer's status began at its
`degraded_since`; a healthy one's start is not known and stays NULL (its next heartbeat takes
its open interval's start: healthy at least since then; nothing reads a healthy status's
start). An agent with a `degraded_since` was last heard degraded without naming a consumer
(when last is not known: its run's first heartbeat stands in); one without may have been heard
healthy that way or not at all, and is left NULL, which rule 3b reads alike.

One statement per batch, the same rows written; each upserted row looks its batch up once
(0014's agents did twice), and the intervals a batch ends are found by key, one lookup per
agent and consumer of the batch: 0014 hashed every heartbeat row of the tenant for that, in
every batch, which was most of PostgreSQL's CPU per heartbeat (169 us of it at batches of 32,
56 us now). Adding the columns takes no table rewrite, and only degraded rows are filled in,
so the tables' lock is short.

Revision ID: 0019
Revises: 0018
Create Date: 2026-11-29
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import context, op

revision = "0019"
down_revision = "0018"
branch_labels = None
depends_on = None

FUNCTION = """
CREATE OR REPLACE FUNCTION rig_record_heartbeats(p_tenant text, p_batch jsonb, p_break interval)
RETURNS timestamptz LANGUAGE plpgsql AS $$
DECLARE
    received timestamptz;
BEGIN
    WITH batch AS (
        SELECT item->>0 AS agent_id, item->>1 AS consumer, (item->>2)::boolean AS degraded,
               item->3 AS reasons, ord
          FROM jsonb_array_elements(p_batch) WITH ORDINALITY AS b(item, ord)
    ), latest_agent AS (
        -- Per agent: its latest heartbeat of any kind, and of those naming no consumer the last
        -- one's `degraded` (NULL: none) and whether all of them said the same.
        SELECT agent_id, degraded, reasons, beats,
               anonymous_said[array_upper(anonymous_said, 1)] AS anonymous_degraded,
               anonymous_all IS NOT DISTINCT FROM anonymous_any AS anonymous_steady
          FROM (SELECT DISTINCT ON (agent_id) agent_id, degraded, reasons, ord,
                       count(*) OVER w AS beats,
                       array_agg(degraded) FILTER (WHERE consumer IS NULL) OVER w AS anonymous_said,
                       bool_and(degraded) FILTER (WHERE consumer IS NULL) OVER w AS anonymous_all,
                       bool_or(degraded) FILTER (WHERE consumer IS NULL) OVER w AS anonymous_any
                  FROM batch
                WINDOW w AS (PARTITION BY agent_id ORDER BY ord
                             ROWS BETWEEN UNBOUNDED PRECEDING AND UNBOUNDED FOLLOWING)
                 ORDER BY agent_id, ord DESC) latest
    ), latest_consumer AS (
        -- Per consumer: its latest heartbeat, and whether all of the batch's said the same.
        SELECT DISTINCT ON (consumer) consumer, agent_id, degraded, reasons,
               count(*) OVER (PARTITION BY consumer) AS beats,
               bool_and(degraded) OVER (PARTITION BY consumer)
                   = bool_or(degraded) OVER (PARTITION BY consumer) AS steady
          FROM batch WHERE consumer IS NOT NULL ORDER BY consumer, ord DESC
    ), ended AS (
        -- Each row of the batch looks its row up by key (LATERAL ... LIMIT 1: the key is
        -- unique, and the limit keeps the lookup from being turned into a join). As a join, the
        -- planner's guess of 100 rows for any batch made it read every row of the tenant's
        -- table to hash them, for every batch, up to a few thousand rows.
        INSERT INTO liveness (tenant, agent_id, consumer, heard_from, heard_to, degraded, beats)
        SELECT a.tenant, a.agent_id, NULL, COALESCE(a.heard_since, a.last_heartbeat_at),
               a.last_heartbeat_at, a.degraded, a.beats
          FROM latest_agent l
         CROSS JOIN LATERAL (SELECT * FROM agent_heartbeats a
                              WHERE a.tenant = p_tenant AND a.agent_id = l.agent_id LIMIT 1) a
         WHERE a.last_heartbeat_at < now() - p_break OR a.degraded <> l.degraded
        UNION ALL
        SELECT c.tenant, c.agent_id, c.consumer, COALESCE(c.heard_since, c.last_heartbeat_at),
               c.last_heartbeat_at, c.degraded, c.beats
          FROM latest_consumer l
         CROSS JOIN LATERAL (SELECT * FROM consumer_heartbeats c
                              WHERE c.tenant = p_tenant AND c.consumer = l.consumer LIMIT 1) c
         WHERE c.last_heartbeat_at < now() - p_break OR c.degraded <> l.degraded
    ), agents AS (
        INSERT INTO agent_heartbeats AS a (tenant, agent_id, last_heartbeat_at, degraded,
                                           degraded_reasons, heard_since, beats, anonymous_at,
                                           anonymous_degraded, anonymous_since, degraded_since)
        SELECT p_tenant, agent_id, now(), degraded, reasons, now(), beats,
               CASE WHEN anonymous_degraded IS NOT NULL THEN now() END, anonymous_degraded,
               CASE WHEN anonymous_degraded IS NOT NULL THEN now() END,
               CASE WHEN anonymous_degraded THEN now() END
          FROM latest_agent ORDER BY agent_id
        ON CONFLICT (tenant, agent_id) DO UPDATE
           SET last_heartbeat_at = EXCLUDED.last_heartbeat_at, degraded = EXCLUDED.degraded,
               degraded_reasons = EXCLUDED.degraded_reasons,
               heard_since = CASE
                   WHEN a.last_heartbeat_at < now() - p_break OR a.degraded <> EXCLUDED.degraded
                       THEN now() ELSE COALESCE(a.heard_since, a.last_heartbeat_at) END,
               beats = CASE
                   WHEN a.last_heartbeat_at < now() - p_break OR a.degraded <> EXCLUDED.degraded
                       THEN EXCLUDED.beats ELSE a.beats + EXCLUDED.beats END,
               anonymous_at = COALESCE(EXCLUDED.anonymous_at, a.anonymous_at),
               anonymous_degraded = COALESCE(EXCLUDED.anonymous_degraded, a.anonymous_degraded),
               -- `degraded_since` for N-1's readers only: `anonymous_since` while degraded.
               (anonymous_since, degraded_since) = (
                   SELECT since, CASE WHEN EXCLUDED.anonymous_degraded IS NULL
                                          THEN a.degraded_since
                                      WHEN EXCLUDED.anonymous_degraded THEN since END
                     FROM (SELECT CASE
                                  WHEN EXCLUDED.anonymous_degraded IS NULL THEN a.anonymous_since
                                  WHEN l.anonymous_steady
                                       AND a.anonymous_degraded = EXCLUDED.anonymous_degraded
                                      THEN COALESCE(a.anonymous_since, now())
                                  ELSE now() END AS since
                             FROM latest_agent l WHERE l.agent_id = a.agent_id) s)
    ), consumers AS (
        INSERT INTO consumer_heartbeats AS c (tenant, consumer, agent_id, last_heartbeat_at,
                                              degraded, degraded_reasons, heard_since, beats,
                                              status_since, degraded_since)
        SELECT p_tenant, consumer, agent_id, now(), degraded, reasons, now(), beats, now(),
               CASE WHEN degraded THEN now() END
          FROM latest_consumer ORDER BY consumer
        ON CONFLICT (tenant, consumer) DO UPDATE
           SET agent_id = EXCLUDED.agent_id, last_heartbeat_at = EXCLUDED.last_heartbeat_at,
               degraded = EXCLUDED.degraded, degraded_reasons = EXCLUDED.degraded_reasons,
               heard_since = CASE
                   WHEN c.last_heartbeat_at < now() - p_break OR c.degraded <> EXCLUDED.degraded
                       THEN now() ELSE COALESCE(c.heard_since, c.last_heartbeat_at) END,
               beats = CASE
                   WHEN c.last_heartbeat_at < now() - p_break OR c.degraded <> EXCLUDED.degraded
                       THEN EXCLUDED.beats ELSE c.beats + EXCLUDED.beats END,
               -- `degraded_since` for N-1's readers only: `status_since` while degraded.
               (status_since, degraded_since) = (
                   SELECT since, CASE WHEN EXCLUDED.degraded THEN since END
                     FROM (SELECT CASE WHEN l.steady AND c.degraded = EXCLUDED.degraded
                                           THEN COALESCE(c.status_since, c.heard_since,
                                                         c.last_heartbeat_at)
                                       ELSE now() END AS since
                             FROM latest_consumer l WHERE l.consumer = c.consumer) s)
    )
    SELECT now() INTO received;
    RETURN received;
END
$$
"""


def upgrade() -> None:
    # Adding a column locks its table until the migration commits: no batch is recorded between
    # the rows' facts filled in here and the function that keeps them from now on.
    op.add_column("consumer_heartbeats", sa.Column("status_since", sa.DateTime(timezone=True)))
    op.add_column("agent_heartbeats", sa.Column("anonymous_at", sa.DateTime(timezone=True)))
    op.add_column("agent_heartbeats", sa.Column("anonymous_degraded", sa.Boolean))
    op.add_column("agent_heartbeats", sa.Column("anonymous_since", sa.DateTime(timezone=True)))
    # Only degraded rows are written (few): a healthy consumer's status start is not known and
    # stays NULL until its next heartbeat (see the docstring).
    op.execute(
        "UPDATE consumer_heartbeats SET status_since = degraded_since"
        " WHERE degraded AND degraded_since IS NOT NULL"
    )
    op.execute(
        "UPDATE agent_heartbeats SET anonymous_at = degraded_since, anonymous_degraded = true,"
        " anonymous_since = degraded_since WHERE degraded_since IS NOT NULL"
    )
    op.execute(FUNCTION)


def downgrade() -> None:
    # 0014's function, which goes on from `degraded_since` as this one kept it.
    op.execute(context.script.get_revision("0014").module.FUNCTION)
    op.drop_column("agent_heartbeats", "anonymous_since")
    op.drop_column("agent_heartbeats", "anonymous_degraded")
    op.drop_column("agent_heartbeats", "anonymous_at")
    op.drop_column("consumer_heartbeats", "status_since")
