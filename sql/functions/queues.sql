-- leaseq functions: named queues (tables in migrations/0026_named_queues.sql).
--
-- A job's queue decides which workers claim it (the claim functions' p_queue) and whose
-- pool fans out for it (functions/pool.sql). Operators pause and resume a queue; the
-- owner routes kinds to queues and sets a queue's own worker limit. Every read here is
-- per queue: depth, the oldest ready job's age, running, retrying and dead jobs, the
-- pool, and whether (and since when, by whom, why) it is paused.

-- The names of the paused queues, for the claims: one probe of queues_paused_idx (a
-- partial index of the paused rows only, so its cost stays one page however many queues
-- have rows; enable_seqscan is off here because the planner would otherwise scan the
-- small table, and a claim reads no table by a scan). p_queue, when given, is checked
-- first (22023 for a name no queue can have). Internal.
create or replace function app.paused_queues(p_queue text default null)
returns text[]
language plpgsql
stable
set search_path = pg_catalog, pg_temp
set enable_seqscan = off
as $$
begin
  if p_queue is not null and p_queue !~ '^[a-z][a-z0-9_-]{0,39}$' then
    perform app.check_queue('p_queue', p_queue);
  end if;
  return coalesce((select array_agg(q.name order by q.name) from app.queues q
                   where q.paused_at is not null),
                  '{}');
end;
$$;
revoke all on function app.paused_queues(text) from public;

-- The queue's row, created with no state of its own when it has none yet. Internal.
create or replace function app.ensure_queue(p_queue text)
returns void
language plpgsql
set search_path = pg_catalog, pg_temp
as $$
begin
  perform app.check_queue('p_queue', p_queue);
  if not exists (select 1 from app.queues q where q.name = p_queue) then
    insert into app.queues (name) values (p_queue) on conflict (name) do nothing;
  end if;
end;
$$;
revoke all on function app.ensure_queue(text) from public;

