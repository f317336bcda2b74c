-- leaseq functions: reads for operators, the command line and the dashboard.
--
-- One file over 600 lines: each operator read sits beside its tenant reader's form
-- (reader_*, security invoker, row-level security), so a change to one is seen next to the
-- other; the two cannot share a body, as they run with different rights.
--
-- The dashboard's group (leaseq_dashboard) may execute the five reads its pages use:
-- get_job, job_timeline, queue_depth, job_activity and list_jobs; not queue_status or
-- dead_jobs, which only the command line calls.
--
-- Reads never return lease tokens: they fence a worker's writes; an operator needs the
-- owner and expiry, never the token. Dead list limit 1 .. 1000; timeline 1 .. 10000
-- events.

-- Per tenant and state: how many jobs, how many of them are ready to run now, how long
-- the oldest ready one has waited, how soon the next one not yet ready will be, and
-- (running jobs) how many have a cancel request their worker has not acted on yet.
-- Scans app.jobs: an operator's query, not a hot-path one. p_tenant_id NULL means every
-- tenant.
create or replace function app.queue_status(p_tenant_id uuid default null)
returns table (
  tenant_id uuid,
  state app.job_state,
  jobs bigint,
  ready_jobs bigint,
  oldest_ready_age interval,
  next_ready_in interval,
  cancel_requested bigint
)
language plpgsql
stable
security definer
set search_path = pg_catalog, pg_temp
as $$
#variable_conflict use_column
declare
  v_now timestamptz := clock_timestamp();
begin
  return query
  select j.tenant_id,
         j.state,
         count(*),
         count(*) filter (where j.state in ('pending', 'retry_wait') and j.available_at <= v_now),
         v_now - min(j.available_at)
           filter (where j.state in ('pending', 'retry_wait') and j.available_at <= v_now),
         min(j.available_at)
           filter (where j.state in ('pending', 'retry_wait') and j.available_at > v_now) - v_now,
         count(*) filter (where j.state = 'running' and j.cancel_requested_at is not null)
  from app.jobs j
  where p_tenant_id is null or j.tenant_id = p_tenant_id
  group by j.tenant_id, j.state
  order by j.tenant_id, j.state;
end;
$$;
revoke all on function app.queue_status(uuid) from public;
grant execute on function app.queue_status(uuid) to leaseq_operator;

-- One job, without its lease token, with its cancel request (when and by whom; NULL
-- when none was made). No row when the id is unknown.
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
  completed_at timestamptz,
  cancel_requested_at timestamptz,
  cancel_requested_by text
)
language plpgsql
stable
security definer
set search_path = pg_catalog, pg_temp
as $$
#variable_conflict use_column
begin
  perform app.check_required('p_job_id', p_job_id);
  return query
  select j.id, j.tenant_id, j.operation_key, j.kind, j.payload::jsonb, j.state, j.attempts,
         j.max_attempts, j.available_at, j.lease_owner,
         (select l.expires_at from app.leases l where l.job_id = j.id), j.last_error,
         j.result, j.correlation_id, j.created_at, j.updated_at, j.completed_at,
         j.cancel_requested_at, j.cancel_requested_by
  from app.jobs j
  where j.id = p_job_id;
end;
$$;
revoke all on function app.get_job(uuid) from public;
grant execute on function app.get_job(uuid) to leaseq_operator, leaseq_dashboard;

-- A job's audit trail in the order it was written (first p_limit events).
create or replace function app.job_timeline(p_job_id uuid, p_limit integer default 1000)
returns table (
  sequence bigint,
  event_type text,
  actor text,
  details jsonb,
  created_at timestamptz
)
language plpgsql
stable
security definer
set search_path = pg_catalog, pg_temp
as $$
#variable_conflict use_column
begin
  perform app.check_required('p_job_id', p_job_id);
  perform app.check_range('p_limit', p_limit, 1, 10000);
  return query
  select e.sequence, e.event_type, e.actor, e.details, e.created_at
  from app.jobs j
  join app.job_events e on e.tenant_id = j.tenant_id and e.job_id = j.id
  where j.id = p_job_id
  order by e.sequence
  limit p_limit;
end;
$$;
revoke all on function app.job_timeline(uuid, integer) from public;
grant execute on function app.job_timeline(uuid, integer) to leaseq_operator, leaseq_dashboard;

-- Dead jobs, most recent death first, with the reason their 'dead' event recorded.
create or replace function app.dead_jobs(
  p_tenant_id uuid default null,
  p_kind text default null,
  p_limit integer default 100
)
returns table (
  id uuid,
  tenant_id uuid,
  kind text,
  operation_key text,
  attempts integer,
  max_attempts integer,
  reason text,
  last_error jsonb,
  completed_at timestamptz
)
language plpgsql
stable
security definer
set search_path = pg_catalog, pg_temp
as $$
#variable_conflict use_column
begin
  perform app.check_filters(null, p_kind, p_limit);
  return query
  select j.id, j.tenant_id, j.kind, j.operation_key, j.attempts, j.max_attempts,
         d.reason, j.last_error, j.completed_at
  from app.jobs j
  left join lateral (
    select e.details ->> 'reason' as reason
    from app.job_events e
    where e.tenant_id = j.tenant_id and e.job_id = j.id and e.event_type = 'dead'
    order by e.sequence desc
    limit 1
  ) d on true
  where j.unsuccessful = 'dead'
    and (p_tenant_id is null or j.tenant_id = p_tenant_id)
    and (p_kind is null or j.kind = p_kind)
  order by j.unsuccessful_at desc, j.id
  limit p_limit;
