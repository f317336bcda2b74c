-- leaseq functions: claim and renew leases.
--
-- One file over 600 lines: every claim path reads the same turns and indexes, and the
-- fair-share loop is still written twice (claim_ready_jobs, claim_ready_jobs_of_kinds), a
-- known debt: merging them must keep each plan's index use (docs/sql-plans.md).
--
-- Claims lock the first ready rows in claim order with FOR UPDATE SKIP LOCKED, so
-- concurrent claimers never wait on, nor double-claim, each other's rows. A lease is
-- 1 second .. 1 day; a claim takes 1 .. 100 jobs.
--
-- Claim order, within a tenant (and a kind): claim_key, then created_at, then id. The key
-- is available_at less (priority - 1) x app.settings.priority_step, written whenever a
-- job becomes claimable (enqueue.sql tells why: aging), so a claim stays one walk of
-- jobs_claimable_idx (tenant_id, claim_key, created_at, id) include (available_at). A job
-- is claimable when available_at <= now; its key is never later than that, so the walk
-- has claim_key <= now as its index bound and available_at <= now as a filter on the
-- included column, which skips only the jobs due within the next (priority - 1) steps.
-- Turns (below) still follow available_at: a tenant's next claimable time is the least
-- available_at among its jobs keyed before the due time of its first job in claim order
-- (any job due earlier has an earlier key), a bounded range of the same index.
--
-- Named queues (migration 0023_named_queues): every claim takes p_queue, the queue whose
-- jobs it claims (NULL: every queue), and never claims a job of a paused queue
-- (app.paused_queues; a claim of a paused queue returns nothing at once). The queue is a
-- filter on the rows each walk reads; the fair claim also reads only due tenants with a
-- ready job in its queue (one probe of jobs_queue_claimable_idx each), so due tenants
-- whose ready work is in other queues never take its picks. Turns stay per tenant (and
-- kind): a queue's claim that serves a tenant moves the tenant's turn as any claim does,
-- so queues of one tenant share its round robin; a tenant is idle only with no ready job
-- in any queue.
--
-- The claim functions plan their statements once per session (plan_cache_mode =
-- force_generic_plan). PL/pgSQL plans a statement with parameters again for every call
-- for as long as the generic plan's estimate looks costlier, and the claim statements
-- always look costlier generically (their LIMIT and due-time cut-off are parameters):
-- measured with bench/, planning was about 15% of the server's CPU per job in a no-op
-- drain. Their best plan does not depend on the values (walk jobs_claimable_idx of one
-- tenant in (claim_key, created_at, id) order, lock with SKIP LOCKED, stop at the
-- limit); tests/sql/test_query_plans.py checks exactly those plans on a large table.

-- Claim rows this transaction has already locked FOR UPDATE: one INSERT ... SELECT of
-- 'claimed' audit rows, then one UPDATE. The audit rows come first so that the foreign
-- key check of each finds its job row already locked FOR UPDATE by the claim and takes
-- no second row lock (one heap LOCK WAL record per job fewer). Internal: owner only.
create or replace function app.claim_locked_jobs(
  p_ids uuid[],
  p_owner text,
  p_lease interval,
  p_now timestamptz
)
returns setof app.jobs
language plpgsql
set search_path = pg_catalog, pg_temp
set plan_cache_mode = force_generic_plan
as $$
declare
  v_tokens uuid[];
begin
  select array_agg(gen_random_uuid()) into v_tokens from unnest(p_ids);

  insert into app.job_events (tenant_id, job_id, event_type, actor, lease_token, details, created_at)
  select j.tenant_id, j.id, 'claimed', p_owner, c.token,
         jsonb_build_object('attempt', j.attempts + 1, 'leaseExpiresAt', p_now + p_lease),
         p_now
  from unnest(p_ids, v_tokens) as c(id, token)
  join app.jobs j on j.id = c.id;

  return query
  with claimed as (
    update app.jobs j
    set state = 'running',
        attempts = j.attempts + 1,
        lease_owner = p_owner,
        lease_token = c.token,
        lease_expires_at = p_now + p_lease,
        updated_at = p_now
    from unnest(p_ids, v_tokens) as c(id, token)
    where j.id = c.id
    returning j.*
  )
  select * from claimed c order by c.claim_key, c.created_at, c.id;
end;
$$;
revoke all on function app.claim_locked_jobs(uuid[], text, interval, timestamptz) from public;

-- Claims take the first ready rows in claim order with FOR UPDATE SKIP LOCKED in a
-- subquery whose LIMIT applies to rows this transaction actually locked, so concurrent
-- claimers walk past each other instead of queueing on the same rows; claim_locked_jobs then writes
-- all their 'claimed' audit rows with one INSERT ... SELECT and updates them with one
-- UPDATE. Argument checks are plain expressions; the helper that raises the detailed
-- message only runs when one fails.
--
-- With a kind filter (p_kinds: only these kinds; p_exclude_kinds: every kind but these;
-- app.check_kind_filter) the candidates are each kind's first ready jobs, from
-- jobs_kind_claimable_idx (tenant, kind, claim order), so jobs of other kinds are never
-- read: the up to p_limit first of every kind, merged in claim order and then locked in
-- that order (SKIP LOCKED, LIMIT p_limit), so only the rows claimed are locked. With
-- p_exclude_kinds the tenant's kinds are found by a loose scan of the same index, one
-- probe per kind that has claimable jobs.
create or replace function app.claim_jobs(
  p_tenant_id uuid,
  p_owner text,
  p_limit integer default 10,
  p_lease interval default interval '30 seconds',
  p_kinds text[] default null,
  p_exclude_kinds text[] default null,
  p_queue text default null
)
returns setof app.jobs
language plpgsql
security definer
set search_path = pg_catalog, pg_temp
set plan_cache_mode = force_generic_plan
as $$
declare
  v_now timestamptz := clock_timestamp();
  v_ids uuid[];
  v_kinds text[];
  v_paused text[];
