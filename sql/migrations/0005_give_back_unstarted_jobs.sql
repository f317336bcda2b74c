-- leaseq 0005: give back claimed jobs that were never started.
--
-- A worker claims a batch, then checks before each job that the time left in its
-- invocation covers that job's budget. A job it cannot start in time is handed back
-- at once, with its claim undone: the attempt is not counted, it keeps its place in
-- the queue (available_at is unchanged), and other workers may claim it immediately
-- instead of waiting for the lease to expire. Fenced like every other transition.

create function app.release_jobs(
  p_owner text,
  p_tenant_ids uuid[],
  p_job_ids uuid[],
  p_tokens uuid[]
)
returns table (job_id uuid)
language plpgsql
security definer
set search_path = ''
as $$
#variable_conflict use_column
declare
  v_now timestamptz := clock_timestamp();
  v_count integer := coalesce(cardinality(p_job_ids), 0);
begin
  perform app.check_owner(p_owner);
  perform app.check_range('number of jobs', v_count, 1, 1000);
  if coalesce(cardinality(p_tenant_ids), -1) <> v_count
     or coalesce(cardinality(p_tokens), -1) <> v_count then
    perform app.raise_invalid('release arrays must all have the same length');
  end if;
  if array_position(p_job_ids, null) is not null
     or array_position(p_tenant_ids, null) is not null
     or array_position(p_tokens, null) is not null then
    perform app.raise_invalid('tenant_id, job_id and token are required for every job');
  end if;

  return query
  with input as (
    select u.tenant_id, u.job_id, u.token
    from unnest(p_tenant_ids, p_job_ids, p_tokens) as u(tenant_id, job_id, token)
  ), given_back as (
    update app.jobs j
    set state = case when j.attempts <= 1 then 'pending'::app.job_state
                     else 'retry_wait'::app.job_state end,
        attempts = j.attempts - 1,
        lease_owner = null,
        lease_token = null,
        lease_expires_at = null,
        updated_at = v_now
    from input i
    where j.id = i.job_id
      and j.tenant_id = i.tenant_id
      and j.state = 'running'
      and j.lease_owner = p_owner
      and j.lease_token = i.token
      and j.lease_expires_at > v_now
    returning j.id, j.tenant_id, j.attempts, i.token
  ), audit as (
    insert into app.job_events (tenant_id, job_id, event_type, actor, lease_token, details, created_at)
    select g.tenant_id, g.id, 'released', p_owner, g.token,
           jsonb_build_object('attempts', g.attempts, 'reason', 'not_started'),
           v_now
    from given_back g
  )
  select g.id from given_back g;
end;
$$;

revoke all on function app.release_jobs(text, uuid[], uuid[], uuid[]) from public;
grant execute on function app.release_jobs(text, uuid[], uuid[], uuid[]) to service_role;