end;
$$;
revoke all on function app.dead_jobs(uuid, text, integer) from public;
grant execute on function app.dead_jobs(uuid, text, integer) to leaseq_operator;

-- Dashboard reads --------------------------------------------------------------------
--
-- Each read has two forms with one body:
--   * app.reader_<name> runs with the caller's rights (SECURITY INVOKER) and is granted
--     to authenticated: called by a tenant reader (a role bound in app.tenant_readers,
--     with app.tenant_id set for the transaction), row-level security picks that
--     tenant's rows, and a reader bound to nothing sees nothing. The filtering is the
--     policies', not this code's, so a wrong p_tenant_id can never widen what it sees.
--   * app.<name> (SECURITY DEFINER, granted to leaseq_operator and leaseq_dashboard)
--     calls the reader form as the schema owner, who is not subject to RLS: every
--     tenant.
-- The reader forms check their own arguments (22023) instead of calling app.check_*,
-- which only the owner may execute. None of them reads lease_token, which readers are
-- not granted and an operator never needs.

-- Queue depth now: per tenant, per kind and in total, the jobs that are not finished
-- (pending, of which ready now; running, of which past their lease expiry; retry_wait)
-- and the dead ones still kept, with the oldest ready job's available_at. Tenants come
-- longest-waiting first (then deepest), at most p_limit of them; kinds at most 200.
-- The three branches read app.claimable, app.leases (with their jobs) and
-- jobs_dead_tenant_idx, so the cost is the number of unfinished and dead jobs, never the
-- finished history (docs/benchmarks.md, "Dashboard").
create or replace function app.reader_queue_depth(
  p_tenant_id uuid default null,
  p_kind text default null,
  p_limit integer default 20
)
returns table (
  dimension text,
  tenant_id uuid,
  kind text,
  pending bigint,
  ready bigint,
  running bigint,
  expired bigint,
  retry_wait bigint,
  dead bigint,
  oldest_ready_at timestamptz
)
language plpgsql
stable
security invoker
set search_path = pg_catalog, pg_temp
as $$
#variable_conflict use_column
declare
  v_now timestamptz := clock_timestamp();
begin
  if p_kind is not null and (p_kind ~ '^\s*$' or length(p_kind) > 128) then
    raise exception using errcode = '22023',
      message = 'p_kind must be a non-blank text of at most 128 characters';
  end if;
  if p_limit is null or p_limit < 1 or p_limit > 1000 then
    raise exception using errcode = '22023',
      message = format('p_limit must be between 1 and 1000 (got %s)',
                       coalesce(p_limit::text, 'NULL'));
  end if;
  return query
  with live as (
    -- The claimable entries and the leases are small tables of their own (0023), read
    -- whole; the dead jobs are an index-only scan of jobs_dead_tenant_idx.
    select c.tenant_id, c.kind, c.state, c.available_at, null::timestamptz as lease_expires_at
    from app.claimable c
    where (p_tenant_id is null or c.tenant_id = p_tenant_id)
      and (p_kind is null or c.kind = p_kind)
    union all
    select j.tenant_id, j.kind, j.state, j.available_at, l.expires_at
    from app.leases l
    join app.jobs j on j.id = l.job_id and j.tenant_id = l.tenant_id
    where j.state = 'running'
      and (p_tenant_id is null or l.tenant_id = p_tenant_id)
      and (p_kind is null or j.kind = p_kind)
    union all
    select j.tenant_id, j.kind, 'dead'::app.job_state, null::timestamptz, null::timestamptz
    from app.jobs j
    where j.unsuccessful = 'dead'
      and (p_tenant_id is null or j.tenant_id = p_tenant_id)
      and (p_kind is null or j.kind = p_kind)
  ), grouped as (
    select case when grouping(l.tenant_id) = 0 then 'tenant'
                when grouping(l.kind) = 0 then 'kind'
                else 'total' end as dimension,
           l.tenant_id,
           l.kind,
           count(*) filter (where l.state = 'pending') as pending,
           count(*) filter (where l.state in ('pending', 'retry_wait')
                              and l.available_at <= v_now) as ready,
           count(*) filter (where l.state = 'running') as running,
           count(*) filter (where l.state = 'running' and l.lease_expires_at < v_now)
             as expired,
           count(*) filter (where l.state = 'retry_wait') as retry_wait,
           count(*) filter (where l.state = 'dead') as dead,
           min(l.available_at) filter (where l.state in ('pending', 'retry_wait')
                                         and l.available_at <= v_now) as oldest_ready_at
    from live l
    group by grouping sets ((l.tenant_id), (l.kind), ())
  ), ranked as (
    select g.*,
           row_number() over (
             partition by g.dimension
             order by g.oldest_ready_at nulls last,
                      g.pending + g.running + g.retry_wait + g.dead desc,
                      g.tenant_id, g.kind) as position
    from grouped g
  )
  select r.dimension, r.tenant_id, r.kind, r.pending, r.ready, r.running, r.expired,
         r.retry_wait, r.dead, r.oldest_ready_at
  from ranked r
  where r.dimension = 'total'
     or (r.dimension = 'kind' and r.position <= 200)
     or (r.dimension = 'tenant' and r.position <= p_limit)
  order by r.dimension, r.position;