begin
  if p_tenant_id is null then
    perform app.check_required('p_tenant_id', p_tenant_id);
  end if;
  perform app.check_claim(p_owner, p_limit, p_lease);
  v_paused := app.paused_queues(p_queue);
  if p_queue = any (v_paused) then
    return;
  end if;

  if p_kinds is null and p_exclude_kinds is null then
    select array_agg(c.id) into v_ids
    from (
      select j.id
      from app.jobs j
      where j.tenant_id = p_tenant_id
        and j.state in ('pending', 'retry_wait')
        and j.claim_key <= v_now
        and j.available_at <= v_now
        and j.queue = coalesce(p_queue, j.queue) and j.queue <> all (v_paused)
      order by j.claim_key, j.created_at, j.id
      for update skip locked
      limit p_limit
    ) c;
  else
    perform app.check_kind_filter(p_kinds, p_exclude_kinds);
    if p_kinds is not null then
      v_kinds := p_kinds;
    else
      with recursive kinds as (
        (select j.kind
         from app.jobs j
         where j.tenant_id = p_tenant_id and j.state in ('pending', 'retry_wait')
         order by j.kind
         limit 1)
        union all
        select n.kind
        from kinds k
        cross join lateral (
          select j.kind
          from app.jobs j
          where j.tenant_id = p_tenant_id and j.state in ('pending', 'retry_wait')
            and j.kind > k.kind
          order by j.kind
          limit 1
        ) n
      )
      select array_agg(k.kind) into v_kinds
      from kinds k
      where k.kind <> all (p_exclude_kinds);
    end if;
    select array_agg(c.id) into v_ids
    from (
      select j.id
      from (
        select head.id, head.claim_key, head.created_at
        from (select distinct u.kind from unnest(v_kinds) as u(kind)) k
        cross join lateral (
          select q.id, q.claim_key, q.created_at
          from app.jobs q
          where q.tenant_id = p_tenant_id
            and q.kind = k.kind
            and q.state in ('pending', 'retry_wait')
            and q.claim_key <= v_now
            and q.available_at <= v_now
            and q.queue = coalesce(p_queue, q.queue) and q.queue <> all (v_paused)
          order by q.claim_key, q.created_at, q.id
          limit p_limit
        ) head
      ) candidate
      -- By id alone (jobs_pkey): the tenant would let the planner walk the tenant's
      -- claimable jobs instead. The state and time are checked again on the locked row.
      join app.jobs j on j.id = candidate.id
      where j.state in ('pending', 'retry_wait')
        and j.claim_key <= v_now
        and j.available_at <= v_now
        and j.queue = coalesce(p_queue, j.queue) and j.queue <> all (v_paused)
      order by candidate.claim_key, candidate.created_at, candidate.id
      for update of j skip locked
      limit p_limit
    ) c;
  end if;
  if v_ids is null then
    return;
  end if;
  return query select * from app.claim_locked_jobs(v_ids, p_owner, p_lease, v_now);
end;
$$;
revoke all on function app.claim_jobs(uuid, text, integer, interval, text[], text[], text) from public;
grant execute on function app.claim_jobs(uuid, text, integer, interval, text[], text[], text) to leaseq_worker;

