-- leaseq functions: release expired leases (the reaper's work).
--
-- A lease that ran out means its worker crashed or timed out. The job goes back to
-- retry_wait (available now) or, at max_attempts, to dead. Limits: 1 .. 1000 per tenant,
-- 1 .. 10000 across tenants per call.

-- Expired leases go back to retry_wait (available now) or, at max_attempts, to dead; a
-- job whose cancel was requested (app.request_job_cancel) ends 'cancelled' instead,
-- never retried, its event naming the operator who asked. One statement deletes the
-- leases, updates the jobs and writes their audit rows; the old owner and token
-- are kept in the event. p_tenant_id NULL means every tenant (internal use only).
create or replace function app.release_expired(p_tenant_id uuid, p_limit integer)
returns integer
language plpgsql
set search_path = pg_catalog, pg_temp
set plan_cache_mode = force_generic_plan
as $$
declare
  v_now timestamptz := clock_timestamp();
  v_step interval := app.priority_step();
  v_count integer;
  v_retrying uuid[];
  v_retrying_kinds text[];
  v_retrying_queues text[];
  v_ids uuid[];
  v_tenants uuid[];
  v_owners text[];
  v_tokens uuid[];
begin
  -- The expired leases: a scan of app.leases (the running jobs only; no index on
  -- expires_at, so that a renewal stays a HOT update), each lease's job by its primary
  -- key (a lateral probe: a join would let the planner hash the job table). SKIP LOCKED
  -- on both: a lease being renewed or finished right now is that statement's, a job an
  -- operator holds (a cancel request) is the operator's, and the next pass takes them.
  with expiring as materialized (
    select l.ctid as tid
    from app.leases l
    cross join lateral (
      select 1
      from app.jobs j
      where j.id = l.job_id and j.tenant_id = l.tenant_id
      for update skip locked
    ) held
    where l.expires_at <= v_now
      and (p_tenant_id is null or l.tenant_id = p_tenant_id)
    order by l.expires_at
    for update of l skip locked
    limit p_limit
  ), expired as (
    delete from app.leases l
    where l.ctid = any (array(select x.tid from expiring x))
    returning l.job_id, l.tenant_id, l.lease_owner, l.lease_token
  )
  select array_agg(x.job_id), array_agg(x.tenant_id), array_agg(x.lease_owner),
         array_agg(x.lease_token)
  into v_ids, v_tenants, v_owners, v_tokens
  from expired x;
  if v_ids is null then
    return 0;
  end if;

  -- The jobs by primary key (an array's rows, as every function's input).
  with expired as (
    select u.id, u.tenant_id, u.lease_owner, u.lease_token
    from unnest(v_ids, v_tenants, v_owners, v_tokens) as u(id, tenant_id, lease_owner,
                                                            lease_token)
  ), released as (
    update app.jobs j
    set state = case when j.cancel_requested_at is not null then 'cancelled'::app.job_state
                     when j.attempts >= j.max_attempts then 'dead'::app.job_state
                     else 'retry_wait'::app.job_state end,
        available_at = case when j.attempts >= j.max_attempts
                                 or j.cancel_requested_at is not null
                            then j.available_at else v_now end,
        claim_key = case when j.attempts >= j.max_attempts
                              or j.cancel_requested_at is not null then j.claim_key
                         else v_now - (j.priority - 1) * v_step end,
        last_error = jsonb_build_object('code', 'LEASE_EXPIRED',
                                        'retryable', j.attempts < j.max_attempts
                                                     and j.cancel_requested_at is null,
                                        'leaseOwner', e.lease_owner),
        lease_owner = null,
        completed_at = case when j.attempts >= j.max_attempts
                                 or j.cancel_requested_at is not null
                            then v_now else null end,
        updated_at = v_now
    from expired e
    where j.id = e.id
      and j.tenant_id = e.tenant_id
      and j.state = 'running'
    returning j.id, j.tenant_id, j.kind, j.queue, j.state, j.attempts, e.lease_owner,
              e.lease_token,
              j.cancel_requested_by, j.cancel_requested_at
  ), audit as (
    insert into app.job_events (tenant_id, job_id, event_type, actor, lease_token, details, created_at)
    select r.tenant_id, r.id,
           case r.state when 'dead' then 'dead' when 'cancelled' then 'cancelled'
                        else 'lease_expired' end,
           case when r.state = 'cancelled' then r.cancel_requested_by else 'watchdog' end,
           r.lease_token,
           case when r.state = 'cancelled'
                then jsonb_build_object('attempt', r.attempts, 'previousState', 'running',
                                        'leaseOwner', r.lease_owner,
                                        'requestedAt', r.cancel_requested_at,
                                        'reason', 'lease_expired_after_cancel_request')
                else jsonb_build_object('attempt', r.attempts, 'leaseOwner', r.lease_owner,
                              'recoveredState', r.state,
                              'reason', case when r.state = 'dead' then 'lease_expired_at_max_attempts'
                                             else 'lease_expired' end) end,
           v_now
    from released r
  )
  select count(*), array_agg(r.tenant_id) filter (where r.state = 'retry_wait'),
         array_agg(r.kind) filter (where r.state = 'retry_wait'),
         array_agg(r.queue) filter (where r.state = 'retry_wait')
  into v_count, v_retrying, v_retrying_kinds, v_retrying_queues
  from released r;
  -- Jobs back in retry_wait are claimable now: their tenants and kinds are due a turn.
  if v_retrying is not null then
    perform app.wake_tenants(v_retrying_queues, v_retrying, null, v_retrying_kinds);
  end if;
  return v_count;
end;
$$;
revoke all on function app.release_expired(uuid, integer) from public;

create or replace function app.release_expired_jobs(
  p_tenant_id uuid,
  p_limit integer default 100
)
returns integer
language plpgsql
security definer
set search_path = pg_catalog, pg_temp
as $$
begin
  perform app.check_required('p_tenant_id', p_tenant_id);
  perform app.check_range('p_limit', p_limit, 1, 1000);
  return app.release_expired(p_tenant_id, p_limit);
end;
$$;
revoke all on function app.release_expired_jobs(uuid, integer) from public;
grant execute on function app.release_expired_jobs(uuid, integer) to leaseq_reaper;

-- The scheduled reaper's single call: expired leases of every tenant, oldest expiry
-- first, at most p_limit rows per call, scanning app.leases (the running jobs only).
create or replace function app.release_all_expired_jobs(p_limit integer default 1000)
returns integer
language plpgsql
security definer
set search_path = pg_catalog, pg_temp
as $$
begin
  perform app.check_range('p_limit', p_limit, 1, 10000);
  return app.release_expired(null, p_limit);
end;
$$;
revoke all on function app.release_all_expired_jobs(integer) from public;
grant execute on function app.release_all_expired_jobs(integer) to leaseq_reaper;
