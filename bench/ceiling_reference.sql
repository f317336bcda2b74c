-- The set-based ceiling on the reference schema (one job table whose row every
-- transition updates), run by pgbench (simple protocol); bench/ceiling.sql is the same
-- on leaseq's current tables.
--
-- One transaction per 10 jobs, no client code between the statements: claim the first
-- 10 claimable rows of jobs_claimable_idx, in its claim-key order (SKIP LOCKED, lease
-- owner + random token + expiry, attempts + 1) and write their 'claimed' events; then
-- complete exactly those rows, fenced by id + owner + token + live lease, and write
-- their 'succeeded' events.
-- Every row change and audit row of leaseq's own claim-then-finish is here, but
-- there is no fairness across tenants and there is one commit per batch, not two.
BEGIN;
WITH picked AS MATERIALIZED (
  SELECT j.id
  FROM app.jobs j
  WHERE j.state IN ('pending', 'retry_wait')
    AND j.claim_key <= clock_timestamp()
    AND j.available_at <= clock_timestamp()
  ORDER BY j.tenant_id, j.claim_key, j.created_at, j.id
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
  INSERT INTO app.job_events (tenant_id, job_id, event_type, actor, lease_token, details, created_at)
  SELECT c.tenant_id, c.id, 'claimed', 'ceiling-' || :client_id, c.lease_token,
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
INSERT INTO app.job_events (tenant_id, job_id, event_type, actor, lease_token, details, created_at)
SELECT f.tenant_id, f.id, 'succeeded', 'ceiling-' || :client_id, f.token,
       jsonb_build_object('attempt', f.attempts), clock_timestamp()
FROM finished f;
COMMIT;