-- Pause a queue (operators, and the dashboard by its operator): from the commit on, no
-- claim takes its jobs, its pool neither fans out nor wakes, and a worker that starts for
-- it returns at once; jobs already running finish and record their outcomes as ever, and
-- producers may still enqueue into it. p_actor is the operator's identity (the command
-- line's OS user, the dashboard's IAM principal), p_reason why (optional, checked by
-- app.check_reason as for redrive and cancel). One 'paused' row in app.queue_events, with
-- p_actor and the login. Pausing a paused queue changes nothing and writes no event
-- (paused_at stays the first pause's).
-- Returns the queue's state after the call.
create or replace function app.pause_queue(p_queue text, p_actor text, p_reason text default null)
returns table (queue text, paused_at timestamptz, paused_by text, pause_reason text)
language plpgsql
security definer
set search_path = pg_catalog, pg_temp
as $$
#variable_conflict use_column
declare
  v_now timestamptz := clock_timestamp();
begin
  perform app.check_queue('p_queue', p_queue);
  perform app.check_actor(p_actor);
  perform app.check_reason(p_reason);
  perform app.ensure_queue(p_queue);
  update app.queues q
  set paused_at = v_now, paused_by = p_actor, pause_reason = p_reason, updated_at = v_now
  where q.name = p_queue and q.paused_at is null;
  if found then
    insert into app.queue_events (queue, event_type, actor, reason, created_at)
    values (p_queue, 'paused', p_actor, p_reason, v_now);
  end if;
  return query
  select q.name, q.paused_at, q.paused_by, q.pause_reason from app.queues q
  where q.name = p_queue;
end;
$$;
revoke all on function app.pause_queue(text, text, text) from public;
grant execute on function app.pause_queue(text, text, text) to leaseq_operator, leaseq_dashboard;

-- Resume a paused queue: its jobs are claimed again from the commit on (the next tick,
-- or a wake of its pool, starts its worker). One 'resumed' event with p_actor and the
-- login; resuming a queue that is not paused writes nothing. Returns the queue's state.
create or replace function app.resume_queue(p_queue text, p_actor text)
returns table (queue text, paused_at timestamptz, paused_by text, pause_reason text)
language plpgsql
security definer
set search_path = pg_catalog, pg_temp
as $$
#variable_conflict use_column
declare
  v_now timestamptz := clock_timestamp();
begin
  perform app.check_queue('p_queue', p_queue);
  perform app.check_actor(p_actor);
  perform app.ensure_queue(p_queue);
  update app.queues q
  set paused_at = null, paused_by = null, pause_reason = null, updated_at = v_now
  where q.name = p_queue and q.paused_at is not null;
  if found then
    insert into app.queue_events (queue, event_type, actor, created_at)
    values (p_queue, 'resumed', p_actor, v_now);
  end if;
  return query
  select q.name, q.paused_at, q.paused_by, q.pause_reason from app.queues q
  where q.name = p_queue;
end;
$$;
revoke all on function app.resume_queue(text, text) from public;
grant execute on function app.resume_queue(text, text) to leaseq_operator, leaseq_dashboard;

-- Every queue with its state and depth: the queues with a row (app.queues) and those any
-- unfinished or dead job names. Per queue: ready (claimable now), scheduled (pending or
-- retry_wait, due later), running, retrying (retry_wait), dead, the oldest ready job's
-- available_at, the pool's live and reserved places, its worker limit (the queue's own, or
-- the owner's max_workers) and the pause. One queue with p_queue. Reads the claimable
-- entries and the leases (the small tables of unfinished work, 0023_hot_and_cold_jobs)
-- and the dead jobs (jobs_unsuccessful_idx); finished jobs are never read. Operators, the dashboard, workers, and the reaper (its per-queue
-- metrics, once per tick).
create or replace function app.queue_overview(p_queue text default null)
returns table (
  queue text,
  ready bigint,
  scheduled bigint,
  running bigint,
  retrying bigint,
  dead bigint,
  oldest_ready_at timestamptz,
  live_workers integer,
  reserved_workers integer,
  max_workers integer,
  paused_at timestamptz,
  paused_by text,
  pause_reason text
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
  if p_queue is not null then
    perform app.check_queue('p_queue', p_queue);
  end if;
  return query
  with waiting as (
    select c.queue,
           count(*) filter (where c.available_at <= v_now) as ready,
           count(*) filter (where c.available_at > v_now) as scheduled,
           count(*) filter (where c.state = 'retry_wait') as retrying,
           min(c.available_at) filter (where c.available_at <= v_now) as oldest_ready_at
    from app.claimable c
    where p_queue is null or c.queue = p_queue
    group by c.queue
  ), busy as (
    select j.queue, count(*) as running
    from app.leases l
    join app.jobs j on j.id = l.job_id and j.tenant_id = l.tenant_id
    where p_queue is null or j.queue = p_queue
    group by j.queue
  ), counts as (
    select coalesce(w.queue, b.queue) as queue, coalesce(w.ready, 0) as ready,
           coalesce(w.scheduled, 0) as scheduled, coalesce(b.running, 0) as running,
           coalesce(w.retrying, 0) as retrying, w.oldest_ready_at
    from waiting w
    full join busy b on b.queue = w.queue
  ), dead as (
    select j.queue, count(*) as dead
    from app.jobs j
    where j.unsuccessful = 'dead' and (p_queue is null or j.queue = p_queue)
    group by j.queue
  ), pool as (
    select p.queue,
           (count(*) filter (where p.owner is not null))::integer as live,
           (count(*) filter (where p.owner is null))::integer as reserved
    from app.worker_pool p
    where p.expires_at > v_now and (p_queue is null or p.queue = p_queue)
    group by p.queue
  ), names as (
    select q.name from app.queues q where p_queue is null or q.name = p_queue
    union select c.queue from counts c
    union select d.queue from dead d
    union select p.queue from pool p
    union select p_queue where p_queue is not null
  )
  select n.name,
         coalesce(c.ready, 0), coalesce(c.scheduled, 0), coalesce(c.running, 0),
         coalesce(c.retrying, 0), coalesce(d.dead, 0), c.oldest_ready_at,
         coalesce(p.live, 0), coalesce(p.reserved, 0),
         coalesce(q.max_workers, (select s.max_workers from app.settings s)),
         q.paused_at, q.paused_by, q.pause_reason
  from names n
  left join app.queues q on q.name = n.name
  left join counts c on c.queue = n.name
  left join dead d on d.queue = n.name
  left join pool p on p.queue = n.name
  order by n.name;
end;
$$;
revoke all on function app.queue_overview(text) from public;
grant execute on function app.queue_overview(text)
  to leaseq_operator, leaseq_dashboard, leaseq_worker, leaseq_reaper;

-- A queue's pauses and resumes, newest first (at most p_limit, 1 .. 1000): who, from
-- which login, when and why. Operators and the dashboard.
create or replace function app.queue_history(p_queue text, p_limit integer default 100)
returns table (queue text, event_type text, actor text, login text, reason text,
               created_at timestamptz)
language plpgsql
stable
security definer
set search_path = pg_catalog, pg_temp
as $$
#variable_conflict use_column
begin
  perform app.check_queue('p_queue', p_queue);
  perform app.check_range('p_limit', p_limit, 1, 1000);
  return query
  select e.queue, e.event_type, e.actor, e.login, e.reason, e.created_at
  from app.queue_events e
  where e.queue = p_queue
  order by e.created_at desc, e.id desc
  limit p_limit;
end;
$$;
revoke all on function app.queue_history(text, integer) from public;
grant execute on function app.queue_history(text, integer) to leaseq_operator, leaseq_dashboard;

-- The owner routes kinds to a queue: a job of one of p_kinds enqueued without a queue
-- goes to p_queue from the commit on, and the kinds' jobs waiting (pending or retry_wait)
-- in 'default' move to it, so that an upgrade from a deployment whose second worker took
-- these kinds (the former slow-kinds worker) keeps them on the worker that has their
-- settings. A kind routed elsewhere before is routed here now; p_queue 'default' removes
-- the routes (and moves nothing back). Returns the number of waiting jobs moved. Runs
-- with the caller's rights and is granted to nobody: the deploy (the migrations custom
-- resource), or the owner's login.
create or replace function app.route_kinds(p_queue text, p_kinds text[])
returns bigint
language plpgsql
set search_path = pg_catalog, pg_temp
as $$
declare
  v_moved bigint := 0;
  v_tenants uuid[];
  v_kinds text[];
  v_ats timestamptz[];
begin
  perform app.check_queue('p_queue', p_queue);
  perform app.check_array('p_kinds', p_kinds);
  if p_queue = 'default' then
    delete from app.queue_kinds r where r.kind = any (p_kinds);
    return 0;
  end if;
  perform app.ensure_queue(p_queue);
  insert into app.queue_kinds (kind, queue)
  select distinct k.kind, p_queue from unnest(p_kinds) as k(kind) where k.kind is not null
  on conflict (kind) do update set queue = excluded.queue, updated_at = clock_timestamp();
  -- The waiting jobs, found by their claimable entries (the job table has no index on
  -- waiting jobs); the update trigger moves each entry to the new queue, and their
  -- tenants and kinds get their turns there (each queue has its own, turns.sql).
  with moved as (
    update app.jobs j
    set queue = p_queue
    from app.claimable c
    where c.queue = 'default' and c.kind = any (p_kinds)
      and j.id = c.job_id and j.tenant_id = c.tenant_id
      and j.state in ('pending', 'retry_wait')
    returning j.tenant_id, j.kind, j.available_at
  )
  select count(*), array_agg(m.tenant_id), array_agg(m.kind), array_agg(m.available_at)
  into v_moved, v_tenants, v_kinds, v_ats
  from moved m;
  if v_moved > 0 then
    perform app.wake_tenants(array_fill(p_queue, array[v_moved::integer]), v_tenants, v_ats,
                             v_kinds);
  end if;
  return v_moved;
end;
$$;
revoke all on function app.route_kinds(text, text[]) from public;

-- The owner's worker limit of one queue (0 .. 1000; NULL: the owner's max_workers of
-- app.settings). Granted to nobody: the deploy or the owner's login.
create or replace function app.set_queue_limits(p_queue text, p_max_workers integer)
returns integer
language plpgsql
set search_path = pg_catalog, pg_temp
as $$
begin
  perform app.check_queue('p_queue', p_queue);
  if p_max_workers is not null then
    perform app.check_range('p_max_workers', p_max_workers, 0, 1000);
  end if;
  perform app.ensure_queue(p_queue);
  update app.queues q set max_workers = p_max_workers, updated_at = clock_timestamp()
  where q.name = p_queue;
  return coalesce(p_max_workers, (select s.max_workers from app.settings s));
