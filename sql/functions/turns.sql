-- leaseq functions: the tenants' and kinds' turns of the fair claim.
--
-- The turns say which tenants (and which kinds of them) may have a claimable entry now;
-- the fair claim (claim.sql) serves them in turn order and settles them afterwards
-- (app.settle_turns), the producers lower them (app.wake_tenants), and the reaper
-- repairs them (app.repair_tenant_turns). Their claimable entries are app.claimable's
-- (0023_hot_and_cold_jobs).

-- Tenants' turns (app.tenant_turns, migrations 0012_tenant_turns and 0027_queue_turns)
--
-- Every queue keeps its own round robin: a turn belongs to a (queue, tenant), and a
-- queue's claim reads and moves only its queue's turns, so the workers of a busy queue
-- never push a tenant back in another queue's order, and a tenant is idle in a queue when
-- it has nothing ready there, whatever it has ready elsewhere. turn_at is when the
-- tenant is next due a turn in the queue's fair claim. It is never later than the
-- tenant's next claimable job in the queue, or than the moment the tenant was last
-- served there while it still has ready work; NULL means nothing claimable. Three rules
-- keep that true:
--   * every path that makes a job claimable (enqueue, a retry, a released lease, a
--     give-back, a redrive, an admission past a limit, a move to another queue) calls
--     app.wake_tenants, which lowers the turn to the job's time where the turn is later
--     or NULL, and writes nothing otherwise: the producers of a busy tenant do not write
--     its row on every enqueue;
--   * app.claim_ready_jobs moves a turn later only (a) to "now" after serving the tenant,
--     or (b) to the tenant's next claimable job in the queue (NULL when none) when it
--     finds no ready work left there;
--   * (b) must not race a producer whose job is not committed yet: that producer read the
--     old turn and wrote nothing, and the claim cannot see its job, so the job would wait
--     for the reaper's repair sweep. Producers therefore hold a shared advisory lock
--     (class 1819374711, key: the turn's bucket, app.turn_bucket) from before they read
--     the turn until they commit, and a claim does (b) only when it gets that lock
--     exclusively (pg_try_advisory_xact_lock, never waiting), reading the next job in a
--     statement that starts after it got the lock; otherwise it sets the turn to now and
--     tries again on the tenant's next turn (tests/sql/test_fair_claim.py forces both
--     orders).
-- Buckets are hashtext(queue/tenant_id) & 255: a producer of 1,000 tenants takes at most
-- 256 locks (the shared lock table holds max_locks_per_transaction x max_connections),
-- and two turns in one bucket only make a claim keep a turn at now one round longer.
-- app.repair_tenant_turns rebuilds missing or too-late turns from the claimable entries
-- (the reaper's sweep), so a defect in these rules can delay a job, never lose it.
--
-- Kinds' turns (app.kind_turns, migration 0015_claim_by_kind): the same, per queue,
-- tenant and kind, for the claims with a kind filter (app.claim_ready_jobs with a kind
-- filter), by the same three rules under the same locks. wake_tenants lowers both turns
-- of a woken job; a filtered claim moves later only the kinds' turns of its own kinds (to
-- now after serving the tenant; to the next claimable job of the kind when none is
-- ready), an unfiltered claim only the tenants' turns. Each kind of claim so keeps its
-- own round robin, and workers of disjoint kinds never move each other's turns (0015
-- tells why that matters). The one exception: a claim of either kind that finds a
-- tenant with no ready job at all in its queue, and gets its bucket lock, moves both the
-- tenant's turn and its kinds' due turns there to their next claimable jobs, so that
-- neither table keeps stale due turns of idle tenants for the other kind of claim to
-- wade through.