end;
$$;
revoke all on function app.reader_queue_depth(uuid, text, integer) from public;
grant execute on function app.reader_queue_depth(uuid, text, integer) to authenticated;

create or replace function app.queue_depth(
  p_tenant_id uuid default null,
  p_kind text default null,
  p_limit integer default 20
)
returns table (
  dimension text,
  tenant_id uuid,
  kind text,
  pending bigint,
  ready bigint,
  running bigint,
  expired bigint,
  retry_wait bigint,
  dead bigint,
  oldest_ready_at timestamptz
)
language sql
stable
security definer
set search_path = pg_catalog, pg_temp
as $$
  select * from app.reader_queue_depth(p_tenant_id, p_kind, p_limit)
$$;
revoke all on function app.queue_depth(uuid, text, integer) from public;
grant execute on function app.queue_depth(uuid, text, integer) to leaseq_operator,
  leaseq_dashboard;

-- Finished work over the last p_window, in p_buckets equal buckets of completion time
-- (the first bucket starts p_window ago, the last ends now): how many jobs succeeded,
-- died or were cancelled, and, from up to p_samples of the latest jobs finished in each
-- bucket, how many of them needed more than one attempt and their enqueue-to-start
-- latency: the first claim minus the time the job became available at enqueue (a job
-- scheduled for later is not counted as waiting before its time). Buckets without jobs
-- come back with zeros.
--
-- Without a tenant or kind filter the counts are index-only scans: succeeded jobs from
-- their 'succeeded' events (job_events_succeeded_idx: a succeeded job has exactly one, at
-- its completed_at), dead and cancelled ones from jobs_unsuccessful_idx. With a kind
-- they read the same two, each succeeded event's job probed for its kind; with a tenant
-- (given, or a tenant reader's own) that tenant's jobs through
-- jobs_operation_key_unique. The samples read at most p_samples x p_buckets jobs of
-- each source and their first events, by primary key.
create or replace function app.reader_job_activity(
  p_tenant_id uuid default null,
  p_kind text default null,
  p_window interval default '24 hours',
  p_buckets integer default 24,
  p_samples integer default 20
)
returns table (
  bucket_start timestamptz,
  bucket_end timestamptz,
  succeeded bigint,
  dead bigint,
  cancelled bigint,
  samples bigint,
  samples_retried bigint,
  latency_p50 interval,
  latency_p95 interval,
  latency_max interval
)
language plpgsql
stable
security invoker
set search_path = pg_catalog, pg_temp
as $$
#variable_conflict use_column
declare
  v_now timestamptz := clock_timestamp();
  v_start timestamptz;
  v_width interval;
  v_counts jsonb;
  v_sql text;
  -- The bucket (0 .. p_buckets - 1) of a time in the window: $3 its start, $4 its end,
  -- $5 the buckets, as the statements below bind them.
  v_bucket constant text := 'least(width_bucket(extract(epoch from %s), extract(epoch from'
    ' $3), extract(epoch from $4), $5), $5) - 1';
begin
  if p_kind is not null and (p_kind ~ '^\s*$' or length(p_kind) > 128) then
    raise exception using errcode = '22023',
      message = 'p_kind must be a non-blank text of at most 128 characters';
  end if;
  if p_window is null or p_window < interval '1 minute' or p_window > interval '31 days' then
    raise exception using errcode = '22023',
      message = format('p_window must be between 00:01:00 and 31 days (got %s)',
                       coalesce(p_window::text, 'NULL'));
  end if;
  if p_buckets is null or p_buckets < 1 or p_buckets > 240 then
    raise exception using errcode = '22023',
      message = format('p_buckets must be between 1 and 240 (got %s)',
                       coalesce(p_buckets::text, 'NULL'));
  end if;
  if p_samples is null or p_samples < 0 or p_samples > 500 then
    raise exception using errcode = '22023',
      message = format('p_samples must be between 0 and 500 (got %s)',
                       coalesce(p_samples::text, 'NULL'));
  end if;
  v_start := v_now - p_window;
  v_width := p_window / p_buckets;
  -- A tenant reader's rows are one tenant's (row-level security): naming it lets the
  -- reads below take that tenant's index instead of filtering everyone's rows.
  p_tenant_id := coalesce(p_tenant_id, app.current_tenant_id());

  -- Counts per bucket as {"i": [finished, dead, cancelled]}; bucket i covers
  -- [v_start + i * v_width, v_start + (i + 1) * v_width). Built from fixed fragments for
  -- the filters given (values bound), so that each form is planned for what it reads:
  --   * every tenant: succeeded jobs by their events, dead and cancelled ones by
  --     jobs_unsuccessful_idx, both index-only; with a kind, each succeeded event's job
  --     probed for it, and the dead and cancelled ones filtered on the included kind;
  --   * one tenant: its jobs, by its index (jobs_operation_key_unique).
  if p_tenant_id is null then
    v_sql := 'select ' || format(v_bucket, 'e.created_at') || ' as i, count(*) as finished,'
      || ' 0 as dead, 0 as cancelled from app.job_events e'
      || ' where e.event_type = ''succeeded'' and e.created_at >= $3'
      || case when p_kind is null then '' else ' and exists (select 1 from app.jobs x'
           || ' where x.id = e.job_id and x.tenant_id = e.tenant_id and x.kind = $2)' end
      || ' group by 1 union all select ' || format(v_bucket, 'j.unsuccessful_at')
      || ', count(*), count(*) filter (where j.unsuccessful = ''dead''),'
      || ' count(*) filter (where j.unsuccessful = ''cancelled'') from app.jobs j'
      || ' where j.unsuccessful in (''dead'', ''cancelled'') and j.unsuccessful_at >= $3'
      || case when p_kind is null then '' else ' and j.kind = $2' end
      || ' group by 1';
  else
    v_sql := 'select ' || format(v_bucket, 'j.completed_at') || ' as i, count(*) as finished,'
      || ' count(*) filter (where j.state = ''dead'') as dead,'
      || ' count(*) filter (where j.state = ''cancelled'') as cancelled from app.jobs j'
      || ' where j.tenant_id = $1 and j.completed_at >= $3'
      || case when p_kind is null then '' else ' and j.kind = $2' end
      || ' group by 1';
  end if;
  execute 'select coalesce(jsonb_object_agg(c.i, jsonb_build_array(c.finished, c.dead,'
    || ' c.cancelled)), ''{}'') from (select a.i, sum(a.finished) as finished,'
    || ' sum(a.dead) as dead, sum(a.cancelled) as cancelled from (' || v_sql
    || ') a group by a.i) c'
    into v_counts using p_tenant_id, p_kind, v_start, v_now, p_buckets;

  return query
  with buckets as (
    select b.i, v_start + v_width * b.i as lo, v_start + v_width * (b.i + 1) as hi
    from generate_series(0, p_buckets - 1) as b(i)
  ), waits as (
    select b.i, s.attempts,
           greatest(ev.claimed_at - greatest(s.created_at, ev.available_at),
                    interval '0') as wait
    from buckets b
    cross join lateral (
      -- The latest finished jobs of the bucket: of every tenant, the succeeded ones by
      -- their events and the dead and cancelled ones by jobs_unsuccessful_idx, merged;
      -- of one tenant, its jobs by its index.
      select f.id, f.tenant_id, f.created_at, f.attempts
      from (
        (select j.id, j.tenant_id, j.created_at, j.attempts, e.created_at as finished_at
         from app.job_events e
         -- A probe per event (LIMIT 1 keeps it one): as a plain join the planner
         -- multiplies the two key columns' selectivities, expects a handful of rows
         -- and hashes the whole window instead of walking the index in order.
         cross join lateral (
           select x.id, x.tenant_id, x.created_at, x.attempts
           from app.jobs x
           where x.id = e.job_id and x.tenant_id = e.tenant_id
             and (p_kind is null or x.kind = p_kind)
           limit 1) j
         where p_tenant_id is null and e.event_type = 'succeeded'
           and e.created_at >= b.lo and e.created_at < b.hi
         order by e.created_at desc
         limit p_samples)
        union all
        (select j.id, j.tenant_id, j.created_at, j.attempts, j.unsuccessful_at
         from app.jobs j
         where p_tenant_id is null and j.unsuccessful in ('dead', 'cancelled')
           and j.unsuccessful_at >= b.lo and j.unsuccessful_at < b.hi
           and (p_kind is null or j.kind = p_kind)
         order by j.unsuccessful_at desc
         limit p_samples)
        union all
        (select j.id, j.tenant_id, j.created_at, j.attempts, j.completed_at
         from app.jobs j
         where j.tenant_id = p_tenant_id
           and j.completed_at >= b.lo and j.completed_at < b.hi
           and (p_kind is null or j.kind = p_kind)
         order by j.completed_at desc
         limit p_samples)
      ) f
      order by f.finished_at desc
      limit p_samples
    ) s
    cross join lateral (
      select min(e.created_at) filter (where e.event_type = 'claimed') as claimed_at,
             min((e.details ->> 'availableAt')::timestamptz)
               filter (where e.event_type = 'created') as available_at
      from (
        select e.event_type, e.created_at, e.details
        from app.job_events e
        where e.tenant_id = s.tenant_id and e.job_id = s.id
        order by e.sequence
        limit 4
      ) e
    ) ev
    where ev.claimed_at is not null
  ), latency as (
    select w.i, count(*) as samples, count(*) filter (where w.attempts > 1) as retried,
           percentile_cont(0.5) within group (order by w.wait) as p50,
           percentile_cont(0.95) within group (order by w.wait) as p95,
           max(w.wait) as longest
    from waits w
    group by w.i
  )
  select b.lo, b.hi,
         coalesce((v_counts -> b.i::text ->> 0)::bigint, 0)
           - coalesce((v_counts -> b.i::text ->> 1)::bigint, 0)
           - coalesce((v_counts -> b.i::text ->> 2)::bigint, 0),
         coalesce((v_counts -> b.i::text ->> 1)::bigint, 0),
         coalesce((v_counts -> b.i::text ->> 2)::bigint, 0),
         coalesce(l.samples, 0), coalesce(l.retried, 0), l.p50, l.p95, l.longest
  from buckets b
  left join latency l on l.i = b.i
  order by b.i;
end;
$$;
revoke all on function app.reader_job_activity(uuid, text, interval, integer, integer) from public;
grant execute on function app.reader_job_activity(uuid, text, interval, integer, integer)
  to authenticated;

create or replace function app.job_activity(
  p_tenant_id uuid default null,
  p_kind text default null,
  p_window interval default '24 hours',
  p_buckets integer default 24,
  p_samples integer default 20
)
returns table (
  bucket_start timestamptz,
  bucket_end timestamptz,
  succeeded bigint,
  dead bigint,
  cancelled bigint,
  samples bigint,
  samples_retried bigint,
  latency_p50 interval,
  latency_p95 interval,
  latency_max interval
)
language sql
stable
security definer
set search_path = pg_catalog, pg_temp
as $$
  select * from app.reader_job_activity(p_tenant_id, p_kind, p_window, p_buckets, p_samples)
$$;
revoke all on function app.job_activity(uuid, text, interval, integer, integer)
  from public;
grant execute on function app.job_activity(uuid, text, interval, integer, integer)
  to leaseq_operator, leaseq_dashboard;

-- One page of the jobs in p_state, in that state's own order, which is also what is
-- most likely stuck first: pending and retry_wait by available_at (longest ready first),
-- running by lease expiry (expired first), finished states by completion, newest first.
-- Filters (NULL = any): tenant, kind, and a time range [p_from, p_to) on that same sort
-- time. Keyset paging: pass the last row's sort_at and id as p_after_at and p_after_id
-- to get the next page, so page 1000 costs what page 1 does (OFFSET would read every
-- row before it). The statement is built from fixed fragments for the filters given
-- (values are bound, never spliced), so each call is planned for its own filters and
-- walks one index range (sql/migrations/0010 lists which). error_summary is the error's
-- message (or the document) cut to 300 characters; the job page shows all of it.
create or replace function app.reader_list_jobs(
  p_state app.job_state,
  p_tenant_id uuid default null,
  p_kind text default null,
  p_from timestamptz default null,
  p_to timestamptz default null,
  p_after_at timestamptz default null,
  p_after_id uuid default null,
  p_limit integer default 50
)
returns table (
  id uuid,
  tenant_id uuid,
  kind text,
  state app.job_state,
  attempts integer,
  max_attempts integer,
  available_at timestamptz,
  lease_owner text,
  lease_expires_at timestamptz,
  error_summary text,
  created_at timestamptz,
  completed_at timestamptz,
  sort_at timestamptz
)
language plpgsql
stable
security invoker
set search_path = pg_catalog, pg_temp
as $$
declare
  v_column text;
  v_descending boolean;
  v_sql text;
begin
  if p_state is null then
    raise exception using errcode = '22023', message = 'p_state is required (got NULL)';
  end if;
  if p_kind is not null and (p_kind ~ '^\s*$' or length(p_kind) > 128) then
    raise exception using errcode = '22023',
      message = 'p_kind must be a non-blank text of at most 128 characters';
  end if;
  if p_limit is null or p_limit < 1 or p_limit > 500 then
    raise exception using errcode = '22023',
      message = format('p_limit must be between 1 and 500 (got %s)',
                       coalesce(p_limit::text, 'NULL'));
  end if;
  if (p_after_at is null) <> (p_after_id is null) then
    raise exception using errcode = '22023',
      message = 'p_after_at and p_after_id go together: give both or neither';
  end if;
  if p_from is not null and p_to is not null and p_from > p_to then
    raise exception using errcode = '22023',
      message = format('p_from must not be after p_to (got %s > %s)', p_from, p_to);
  end if;

  -- A tenant reader's rows are one tenant's (row-level security): naming it lets the
  -- list take that tenant's index instead of filtering everyone's rows.
  p_tenant_id := coalesce(p_tenant_id, app.current_tenant_id());

  v_column := case p_state
                when 'running' then 'lease_expires_at'
                when 'pending' then 'available_at'
                when 'retry_wait' then 'available_at'
                when 'succeeded' then 'succeeded_at'
                else 'unsuccessful_at' end;
  v_descending := p_state in ('succeeded', 'dead', 'cancelled');

  v_sql := format(
    'select j.id, j.tenant_id, j.kind, j.state, j.attempts, j.max_attempts, j.available_at,'
    ' j.lease_owner, j.lease_expires_at,'
    ' left(coalesce(j.last_error ->> ''message'', j.last_error::text), 300),'
    ' j.created_at, j.completed_at, j.%1$I'
    ' from %3$s j where j.%4$I = %2$L::app.job_state', v_column, p_state,
    -- Running jobs through their leases, waiting ones through their claimable entries
    -- (small tables), succeeded ones through their 'succeeded' events
    -- (job_events_succeeded_idx), dead and cancelled ones through jobs_unsuccessful_idx.
    case p_state
      when 'running' then '(select jj.*, l.expires_at as lease_expires_at'
        ' from app.leases l join app.jobs jj on jj.id = l.job_id and jj.tenant_id = l.tenant_id)'
      when 'pending' then '(select jj.*, null::timestamptz as lease_expires_at'
        ' from app.claimable c join app.jobs jj on jj.id = c.job_id and jj.tenant_id = c.tenant_id'
        ' where c.state = ''pending'')'
      when 'retry_wait' then '(select jj.*, null::timestamptz as lease_expires_at'
        ' from app.claimable c join app.jobs jj on jj.id = c.job_id and jj.tenant_id = c.tenant_id'
        ' where c.state = ''retry_wait'')'
      -- Of every tenant: one probe per event, in the index's order (LIMIT 1 keeps the
      -- planner from flattening it into a join it would misestimate and hash whole). Of
      -- one tenant: its jobs, by its index (the event's time is the row's completed_at).
      when 'succeeded' then case when p_tenant_id is null
        then '(select jj.*, null::timestamptz as lease_expires_at,'
          ' e.created_at as succeeded_at from app.job_events e'
          ' cross join lateral (select x.* from app.jobs x'
          ' where x.id = e.job_id and x.tenant_id = e.tenant_id limit 1) jj'
          ' where e.event_type = ''succeeded'')'
        else '(select jj.*, null::timestamptz as lease_expires_at,'
          ' jj.completed_at as succeeded_at from app.jobs jj)' end
      else '(select jj.*, null::timestamptz as lease_expires_at from app.jobs jj)' end,
    -- Dead and cancelled jobs by unsuccessful alone: naming state as well would make the
    -- planner multiply two selectivities that are one and sort the whole list.
    case when p_state in ('dead', 'cancelled') then 'unsuccessful' else 'state' end);
  if p_tenant_id is not null then
    v_sql := v_sql || ' and j.tenant_id = $1';
  end if;
  if p_kind is not null then
    v_sql := v_sql || ' and j.kind = $2';
  end if;
  if p_from is not null then
    v_sql := v_sql || format(' and j.%I >= $3', v_column);
  end if;
  if p_to is not null then
    v_sql := v_sql || format(' and j.%I < $4', v_column);
  end if;
  if p_after_at is not null then
    v_sql := v_sql || case when v_descending
      then format(' and j.%1$I <= $5 and (j.%1$I, j.id) < ($5, $6)', v_column)
      else format(' and j.%1$I >= $5 and (j.%1$I, j.id) > ($5, $6)', v_column) end;
  end if;
  v_sql := v_sql || case when v_descending
    then format(' order by j.%1$I desc, j.id desc limit $7', v_column)
    else format(' order by j.%1$I, j.id limit $7', v_column) end;

  return query execute v_sql
    using p_tenant_id, p_kind, p_from, p_to, p_after_at, p_after_id, p_limit;
