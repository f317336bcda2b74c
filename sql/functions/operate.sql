-- leaseq functions: operator actions (redrive, cancel, prune) and the reaper's prune.
--
-- Callers: leaseq_operator (redrive, cancel, prune by any age); leaseq_reaper only
-- prune_retained_jobs, bounded below by the owner's retention floor; leaseq_dashboard
-- only redrive_jobs_by_id and cancel_jobs_by_id (named jobs, never a filter), which
-- operators may call as well.
--
-- Decisions:
--   * redrive turns a dead job back into a pending one with attempts reset to 0: it gets
--     a whole new set of max_attempts. The previous attempts and the error that killed
--     it stay in the 'redriven' event (and in last_error until the next failure).
--   * cancel_jobs and cancel_jobs_by_id apply to pending and retry_wait jobs only. A
--     running job is cancelled by id only, through request_job_cancel: it records a
--     cancel request that the job's worker learns at its next renewal or outcome, and
--     the job ends 'cancelled' when that worker records anything or its lease expires
--     (a filter never reaches running jobs: stopping work in flight is a decision
--     about named jobs).
--
-- Argument bounds (anything outside, or NULL where required, raises 22023):
--   actor                 non-blank (app.is_blank), at most 200 characters
--   reason                at most 500 characters (NULL allowed)
--   job ids               1 .. 1000 per call, a one-dimensional array (NULL = no filter;
--                         required by the by-id forms)
--   kind filter           non-blank, at most 128 characters (NULL = no filter)
--   redrive/cancel limit  1 .. 1000 per call
--   prune age             0 seconds .. 3650 days; prune limit 1 .. 10000 per call
--   reaper's prune age    app.settings.min_retention .. 3650 days

-- Dead jobs matching every given filter (NULL = any) go back to pending, available now,
-- with attempts reset to 0, oldest death first, at most p_limit per call. Each gets a
-- 'redriven' event naming p_actor. Returns the jobs redriven.
create or replace function app.redrive_jobs(
  p_actor text,
  p_tenant_id uuid default null,
  p_job_ids uuid[] default null,
  p_kind text default null,
  p_limit integer default 100,
  p_reason text default null
)
returns table (job_id uuid, tenant_id uuid, kind text)
language plpgsql
security definer
set search_path = pg_catalog, pg_temp
as $$
#variable_conflict use_column
declare
  v_now timestamptz := clock_timestamp();
  v_step interval := app.priority_step();
  v_redriven_ids uuid[];
  v_redriven_tenants uuid[];
  v_redriven_kinds text[];
  v_redriven_queues text[];
begin
  perform app.check_actor(p_actor);
  perform app.check_filters(p_job_ids, p_kind, p_limit);
  perform app.check_reason(p_reason);

  with victims as materialized (
    select j.id, j.attempts as previous_attempts
    from app.jobs j
    where j.unsuccessful = 'dead'
      and (p_tenant_id is null or j.tenant_id = p_tenant_id)
      and (p_job_ids is null or j.id = any (p_job_ids))
      and (p_kind is null or j.kind = p_kind)
    order by j.unsuccessful_at, j.id
    for update skip locked
    limit p_limit
  ), redriven as (
    update app.jobs j
    set state = 'pending',
        attempts = 0,
        available_at = v_now,
        claim_key = v_now - (j.priority - 1) * v_step,
        completed_at = null,
        updated_at = v_now
    from victims v
    where j.id = v.id
    returning j.id, j.tenant_id, j.kind, j.queue, v.previous_attempts
  ), audit as (
    insert into app.job_events (tenant_id, job_id, event_type, actor, details, created_at)
    select r.tenant_id, r.id, 'redriven', p_actor,
           jsonb_strip_nulls(jsonb_build_object(
             'previousAttempts', r.previous_attempts,
             'reason', p_reason)),
           v_now
    from redriven r
  ), holds as (
    -- The days of a redriven job's events are kept until the job is pruned.
    insert into app.event_holds (day, tenant_id, job_id, reason)
    select distinct (e.created_at at time zone 'UTC')::date, e.tenant_id, e.job_id, 'redriven'
    from app.job_events e
    join redriven r on e.tenant_id = r.tenant_id and e.job_id = r.id
    on conflict do nothing
  )
  select array_agg(r.id order by r.id), array_agg(r.tenant_id order by r.id),
         array_agg(r.kind order by r.id), array_agg(r.queue order by r.id)
  into v_redriven_ids, v_redriven_tenants, v_redriven_kinds, v_redriven_queues
  from redriven r;
  -- Redriven jobs are claimable now: their tenants and kinds are due a turn.
  if v_redriven_ids is not null then
    perform app.wake_tenants(v_redriven_queues, v_redriven_tenants, null, v_redriven_kinds);
  end if;

  return query
  select u.id, u.tenant_id, u.kind
  from unnest(v_redriven_ids, v_redriven_tenants, v_redriven_kinds) as u(id, tenant_id, kind);