-- Lower the turns of these tenants, and of these kinds of them, in these queues, to the
-- time of their newly claimable jobs (element i of the four arrays is one job; a NULL
-- queue is 'default', an available_at of NULL means now, and a time in the past counts
-- as now). Called by every function that makes a job claimable, after it changed the
-- jobs or before, in the same transaction. The shared locks come first, in a statement of
-- their own, so that the turns are read in a statement whose snapshot is taken after
-- them. Rows are written in key order (queue, tenant_id, kind), tenants' turns before
-- kinds' turns, so two producers never lock each other's turns in opposite orders.
-- Internal: owner only.
create or replace function app.wake_tenants(
  p_queues text[],
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
    select distinct app.turn_bucket(coalesce(u.queue, 'default'), u.tenant_id) as bucket
    from unnest(p_queues, p_tenant_ids) as u(queue, tenant_id)
    where u.tenant_id is not null
  ) b;

  insert into app.tenant_turns as tt (queue, tenant_id, turn_at)
  select w.queue, w.tenant_id, w.turn_at
  from (
    select coalesce(u.queue, 'default') as queue, u.tenant_id,
           greatest(min(u.available_at), v_now) as turn_at
    from unnest(p_queues, p_tenant_ids, p_available_ats)
      as u(queue, tenant_id, available_at)
    where u.tenant_id is not null
    group by 1, 2
  ) w
  -- A scalar subquery, not NOT EXISTS: one primary-key probe per turn, never a join
  -- that could read the whole table.
  where not coalesce((select t.turn_at <= w.turn_at
                      from app.tenant_turns t
                      where t.queue = w.queue and t.tenant_id = w.tenant_id), false)
  order by w.queue, w.tenant_id
  on conflict (queue, tenant_id) do update
    set turn_at = excluded.turn_at
    where tt.turn_at is null or tt.turn_at > excluded.turn_at;

  insert into app.kind_turns as kt (queue, tenant_id, kind, turn_at)
  select w.queue, w.tenant_id, w.kind, w.turn_at
  from (
    select coalesce(u.queue, 'default') as queue, u.tenant_id, u.kind,
           greatest(min(u.available_at), v_now) as turn_at
    from unnest(p_queues, p_tenant_ids, p_kinds, p_available_ats)
      as u(queue, tenant_id, kind, available_at)
    where u.tenant_id is not null and u.kind is not null
    group by 1, 2, 3
  ) w
  where not coalesce((select t.turn_at <= w.turn_at
                      from app.kind_turns t
                      where t.queue = w.queue and t.tenant_id = w.tenant_id
                        and t.kind = w.kind), false)
  order by w.queue, w.tenant_id, w.kind
  on conflict (queue, tenant_id, kind) do update
    set turn_at = excluded.turn_at
    where kt.turn_at is null or kt.turn_at > excluded.turn_at;
end;
$$;
revoke all on function app.wake_tenants(text[], uuid[], timestamptz[], text[]) from public;

-- The producers' and the claims' advisory lock key of a tenant's turns in a queue: one
-- of 256 buckets (the rules above), so that a producer of many tenants takes few locks
-- and claims of two queues never wait on each other's producers. Internal.
create or replace function app.turn_bucket(p_queue text, p_tenant_id uuid)
returns integer
language sql
immutable
parallel safe
set search_path = pg_catalog, pg_temp
as $$
  select hashtext(p_queue || '/' || p_tenant_id::text) & 255
$$;
revoke all on function app.turn_bucket(text, uuid) from public;

-- The queues with a due tenant's turn, the one whose earliest turn is oldest first: a
-- loose scan of tenant_turns_due_idx, one probe per queue that has turns (the first
-- entry of a queue is its earliest turn). What a claim that names no queue serves, and the ready tenants'
-- list reads. PL/pgSQL, not SQL: a SQL function with a SET clause is never inlined and is
-- planned again at every call (about 0.25 ms of this recursive query, once per claim);
-- PL/pgSQL keeps its plan for the session. Internal.
create or replace function app.due_queues(p_now timestamptz)
returns text[]
language plpgsql
stable
set search_path = pg_catalog, pg_temp
as $$
declare
  v_queues text[];
