"""The heartbeat batch statement as a function in the database, `rig_record_heartbeats`: its
plan is made once per connection and kept (PL/pgSQL caches the plans of its statements), where
the statement sent as text was planned anew for every batch. Planning was most of a batch's
time in PostgreSQL; the function is called with a one-line statement that plans in
microseconds. Nothing is prepared on the connection, so it works behind PgBouncer in
transaction mode as the text did.

The statement is the one of `adapters/postgres/intake.py` at revision 0013, unchanged.

Revision ID: 0014
Revises: 0013
Create Date: 2026-11-27
"""

from __future__ import annotations

from alembic import op

revision = "0014"
down_revision = "0013"
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
        SELECT DISTINCT ON (agent_id) agent_id, degraded, reasons,
               count(*) OVER w AS beats,
               bool_or(consumer IS NULL) OVER w AS anonymous,
               bool_and(degraded) FILTER (WHERE consumer IS NULL) OVER w AS anonymous_all_degraded,
               array_agg(degraded) FILTER (WHERE consumer IS NULL) OVER w AS anonymous_runs
          FROM batch
        WINDOW w AS (PARTITION BY agent_id ORDER BY ord
                     ROWS BETWEEN UNBOUNDED PRECEDING AND UNBOUNDED FOLLOWING)
         ORDER BY agent_id, ord DESC
    ), latest_consumer AS (
        SELECT DISTINCT ON (consumer) consumer, agent_id, degraded, reasons,
               count(*) OVER (PARTITION BY consumer) AS beats,
               bool_and(degraded) OVER (PARTITION BY consumer) AS all_degraded
          FROM batch WHERE consumer IS NOT NULL ORDER BY consumer, ord DESC
    ), ended AS (
        INSERT INTO liveness (tenant, agent_id, consumer, heard_from, heard_to, degraded, beats)
        SELECT a.tenant, a.agent_id, NULL, COALESCE(a.heard_since, a.last_heartbeat_at),
               a.last_heartbeat_at, a.degraded, a.beats
          FROM agent_heartbeats a JOIN latest_agent l ON a.agent_id = l.agent_id
         WHERE a.tenant = p_tenant
           AND (a.last_heartbeat_at < now() - p_break OR a.degraded <> l.degraded)
        UNION ALL
        SELECT c.tenant, c.agent_id, c.consumer, COALESCE(c.heard_since, c.last_heartbeat_at),
               c.last_heartbeat_at, c.degraded, c.beats
          FROM consumer_heartbeats c JOIN latest_consumer l ON c.consumer = l.consumer
         WHERE c.tenant = p_tenant
           AND (c.last_heartbeat_at < now() - p_break OR c.degraded <> l.degraded)
    ), agents AS (
        INSERT INTO agent_heartbeats AS a (tenant, agent_id, last_heartbeat_at, degraded,
                                           degraded_reasons, degraded_since, heard_since, beats)
        SELECT p_tenant, agent_id, now(), degraded, reasons,
               CASE WHEN anonymous_runs[array_upper(anonymous_runs, 1)] THEN now() END, now(), beats
          FROM latest_agent ORDER BY agent_id
        ON CONFLICT (tenant, agent_id) DO UPDATE
           SET last_heartbeat_at = EXCLUDED.last_heartbeat_at, degraded = EXCLUDED.degraded,
               degraded_reasons = EXCLUDED.degraded_reasons,
               degraded_since = CASE
                   WHEN NOT (SELECT anonymous FROM latest_agent l WHERE l.agent_id = a.agent_id)
                       THEN a.degraded_since
                   WHEN (SELECT anonymous_all_degraded FROM latest_agent l
                          WHERE l.agent_id = a.agent_id)
                       THEN COALESCE(a.degraded_since, now())
                   ELSE EXCLUDED.degraded_since END,
               heard_since = CASE
                   WHEN a.last_heartbeat_at < now() - p_break OR a.degraded <> EXCLUDED.degraded
                       THEN now() ELSE COALESCE(a.heard_since, a.last_heartbeat_at) END,
               beats = CASE
                   WHEN a.last_heartbeat_at < now() - p_break OR a.degraded <> EXCLUDED.degraded
                       THEN EXCLUDED.beats ELSE a.beats + EXCLUDED.beats END
    ), consumers AS (
        INSERT INTO consumer_heartbeats AS c (tenant, consumer, agent_id, last_heartbeat_at,
                                              degraded, degraded_reasons, degraded_since,
                                              heard_since, beats)
        SELECT p_tenant, consumer, agent_id, now(), degraded, reasons,
               CASE WHEN degraded THEN now() END, now(), beats
          FROM latest_consumer ORDER BY consumer
        ON CONFLICT (tenant, consumer) DO UPDATE
           SET agent_id = EXCLUDED.agent_id, last_heartbeat_at = EXCLUDED.last_heartbeat_at,
               degraded = EXCLUDED.degraded, degraded_reasons = EXCLUDED.degraded_reasons,
               degraded_since = CASE
                   WHEN (SELECT all_degraded FROM latest_consumer l WHERE l.consumer = c.consumer)
                       THEN COALESCE(c.degraded_since, now())
                   ELSE EXCLUDED.degraded_since END,
               heard_since = CASE
                   WHEN c.last_heartbeat_at < now() - p_break OR c.degraded <> EXCLUDED.degraded
                       THEN now() ELSE COALESCE(c.heard_since, c.last_heartbeat_at) END,
               beats = CASE
                   WHEN c.last_heartbeat_at < now() - p_break OR c.degraded <> EXCLUDED.degraded
                       THEN EXCLUDED.beats ELSE c.beats + EXCLUDED.beats END
    )
    SELECT now() INTO received;
    RETURN received;
END
$$
"""


def upgrade() -> None:
    op.execute(FUNCTION)


def downgrade() -> None:
    op.execute("DROP FUNCTION rig_record_heartbeats(text, jsonb, interval)")