end;
$$;
revoke all on function app.reader_list_jobs(app.job_state, uuid, text, timestamptz, timestamptz,
  timestamptz, uuid, integer) from public;
grant execute on function app.reader_list_jobs(app.job_state, uuid, text, timestamptz,
  timestamptz, timestamptz, uuid, integer) to authenticated;

create or replace function app.list_jobs(
  p_state app.job_state,
  p_tenant_id uuid default null,
  p_kind text default null,
  p_from timestamptz default null,
  p_to timestamptz default null,
  p_after_at timestamptz default null,
  p_after_id uuid default null,
  p_limit integer default 50
)
returns table (
  id uuid,
  tenant_id uuid,
  kind text,
  state app.job_state,
  attempts integer,
  max_attempts integer,
  available_at timestamptz,
  lease_owner text,
  lease_expires_at timestamptz,
  error_summary text,
  created_at timestamptz,
  completed_at timestamptz,
  sort_at timestamptz
)
language sql
stable
security definer
set search_path = pg_catalog, pg_temp
as $$
  select * from app.reader_list_jobs(p_state, p_tenant_id, p_kind, p_from, p_to,
                                     p_after_at, p_after_id, p_limit)
$$;
revoke all on function app.list_jobs(app.job_state, uuid, text, timestamptz, timestamptz,
  timestamptz, uuid, integer) from public;