begin
  with recursive queues as (
    (select t.queue, t.turn_at
     from app.tenant_turns t
     where t.turn_at is not null
     order by t.queue, t.turn_at
     limit 1)
    union all
    select n.queue, n.turn_at
    from queues q
    cross join lateral (
      select t.queue, t.turn_at
      from app.tenant_turns t
      where t.turn_at is not null and t.queue > q.queue
      order by t.queue, t.turn_at
      limit 1
    ) n
  )
  select coalesce(array_agg(q.queue order by q.turn_at, q.queue), '{}')
  into v_queues
  from queues q
  where q.turn_at <= p_now;
  return v_queues;
end;
$$;
revoke all on function app.due_queues(timestamptz) from public;


-- A tenant's (or a tenant's kind's) next claimable time in a queue: the least
-- available_at among its entries keyed no later than the due time of its first entry in
-- claim order (any entry due earlier has an earlier key): a bounded range of
-- claimable_queue_idx (claimable_kind_idx with a kind). NULL when it has no claimable
-- entry in the queue. Internal.
create or replace function app.next_claimable_at(p_queue text, p_tenant_id uuid, p_kind text)
returns timestamptz
language sql
stable
set search_path = pg_catalog, pg_temp
as $$
  select case when p_kind is null then (
    select min(j.available_at)
    from app.claimable j
    where j.queue = p_queue
      and j.tenant_id = p_tenant_id
      and j.claim_key <= (select f.available_at
                          from app.claimable f
                          where f.queue = p_queue
                            and f.tenant_id = p_tenant_id
                          order by f.claim_key
                          limit 1))
  else (
    select min(q.available_at)
    from app.claimable q
    where q.tenant_id = p_tenant_id
      and q.kind = p_kind
      and q.queue = p_queue
      and q.claim_key <= (select f.available_at
                          from app.claimable f
                          where f.tenant_id = p_tenant_id
                            and f.kind = p_kind
                            and f.queue = p_queue
                          order by f.claim_key
                          limit 1))
  end
$$;
revoke all on function app.next_claimable_at(text, uuid, text) from public;

-- After a fair claim of a queue: that queue's turns of the tenants it held (p_held;
-- p_seen are every tenant it looked at), by the rules above the turn functions; no other
-- queue's turn is read or moved. Without a kind filter (p_kinds NULL) the tenants'
-- turns: each held tenant with no ready entry left in the queue goes to its next
-- claimable time there under the producers' bucket lock (to now without it), and when
-- other tenants are waiting (a due turn of the queue this claim did not see) every held
-- tenant goes to now, behind them; a tenant that went idle gets its kinds' due turns in
-- the queue moved to their next claimable times as well. With a kind filter the same
-- over the kinds' turns of p_kinds; a tenant with no ready entry of any kind in the queue
-- also gets its tenant's turn and its other kinds' due turns settled. One index probe per
-- tenant (and kind), one probe of the due turns per kind; turn rows are written in key
-- order, as the producers write them. Internal: owner only.
create or replace function app.settle_turns(
  p_queue text,
  p_held uuid[],
  p_seen uuid[],
  p_kinds text[],
  p_now timestamptz
)
returns void
language plpgsql
set search_path = pg_catalog, pg_temp
set plan_cache_mode = force_generic_plan
as $$
declare
  v_pair_tenants uuid[];
  v_pair_kinds text[];
  v_pair_idle boolean[];
  v_idle uuid[];
  v_free uuid[] := '{}';
  v_settle uuid[] := '{}';
  v_rotate boolean;