end;
$$;
revoke all on function app.redrive_jobs(text, uuid, uuid[], text, integer, text) from public;
grant execute on function app.redrive_jobs(text, uuid, uuid[], text, integer, text) to leaseq_operator;

-- Pending and retry_wait jobs matching every given filter become 'cancelled' (terminal,
-- completed now), at most p_limit per call, each with a 'cancelled' event. Jobs a
-- claimer holds locked right now are skipped: they are about to run.
create or replace function app.cancel_jobs(
  p_actor text,
  p_tenant_id uuid default null,
  p_job_ids uuid[] default null,
  p_kind text default null,
  p_limit integer default 100,
  p_reason text default null
)
returns table (job_id uuid, tenant_id uuid, kind text)
language plpgsql
security definer
set search_path = pg_catalog, pg_temp
as $$
#variable_conflict use_column
declare
  v_now timestamptz := clock_timestamp();
begin
  perform app.check_actor(p_actor);
  perform app.check_filters(p_job_ids, p_kind, p_limit);
  perform app.check_reason(p_reason);

  return query
  with victims as materialized (
    -- The waiting jobs through their claimable entries (a small table), in due order,
    -- and (limits hook, functions/admission.sql) the jobs a limit holds back.
    select j.id, j.state as previous_state
    from (
      select c.job_id, c.tenant_id, c.kind, c.available_at from app.claimable c
      union all
      select h.job_id, h.tenant_id, hj.kind, h.available_at
      from app.held_jobs h
      join app.jobs hj on hj.id = h.job_id and hj.tenant_id = h.tenant_id
    ) c
    join app.jobs j on j.id = c.job_id and j.tenant_id = c.tenant_id
    where j.state in ('pending', 'retry_wait')
      and (p_tenant_id is null or c.tenant_id = p_tenant_id)
      and (p_job_ids is null or c.job_id = any (p_job_ids))
      and (p_kind is null or c.kind = p_kind)
    order by c.available_at, c.job_id
    for update of j skip locked
    limit p_limit
  ), cancelled as (
    update app.jobs j
    set state = 'cancelled',
        completed_at = v_now,
        updated_at = v_now
    from victims v
    where j.id = v.id
    returning j.id, j.tenant_id, j.kind, j.attempts, v.previous_state
  ), audit as (
    insert into app.job_events (tenant_id, job_id, event_type, actor, details, created_at)
    select c.tenant_id, c.id, 'cancelled', p_actor,
           jsonb_strip_nulls(jsonb_build_object(
             'previousState', c.previous_state,
             'attempts', c.attempts,
             'reason', p_reason)),
           v_now
    from cancelled c
  )
  select c.id, c.tenant_id, c.kind from cancelled c order by c.id;
end;
$$;
revoke all on function app.cancel_jobs(text, uuid, uuid[], text, integer, text) from public;
grant execute on function app.cancel_jobs(text, uuid, uuid[], text, integer, text) to leaseq_operator;