end;
$$;
revoke all on function app.set_queue_limits(text, integer) from public;

-- One queue's pause (one primary-key probe of app.queues; a queue without a row runs):
-- what a worker checks before it drains, so that a paused queue's scheduled invocation
-- returns at once even without a pool, and why a join was refused.
create or replace function app.queue_state(p_queue text)
returns table (queue text, paused_at timestamptz, paused_by text, pause_reason text)
language plpgsql
stable
security definer
set search_path = pg_catalog, pg_temp
as $$
#variable_conflict use_column
begin
  perform app.check_queue('p_queue', p_queue);
  return query
  select p_queue, q.paused_at, q.paused_by, q.pause_reason
  from (select 1) one
  left join app.queues q on q.name = p_queue;
end;
$$;
revoke all on function app.queue_state(text) from public;
grant execute on function app.queue_state(text)
  to leaseq_worker, leaseq_operator, leaseq_dashboard;

-- Queues' worker functions (migration 0028_queue_workers) ------------------------------
--
-- A queue's deploy registers its worker (the nested application's Registration custom
-- resource, run by the leaseq stack's migrations function as the owner): an enqueue that
-- wins the queue's wake ticket starts that function, and the connection budget counts its
-- connections beside the leaseq stack's own.

-- The leaseq stack's own connections, as its migrations resource checked them, and its
-- proxy share (NULL: no proxy). Granted to nobody: the deploy.
create or replace function app.set_stack_connections(p_connections integer,
                                                     p_proxy_percent integer)