begin
  if cardinality(p_held) = 0 then
    return;
  end if;
  if p_kinds is null then
    -- Every held tenant is one "pair" with no kind.
    select array_agg(t.tenant_id order by t.tenant_id), array_agg(null::text),
           array_agg((select j.job_id
                      from app.claimable j
                      where j.queue = p_queue
                        and j.tenant_id = t.tenant_id
                        and j.claim_key <= p_now
                        and j.available_at <= p_now
                      order by j.claim_key
                      limit 1) is null order by t.tenant_id)
    into v_pair_tenants, v_pair_kinds, v_pair_idle
    from unnest(p_held) as t(tenant_id);
    v_rotate := (select t.tenant_id
                 from app.tenant_turns t
                 where t.queue = p_queue and t.turn_at <= p_now
                   and t.tenant_id <> all (p_seen)
                 order by t.turn_at, t.tenant_id
                 limit 1) is not null;
  else
    -- Driven from the held tenants and the kinds: a primary-key probe per pair, whatever
    -- the generic plan guesses of the arrays' sizes.
    select array_agg(kt.tenant_id order by kt.tenant_id, kt.kind),
           array_agg(kt.kind order by kt.tenant_id, kt.kind),
           array_agg((select q.job_id
                      from app.claimable q
                      where q.tenant_id = kt.tenant_id
                        and q.kind = kt.kind
                        and q.queue = p_queue
                        and q.claim_key <= p_now
                        and q.available_at <= p_now
                      order by q.claim_key
                      limit 1) is null order by kt.tenant_id, kt.kind)
    into v_pair_tenants, v_pair_kinds, v_pair_idle
    from unnest(p_held) as h(tenant_id)
    cross join unnest(p_kinds) as k(kind)
    cross join lateral (
      select t.tenant_id, t.kind
      from app.kind_turns t
      where t.queue = p_queue and t.tenant_id = h.tenant_id and t.kind = k.kind
        and t.turn_at <= p_now
    ) kt;
    v_rotate := exists (
      select 1
      from unnest(p_kinds) as k(kind)
      cross join lateral (
        select t.tenant_id
        from app.kind_turns t
        where t.queue = p_queue and t.kind = k.kind and t.turn_at <= p_now
          and t.tenant_id <> all (p_seen)
        order by t.turn_at, t.tenant_id
        limit 1
      ) waiting);
  end if;
  if v_pair_tenants is null then
    return;
  end if;

  select array_agg(distinct p.tenant_id) into v_idle
  from unnest(v_pair_tenants, v_pair_idle) as p(tenant_id, idle)
  where p.idle;
  if v_idle is not null then
    select coalesce(array_agg(t.tenant_id), '{}') into v_free
    from unnest(v_idle) as t(tenant_id)
    where pg_try_advisory_xact_lock(1819374711, app.turn_bucket(p_queue, t.tenant_id));
    -- The tenants with no ready entry of any kind left in the queue.
    select coalesce(array_agg(t.tenant_id), '{}') into v_settle
    from unnest(v_free) as t(tenant_id)
    where not exists (select 1
                      from unnest(v_pair_tenants, v_pair_idle) as p(tenant_id, idle)
                      where p.tenant_id = t.tenant_id and not p.idle)
      and (p_kinds is null
           or (select j.job_id
               from app.claimable j
               where j.queue = p_queue
                 and j.tenant_id = t.tenant_id
                 and j.claim_key <= p_now
                 and j.available_at <= p_now
               order by j.claim_key
               limit 1) is null);
  end if;

  -- Tenants' turns before kinds' turns, each in key order: the order in which producers
  -- write them.
  if p_kinds is null then
    if v_rotate or v_idle is not null then
      update app.tenant_turns tt
      set turn_at = case when w.tenant_id = any (v_free)
                         then app.next_claimable_at(p_queue, w.tenant_id, null)
                         else p_now end
      from (select t.tenant_id
            from app.tenant_turns t
            where t.queue = p_queue
              and t.tenant_id = any (case when v_rotate then p_held else v_idle end)
            order by t.tenant_id
            for update) w
      where tt.queue = p_queue and tt.tenant_id = w.tenant_id;
    end if;
  elsif cardinality(v_settle) > 0 then
    update app.tenant_turns tt
    set turn_at = app.next_claimable_at(p_queue, w.tenant_id, null)
    from (select t.tenant_id
          from app.tenant_turns t
          where t.queue = p_queue and t.tenant_id = any (v_settle)
          order by t.tenant_id
          for update) w
    where tt.queue = p_queue and tt.tenant_id = w.tenant_id;
  end if;

  if p_kinds is null then
    -- A tenant with no ready entry left has none of any kind: its kinds' due turns go to
    -- their next claimable times too.
    if cardinality(v_settle) > 0 then
      update app.kind_turns kt
      set turn_at = app.next_claimable_at(p_queue, w.tenant_id, w.kind)
      from (select t.tenant_id, t.kind
            from app.kind_turns t
            where t.queue = p_queue and t.tenant_id = any (v_settle)
              and t.turn_at <= p_now
            order by t.tenant_id, t.kind
            for update) w
      where kt.queue = p_queue and kt.tenant_id = w.tenant_id and kt.kind = w.kind;
    end if;
  elsif v_rotate or v_idle is not null then
    update app.kind_turns kt
    set turn_at = w.turn_at
    from (
      select o.tenant_id, o.kind, o.turn_at
      from (
        select p.tenant_id, p.kind,
               case when p.idle and p.tenant_id = any (v_free)
                    then app.next_claimable_at(p_queue, p.tenant_id, p.kind)
                    else p_now end as turn_at
        from unnest(v_pair_tenants, v_pair_kinds, v_pair_idle) as p(tenant_id, kind, idle)
        where v_rotate or p.idle
        union all
        -- A tenant with no ready entry at all: its due turns of other kinds are stale too.
        select o.tenant_id, o.kind, app.next_claimable_at(p_queue, o.tenant_id, o.kind)
        from app.kind_turns o
        where o.queue = p_queue
          and o.tenant_id = any (v_settle)
          and o.turn_at <= p_now
          and o.kind <> all (p_kinds)
      ) o
      join app.kind_turns l
        on l.queue = p_queue and l.tenant_id = o.tenant_id and l.kind = o.kind
      order by o.tenant_id, o.kind
      for update of l
    ) w
    where kt.queue = p_queue
      and kt.tenant_id = w.tenant_id
      and kt.kind = w.kind;
  end if;