-- Tenants' turns (app.tenant_turns, migration 0012_tenant_turns) --------------------------
--
-- turn_at is when a tenant is next due a turn in the fair claim. It is never later than
-- the tenant's next claimable job, or than the moment the tenant was last served while it
-- still has ready work; NULL means nothing claimable. Three rules keep that true:
--   * every path that makes a job claimable (enqueue, a retry, a released lease, a
--     give-back, a redrive) calls app.wake_tenants, which lowers the turn to the job's
--     time where the turn is later or NULL, and writes nothing otherwise: the producers
--     of a busy tenant do not write its row on every enqueue;
--   * app.claim_ready_jobs moves a turn later only (a) to "now" after serving the tenant,
--     or (b) to the tenant's next claimable job (NULL when none) when it finds no ready
--     work left;
--   * (b) must not race a producer whose job is not committed yet: that producer read the
--     old turn and wrote nothing, and the claim cannot see its job, so the job would wait
--     for the reaper's repair sweep. Producers therefore hold a shared advisory lock
--     (class 1819374711, key: the tenant's bucket) from before they read the turn until
--     they commit, and a claim does (b) only when it gets that lock exclusively
--     (pg_try_advisory_xact_lock, never waiting), reading the next job in a statement
--     that starts after it got the lock; otherwise it sets the turn to now and tries
--     again on the tenant's next turn (tests/sql/test_fair_claim.py forces both orders).
-- Buckets are hashtext(tenant_id::text) & 255: a producer of 1,000 tenants takes at most
-- 256 locks (the shared lock table holds max_locks_per_transaction x max_connections),
-- and two tenants in one bucket only make a claim keep a turn at now one round longer.
-- app.repair_tenant_turns rebuilds missing or too-late turns from the jobs table (the
-- reaper's sweep), so a defect in these rules can delay a job, never lose it.
--
-- Kinds' turns (app.kind_turns, migration 0015_claim_by_kind): the same, per tenant and
-- kind, for the claims with a kind filter (app.claim_ready_jobs_of_kinds), by the same
-- three rules under the same locks. wake_tenants lowers both turns of a woken job; a
-- filtered claim moves later only the kinds' turns of its own kinds (to now after serving
-- the tenant; to the next claimable job of the kind when none is ready), an unfiltered
-- claim only the tenants' turns. Each kind of claim so keeps its own round robin, and
-- workers of disjoint kinds never move each other's turns (0015 tells why that matters).
-- The one exception: a claim of either kind that finds a tenant with no ready job at
-- all, and gets its bucket lock, moves both the tenant's turn and its kinds' due turns to
-- their next claimable jobs, so that neither table keeps stale due turns of idle tenants
-- for the other kind of claim to wade through.

-- Lower the turns of these tenants, and of these kinds of them, to the time of their
-- newly claimable jobs (element i of the three arrays is one job; an available_at of
-- NULL means now, and a time in the past counts as now). Called by every function that
-- makes a job claimable, after it changed the jobs or before, in the same transaction.
-- The shared locks come first, in a statement of their own, so that the turns are read
-- in a statement whose snapshot is taken after them. Rows are written in (tenant_id,
-- kind) order, tenants' turns before kinds' turns, so two producers never lock each
-- other's turns in opposite orders. Internal: owner only.
create or replace function app.wake_tenants(
  p_tenant_ids uuid[],
  p_available_ats timestamptz[],
  p_kinds text[]
)
returns void
language plpgsql
set search_path = pg_catalog, pg_temp
as $$
declare
  v_now timestamptz := clock_timestamp();
begin
  perform pg_advisory_xact_lock_shared(1819374711, b.bucket)
  from (
    select distinct hashtext(u.tenant_id::text) & 255 as bucket
    from unnest(p_tenant_ids) as u(tenant_id)
    where u.tenant_id is not null
  ) b;

  insert into app.tenant_turns as tt (tenant_id, turn_at)
  select w.tenant_id, w.turn_at
  from (
    select u.tenant_id, greatest(min(u.available_at), v_now) as turn_at
    from unnest(p_tenant_ids, p_available_ats) as u(tenant_id, available_at)
    where u.tenant_id is not null
    group by u.tenant_id
  ) w
  -- A scalar subquery, not NOT EXISTS: one primary-key probe per tenant, never a join
  -- that could read the whole table.
  where not coalesce((select t.turn_at <= w.turn_at
                      from app.tenant_turns t
                      where t.tenant_id = w.tenant_id), false)
  order by w.tenant_id
  on conflict (tenant_id) do update
    set turn_at = excluded.turn_at
    where tt.turn_at is null or tt.turn_at > excluded.turn_at;

  insert into app.kind_turns as kt (tenant_id, kind, turn_at)
  select w.tenant_id, w.kind, w.turn_at
  from (
    select u.tenant_id, u.kind, greatest(min(u.available_at), v_now) as turn_at
    from unnest(p_tenant_ids, p_kinds, p_available_ats) as u(tenant_id, kind, available_at)
    where u.tenant_id is not null and u.kind is not null
    group by u.tenant_id, u.kind
  ) w
  where not coalesce((select t.turn_at <= w.turn_at
                      from app.kind_turns t
                      where t.tenant_id = w.tenant_id and t.kind = w.kind), false)
  order by w.tenant_id, w.kind
  on conflict (tenant_id, kind) do update
    set turn_at = excluded.turn_at
    where kt.turn_at is null or kt.turn_at > excluded.turn_at;
end;
$$;
revoke all on function app.wake_tenants(uuid[], timestamptz[], text[]) from public;

-- Tenants with a job ready now, in tenant_id order, with the available_at of their
-- first ready job in claim order. Only tenants whose turn is due can have one (see above), so this reads
-- the due turns (tenant_turns_due_idx) and probes each tenant's first ready entry in
-- jobs_claimable_idx: its cost follows the tenants with ready work (or a stale turn),
-- never those whose work is all in the future. Planned for each call's time (custom
-- plans): a generic plan cannot know that few turns are due, and might walk every turn
-- in tenant_id order instead; the due tenants are listed first, then sorted.
create or replace function app.ready_tenants(p_limit integer default 100)
returns table (tenant_id uuid, oldest_ready_at timestamptz)
language plpgsql
stable
security definer
set search_path = pg_catalog, pg_temp
set plan_cache_mode = force_custom_plan
as $$
#variable_conflict use_column
declare
  v_now timestamptz := clock_timestamp();
begin
  if p_limit is null or p_limit < 1 or p_limit > 10000 then
    perform app.check_range('p_limit', p_limit, 1, 10000);
  end if;
  return query
  with due as materialized (
    select t.tenant_id from app.tenant_turns t where t.turn_at <= v_now
  )
  select t.tenant_id, r.available_at
  from due t
  cross join lateral (
    select j.available_at
    from app.jobs j
    where j.tenant_id = t.tenant_id
      and j.state in ('pending', 'retry_wait')
      and j.claim_key <= v_now
      and j.available_at <= v_now
    order by j.claim_key
    limit 1
  ) r
  order by t.tenant_id
  limit p_limit;
end;
$$;
revoke all on function app.ready_tenants(integer) from public;
grant execute on function app.ready_tenants(integer) to leaseq_worker;

-- The available_at of the oldest job ready now, of any tenant (NULL when none): the
-- first live entry of jobs_ready_at_idx, one index probe whatever the number of tenants
-- or of future jobs. The Lambda runtime's oldest-ready-age metric. The index is on
-- available_at at time zone 'UTC' (see 0012_tenant_turns), so this query names that
-- expression.
create or replace function app.oldest_ready_at()
returns timestamptz
language plpgsql
stable
security definer
set search_path = pg_catalog, pg_temp
set plan_cache_mode = force_generic_plan
as $$
declare
  v_now timestamptz := clock_timestamp();
  v_oldest timestamptz;
begin
  select j.available_at into v_oldest
  from app.jobs j
  where j.state in ('pending', 'retry_wait')
    and (j.available_at at time zone 'UTC') <= (v_now at time zone 'UTC')
  order by (j.available_at at time zone 'UTC')
  limit 1;
  return v_oldest;
end;
$$;
-- The worker function reports the age as a metric; operators read it in status views.
revoke all on function app.oldest_ready_at() from public;
grant execute on function app.oldest_ready_at() to leaseq_worker, leaseq_operator;

