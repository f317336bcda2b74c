-- leaseq functions: a producer reads the state and result of the jobs it enqueued.
--
-- Callers: leaseq_producer (any tenant) and leaseq_tenant_producer (only its bound
-- tenants: app.check_producer_tenants refuses any other with 42501 before the lookup,
-- so the answer "no such job" cannot be used to probe another tenant's keys or ids).
-- A job is named by tenant and id (as enqueue returned it) or by tenant and operation
-- key (as the producer chose it). The row carries no lease token, no lease owner and
-- no payload: the producer learns what became of its job, not how a worker holds it.
-- No row when the tenant has no such job.

create or replace function app.get_job_result(p_tenant_id uuid, p_job_id uuid)
returns table (
  id uuid,
  tenant_id uuid,
  operation_key text,
  kind text,
  state app.job_state,
  attempts integer,
  max_attempts integer,
  available_at timestamptz,
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
set search_path = pg_catalog, pg_temp
as $$
#variable_conflict use_column
begin
  perform app.check_producer_tenants(array[p_tenant_id]);
  perform app.check_required('p_tenant_id', p_tenant_id);
  perform app.check_required('p_job_id', p_job_id);
  return query
  select j.id, j.tenant_id, j.operation_key, j.kind, j.state, j.attempts, j.max_attempts,
         j.available_at, j.last_error, j.result, j.correlation_id, j.created_at,
         j.updated_at, j.completed_at
  from app.jobs j
  where j.id = p_job_id and j.tenant_id = p_tenant_id;
end;
$$;
revoke all on function app.get_job_result(uuid, uuid) from public;
grant execute on function app.get_job_result(uuid, uuid) to leaseq_producer, leaseq_tenant_producer;

create or replace function app.get_job_result_by_key(p_tenant_id uuid, p_operation_key text)
returns table (
  id uuid,
  tenant_id uuid,
  operation_key text,
  kind text,
  state app.job_state,
  attempts integer,
  max_attempts integer,
  available_at timestamptz,
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
set search_path = pg_catalog, pg_temp
as $$
#variable_conflict use_column
begin
  perform app.check_producer_tenants(array[p_tenant_id]);
  perform app.check_required('p_tenant_id', p_tenant_id);
  perform app.check_required('p_operation_key', p_operation_key);
  return query
  select j.id, j.tenant_id, j.operation_key, j.kind, j.state, j.attempts, j.max_attempts,
         j.available_at, j.last_error, j.result, j.correlation_id, j.created_at,
         j.updated_at, j.completed_at
  from app.jobs j
  where j.tenant_id = p_tenant_id and j.operation_key = p_operation_key;
end;
$$;
revoke all on function app.get_job_result_by_key(uuid, text) from public;
grant execute on function app.get_job_result_by_key(uuid, text) to leaseq_producer, leaseq_tenant_producer;