end;
$$;
revoke all on function app.settle_turns(text, uuid[], uuid[], text[], timestamptz) from public;

-- Self-healing for the turns: one page of the (queue, tenant) pairs that have claimable
-- jobs, from the cursor in app.tenant_turn_sweep (a loose index scan over
-- claimable_queue_idx, one probe per pair), giving a turn to each one whose turn is
-- missing, NULL or later than its next claimable job in the queue (or, for a ready job,
-- later than now). It only ever moves turns earlier, so it cannot race anything into
-- losing a job. The cursor wraps at the end: every pair is checked once per
-- ceil(pairs with claimable jobs / p_limit) calls. The kinds' turns of the same page's
-- tenants are repaired alike, from a loose scan of claimable_kind_idx (one probe per
-- tenant, kind and queue); turns_repaired counts both. The reaper calls it
-- (layer/leaseq/upkeep/reaper.py); p_limit 1..10000.
create or replace function app.repair_tenant_turns(p_limit integer default 1000)
returns table (tenants_checked integer, turns_repaired integer)
language plpgsql
security definer
set search_path = pg_catalog, pg_temp
as $$
#variable_conflict use_column
declare
  v_now timestamptz := clock_timestamp();
  v_from_queue text;
  v_from uuid;
  v_checked integer;
  v_repaired integer;
  v_kinds_repaired integer;
  v_next_queue text;
  v_next uuid;
  v_page_tenants uuid[];