-- Fair claim across tenants, for scheduled workers that serve everyone.
--
-- Tenants are taken by turn: the due turns (turn_at <= now), oldest first, up to
-- p_limit of them, skipping tenants another claim is serving right now (each claim holds
-- an advisory lock, class 1819374707, per tenant it serves, taken without waiting). Each
-- tenant locks a share of ceil(limit / tenants) of its oldest ready jobs, and the batch
-- takes them round by round: every tenant's first job, then every tenant's second, and
-- so on; shares left unused by small tenants are then refilled from the others. So while
-- no more than p_limit tenants have ready work, every one of them gets at least one job
-- into every batch: a backlog of any size in one tenant delays another tenant's job by
-- at most one batch. Locked candidates beyond the limit (a share's rounding) unlock at
-- commit.
--
-- Round robin: when more tenants are due than this claim serves, the tenants it served
-- get their turn moved to now, behind every tenant that has waited longer. Bound: a
-- tenant with a ready job is served within ceil(D / p_limit) fair claims (counting the
-- claims of every worker), D being the number of tenants whose turn is due (those with
-- ready work, plus at most one stale turn each for tenants whose work was cancelled or
-- taken by claim_jobs; a claim fixes every stale turn it meets). A claim never reads
-- the turns of tenants whose work is all in the future.
--
-- When fewer tenants are free than the limit, the claim also serves, without moving
-- their turns, due tenants that other claims are serving (SKIP LOCKED on the jobs keeps
-- them apart): concurrent workers of a few busy tenants all get work. A tenant that gave
-- no job had a stale turn: its room goes to the next tenants in turn (at most three picks
-- per claim). A tenant served that has no ready job left gets its turn moved to its next
-- claimable job, or NULL, as told above the turn functions. When every due tenant fits in
-- the batch, busy tenants' turns are not written at all.
--
-- With a kind filter (p_kinds or p_exclude_kinds, app.check_kind_filter) the claim is
-- app.claim_ready_jobs_of_kinds below: the same rules over the kinds' turns.
create or replace function app.claim_ready_jobs(
  p_owner text,
  p_limit integer default 10,
  p_lease interval default interval '30 seconds',
  p_kinds text[] default null,
  p_exclude_kinds text[] default null,
  p_queue text default null
)
returns setof app.jobs
language plpgsql
security definer
set search_path = pg_catalog, pg_temp
set plan_cache_mode = force_generic_plan
as $$
declare
  v_now timestamptz := clock_timestamp();
  v_paused text[];
  v_pass integer := 0;
  v_room integer;
  v_pick uuid[];
  v_seen uuid[] := '{}';
  v_held uuid[] := '{}';
  v_share integer;
  v_got uuid[];
  v_fed uuid[];
  v_ids uuid[] := '{}';
  v_served uuid[] := '{}';
  v_more uuid[];
  v_idle uuid[];
  v_free uuid[] := '{}';
  v_rotate boolean;
begin
  perform app.check_claim(p_owner, p_limit, p_lease);
  v_paused := app.paused_queues(p_queue);
  if p_queue = any (v_paused) then
    return;
  end if;
  if p_kinds is not null or p_exclude_kinds is not null then
    perform app.check_kind_filter(p_kinds, p_exclude_kinds);
    return query
    select * from app.claim_ready_jobs_of_kinds(p_owner, p_limit, p_lease, p_kinds,
                                                p_exclude_kinds, p_queue, v_paused);
    return;
  end if;

  loop
    v_pass := v_pass + 1;
    v_room := p_limit - cardinality(v_ids);
    -- The lock is tried on the due turns in turn order only (OFFSET 0 keeps the ordered
    -- subquery apart and the volatile test out of it), so a claim holds locks on the
    -- tenants it serves and no others.
    select coalesce(array_agg(d.tenant_id order by d.turn_at, d.tenant_id), '{}')
    into v_pick
    from (
      select due.tenant_id, due.turn_at
      from (
        select t.tenant_id, t.turn_at
        from app.tenant_turns t
        where t.turn_at <= v_now
          and t.tenant_id <> all (v_seen)
          and (p_queue is null
               or (select q.id from app.jobs q
                   where q.queue = p_queue and q.tenant_id = t.tenant_id
                     and q.state in ('pending', 'retry_wait')
                     and q.claim_key <= v_now and q.available_at <= v_now
                   order by q.queue, q.tenant_id, q.claim_key
                   limit 1) is not null)
        order by t.turn_at, t.tenant_id
        offset 0
      ) due
      where pg_try_advisory_xact_lock(1819374707, hashtext(due.tenant_id::text))
      limit v_room
    ) d;
    v_held := v_held || v_pick;
    v_seen := v_seen || v_pick;
    if v_pass = 1 and cardinality(v_pick) < v_room then
      select v_pick || coalesce(array_agg(d.tenant_id order by d.turn_at, d.tenant_id), '{}')
      into v_pick
      from (
        select t.tenant_id, t.turn_at
        from app.tenant_turns t
        where t.turn_at <= v_now
          and t.tenant_id <> all (v_seen)
          and (p_queue is null
               or (select q.id from app.jobs q
                   where q.queue = p_queue and q.tenant_id = t.tenant_id
                     and q.state in ('pending', 'retry_wait')
                     and q.claim_key <= v_now and q.available_at <= v_now
                   order by q.queue, q.tenant_id, q.claim_key
                   limit 1) is not null)
        order by t.turn_at, t.tenant_id
        limit v_room - cardinality(v_pick)
      ) d;
      v_seen := v_pick;
    end if;
    exit when cardinality(v_pick) = 0;

    v_share := ceil(v_room::numeric / cardinality(v_pick));
    select array_agg(r.id order by r.round, r.pos),
           array_agg(r.tenant_id order by r.pos) filter (where r.round = 1)
    into v_got, v_fed
    from (
      select ranked.id, ranked.round, t.tenant_id, t.pos
      from unnest(v_pick) with ordinality as t(tenant_id, pos)
      cross join lateral (
        select picked.id,
               row_number() over (order by picked.claim_key, picked.created_at, picked.id)
                 as round
        from (
          select j.id, j.claim_key, j.created_at
          from app.jobs j
          where j.tenant_id = t.tenant_id
            and j.state in ('pending', 'retry_wait')
            and j.claim_key <= v_now
            and j.available_at <= v_now
            and j.queue = coalesce(p_queue, j.queue) and j.queue <> all (v_paused)
          order by j.claim_key, j.created_at, j.id
          for update skip locked
          limit v_share
        ) picked
      ) ranked
      order by ranked.round, t.pos
      limit v_room
    ) r;
    v_ids := v_ids || coalesce(v_got, '{}');
    v_served := v_served || coalesce(v_fed, '{}');
    exit when cardinality(v_ids) >= p_limit or v_pass >= 3
           or coalesce(cardinality(v_fed), 0) = cardinality(v_pick);
  end loop;

  if cardinality(v_ids) < p_limit and (cardinality(v_served) > 1 or v_pass > 1) then
    select array_agg(c.id) into v_more
    from (
      select picked.id
      from unnest(v_served) with ordinality as t(tenant_id, pos)
      cross join lateral (
        select j.id
        from app.jobs j
        where j.tenant_id = t.tenant_id
          and j.state in ('pending', 'retry_wait')
          and j.claim_key <= v_now
          and j.available_at <= v_now
          and j.queue = coalesce(p_queue, j.queue) and j.queue <> all (v_paused)
          and j.id <> all (v_ids)
        order by j.claim_key, j.created_at, j.id
        for update skip locked
        limit p_limit - cardinality(v_ids)
      ) picked
      limit p_limit - cardinality(v_ids)
    ) c;
    v_ids := v_ids || coalesce(v_more, '{}');
  end if;

  if cardinality(v_ids) > 0 then
    return query select * from app.claim_locked_jobs(v_ids, p_owner, p_lease, v_now);
  end if;

  -- The turns of the tenants this claim held (it claimed their jobs above, so they are
  -- no longer claimable here). Scalar subqueries with ORDER BY ... LIMIT 1: one index
  -- probe per tenant, and one probe of the due turns, whatever the plan's estimates.
  if cardinality(v_held) > 0 then
    select array_agg(t.tenant_id) into v_idle
    from unnest(v_held) as t(tenant_id)
    where (select j.id
           from app.jobs j
           where j.tenant_id = t.tenant_id
             and j.state in ('pending', 'retry_wait')
             and j.claim_key <= v_now
             and j.available_at <= v_now
           order by j.claim_key
           limit 1) is null;
    v_rotate := (select t.tenant_id
                 from app.tenant_turns t
                 where t.turn_at <= v_now and t.tenant_id <> all (v_seen)
                 order by t.turn_at, t.tenant_id
                 limit 1) is not null;
    if v_idle is not null then
      select coalesce(array_agg(t.tenant_id), '{}') into v_free
      from unnest(v_idle) as t(tenant_id)
      where pg_try_advisory_xact_lock(1819374711, hashtext(t.tenant_id::text) & 255);
    end if;
    if v_rotate or v_idle is not null then
      update app.tenant_turns tt
      set turn_at = case
            when tt.tenant_id = any (v_free) then (
              select min(j.available_at)
              from app.jobs j
              where j.tenant_id = tt.tenant_id
                and j.state in ('pending', 'retry_wait')
                and j.claim_key <= (
                  select f.available_at
                  from app.jobs f
                  where f.tenant_id = tt.tenant_id
                    and f.state in ('pending', 'retry_wait')
                  order by f.claim_key
                  limit 1))
            else v_now
          end
      where tt.tenant_id = any (case when v_rotate then v_held else v_idle end);
    end if;
    -- A tenant with no ready job left has no ready job of any kind either: its kinds'
    -- due turns go to their next claimable jobs too (the exception told above the turn
    -- functions). Runs only for tenants that just went idle.
    if cardinality(v_free) > 0 then
      update app.kind_turns kt
      set turn_at = (
            select min(j.available_at)
            from app.jobs j
            where j.tenant_id = kt.tenant_id
              and j.kind = kt.kind
              and j.state in ('pending', 'retry_wait')
              and j.claim_key <= (
                select f.available_at
                from app.jobs f
                where f.tenant_id = kt.tenant_id
                  and f.kind = kt.kind
                  and f.state in ('pending', 'retry_wait')
                order by f.claim_key
                limit 1))
      where kt.tenant_id = any (v_free)
        and kt.turn_at <= v_now;
    end if;
  end if;
end;
$$;
revoke all on function app.claim_ready_jobs(text, integer, interval, text[], text[], text) from public;
grant execute on function app.claim_ready_jobs(text, integer, interval, text[], text[], text) to leaseq_worker;

-- The fair claim with a kind filter (app.claim_ready_jobs with p_kinds or
-- p_exclude_kinds, checked there): the rules of the fair claim above, over the kinds'
-- turns (app.kind_turns) of the claim's kinds instead of the tenants' turns.
--
-- The claim's kinds are p_kinds, or every kind that has a turn (a loose scan of
-- kind_turns_due_idx, one probe per kind) but p_exclude_kinds. A tenant's place in turn
-- order is its oldest due turn among those kinds; the tenants are read per kind, the
-- oldest p_limit due turns of each (enough: a tenant among the first p_limit overall is
-- among the first p_limit of the kind of its oldest turn), so a claim reads the due
-- turns of its own kinds only and never a tenant whose ready work is all of other kinds.
-- A tenant's share comes from its due turns of those kinds, each kind's oldest ready
-- jobs through jobs_kind_claimable_idx, merged in claim order and locked in that order
-- (SKIP LOCKED, LIMIT the share), so no job of another kind is read or locked. Claims of
-- one filter keep apart with an advisory lock per tenant and filter (class 1819374713),
-- so that the claims of two different filters never skip each other's tenants.
--
-- Round robin and bound, per filter: when more tenants have due turns of the claim's
-- kinds than it serves, the served tenants' due turns of those kinds move to now; a
-- tenant with a ready job of those kinds is served within ceil(D / p_limit) claims of
-- that filter, D being the tenants with due turns of its kinds. Turns of other kinds are
-- never moved (except for a tenant with no ready job at all, see the turn functions), so
-- a worker of other kinds, however often it serves the tenant, does not delay it here.
-- A kind of a held tenant with no ready job left gets its turn moved to its next
-- claimable job of that kind (or NULL) under the producers' bucket lock, as for the
-- tenants' turns; without the lock, to now. Internal: owner only.
create or replace function app.claim_ready_jobs_of_kinds(
  p_owner text,
  p_limit integer,
  p_lease interval,
  p_kinds text[],
  p_exclude_kinds text[],
  p_queue text,
  p_paused text[]
)
returns setof app.jobs
language plpgsql
set search_path = pg_catalog, pg_temp
set plan_cache_mode = force_generic_plan
as $$
declare
  v_now timestamptz := clock_timestamp();
  v_kinds text[];
  v_filter text;
  v_pass integer := 0;
  v_room integer;
  v_pick uuid[];
  v_seen uuid[] := '{}';
  v_held uuid[] := '{}';
  v_share integer;
  v_got uuid[];
  v_fed uuid[];
  v_ids uuid[] := '{}';
  v_served uuid[] := '{}';
  v_more uuid[];
  v_pair_tenants uuid[];
  v_pair_kinds text[];
  v_pair_idle boolean[];
  v_idle uuid[];
  v_free uuid[] := '{}';
  v_settle uuid[] := '{}';
  v_rotate boolean;
