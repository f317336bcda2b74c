-- leaseq 0007: record a batch's outcomes and claim the next batch in one call.
--
-- A draining worker used two statements, and two commits, per batch: claim, then
-- finish. Bundling the finish of batch N with the claim of batch N+1 makes it one round
-- trip and one commit per batch, which bench/ measured as the largest remaining cost of
-- a no-op drain (docs/benchmarks.md). Both halves are the existing functions, so fences,
-- bounds, fairness and audit rows are exactly theirs; they share one transaction, so a
-- refused outcome also refuses the claim (the worker then records and claims apart).
--
-- Rows: first one per outcome applied (claimed = false: id and the job's new state;
-- a stale token gives no row, as in finish_jobs), then the jobs claimed (claimed = true,
-- with what a worker needs to run them). p_limit 0 claims nothing; an empty outcome
-- list records nothing.

create function app.finish_and_claim_jobs(
  p_owner text,
  p_tenant_ids uuid[],
  p_job_ids uuid[],
  p_tokens uuid[],
  p_outcomes text[],
  p_details jsonb[],
  p_retry_delays interval[],
  p_limit integer default 10,
  p_lease interval default interval '30 seconds'
)
returns table (
  claimed boolean,
  id uuid,
  tenant_id uuid,
  state app.job_state,
  operation_key text,
  kind text,
  payload jsonb,
  attempts integer,
  max_attempts integer,
  available_at timestamptz,
  created_at timestamptz,
  lease_owner text,
  lease_token uuid,
  lease_expires_at timestamptz,
  correlation_id text
)
language plpgsql
security definer
set search_path = ''
as $$
#variable_conflict use_column
begin
  if p_limit is null or p_limit < 0 or p_limit > 100 then
    perform app.check_range('p_limit', p_limit, 0, 100);
  end if;
  if coalesce(cardinality(p_job_ids), 0) > 0 then
    return query
    select false, f.job_id, null::uuid, f.state, null::text, null::text, null::jsonb,
           null::integer, null::integer, null::timestamptz, null::timestamptz,
           null::text, null::uuid, null::timestamptz, null::text
    from app.finish_jobs(p_owner, p_tenant_ids, p_job_ids, p_tokens, p_outcomes, p_details,
                         p_retry_delays) f;
  end if;
  if p_limit > 0 then
    return query
    select true, c.id, c.tenant_id, c.state, c.operation_key, c.kind, c.payload,
           c.attempts, c.max_attempts, c.available_at, c.created_at,
           c.lease_owner, c.lease_token, c.lease_expires_at, c.correlation_id
    from app.claim_ready_jobs(p_owner, p_limit, p_lease) c;
  end if;
end;
$$;

revoke all on function app.finish_and_claim_jobs(text, uuid[], uuid[], uuid[], text[], jsonb[], interval[], integer, interval) from public;
grant execute on function app.finish_and_claim_jobs(text, uuid[], uuid[], uuid[], text[], jsonb[], interval[], integer, interval) to service_role;