returns void
language plpgsql
set search_path = pg_catalog, pg_temp
as $$
begin
  perform app.check_range('p_connections', p_connections, 0, 100000);
  if p_proxy_percent is not null then
    perform app.check_range('p_proxy_percent', p_proxy_percent, 1, 100);
  end if;
  insert into app.connection_budget as b (only_row, stack_connections, proxy_percent)
  values (true, p_connections, p_proxy_percent)
  on conflict (only_row) do update
    set stack_connections = excluded.stack_connections,
        proxy_percent = excluded.proxy_percent,
        updated_at = clock_timestamp();
end;
$$;
revoke all on function app.set_stack_connections(integer, integer) from public;

-- What the budget holds now: the leaseq stack's connections and proxy share (NULLs
-- before its first deploy of this release) and the registered queues' connections but
-- p_except_queue's (the one being registered again). Granted to nobody: the deploy.
create or replace function app.queue_connections(p_except_queue text default null)
returns table (stack_connections integer, proxy_percent integer, queue_connections bigint,
               queues text[])
language sql
stable
set search_path = pg_catalog, pg_temp
as $$
  select b.stack_connections, b.proxy_percent,
         coalesce((select sum(w.connections) from app.queue_workers w
                   where w.queue is distinct from p_except_queue), 0),
         coalesce((select array_agg(w.queue || ' ' || w.connections order by w.queue)
                   from app.queue_workers w
                   where w.queue is distinct from p_except_queue and w.connections > 0),
                  '{}')
  from (select true as only_row) o
  left join app.connection_budget b on b.only_row
$$;
revoke all on function app.queue_connections(text) from public;