begin
  if p_kinds is not null then
    v_kinds := array(select distinct u.kind from unnest(p_kinds) as u(kind) order by 1);
    v_filter := 'kinds ' || v_kinds::text;
  else
    with recursive known as (
      (select t.kind
       from app.kind_turns t
       where t.turn_at is not null
       order by t.kind
       limit 1)
      union all
      select n.kind
      from known k
      cross join lateral (
        select t.kind
        from app.kind_turns t
        where t.turn_at is not null and t.kind > k.kind
        order by t.kind
        limit 1
      ) n
    )
    select coalesce(array_agg(k.kind), '{}') into v_kinds
    from known k
    where k.kind <> all (p_exclude_kinds);
    v_filter := 'exclude ' || array(select distinct u.kind from unnest(p_exclude_kinds) as u(kind)
                                    order by 1)::text;
  end if;

  loop
    v_pass := v_pass + 1;
    v_room := p_limit - cardinality(v_ids);
    -- As in claim_ready_jobs: the lock is tried in turn order only (OFFSET 0).
    select coalesce(array_agg(d.tenant_id order by d.turn_at, d.tenant_id), '{}')
    into v_pick
    from (
      select due.tenant_id, due.turn_at
      from (
        select c.tenant_id, min(c.turn_at) as turn_at
        from unnest(v_kinds) as k(kind)
        cross join lateral (
          select t.tenant_id, t.turn_at
          from app.kind_turns t
          where t.kind = k.kind
            and t.turn_at <= v_now
            and t.tenant_id <> all (v_seen)
          order by t.turn_at, t.tenant_id
          limit v_room
        ) c
        group by c.tenant_id
        order by 2, 1
        offset 0
      ) due
      where pg_try_advisory_xact_lock(1819374713, hashtext(v_filter || due.tenant_id::text))
      limit v_room
    ) d;
    v_held := v_held || v_pick;
    v_seen := v_seen || v_pick;
    if v_pass = 1 and cardinality(v_pick) < v_room then
      select v_pick || coalesce(array_agg(d.tenant_id order by d.turn_at, d.tenant_id), '{}')
      into v_pick
      from (
        select c.tenant_id, min(c.turn_at) as turn_at
        from unnest(v_kinds) as k(kind)
        cross join lateral (
          select t.tenant_id, t.turn_at
          from app.kind_turns t
          where t.kind = k.kind
            and t.turn_at <= v_now
            and t.tenant_id <> all (v_seen)
          order by t.turn_at, t.tenant_id
          limit v_room - cardinality(v_pick)
        ) c
        group by c.tenant_id
        order by 2, 1
        limit v_room - cardinality(v_pick)
      ) d;
      v_seen := v_pick;
    end if;
    exit when cardinality(v_pick) = 0;

    v_share := ceil(v_room::numeric / cardinality(v_pick));
    select array_agg(r.id order by r.round, r.pos),
           array_agg(r.tenant_id order by r.pos) filter (where r.round = 1)
    into v_got, v_fed
    from (
      select ranked.id, ranked.round, t.tenant_id, t.pos
      from unnest(v_pick) with ordinality as t(tenant_id, pos)
      cross join lateral (
        select locked.id,
               row_number() over (order by locked.claim_key, locked.created_at, locked.id)
                 as round
        from (
          select j.id, j.claim_key, j.created_at
          from (
            select head.id, head.claim_key, head.created_at
            from app.kind_turns kt
            cross join lateral (
              select q.id, q.claim_key, q.created_at
              from app.jobs q
              where q.tenant_id = kt.tenant_id
                and q.kind = kt.kind
                and q.state in ('pending', 'retry_wait')
                and q.claim_key <= v_now
                and q.available_at <= v_now
                and q.queue = coalesce(p_queue, q.queue) and q.queue <> all (p_paused)
              order by q.claim_key, q.created_at, q.id
              limit v_share
            ) head
            where kt.tenant_id = t.tenant_id
              and kt.turn_at <= v_now
              and kt.kind = any (v_kinds)
          ) candidate
          join app.jobs j on j.id = candidate.id  -- by id alone, as in claim_jobs
          where j.state in ('pending', 'retry_wait')
            and j.claim_key <= v_now
            and j.available_at <= v_now
            and j.queue = coalesce(p_queue, j.queue) and j.queue <> all (p_paused)
          order by candidate.claim_key, candidate.created_at, candidate.id
          for update of j skip locked
          limit v_share
        ) locked
      ) ranked
      order by ranked.round, t.pos
      limit v_room
    ) r;
    v_ids := v_ids || coalesce(v_got, '{}');
    v_served := v_served || coalesce(v_fed, '{}');
    exit when cardinality(v_ids) >= p_limit or v_pass >= 3
           or coalesce(cardinality(v_fed), 0) = cardinality(v_pick);
  end loop;

  if cardinality(v_ids) < p_limit and (cardinality(v_served) > 1 or v_pass > 1) then
    select array_agg(m.id) into v_more
    from (
      select j.id
      from (
        select head.id, head.claim_key, head.created_at, t.pos
        from unnest(v_served) with ordinality as t(tenant_id, pos)
        join app.kind_turns kt on kt.tenant_id = t.tenant_id
        cross join lateral (
          select q.id, q.claim_key, q.created_at
          from app.jobs q
          where q.tenant_id = kt.tenant_id
            and q.kind = kt.kind
            and q.state in ('pending', 'retry_wait')
            and q.claim_key <= v_now
            and q.available_at <= v_now
            and q.queue = coalesce(p_queue, q.queue) and q.queue <> all (p_paused)
            and q.id <> all (v_ids)
          order by q.claim_key, q.created_at, q.id
          limit p_limit - cardinality(v_ids)
        ) head
        where kt.turn_at <= v_now
          and kt.kind = any (v_kinds)
      ) candidate
      join app.jobs j on j.id = candidate.id
      where j.state in ('pending', 'retry_wait')
        and j.claim_key <= v_now
        and j.available_at <= v_now
        and j.queue = coalesce(p_queue, j.queue) and j.queue <> all (p_paused)
      order by candidate.pos, candidate.claim_key, candidate.created_at, candidate.id
      for update of j skip locked
      limit p_limit - cardinality(v_ids)
    ) m;
    v_ids := v_ids || coalesce(v_more, '{}');
  end if;

  if cardinality(v_ids) > 0 then
    return query select * from app.claim_locked_jobs(v_ids, p_owner, p_lease, v_now);
  end if;

  -- The turns of the tenants this claim held: their due turns of the claim's kinds, and
  -- which of those kinds have no ready job left (one jobs_kind_claimable_idx probe each);
  -- a tenant whose kinds are all idle here is checked for a ready job of any kind (one
  -- jobs_claimable_idx probe). Then one probe of the due turns per kind: is anyone else
  -- waiting?
  if cardinality(v_held) > 0 then
    select array_agg(p.tenant_id), array_agg(p.kind), array_agg(p.idle)
    into v_pair_tenants, v_pair_kinds, v_pair_idle
    from (
      select kt.tenant_id, kt.kind,
             (select q.id
              from app.jobs q
              where q.tenant_id = kt.tenant_id
                and q.kind = kt.kind
                and q.state in ('pending', 'retry_wait')
                and q.claim_key <= v_now
                and q.available_at <= v_now
              order by q.claim_key
              limit 1) is null as idle
      from app.kind_turns kt
      where kt.tenant_id = any (v_held)
        and kt.turn_at <= v_now
        and kt.kind = any (v_kinds)
    ) p;
    if v_pair_tenants is null then
      return;
    end if;
    select array_agg(distinct p.tenant_id) into v_idle
    from unnest(v_pair_tenants, v_pair_idle) as p(tenant_id, idle)
    where p.idle;
    v_rotate := exists (
      select 1
      from unnest(v_kinds) as k(kind)
      cross join lateral (
        select t.tenant_id
        from app.kind_turns t
        where t.kind = k.kind and t.turn_at <= v_now and t.tenant_id <> all (v_seen)
        order by t.turn_at, t.tenant_id
        limit 1
      ) waiting);
    if v_idle is not null then
      select coalesce(array_agg(t.tenant_id), '{}') into v_free
      from unnest(v_idle) as t(tenant_id)
      where pg_try_advisory_xact_lock(1819374711, hashtext(t.tenant_id::text) & 255);
      select coalesce(array_agg(t.tenant_id), '{}') into v_settle
      from unnest(v_free) as t(tenant_id)
      where not exists (select 1
                        from unnest(v_pair_tenants, v_pair_idle) as p(tenant_id, idle)
                        where p.tenant_id = t.tenant_id and not p.idle)
        and (select j.id
             from app.jobs j
             where j.tenant_id = t.tenant_id
               and j.state in ('pending', 'retry_wait')
               and j.claim_key <= v_now
               and j.available_at <= v_now
             order by j.claim_key
             limit 1) is null;
    end if;
    -- Tenants' turns before kinds' turns, the order in which producers write them.
    if cardinality(v_settle) > 0 then
      update app.tenant_turns tt
      set turn_at = (
            select min(j.available_at)
            from app.jobs j
            where j.tenant_id = tt.tenant_id
              and j.state in ('pending', 'retry_wait')
              and j.claim_key <= (
                select f.available_at
                from app.jobs f
                where f.tenant_id = tt.tenant_id
                  and f.state in ('pending', 'retry_wait')
                order by f.claim_key
                limit 1))
      where tt.tenant_id = any (v_settle);
    end if;
    if v_rotate or v_idle is not null then
      update app.kind_turns kt
      set turn_at = w.turn_at
      from (
        select p.tenant_id, p.kind,
               case when p.idle and p.tenant_id = any (v_free) then (
                      select min(q.available_at)
                      from app.jobs q
                      where q.tenant_id = p.tenant_id
                        and q.kind = p.kind
                        and q.state in ('pending', 'retry_wait')
                        and q.claim_key <= (
                          select f.available_at
                          from app.jobs f
                          where f.tenant_id = p.tenant_id
                            and f.kind = p.kind
                            and f.state in ('pending', 'retry_wait')
                          order by f.claim_key
                          limit 1))
                    else v_now end as turn_at
        from unnest(v_pair_tenants, v_pair_kinds, v_pair_idle) as p(tenant_id, kind, idle)
        where v_rotate or p.idle
        union all
        -- A tenant with no ready job at all: its due turns of other kinds are stale too.
        select o.tenant_id, o.kind, (
                 select min(q.available_at)
                 from app.jobs q
                 where q.tenant_id = o.tenant_id
                   and q.kind = o.kind
                   and q.state in ('pending', 'retry_wait')
                   and q.claim_key <= (
                     select f.available_at
                     from app.jobs f
                     where f.tenant_id = o.tenant_id
                       and f.kind = o.kind
                       and f.state in ('pending', 'retry_wait')
                     order by f.claim_key
                     limit 1))
        from app.kind_turns o
        where o.tenant_id = any (v_settle)
          and o.turn_at <= v_now
          and o.kind <> all (v_kinds)
      ) w
      where kt.tenant_id = w.tenant_id
        and kt.kind = w.kind;
    end if;
  end if;
