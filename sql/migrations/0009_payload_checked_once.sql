-- leaseq 0009: a job's payload is checked when it is written, not again by every claim
-- and every finish.
--
-- PostgreSQL evaluates every CHECK constraint of a table on every UPDATE of a row, also
-- when the columns it reads are unchanged. A job is updated at least twice (claim,
-- finish), and its payload never changes after enqueue, yet each update ran
-- jsonb_typeof(payload), which reads the whole payload: for a toasted payload, a fetch
-- and decompression of up to 256 KiB per update. Measured with 100 KB payloads, that
-- check was about 45% of the server's CPU per job (docs/benchmarks.md).
--
-- A domain's check runs when a value is assigned to a column of that type (INSERT, or
-- an UPDATE that sets the column), never for the values an UPDATE carries over. So the
-- rule moves from the table to a domain. Clients still see jsonb (PostgreSQL reports a
-- domain column as its base type) and a violation is still SQLSTATE 23514.
--
-- The domain is created without its check, so that the column changes type without a
-- table rewrite; the check is then added NOT VALID, because every existing row passed
-- the table constraint it replaces (dropped in this same transaction). New values are
-- checked in full.
--
-- kind and operation_key keep their table checks (two short regular expressions per
-- update, a few percent of a small job's server CPU): the functions that return them as
-- text would all have to be redefined for that.

create domain app.job_payload as jsonb;

alter table app.jobs
  alter column payload type app.job_payload,
  drop constraint jobs_payload_check;

alter domain app.job_payload
  add constraint job_payload_is_object check (jsonb_typeof(value) = 'object')
  not valid;

-- RETURN QUERY wants the declared column types exactly: the two functions that return
-- the payload column as jsonb now say so (bodies otherwise as in 0006 and 0007).

create or replace function app.get_job(p_job_id uuid)
returns table (
  id uuid,
  tenant_id uuid,
  operation_key text,
  kind text,
  payload jsonb,
  state app.job_state,
  attempts integer,
  max_attempts integer,
  available_at timestamptz,
  lease_owner text,
  lease_expires_at timestamptz,
  last_error jsonb,
  result jsonb,
  correlation_id text,
  created_at timestamptz,
  updated_at timestamptz,
  completed_at timestamptz
)
language plpgsql
stable
security definer
set search_path = ''
as $$
#variable_conflict use_column
begin
  perform app.check_required('p_job_id', p_job_id);
  return query
  select j.id, j.tenant_id, j.operation_key, j.kind, j.payload::jsonb, j.state, j.attempts,
         j.max_attempts, j.available_at, j.lease_owner, j.lease_expires_at, j.last_error,
         j.result, j.correlation_id, j.created_at, j.updated_at, j.completed_at
  from app.jobs j
  where j.id = p_job_id;
end;
$$;

create or replace function app.finish_and_claim_jobs(
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
    select true, c.id, c.tenant_id, c.state, c.operation_key, c.kind, c.payload::jsonb,
           c.attempts, c.max_attempts, c.available_at, c.created_at,
           c.lease_owner, c.lease_token, c.lease_expires_at, c.correlation_id
    from app.claim_ready_jobs(p_owner, p_limit, p_lease) c;
  end if;
end;
$$;
