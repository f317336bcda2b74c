-- The set-based ceiling on the reference schema (../shared/spec, copied for the upgrade
-- test as tests/migrations/fixtures/reference-schema.sql), run by pgbench exactly like
-- bench/ceiling.sql: the same claim of 10 and completion of 10 in one transaction, with
-- the same audit rows, except that the reference's events have no lease_token column.
-- It answers one question: how fast can any client of the data model the product
-- started from go on this machine?
BEGIN;
WITH picked AS MATERIALIZED (
  SELECT j.id
  FROM app.jobs j
  WHERE j.state IN ('pending', 'retry_wait')
    AND j.available_at <= clock_timestamp()
  ORDER BY j.tenant_id, j.available_at, j.created_at, j.id
  LIMIT 10
  FOR UPDATE SKIP LOCKED
), claimed AS (
  UPDATE app.jobs j
  SET state = 'running',
      attempts = j.attempts + 1,
      lease_owner = 'ceiling-' || :client_id,
      lease_token = gen_random_uuid(),
      lease_expires_at = clock_timestamp() + interval '30 seconds',
      updated_at = clock_timestamp()
  FROM picked p
  WHERE j.id = p.id
  RETURNING j.id, j.tenant_id, j.attempts, j.lease_token, j.lease_expires_at
), audit AS (
  INSERT INTO app.job_events (tenant_id, job_id, event_type, actor, details, created_at)
  SELECT c.tenant_id, c.id, 'claimed', 'ceiling-' || :client_id,
         jsonb_build_object('attempt', c.attempts, 'leaseExpiresAt', c.lease_expires_at),
         clock_timestamp()
  FROM claimed c
)
SELECT quote_literal(coalesce(array_agg(c.id)::text, '{}')) AS ids,
       quote_literal(coalesce(array_agg(c.lease_token)::text, '{}')) AS tokens
FROM claimed c
\gset
WITH input AS (
  SELECT u.id, u.token FROM unnest(:ids::uuid[], :tokens::uuid[]) AS u(id, token)
), finished AS (
  UPDATE app.jobs j
  SET state = 'succeeded',
      result = 'null'::jsonb,
      lease_owner = NULL,
      lease_token = NULL,
      lease_expires_at = NULL,
      completed_at = clock_timestamp(),
      updated_at = clock_timestamp()
  FROM input i
  WHERE j.id = i.id
    AND j.state = 'running'
    AND j.lease_owner = 'ceiling-' || :client_id
    AND j.lease_token = i.token
    AND j.lease_expires_at > clock_timestamp()
  RETURNING j.id, j.tenant_id, j.attempts, i.token
)
INSERT INTO app.job_events (tenant_id, job_id, event_type, actor, details, created_at)
SELECT f.tenant_id, f.id, 'succeeded', 'ceiling-' || :client_id,
       jsonb_build_object('attempt', f.attempts), clock_timestamp()
FROM finished f;
COMMIT;