end;
$$;
revoke all on function app.claim_ready_jobs_of_kinds(text, integer, interval, text[], text[], text, text[]) from public;

-- Self-healing for the turns: one page of the tenants that have claimable jobs, from
-- the cursor in app.tenant_turn_sweep (a loose index scan over jobs_claimable_idx, one
-- probe per tenant), giving a turn to each one whose turn is missing, NULL or later than
-- its next claimable job (or, for a ready job, later than now). It only ever moves turns
-- earlier, so it cannot race anything into losing a job. The cursor wraps at the end:
-- every tenant is checked once per ceil(tenants with claimable jobs / p_limit) calls.
-- The kinds' turns of the same page of tenants are repaired alike, from a loose scan of
-- jobs_kind_claimable_idx (one probe per kind of each tenant); turns_repaired counts
-- both. The reaper calls it (layer/leaseq/reaper.py); p_limit 1..10000.
create or replace function app.repair_tenant_turns(p_limit integer default 1000)
returns table (tenants_checked integer, turns_repaired integer)
language plpgsql
security definer
set search_path = pg_catalog, pg_temp
as $$
#variable_conflict use_column
declare
  v_now timestamptz := clock_timestamp();
  v_from uuid;
  v_checked integer;
  v_repaired integer;
  v_kinds_repaired integer;
  v_next uuid;
  v_last uuid;