grant execute on function app.list_jobs(app.job_state, uuid, text, timestamptz, timestamptz,
  timestamptz, uuid, integer) to leaseq_operator, leaseq_dashboard;

-- A reader's form of app.get_job: one job of the reader's tenant, without its lease
-- token; no row for an unknown id or another tenant's job (RLS hides it).
create or replace function app.reader_get_job(p_job_id uuid)
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
  completed_at timestamptz,
  cancel_requested_at timestamptz,
  cancel_requested_by text
)
language plpgsql
stable
security invoker
set search_path = pg_catalog, pg_temp
as $$
#variable_conflict use_column
begin
  if p_job_id is null then
    raise exception using errcode = '22023', message = 'p_job_id is required (got NULL)';
  end if;
  return query
  select j.id, j.tenant_id, j.operation_key, j.kind, j.payload::jsonb, j.state, j.attempts,
         j.max_attempts, j.available_at, j.lease_owner,
         (select l.expires_at from app.leases l where l.job_id = j.id), j.last_error,
         j.result, j.correlation_id, j.created_at, j.updated_at, j.completed_at,
         j.cancel_requested_at, j.cancel_requested_by
  from app.jobs j
  where j.id = p_job_id;
end;
$$;
revoke all on function app.reader_get_job(uuid) from public;
grant execute on function app.reader_get_job(uuid) to authenticated;