-- The dashboard's actions (leaseq_dashboard): redrive or cancel exactly the jobs named
-- by id, as app.redrive_jobs and app.cancel_jobs do with only p_job_ids given. There is
-- no tenant or kind filter and no limit to pass: the ids are the whole selection, 1 ..
-- 1000 of them per call (the same bound as the ids of the filtered forms), each id
-- without NULL. A NULL or empty array is refused (22023), never read as "every job",
-- so a dashboard login can change at most the jobs a page listed, one call at a time.
-- Operators may call them too (a narrower form of what they may do already), so one
-- dashboard serves both the deployed login and an operator's own on the command line.
create or replace function app.redrive_jobs_by_id(
  p_actor text,
  p_job_ids uuid[],
  p_reason text default null
)
returns table (job_id uuid, tenant_id uuid, kind text)
language plpgsql
security definer
set search_path = pg_catalog, pg_temp
as $$
begin
  perform app.check_required('p_job_ids', p_job_ids);
  perform app.check_filters(p_job_ids, null, 1);
  return query
  select r.job_id, r.tenant_id, r.kind
  from app.redrive_jobs(p_actor, null, p_job_ids, null, cardinality(p_job_ids), p_reason) r;
end;
$$;
revoke all on function app.redrive_jobs_by_id(text, uuid[], text) from public;
grant execute on function app.redrive_jobs_by_id(text, uuid[], text) to leaseq_operator,
  leaseq_dashboard;

create or replace function app.cancel_jobs_by_id(
  p_actor text,
  p_job_ids uuid[],
  p_reason text default null
)
returns table (job_id uuid, tenant_id uuid, kind text)
language plpgsql
security definer
set search_path = pg_catalog, pg_temp
as $$
begin
  perform app.check_required('p_job_ids', p_job_ids);
  perform app.check_filters(p_job_ids, null, 1);
  return query
  select c.job_id, c.tenant_id, c.kind
  from app.cancel_jobs(p_actor, null, p_job_ids, null, cardinality(p_job_ids), p_reason) c;
end;
$$;
revoke all on function app.cancel_jobs_by_id(text, uuid[], text) from public;
grant execute on function app.cancel_jobs_by_id(text, uuid[], text) to leaseq_operator,
  leaseq_dashboard;