begin
  if p_limit is null or p_limit < 1 or p_limit > 10000 then
    perform app.check_range('p_limit', p_limit, 1, 10000);
  end if;
  -- One sweep at a time: a second reaper waits here, then continues from the new cursor.
  select s.next_tenant_id into v_from from app.tenant_turn_sweep s for update;
  v_from := coalesce(v_from, '00000000-0000-0000-0000-000000000000'::uuid);

  with recursive tenants as (
    (select j.tenant_id, j.available_at, 1 as n
     from app.jobs j
     where j.state in ('pending', 'retry_wait')
       and j.tenant_id >= v_from
     order by j.tenant_id, j.claim_key
     limit 1)
    union all
    select following.tenant_id, following.available_at, t.n + 1
    from tenants t
    cross join lateral (
      select j.tenant_id, j.available_at
      from app.jobs j
      where j.state in ('pending', 'retry_wait')
        and j.tenant_id > t.tenant_id
      order by j.tenant_id, j.claim_key
      limit 1
    ) following
    where t.n <= p_limit
  ), page as (
    -- The tenant's next claimable time: its first job in claim order is due at
    -- t.available_at, so every job due earlier has a claim key before that.
    select t.tenant_id,
           (select min(n.available_at)
            from app.jobs n
            where n.tenant_id = t.tenant_id
              and n.state in ('pending', 'retry_wait')
              and n.claim_key <= t.available_at) as available_at
    from tenants t
    where t.n <= p_limit
  ), repaired as (
    insert into app.tenant_turns as tt (tenant_id, turn_at)
    select p.tenant_id, p.available_at
    from page p
    where not coalesce((select t.turn_at <= greatest(p.available_at, v_now)
                        from app.tenant_turns t
                        where t.tenant_id = p.tenant_id), false)
    order by p.tenant_id
    on conflict (tenant_id) do update
      set turn_at = excluded.turn_at
      where tt.turn_at is null or tt.turn_at > greatest(excluded.turn_at, v_now)
    returning 1
  )
  select (select count(*) from page), (select count(*) from repaired),
         (select t.tenant_id from tenants t where t.n = p_limit + 1),
         (select p.tenant_id from page p order by p.tenant_id desc limit 1)
  into v_checked, v_repaired, v_next, v_last;

  -- Every (tenant, kind) of the page that has claimable jobs: a loose scan in index order.
  with recursive kinds as (
    (select j.tenant_id, j.kind, j.available_at
     from app.jobs j
     where j.state in ('pending', 'retry_wait')
       and j.tenant_id >= v_from
       and j.tenant_id <= v_last
     order by j.tenant_id, j.kind, j.claim_key
     limit 1)
    union all
    select following.tenant_id, following.kind, following.available_at
    from kinds k
    cross join lateral (
      select j.tenant_id, j.kind, j.available_at
      from app.jobs j
      where j.state in ('pending', 'retry_wait')
        and (j.tenant_id, j.kind) > (k.tenant_id, k.kind)
        and j.tenant_id <= v_last
      order by j.tenant_id, j.kind, j.claim_key
      limit 1
    ) following
  ), kind_next as (
    select k.tenant_id, k.kind,
           (select min(n.available_at)
            from app.jobs n
            where n.tenant_id = k.tenant_id
              and n.kind = k.kind
              and n.state in ('pending', 'retry_wait')
              and n.claim_key <= k.available_at) as available_at
    from kinds k
  ), repaired as (
    insert into app.kind_turns as kt (tenant_id, kind, turn_at)
    select k.tenant_id, k.kind, k.available_at
    from kind_next k
    where not coalesce((select t.turn_at <= greatest(k.available_at, v_now)
                        from app.kind_turns t
                        where t.tenant_id = k.tenant_id and t.kind = k.kind), false)
    order by k.tenant_id, k.kind
    on conflict (tenant_id, kind) do update
      set turn_at = excluded.turn_at
      where kt.turn_at is null or kt.turn_at > greatest(excluded.turn_at, v_now)
    returning 1
  )
  select count(*) into v_kinds_repaired from repaired;

  update app.tenant_turn_sweep set next_tenant_id = v_next, swept_at = v_now;
  return query select v_checked, v_repaired + v_kinds_repaired;
end;
$$;
-- The reaper runs it on every pass; an operator may run it after editing jobs by hand.
revoke all on function app.repair_tenant_turns(integer) from public;
grant execute on function app.repair_tenant_turns(integer) to leaseq_reaper, leaseq_operator;

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

  update app.jobs j
  set lease_expires_at = v_now + p_lease,
      updated_at = v_now
  where j.tenant_id = p_tenant_id
    and j.id = p_job_id
    and j.state = 'running'
    and j.lease_owner = p_owner
    and j.lease_token = p_token
    and j.lease_expires_at > v_now
  returning j.cancel_requested_at is not null into v_requested;

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