-- A reader's form of app.job_timeline: the job's events in order, for a job of the
-- reader's tenant (none otherwise), without lease tokens.
create or replace function app.reader_job_timeline(p_job_id uuid, p_limit integer default 1000)
returns table (
  sequence bigint,
  event_type text,
  actor text,
  details jsonb,
  created_at timestamptz
)
language plpgsql
stable
security invoker
set search_path = pg_catalog, pg_temp
as $$
#variable_conflict use_column
begin
  if p_job_id is null then
    raise exception using errcode = '22023', message = 'p_job_id is required (got NULL)';
  end if;
  if p_limit is null or p_limit < 1 or p_limit > 10000 then
    raise exception using errcode = '22023',
      message = format('p_limit must be between 1 and 10000 (got %s)',
                       coalesce(p_limit::text, 'NULL'));
  end if;
  return query
  select e.sequence, e.event_type, e.actor, e.details, e.created_at
  from app.jobs j
  join app.job_events e on e.tenant_id = j.tenant_id and e.job_id = j.id
  where j.id = p_job_id
  order by e.sequence
  limit p_limit;
end;
$$;
revoke all on function app.reader_job_timeline(uuid, integer) from public;
grant execute on function app.reader_job_timeline(uuid, integer) to authenticated;

-- Why a job is not running (sql/README.md, "Waiting jobs"). reason is one of:
--   scheduled        pending, not due yet: until is when it becomes claimable;
--   retry_wait       waiting for its retry: until is when it becomes claimable;
--   behind_priority  claimable, with claimable jobs of higher priority ahead of it in
--                    its tenant's claim order (higher_priority_ahead of jobs_ahead);
--   queued           claimable, behind jobs_ahead of no higher priority (its tenant's
--                    backlog, oldest first);
--   ready            claimable and first in its tenant's claim order: the next claim
--                    that serves its tenant (or its kind) takes it;
--   NULL             not waiting (running or finished).
--   held_by_limit    a concurrency or rate limit holds it back: held_by names the limit
--                    instance (kind:K, tenant:T, kind:K/tenant:T or key:L), available_at
--                    and claim_key are those it gets back when admitted;
-- Reserved for later releases, never written today: cancel_requested (a cancel is on
-- its way). A caller must
-- show an unknown reason as it is. Jobs ahead are counted up to 10,000 (10,000 means at
-- least that many): the count reads the tenant's claimable entries ahead in
-- claimable_order_idx and stops there.
--
-- The reader's form (SECURITY INVOKER: row-level security keeps it, and the jobs it
-- counts ahead, to the reader's tenant) holds the one definition; the operator's form
-- below calls it with the owner's rights. At most 500 ids per call (22023).
create or replace function app.reader_job_wait_reasons(p_job_ids uuid[])
returns table (
  job_id uuid,
  tenant_id uuid,
  state app.job_state,
  priority smallint,
  available_at timestamptz,
  claim_key timestamptz,
  reason text,
  until timestamptz,
  jobs_ahead integer,
  higher_priority_ahead integer,
  held_by text
)
language plpgsql
stable
security invoker
set search_path = pg_catalog, pg_temp
as $$
#variable_conflict use_column
begin
  if p_job_ids is null or cardinality(p_job_ids) not between 1 and 500 then
    raise exception using errcode = '22023',
      message = format('number of jobs must be between 1 and 500 (got %s)',
                       coalesce(cardinality(p_job_ids)::text, 'NULL'));
  end if;
  return query
  select j.id, j.tenant_id, j.state, j.priority, coalesce(h.available_at, j.available_at),
         coalesce(h.claim_key, j.claim_key),
         case
           when j.state not in ('pending', 'retry_wait') then null
           when h.job_id is not null then 'held_by_limit'
           when j.available_at > clock_timestamp() then
             case when j.state = 'retry_wait' then 'retry_wait' else 'scheduled' end
           when a.higher > 0 then 'behind_priority'
           when a.ahead > 0 then 'queued'
           else 'ready'
         end,
         case when j.state in ('pending', 'retry_wait') and j.available_at > clock_timestamp()
                   and h.job_id is null
              then j.available_at end,
         a.ahead, a.higher, h.bucket
  from app.jobs j
  -- A job a limit holds back (functions/admission.sql) has its real due time and claim
  -- key there, and the limit instance that holds it.
  left join app.held_jobs h on h.job_id = j.id and h.tenant_id = j.tenant_id
  left join lateral (
    select count(*)::integer as ahead,
           count(*) filter (where q.priority > j.priority)::integer as higher
    from (
      select q.priority
      from app.claimable q
      where q.tenant_id = j.tenant_id
        and q.claim_key <= j.claim_key
        and q.available_at <= clock_timestamp()
        and (q.claim_key, q.created_at, q.job_id) < (j.claim_key, j.created_at, j.id)
      limit 10000
    ) q
  ) a on j.state in ('pending', 'retry_wait') and j.available_at <= clock_timestamp()
  where j.id = any (p_job_ids);