-- Register (or update) p_queue's worker function for stack p_stack_id. With p_limit (the
-- connections the database allows the deployment, computed by the deploy from the
-- server's settings) the registration is refused with 53400 when the leaseq stack's
-- connections, every other registered queue's and p_connections together exceed it. The
-- table is locked first, so two queues registering at once are counted one after the
-- other and cannot both slip under the limit. A queue registered by another stack is
-- refused with 23505: one worker function per queue. Granted to nobody: the deploy.
create or replace function app.register_queue_worker(
  p_queue text,
  p_function_name text,
  p_connections integer,
  p_stack_id text,
  p_limit integer default null
)
returns bigint
language plpgsql
set search_path = pg_catalog, pg_temp
as $$
declare
  v_holder text;
  v_total bigint;
  v_state record;
begin
  perform app.check_queue('p_queue', p_queue);
  perform app.check_required('p_function_name', p_function_name);
  perform app.check_required('p_stack_id', p_stack_id);
  perform app.check_range('p_connections', p_connections, 0, 10000);
  lock table app.queue_workers in share row exclusive mode;
  select w.stack_id into v_holder from app.queue_workers w where w.queue = p_queue;
  if v_holder is not null and v_holder <> p_stack_id then
    raise exception using errcode = '23505',
      message = format('queue %s already has a worker function, registered by stack %s',
                       p_queue, v_holder),
      hint = 'Each queue is drained by one worker function: give this declaration another '
             'QueueName, or delete the other stack''s declaration first.';
  end if;
  select * into v_state from app.queue_connections(p_queue);
  v_total := coalesce(v_state.stack_connections, 0) + v_state.queue_connections
             + p_connections;
  if p_limit is not null and v_total > p_limit then
    raise exception using errcode = '53400',
      message = format('queue %s''s worker can open %s connections, and with the leaseq '
                       'stack''s %s and the other queues'' %s (%s) the deployment would '
                       'open %s, more than the %s the database allows',
                       p_queue, p_connections, coalesce(v_state.stack_connections, 0),
                       v_state.queue_connections,
                       coalesce(nullif(array_to_string(v_state.queues, ', '), ''), 'none'),
                       v_total, p_limit),
      hint = 'Lower this queue''s ReservedConcurrency (at least MaxWorkers + 1), or another '
             'queue''s or the leaseq stack''s reservations, or give the database more '
             'connections (a larger instance class).';
  end if;
  perform app.ensure_queue(p_queue);
  insert into app.queue_workers as w (queue, function_name, connections, stack_id)
  values (p_queue, p_function_name, p_connections, p_stack_id)
  on conflict (queue) do update
    set function_name = excluded.function_name,
        connections = excluded.connections,
        updated_at = clock_timestamp();
  return v_total;
end;
$$;
revoke all on function app.register_queue_worker(text, text, integer, text, integer) from public;

-- Remove p_queue's worker registration if p_stack_id made it (a stack's delete never
-- removes another stack's); true when one was removed. The queue's jobs stay. Granted to
-- nobody: the deploy.
create or replace function app.unregister_queue_worker(p_queue text, p_stack_id text)
returns boolean
language plpgsql
set search_path = pg_catalog, pg_temp
as $$
begin
  perform app.check_queue('p_queue', p_queue);
  delete from app.queue_workers w where w.queue = p_queue and w.stack_id = p_stack_id;
  return found;
end;
$$;
revoke all on function app.unregister_queue_worker(text, text) from public;

-- The worker function registered for p_queue (a name or ARN), or NULL: what an enqueue
-- that won the queue's wake ticket starts. One primary-key probe; the producers' only read
-- of the registry (they see no connection figures, no stack).
create or replace function app.queue_worker_function(p_queue text)
returns text
language plpgsql
stable
security definer
set search_path = pg_catalog, pg_temp
as $$
begin
  perform app.check_queue('p_queue', p_queue);
  return (select w.function_name from app.queue_workers w where w.queue = p_queue);
end;
$$;
revoke all on function app.queue_worker_function(text) from public;
grant execute on function app.queue_worker_function(text)
  to leaseq_producer, leaseq_tenant_producer;