begin
  if p_limit is null or p_limit < 1 or p_limit > 10000 then
    perform app.check_range('p_limit', p_limit, 1, 10000);
  end if;
  -- One sweep at a time: a second reaper waits here, then continues from the new cursor.
  select s.next_queue, s.next_tenant_id into v_from_queue, v_from
  from app.tenant_turn_sweep s for update;
  v_from_queue := coalesce(v_from_queue, '');
  v_from := coalesce(v_from, '00000000-0000-0000-0000-000000000000'::uuid);

  with recursive pairs as (
    (select j.queue, j.tenant_id, j.available_at, 1 as n
     from app.claimable j
     where (j.queue, j.tenant_id) >= (v_from_queue, v_from)
     order by j.queue, j.tenant_id, j.claim_key
     limit 1)
    union all
    select following.queue, following.tenant_id, following.available_at, p.n + 1
    from pairs p
    cross join lateral (
      select j.queue, j.tenant_id, j.available_at
      from app.claimable j
      where (j.queue, j.tenant_id) > (p.queue, p.tenant_id)
      order by j.queue, j.tenant_id, j.claim_key
      limit 1
    ) following
    where p.n <= p_limit
  ), page as (
    -- The pair's next claimable time: its first job in claim order is due at
    -- p.available_at, so every job due earlier has a claim key before that.
    select p.queue, p.tenant_id,
           (select min(n.available_at)
            from app.claimable n
            where n.queue = p.queue
              and n.tenant_id = p.tenant_id
              and n.claim_key <= p.available_at) as available_at
    from pairs p
    where p.n <= p_limit
  ), repaired as (
    insert into app.tenant_turns as tt (queue, tenant_id, turn_at)
    select p.queue, p.tenant_id, p.available_at
    from page p
    where not coalesce((select t.turn_at <= greatest(p.available_at, v_now)
                        from app.tenant_turns t
                        where t.queue = p.queue and t.tenant_id = p.tenant_id), false)
    order by p.queue, p.tenant_id
    on conflict (queue, tenant_id) do update
      set turn_at = excluded.turn_at
      where tt.turn_at is null or tt.turn_at > greatest(excluded.turn_at, v_now)
    returning 1
  )
  select (select count(*) from page), (select count(*) from repaired),
         (select p.queue from pairs p where p.n = p_limit + 1),
         (select p.tenant_id from pairs p where p.n = p_limit + 1),
         (select array_agg(distinct p.tenant_id) from page p)
  into v_checked, v_repaired, v_next_queue, v_next, v_page_tenants;

  -- Every (tenant, kind, queue) of the page's tenants that has claimable jobs: a loose
  -- scan in index order, per tenant.
  with recursive kinds as (
    select first.tenant_id, first.kind, first.queue, first.available_at
    from unnest(coalesce(v_page_tenants, '{}')) as t(tenant_id)
    cross join lateral (
      select j.tenant_id, j.kind, j.queue, j.available_at
      from app.claimable j
      where j.tenant_id = t.tenant_id
      order by j.tenant_id, j.kind, j.queue, j.claim_key
      limit 1
    ) first
    union all
    select following.tenant_id, following.kind, following.queue, following.available_at
    from kinds k
    cross join lateral (
      select j.tenant_id, j.kind, j.queue, j.available_at
      from app.claimable j
      where j.tenant_id = k.tenant_id
        and (j.kind, j.queue) > (k.kind, k.queue)
      order by j.tenant_id, j.kind, j.queue, j.claim_key
      limit 1
    ) following
  ), kind_next as (
    select k.queue, k.tenant_id, k.kind,
           (select min(n.available_at)
            from app.claimable n
            where n.tenant_id = k.tenant_id
              and n.kind = k.kind
              and n.queue = k.queue
              and n.claim_key <= k.available_at) as available_at
    from kinds k
  ), repaired as (
    insert into app.kind_turns as kt (queue, tenant_id, kind, turn_at)
    select k.queue, k.tenant_id, k.kind, k.available_at
    from kind_next k
    where not coalesce((select t.turn_at <= greatest(k.available_at, v_now)
                        from app.kind_turns t
                        where t.queue = k.queue and t.tenant_id = k.tenant_id
                          and t.kind = k.kind), false)
    order by k.queue, k.tenant_id, k.kind
    on conflict (queue, tenant_id, kind) do update
      set turn_at = excluded.turn_at
      where kt.turn_at is null or kt.turn_at > greatest(excluded.turn_at, v_now)
    returning 1
  )
  select count(*) into v_kinds_repaired from repaired;

  update app.tenant_turn_sweep
  set next_queue = v_next_queue, next_tenant_id = v_next, swept_at = v_now;
  return query select v_checked, v_repaired + v_kinds_repaired;
end;
$$;
-- The reaper runs it on every pass; an operator may run it after editing jobs by hand.
revoke all on function app.repair_tenant_turns(integer) from public;
grant execute on function app.repair_tenant_turns(integer) to leaseq_reaper, leaseq_operator;