end;
$$;
revoke all on function app.reader_job_wait_reasons(uuid[]) from public;
grant execute on function app.reader_job_wait_reasons(uuid[]) to authenticated;

-- The operator's and the dashboard's form: every tenant's jobs.
create or replace function app.job_wait_reasons(p_job_ids uuid[])
returns table (
  job_id uuid,
  tenant_id uuid,
  state app.job_state,
  priority smallint,
  available_at timestamptz,
  claim_key timestamptz,
  reason text,
  until timestamptz,
  jobs_ahead integer,
  higher_priority_ahead integer,
  held_by text
)
language plpgsql
stable
security definer
set search_path = pg_catalog, pg_temp
as $$
begin
  return query select * from app.reader_job_wait_reasons(p_job_ids);
end;
$$;
revoke all on function app.job_wait_reasons(uuid[]) from public;
grant execute on function app.job_wait_reasons(uuid[]) to leaseq_operator, leaseq_dashboard;

-- The waiting jobs of each tenant by reason (the reasons of
-- app.reader_job_wait_reasons, counted for every pending and retry_wait job): for
-- leaseq status. A ready job counts as
-- behind_priority when a claimable job of higher priority is ahead of it in its
-- tenant's claim order; next_at is the earliest time a job of the row becomes
-- claimable (scheduled, retry_wait), or the oldest due time (the others). Reads every
-- waiting job of the tenants asked for: an operator's read, not a hot path.
create or replace function app.waiting_jobs(p_tenant_id uuid default null)
returns table (tenant_id uuid, reason text, jobs bigint, next_at timestamptz)
language plpgsql
stable
security definer
set search_path = pg_catalog, pg_temp
as $$
#variable_conflict use_column
declare
  v_now timestamptz := clock_timestamp();
