-- leaseq functions: renew leases.
--
-- A running job's lease is its row in app.leases (0023_hot_and_cold_jobs): owner, token,
-- expiry. A renewal rewrites that small row in place, a HOT update (no index names
-- expires_at), and reads the job row's cancel request by its primary key, never writing
-- it.

-- Extend a running job's lease to p_lease from now, fenced by owner + token + an
-- unexpired lease, and answer in the same statement whether an operator asked to
-- cancel the job (app.request_job_cancel): the worker learns of a request from the
-- renewal it sends anyway, never from a call of its own. The lease is renewed either
-- way, so that the handler can use the worker's grace to stop cleanly; whatever it
-- records then ends the job 'cancelled' (app.finish_jobs). No row when the lease was
-- lost (renewed is then false, cancel_requested NULL); one row otherwise.
create or replace function app.renew_job_lease_status(
  p_tenant_id uuid,
  p_job_id uuid,
  p_owner text,
  p_token uuid,
  p_lease interval default interval '30 seconds'
)
returns table (renewed boolean, cancel_requested boolean)
language plpgsql
security definer
set search_path = pg_catalog, pg_temp
as $$
#variable_conflict use_column
declare
  v_now timestamptz := clock_timestamp();
  v_requested boolean;
begin
  perform app.check_required('p_tenant_id', p_tenant_id);
  perform app.check_required('p_job_id', p_job_id);
  perform app.check_owner(p_owner);
  perform app.check_required('p_token', p_token);
  perform app.check_lease(p_lease);

  -- One primary-key probe of app.leases and a HOT update (expires_at has no index);
  -- the job row is read, not written.
  update app.leases l
  set expires_at = v_now + p_lease
  where l.job_id = p_job_id
    and l.tenant_id = p_tenant_id
    and l.lease_owner = p_owner
    and l.lease_token = p_token
    and l.expires_at > v_now
  returning (select j.cancel_requested_at is not null
             from app.jobs j
             where j.id = l.job_id and j.tenant_id = l.tenant_id) into v_requested;

  if found then
    return query select true, v_requested;
  else
    return query select false, null::boolean;
  end if;
end;
$$;
revoke all on function app.renew_job_lease_status(uuid, uuid, text, uuid, interval) from public;
grant execute on function app.renew_job_lease_status(uuid, uuid, text, uuid, interval) to leaseq_worker;

-- The renewal alone, for callers of the earlier contract: app.renew_job_lease_status
-- without the cancel request.
create or replace function app.renew_job_lease(
  p_tenant_id uuid,
  p_job_id uuid,
  p_owner text,
  p_token uuid,
  p_lease interval default interval '30 seconds'
)
returns boolean
language sql
security definer
set search_path = pg_catalog, pg_temp
as $$
  select r.renewed
  from app.renew_job_lease_status(p_tenant_id, p_job_id, p_owner, p_token, p_lease) r
$$;
revoke all on function app.renew_job_lease(uuid, uuid, text, uuid, interval) from public;
grant execute on function app.renew_job_lease(uuid, uuid, text, uuid, interval) to leaseq_worker;