-- Cancel the named jobs whatever they are doing (1 .. 1000 ids, none NULL): a pending
-- or retry_wait job is cancelled at once (a 'cancelled' event, as app.cancel_jobs);
-- a running job gets a cancel request: cancel_requested_at and cancel_requested_by
-- (p_actor) are set and a 'cancel_requested' event is written, both naming p_actor
-- and the login that called (details.login, the connection's session_user). Its worker
-- is told at its next lease renewal (app.renew_job_lease_status) or outcome, and the
-- job ends 'cancelled' then (app.finish_jobs, app.release_jobs) or when the reaper
-- finds its lease expired (app.release_expired_jobs), never retried. A request made
-- twice keeps the first (no second event). Finished jobs and unknown ids give no row.
-- Each job is locked first, waiting for (never skipping) a claim, an outcome or the
-- reaper that holds it (up to 5 s, then 55P03 and nothing changed), so a cancel racing
-- any of them acts on the state they leave: a job the reaper just put back in retry_wait is cancelled at once, one
-- a claimer just took gets the request. Rows: every job acted on, with its state after
-- the call (cancelled, or running with the request).
create or replace function app.request_job_cancel(
  p_actor text,
  p_job_ids uuid[],
  p_reason text default null
)
returns table (
  job_id uuid,
  tenant_id uuid,
  kind text,
  state app.job_state,
  cancel_requested_at timestamptz,
  cancel_requested_by text
)
language plpgsql
security definer
set search_path = pg_catalog, pg_temp
as $$
#variable_conflict use_column
declare
  v_now timestamptz;
  v_login text := session_user;
  v_tries integer := 0;
begin
  perform app.check_actor(p_actor);
  perform app.check_required('p_job_ids', p_job_ids);
  perform app.check_filters(p_job_ids, null, 1);
  perform app.check_reason(p_reason);

  -- Wait for whoever holds the rows, then read them afresh: in READ COMMITTED each
  -- statement below sees the versions committed before it began, and these locks keep
  -- them until this transaction ends. The locks are taken all at once or not at all
  -- (NOWAIT in a block of its own, whose failure releases what it took), and tried
  -- again every 10 ms for up to 5 s: this call never holds a job while it waits for
  -- another, so it cannot deadlock with a worker finishing a batch in another order.
  loop
    begin
      perform 1 from app.jobs j
      where j.id = any (p_job_ids)
      order by j.id
      for update nowait;
      exit;
    exception when lock_not_available then
      v_tries := v_tries + 1;
      if v_tries >= 500 then
        raise exception using
          errcode = '55P03',
          message = 'the jobs to cancel stayed locked for 5 seconds (a claim, an outcome '
                    'or the reaper holds one of them)',
          hint = 'Nothing was changed; try again.';
      end if;
      perform pg_sleep(0.01);
    end;
  end loop;

  v_now := clock_timestamp();
  -- Every part of the statement reads the same snapshot: "before" is each job as the
  -- locks left it, and neither update's rows are seen changed by the other parts.
  return query
  with before as materialized (
    select j.id, j.state, j.cancel_requested_at, j.cancel_requested_by
    from app.jobs j
    where j.id = any (p_job_ids)
  ), cancelled as (
    update app.jobs j
    set state = 'cancelled',
        completed_at = v_now,
        updated_at = v_now
    from before b
    where j.id = b.id
      and b.state in ('pending', 'retry_wait')
    returning j.id, j.tenant_id, j.kind, j.attempts, b.state as previous_state
  ), requested as (
    update app.jobs j
    set cancel_requested_at = v_now,
        cancel_requested_by = p_actor,
        updated_at = v_now
    where j.id = any (p_job_ids)
      and j.state = 'running'
      and j.cancel_requested_at is null
    returning j.id, j.tenant_id, j.kind, j.attempts, j.lease_owner,
              (select l.lease_token from app.leases l where l.job_id = j.id) as lease_token
  ), audit as (
    insert into app.job_events (tenant_id, job_id, event_type, actor, lease_token, details, created_at)
    select c.tenant_id, c.id, 'cancelled', p_actor, null,
           jsonb_strip_nulls(jsonb_build_object(
             'previousState', c.previous_state, 'attempts', c.attempts,
             'reason', p_reason, 'login', v_login)),
           v_now
    from cancelled c
    union all
    select r.tenant_id, r.id, 'cancel_requested', p_actor, r.lease_token,
           jsonb_strip_nulls(jsonb_build_object(
             'attempt', r.attempts, 'leaseOwner', r.lease_owner,
             'reason', p_reason, 'login', v_login)),
           v_now
    from requested r
  )
  select c.id, c.tenant_id, c.kind, 'cancelled'::app.job_state, null::timestamptz, null::text
  from cancelled c
  union all
  select r.id, r.tenant_id, r.kind, 'running'::app.job_state, v_now, p_actor
  from requested r
  union all
  select j.id, j.tenant_id, j.kind, b.state, b.cancel_requested_at, b.cancel_requested_by
  from before b
  join app.jobs j on j.id = b.id
  where b.state = 'running'
    and b.cancel_requested_at is not null
  order by 1;
end;
$$;
revoke all on function app.request_job_cancel(text, uuid[], text) from public;
grant execute on function app.request_job_cancel(text, uuid[], text) to leaseq_operator,
  leaseq_dashboard;

-- One bounded batch: finished jobs (succeeded, dead, cancelled) completed more than
-- p_older_than ago, oldest first, with their events. Rows locked by someone else are
-- skipped, so a batch never waits; callers loop until jobs_deleted < p_limit. Each call
-- is its own short transaction holding row locks on at most p_limit jobs.
create or replace function app.prune_jobs(
  p_older_than interval,
  p_limit integer default 1000
)
returns table (jobs_deleted integer, events_deleted integer)
language plpgsql
security definer
set search_path = pg_catalog, pg_temp
as $$
declare
  v_cutoff timestamptz;
  v_day_cut timestamptz;
  v_jobs integer;
  v_events integer;
begin
  perform app.check_interval('p_older_than', p_older_than, interval '0 seconds',
                             interval '3650 days');
  perform app.check_range('p_limit', p_limit, 1, 10000);
  v_cutoff := clock_timestamp() - p_older_than;
  v_day_cut := (v_cutoff at time zone 'UTC')::date::timestamp at time zone 'UTC';

  with found as (
    -- The oldest finished jobs: succeeded ones by their 'succeeded' event
    -- (job_events_succeeded_idx), dead and cancelled ones by jobs_unsuccessful_idx.
    (select j.id, j.tenant_id, e.created_at as finished_at, e.created_at as event_at
     from app.job_events e
     -- One probe per event, in the index's order (LIMIT 1 keeps it from being flattened
     -- into a join whose size the planner underestimates and hashes whole).
     cross join lateral (
       select x.id, x.tenant_id from app.jobs x
       where x.id = e.job_id and x.tenant_id = e.tenant_id and x.state = 'succeeded'
       limit 1) j
     where e.event_type = 'succeeded' and e.created_at < v_cutoff
     order by e.created_at
     limit p_limit)
    union all
    (select j.id, j.tenant_id, j.unsuccessful_at, null::timestamptz
     from app.jobs j
     where j.unsuccessful in ('dead', 'cancelled') and j.unsuccessful_at < v_cutoff
     order by j.unsuccessful_at
     limit p_limit)
  ), victims as materialized (
    select j.id, j.tenant_id, f.event_at
    from found f
    join app.jobs j on j.id = f.id and j.tenant_id = f.tenant_id
    where j.completed_at < v_cutoff
      and j.state in ('succeeded', 'dead', 'cancelled')
    order by f.finished_at
    for update of j skip locked
    limit p_limit
  ), gone_succeeded as (
    -- A succeeded job's event is what finds it here, so it goes with the job even in a
    -- day the drop would take whole: the next batch must not meet it again.
    delete from app.job_events e
    using victims v
    where e.created_at = v.event_at and e.created_at < v_day_cut
      and e.event_type = 'succeeded' and e.tenant_id = v.tenant_id and e.job_id = v.id
    returning 1
  ), gone_events as (
    -- Events of the days retention drops whole are left to the drop.
    delete from app.job_events e
    using victims v
    where e.tenant_id = v.tenant_id and e.job_id = v.id and e.created_at >= v_day_cut
    returning 1
  ), gone_moved as (
    -- Events moved out of a dropped day are in DEFAULT.
    delete from app_events.job_events_default e
    using victims v
    where e.tenant_id = v.tenant_id and e.job_id = v.id and e.created_at < v_day_cut
      and (e.created_at, e.event_type) is distinct from (v.event_at, 'succeeded')
    returning 1
  ), gone_jobs as (
    delete from app.jobs j
    using victims v
    where j.id = v.id
    returning 1
  )
  select (select count(*) from gone_jobs),
         (select count(*) from gone_events) + (select count(*) from gone_moved)
           + (select count(*) from gone_succeeded)
  into v_jobs, v_events;

  -- Nothing older is left: drop the days that ended before the cutoff.
  if v_jobs < p_limit then
    perform app.drop_event_days(v_cutoff);
  end if;

  jobs_deleted := v_jobs;
  events_deleted := v_events;
  return next;
