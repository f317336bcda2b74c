-- The set-based ceiling, run by pgbench (simple protocol) on leaseq's own schema.
--
-- One transaction per 10 jobs, no client code between the statements: take the first 10
-- entries of app.claimable in claim-key order (SKIP LOCKED), delete them, turn their jobs
-- running (attempts + 1, owner), insert their leases (random token, expiry) and write
-- their 'claimed' events; then delete exactly those leases, fenced by job + owner +
-- token + live lease, complete their jobs and write their 'succeeded' events.
-- Every row change and audit row of leaseq's own claim-then-finish is here, but
-- there is no fairness across tenants and there is one commit per batch, not two.
BEGIN;
WITH picked AS MATERIALIZED (
  SELECT c.ctid AS tid
  FROM app.claimable c
  WHERE c.claim_key <= clock_timestamp()
    AND c.available_at <= clock_timestamp()
  ORDER BY c.tenant_id, c.claim_key, c.created_at, c.job_id
  LIMIT 10
  FOR UPDATE SKIP LOCKED
), taken AS (
  DELETE FROM app.claimable c USING picked p WHERE c.ctid = p.tid
  RETURNING c.job_id, c.tenant_id
), claimed AS (
  UPDATE app.jobs j
  SET state = 'running',
      attempts = j.attempts + 1,
      lease_owner = 'ceiling-' || :client_id,
      updated_at = clock_timestamp()
  FROM taken t
  WHERE j.id = t.job_id AND j.tenant_id = t.tenant_id
    AND j.state IN ('pending', 'retry_wait')
  RETURNING j.id, j.tenant_id, j.attempts
), leased AS (
  INSERT INTO app.leases (job_id, tenant_id, lease_owner, lease_token, expires_at, claimed_at)
  SELECT c.id, c.tenant_id, 'ceiling-' || :client_id, gen_random_uuid(),
         clock_timestamp() + interval '30 seconds', clock_timestamp()
  FROM claimed c
  RETURNING job_id, tenant_id, lease_token, expires_at
), audit AS (
  INSERT INTO app.job_events (tenant_id, job_id, event_type, actor, lease_token, details, created_at)
  SELECT c.tenant_id, c.id, 'claimed', 'ceiling-' || :client_id, l.lease_token,
         jsonb_build_object('attempt', c.attempts, 'leaseExpiresAt', l.expires_at),
         clock_timestamp()
  FROM claimed c JOIN leased l ON l.job_id = c.id
)
SELECT quote_literal(coalesce(array_agg(l.job_id)::text, '{}')) AS ids,
       quote_literal(coalesce(array_agg(l.lease_token)::text, '{}')) AS tokens
FROM leased l
\gset
WITH input AS (
  SELECT u.id, u.token FROM unnest(:ids::uuid[], :tokens::uuid[]) AS u(id, token)
), ended AS (
  DELETE FROM app.leases l
  USING input i
  WHERE l.job_id = i.id
    AND l.lease_owner = 'ceiling-' || :client_id
    AND l.lease_token = i.token
    AND l.expires_at > clock_timestamp()
  RETURNING l.job_id, l.tenant_id, l.lease_token
), finished AS (
  UPDATE app.jobs j
  SET state = 'succeeded',
      result = 'null'::jsonb,
      lease_owner = NULL,
      completed_at = clock_timestamp(),
      updated_at = clock_timestamp()
  FROM ended e
  WHERE j.id = e.job_id AND j.tenant_id = e.tenant_id
    AND j.state = 'running'
  RETURNING j.id, j.tenant_id, j.attempts, e.lease_token AS token
)
INSERT INTO app.job_events (tenant_id, job_id, event_type, actor, lease_token, details, created_at)
SELECT f.tenant_id, f.id, 'succeeded', 'ceiling-' || :client_id, f.token,
       jsonb_build_object('attempt', f.attempts), clock_timestamp()
FROM finished f;
COMMIT;