begin
  return query
  with waiting as (
    select j.tenant_id, j.state, j.available_at,
           j.available_at <= v_now as due,
           j.priority < max(j.priority) over (
             partition by j.tenant_id, j.available_at <= v_now
             order by j.claim_key, j.created_at, j.job_id
             rows between unbounded preceding and 1 preceding) as behind,
           row_number() over (
             partition by j.tenant_id, j.available_at <= v_now
             order by j.claim_key, j.created_at, j.job_id) as place
    from app.claimable j
    where (p_tenant_id is null or j.tenant_id = p_tenant_id)
  )
  select w.tenant_id,
         case
           when not w.due then
             case when w.state = 'retry_wait' then 'retry_wait' else 'scheduled' end
           when w.behind then 'behind_priority'
           when w.place > 1 then 'queued'
           else 'ready'
         end as reason,
         count(*),
         min(w.available_at)
  from waiting w
  group by 1, 2
  union all
  -- Jobs a limit holds back have no claimable entry (functions/admission.sql).
  select h.tenant_id, 'held_by_limit', count(*), min(h.available_at)
  from app.held_jobs h
  where (p_tenant_id is null or h.tenant_id = p_tenant_id)
  group by 1
  order by 1, 2;
end;
$$;
revoke all on function app.waiting_jobs(uuid) from public;
grant execute on function app.waiting_jobs(uuid) to leaseq_operator;