end;
$$;
revoke all on function app.prune_jobs(interval, integer) from public;
grant execute on function app.prune_jobs(interval, integer) to leaseq_operator;

-- The reaper's prune: app.prune_jobs, except that p_older_than may not be less than
-- app.settings.min_retention, which only the owner can change. A reaper login may
-- therefore apply its configured retention (LEASEQ_RETENTION_DAYS) but never delete
-- the recent history of jobs (prune_jobs('0 seconds') is an operator's decision).
-- Below the floor it raises 22023 and deletes nothing.
create or replace function app.prune_retained_jobs(
  p_older_than interval,
  p_limit integer default 1000
)
returns table (jobs_deleted integer, events_deleted integer)
language plpgsql
security definer
set search_path = pg_catalog, pg_temp
as $$
declare
  v_floor interval;
begin
  select s.min_retention into v_floor from app.settings s;
  if v_floor is null then
    raise exception using
      errcode = '55000',
      message = 'app.settings has no row, so the retention floor is unknown',
      hint = 'Restore it as the schema owner: insert into app.settings default values.';
  end if;
  if p_older_than is null or p_older_than < v_floor or p_older_than > interval '3650 days' then
    perform app.raise_invalid(format(
      'p_older_than must be between %s (app.settings.min_retention) and 3650 days (got %s)',
      v_floor, coalesce(p_older_than::text, 'NULL')));
  end if;
  return query select * from app.prune_jobs(p_older_than, p_limit);
end;
$$;
revoke all on function app.prune_retained_jobs(interval, integer) from public;
grant execute on function app.prune_retained_jobs(interval, integer) to leaseq_reaper;
