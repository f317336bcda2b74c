-- leaseq functions: claim jobs.
--
-- A little over 600 lines: the fair-share loop and the statement that claims what it
-- locked are read together (turns, entries and leases each have a file of their own).
--
-- A claim takes entries of app.claimable (0023_hot_and_cold_jobs: one per pending or
-- retry_wait job, in claim order, never updated), locks them FOR UPDATE SKIP LOCKED so
-- that concurrent claimers never wait on, nor double-claim, each other's, and then in one
-- statement deletes them, turns their jobs running, inserts their leases and writes the
-- 'claimed' audit events (app.claim_locked_jobs). A lease is 1 second .. 1 day; a claim
-- takes 1 .. 100 jobs. The job row's update changes no indexed column (a HOT update); the
-- claim's index work is app.leases' primary key and the events'.
--
-- Claim order, within a tenant (and a kind): claim_key, then created_at, then id. The key
-- is available_at less (priority - 1) x app.settings.priority_step, written whenever a
-- job becomes claimable (enqueue.sql tells why: aging), so a fair claim stays one walk of
-- claimable_queue_idx (queue, tenant_id, claim_key, created_at, job_id) include
-- (available_at) per tenant (claim_jobs: of claimable_order_idx, the same without queue).
-- An entry is claimable when available_at <= now; its key is never later than that, so
-- the walk has claim_key <= now as its index bound and available_at <= now as a filter on
-- the included column, which skips only the jobs due within the next (priority - 1)
-- steps. Turns (turns.sql) follow available_at.
--
-- The claim functions plan their statements once per session (plan_cache_mode =
-- force_generic_plan). PL/pgSQL plans a statement with parameters again for every call
-- for as long as the generic plan's estimate looks costlier, and the claim statements
-- always look costlier generically (their LIMIT and due-time cut-off are parameters):
-- measured with bench/, planning was about 15% of the server's CPU per job in a no-op
-- drain. Their best plan does not depend on the values (walk one tenant's entries in
-- claim order, lock with SKIP LOCKED, stop at the limit); tests/sql/test_query_plans.py
-- checks exactly those plans on a large table.

-- Claim the app.claimable entries this transaction has locked (p_tids, their row ids:
-- stable while locked, and they spare the table an index on job_id). Entries whose job is
-- no longer pending or retry_wait (a job edited by hand) are deleted and claim nothing.
-- Returns the claimed jobs in claim order. Internal: owner only.
create or replace function app.claim_locked_jobs(
  p_tids tid[],
  p_owner text,
  p_lease interval,
  p_now timestamptz
)
returns setof app.claimed_job
language plpgsql
set search_path = pg_catalog, pg_temp
set plan_cache_mode = force_generic_plan
as $$
begin
  -- Limits hook (functions/admission.sql): a job under a rate limit starts only with a
  -- start slot; one without is scheduled again (its entry moves, so the delete below
  -- does not take it) and is not claimed.
  perform app.start_limited_jobs(
    array(select c.job_id from app.claimable c where c.ctid = any (p_tids)), p_now);
  return query
  with taken as (
    delete from app.claimable c
    where c.ctid = any (p_tids)
    returning c.job_id, c.tenant_id
  ), claimed as (
    update app.jobs j
    set state = 'running',
        attempts = j.attempts + 1,
        lease_owner = p_owner,
        updated_at = p_now
    from taken t
    where j.id = t.job_id
      and j.tenant_id = t.tenant_id
      and j.state in ('pending', 'retry_wait')
    returning j.id, j.tenant_id, j.operation_key, j.kind, j.payload::jsonb as payload,
              j.state, j.attempts, j.max_attempts, j.available_at, j.created_at,
              j.correlation_id, j.priority, j.claim_key
  ), leased as (
    insert into app.leases (job_id, tenant_id, lease_owner, lease_token, expires_at,
                            claimed_at)
    select c.id, c.tenant_id, p_owner, gen_random_uuid(), p_now + p_lease, p_now
    from claimed c
    returning job_id, lease_token
  ), audit as (
    insert into app.job_events (tenant_id, job_id, event_type, actor, lease_token, details,
                                created_at)
    select c.tenant_id, c.id, 'claimed', p_owner, l.lease_token,
           jsonb_build_object('attempt', c.attempts, 'leaseExpiresAt', p_now + p_lease),
           p_now
    from claimed c
    join leased l on l.job_id = c.id
  )
  select c.id, c.tenant_id, c.operation_key, c.kind, c.payload, c.state, c.attempts,
         c.max_attempts, c.available_at, c.created_at, c.correlation_id, c.priority,
         p_owner, l.lease_token, p_now + p_lease, c.claim_key
  from claimed c
  join leased l on l.job_id = c.id
  order by c.claim_key, c.created_at, c.id;
end;
$$;
revoke all on function app.claim_locked_jobs(tid[], text, interval, timestamptz) from public;

-- One tenant's first claimable entries, up to p_limit, locked (SKIP LOCKED).
--
-- Without a kind filter: one walk of claimable_order_idx. With one (p_kinds: only these
-- kinds; p_exclude_kinds: every kind but these; app.check_kind_filter) the candidates are
-- each kind's first entries in each queue, from claimable_kind_idx (tenant, kind, queue,
-- claim order), so entries of other kinds are never read: the up to p_limit first of every kind, merged in
-- claim order and then locked in that order (SKIP LOCKED, LIMIT p_limit), so only the
-- entries claimed are locked. With p_exclude_kinds the tenant's kinds are found by a
-- loose scan of the same index, one probe per kind that has claimable entries.
create or replace function app.claim_jobs(
  p_tenant_id uuid,
  p_owner text,
  p_limit integer default 10,
  p_lease interval default interval '30 seconds',
  p_kinds text[] default null,
  p_exclude_kinds text[] default null,
  p_queue text default null
)
returns setof app.claimed_job
language plpgsql
security definer
set search_path = pg_catalog, pg_temp
set plan_cache_mode = force_generic_plan
as $$
declare
  v_now timestamptz := clock_timestamp();
  v_tids tid[];
  v_kinds text[];
  v_pair_kinds text[];
  v_pair_queues text[];
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
    select array_agg(c.ctid) into v_tids
    from (
      select q.ctid
      from app.claimable q
      where q.tenant_id = p_tenant_id
        and q.claim_key <= v_now
        and q.available_at <= v_now
        and q.queue = coalesce(p_queue, q.queue) and q.queue <> all (v_paused)
      order by q.claim_key, q.created_at, q.job_id
      for update skip locked
      limit p_limit
    ) c;
  else
    perform app.check_kind_filter(p_kinds, p_exclude_kinds);
    if p_kinds is not null then
      v_kinds := p_kinds;
    else
      with recursive kinds as (
        (select q.kind
         from app.claimable q
         where q.tenant_id = p_tenant_id
         order by q.kind
         limit 1)
        union all
        select n.kind
        from kinds k
        cross join lateral (
          select q.kind
          from app.claimable q
          where q.tenant_id = p_tenant_id and q.kind > k.kind
          order by q.kind
          limit 1
        ) n
      )
      select array_agg(k.kind) into v_kinds
      from kinds k
      where k.kind <> all (p_exclude_kinds);
    end if;
    -- The (kind, queue) pairs to walk: claimable_kind_idx orders entries by claim key
    -- within a tenant, kind and queue. Without p_queue, the queues of each kind are found
    -- by a loose scan of the same index, one probe per queue that has the kind's entries.
    if p_queue is not null then
      select array_agg(distinct u.kind), array_agg(p_queue)
      into v_pair_kinds, v_pair_queues
      from unnest(v_kinds) as u(kind);
    else
      with recursive pairs as (
        select k.kind, f.queue
        from (select distinct u.kind from unnest(v_kinds) as u(kind)) k
        cross join lateral (
          select q.queue
          from app.claimable q
          where q.tenant_id = p_tenant_id and q.kind = k.kind
          order by q.kind, q.queue
          limit 1
        ) f
        union all
        select p.kind, n.queue
        from pairs p
        cross join lateral (
          select q.queue
          from app.claimable q
          where q.tenant_id = p_tenant_id and q.kind = p.kind and q.queue > p.queue
          order by q.kind, q.queue
          limit 1
        ) n
      )
      select array_agg(p.kind), array_agg(p.queue)
      into v_pair_kinds, v_pair_queues
      from pairs p
      where p.queue <> all (v_paused);
    end if;
    select array_agg(c.ctid) into v_tids
    from (
      select c.ctid
      from (
        select head.tid, head.claim_key, head.created_at, head.job_id
        from unnest(v_pair_kinds, v_pair_queues) as k(kind, queue)
        cross join lateral (
          select q.ctid as tid, q.claim_key, q.created_at, q.job_id
          from app.claimable q
          where q.tenant_id = p_tenant_id
            and q.kind = k.kind
            and q.queue = k.queue
            and q.claim_key <= v_now
            and q.available_at <= v_now
          order by q.claim_key, q.created_at, q.job_id
          limit p_limit
        ) head
      ) candidate
      join app.claimable c on c.ctid = candidate.tid
      where c.claim_key <= v_now
        and c.available_at <= v_now
        and c.queue = coalesce(p_queue, c.queue) and c.queue <> all (v_paused)
      order by candidate.claim_key, candidate.created_at, candidate.job_id
      for update of c skip locked
      limit p_limit
    ) c;
  end if;
  if v_tids is null then
    return;
  end if;
  return query select * from app.claim_locked_jobs(v_tids, p_owner, p_lease, v_now);
end;
$$;
revoke all on function app.claim_jobs(uuid, text, integer, interval, text[], text[], text) from public;
grant execute on function app.claim_jobs(uuid, text, integer, interval, text[], text[], text) to leaseq_worker;

-- Tenants with a job ready now, in tenant_id order, with the available_at of their
-- first ready job in claim order. Only tenants whose turn is due (in some queue) can
-- have one (see above), so this reads each queue's due turns (tenant_turns_due_idx) and
-- probes each tenant's first ready entry in
-- claimable_order_idx: its cost follows the tenants with ready work (or a stale turn),
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
    select distinct t.tenant_id
    from unnest(app.due_queues(v_now)) as d(queue)
    cross join lateral (
      select t.tenant_id from app.tenant_turns t
      where t.queue = d.queue and t.turn_at <= v_now
    ) t
  )
  select t.tenant_id, r.available_at
  from due t
  cross join lateral (
    select j.available_at
    from app.claimable j
    where j.tenant_id = t.tenant_id
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
-- first live entry of claimable_ready_idx, one index probe whatever the number of
-- tenants or of future jobs. The Lambda runtime's oldest-ready-age metric.
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
  from app.claimable j
  where j.available_at <= v_now
  order by j.available_at
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
-- an advisory lock per tenant it serves, taken without waiting: class 1819374707 keyed
-- by the tenant, or with a kind filter class 1819374713 keyed by the filter and the
-- tenant, so that claims of two different filters never skip each other's tenants).
-- Each tenant locks a share of ceil(limit / tenants) of its oldest ready entries, and
-- the batch takes them round by round: every tenant's first job, then every tenant's
-- second, and so on; shares left unused by small tenants are then refilled from the
-- others. So while no more than p_limit tenants have ready work, every one of them gets
-- at least one job into every batch: a backlog of any size in one tenant delays another
-- tenant's job by at most one batch. Locked candidates beyond the limit (a share's
-- rounding) unlock at commit.
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
-- their turns, due tenants that other claims are serving (SKIP LOCKED on the entries
-- keeps them apart): concurrent workers of a few busy tenants all get work. A tenant
-- that gave no job had a stale turn: its room goes to the next tenants in turn (at most
-- three picks per claim). A tenant served that has no ready job left gets its turn moved
-- to its next claimable job, or NULL (app.settle_turns). When every due tenant fits in
-- the batch, busy tenants' turns are not written at all.
--
-- With a kind filter (p_kinds or p_exclude_kinds, app.check_kind_filter) the same loop
-- runs over the kinds' turns (app.kind_turns) of the claim's kinds instead of the
-- tenants' turns: the claim's kinds are p_kinds, or every kind that has a turn (a loose
-- scan of kind_turns_due_idx) but p_exclude_kinds; a tenant's place in turn order is its
-- oldest due turn among those kinds, read per kind (the oldest p_limit due turns of
-- each: a tenant among the first p_limit overall is among the first p_limit of the kind
-- of its oldest turn); a tenant's share comes from each due kind's first entries in
-- claimable_kind_idx, merged in claim order and locked in that order, so no entry of
-- another kind is read or locked. The round robin and its bound then hold per filter:
-- turns of other kinds are never moved (but for a tenant with no ready job at all), so a
-- worker of other kinds, however often it serves the tenant, does not delay it here.
--
-- Named queues (migrations 0026_named_queues, 0027_queue_turns): a claim serves one
-- queue, by that queue's own turns (turns.sql), and takes only its entries
-- (claimable_queue_idx, and claimable_kind_idx with the queue after the kind), so a
-- queue's claims never read, lock or move another queue's work or turns. Without
-- p_queue the claim serves every queue that is not paused and has a due turn
-- (app.due_queues), the queue whose turn has waited longest first, one queue's claim
-- after the other until the batch is full. A paused queue's claim returns nothing at
-- once (app.paused_queues). claim_jobs takes p_queue as a filter of the tenant's entries.
--
-- Each step of the loop is one statement with the two forms side by side, each behind a
-- test of the filter that the plan evaluates once (a one-time filter): the form not
-- taken costs nothing, and each keeps its own index walk.
create or replace function app.claim_ready_jobs(
  p_owner text,
  p_limit integer default 10,
  p_lease interval default interval '30 seconds',
  p_kinds text[] default null,
  p_exclude_kinds text[] default null,
  p_queue text default null
)
returns setof app.claimed_job
language plpgsql
security definer
set search_path = pg_catalog, pg_temp
set plan_cache_mode = force_generic_plan
as $$
declare
  v_now timestamptz := clock_timestamp();
  v_paused text[];
  v_kinds text[];            -- NULL: every kind (the tenants' turns)
  v_filtered boolean := false;
  v_class integer := 1819374707;
  v_filter text := '';
  v_pass integer := 0;
  v_room integer;
  v_due uuid[];
  v_pick uuid[];
  v_seen uuid[] := '{}';
  v_held uuid[] := '{}';
  v_share integer;
  v_got tid[];
  v_got_ids uuid[];
  v_fed uuid[];
  v_tids tid[] := '{}';
  v_ids uuid[] := '{}';
  v_served uuid[] := '{}';
  v_more tid[];
  v_queue text;
  v_count integer := 0;
  v_rows integer;
begin
  perform app.check_claim(p_owner, p_limit, p_lease);
  v_paused := app.paused_queues(p_queue);
  if p_queue is null then
    -- Every queue that is not paused, the one whose turn has waited longest first, each
    -- by its own round robin, until the batch is full.
    foreach v_queue in array app.due_queues(v_now) loop
      continue when v_queue = any (v_paused);
      return query select * from app.claim_ready_jobs(p_owner, p_limit - v_count, p_lease,
                                                      p_kinds, p_exclude_kinds, v_queue);
      get diagnostics v_rows = row_count;
      v_count := v_count + v_rows;
      exit when v_count >= p_limit;
    end loop;
    return;
  end if;
  if p_queue = any (v_paused) then
    return;
  end if;
  if p_kinds is not null or p_exclude_kinds is not null then
    perform app.check_kind_filter(p_kinds, p_exclude_kinds);
    v_filtered := true;
    v_class := 1819374713;
    if p_kinds is not null then
      v_kinds := array(select distinct u.kind from unnest(p_kinds) as u(kind) order by 1);
      v_filter := 'kinds ' || v_kinds::text;
    else
      with recursive known as (
        (select t.kind
         from app.kind_turns t
         where t.queue = p_queue and t.turn_at is not null
         order by t.queue, t.kind
         limit 1)
        union all
        select n.kind
        from known k
        cross join lateral (
          select t.kind
          from app.kind_turns t
          where t.queue = p_queue and t.turn_at is not null and t.kind > k.kind
          order by t.queue, t.kind
          limit 1
        ) n
      )
      select coalesce(array_agg(k.kind), '{}') into v_kinds
      from known k
      where k.kind <> all (p_exclude_kinds);
      v_filter := 'exclude '
        || array(select distinct u.kind from unnest(p_exclude_kinds) as u(kind)
                 order by 1)::text;
    end if;
  end if;

  loop
    v_pass := v_pass + 1;
    v_room := p_limit - cardinality(v_tids);
    -- The due tenants in turn order, read once per pass (the second pick below takes
    -- them from the same list): of the tenants' turns, the first v_room; of the kinds'
    -- turns, the first v_room of each kind, a tenant at its oldest.
    select coalesce(array_agg(due.tenant_id order by due.turn_at, due.tenant_id), '{}')
    into v_due
    from (
      select u.tenant_id, u.turn_at
      from (
        select t.tenant_id, t.turn_at
        from app.tenant_turns t
        where not v_filtered
          and t.queue = p_queue
          and t.turn_at <= v_now
          and t.tenant_id <> all (v_seen)
        order by t.turn_at, t.tenant_id
        limit v_room
      ) u
      union all
      select c.tenant_id, min(c.turn_at)
      from unnest(v_kinds) as k(kind)
      cross join lateral (
        select t.tenant_id, t.turn_at
        from app.kind_turns t
        where v_filtered
          and t.queue = p_queue
          and t.kind = k.kind
          and t.turn_at <= v_now
          and t.tenant_id <> all (v_seen)
        order by t.turn_at, t.tenant_id
        limit v_room
      ) c
      group by c.tenant_id
    ) due;
    -- The lock is tried in that order only (OFFSET 0 keeps the list's order and the
    -- volatile test apart), so a claim holds locks on the tenants it serves and no others.
    select coalesce(array_agg(d.tenant_id order by d.pos), '{}')
    into v_pick
    from (
      select l.tenant_id, l.pos
      from (select u.tenant_id, u.pos
            from unnest(v_due) with ordinality as u(tenant_id, pos)
            offset 0) l
      where pg_try_advisory_xact_lock(v_class,
                                      hashtext(p_queue || '/' || v_filter || l.tenant_id::text))
      limit v_room
    ) d;
    v_held := v_held || v_pick;
    v_seen := v_seen || v_pick;
    -- Fewer tenants free than room: the next due tenants of the list, served by other
    -- claims too.
    if v_pass = 1 and cardinality(v_pick) < v_room then
      v_pick := v_pick || array(select u.tenant_id
                                from unnest(v_due) with ordinality as u(tenant_id, pos)
                                where u.tenant_id <> all (v_pick)
                                order by u.pos
                                limit v_room - cardinality(v_pick));
      v_seen := v_pick;
    end if;
    exit when cardinality(v_pick) = 0;

    -- Each picked tenant's share, locked; then round by round across the tenants.
    v_share := ceil(v_room::numeric / cardinality(v_pick));
    select array_agg(r.tid order by r.round, r.pos), array_agg(r.job_id order by r.round, r.pos),
           array_agg(r.tenant_id order by r.pos) filter (where r.round = 1)
    into v_got, v_got_ids, v_fed
    from (
      select ranked.tid, ranked.job_id, ranked.round, t.tenant_id, t.pos
      from unnest(v_pick) with ordinality as t(tenant_id, pos)
      cross join lateral (
        select locked.tid, locked.job_id,
               row_number() over (order by locked.claim_key, locked.created_at,
                                           locked.job_id) as round
        from (
          select a.tid, a.job_id, a.claim_key, a.created_at
          from (
            select q.ctid as tid, q.job_id, q.claim_key, q.created_at
            from app.claimable q
            where not v_filtered
              and q.queue = p_queue
              and q.tenant_id = t.tenant_id
              and q.claim_key <= v_now
              and q.available_at <= v_now
            order by q.claim_key, q.created_at, q.job_id
            for update skip locked
            limit v_share
          ) a
          union all
          select b.tid, b.job_id, b.claim_key, b.created_at
          from (
            select c.ctid as tid, c.job_id, c.claim_key, c.created_at
            from (
              select head.tid, head.claim_key, head.created_at, head.job_id
              from app.kind_turns kt
              cross join lateral (
                select q.ctid as tid, q.claim_key, q.created_at, q.job_id
                from app.claimable q
                where q.tenant_id = kt.tenant_id
                  and q.kind = kt.kind
                  and q.claim_key <= v_now
                  and q.available_at <= v_now
                  and q.queue = p_queue
                order by q.claim_key, q.created_at, q.job_id
                limit v_share
              ) head
              where v_filtered
                and kt.queue = p_queue
                and kt.tenant_id = t.tenant_id
                and kt.turn_at <= v_now
                and kt.kind = any (v_kinds)
            ) candidate
            join app.claimable c on c.ctid = candidate.tid
            where c.claim_key <= v_now
              and c.available_at <= v_now
              and c.queue = p_queue
            order by candidate.claim_key, candidate.created_at, candidate.job_id
            for update of c skip locked
            limit v_share
          ) b
        ) locked
      ) ranked
      order by ranked.round, t.pos
      limit v_room
    ) r;
    v_tids := v_tids || coalesce(v_got, '{}');
    v_ids := v_ids || coalesce(v_got_ids, '{}');
    v_served := v_served || coalesce(v_fed, '{}');
    exit when cardinality(v_tids) >= p_limit or v_pass >= 3
           or coalesce(cardinality(v_fed), 0) = cardinality(v_pick);
  end loop;

  -- Room left after the rounds: refill from the tenants served, in their order.
  if cardinality(v_tids) < p_limit and (cardinality(v_served) > 1 or v_pass > 1) then
    select array_agg(m.tid) into v_more
    from (
      select a.tid, a.pos, a.claim_key, a.created_at, a.job_id
      from unnest(v_served) with ordinality as t(tenant_id, pos)
      cross join lateral (
        select q.ctid as tid, t.pos, q.claim_key, q.created_at, q.job_id
        from app.claimable q
        where not v_filtered
          and q.queue = p_queue
          and q.tenant_id = t.tenant_id
          and q.claim_key <= v_now
          and q.available_at <= v_now
          and q.job_id <> all (v_ids)
        order by q.claim_key, q.created_at, q.job_id
        for update skip locked
        limit p_limit - cardinality(v_tids)
      ) a
      union all
      select b.tid, b.pos, b.claim_key, b.created_at, b.job_id
      from (
        select c.ctid as tid, candidate.pos, candidate.claim_key, candidate.created_at,
               candidate.job_id
        from (
          select head.tid, head.claim_key, head.created_at, head.job_id, t.pos
          from unnest(v_served) with ordinality as t(tenant_id, pos)
          join app.kind_turns kt on kt.queue = p_queue and kt.tenant_id = t.tenant_id
          cross join lateral (
            select q.ctid as tid, q.claim_key, q.created_at, q.job_id
            from app.claimable q
            where q.tenant_id = kt.tenant_id
              and q.kind = kt.kind
              and q.claim_key <= v_now
              and q.available_at <= v_now
              and q.queue = p_queue
              and q.job_id <> all (v_ids)
            order by q.claim_key, q.created_at, q.job_id
            limit p_limit - cardinality(v_tids)
          ) head
          where v_filtered
            and kt.turn_at <= v_now
            and kt.kind = any (v_kinds)
        ) candidate
        join app.claimable c on c.ctid = candidate.tid
        where c.claim_key <= v_now
          and c.available_at <= v_now
          and c.queue = p_queue
        order by candidate.pos, candidate.claim_key, candidate.created_at, candidate.job_id
        for update of c skip locked
        limit p_limit - cardinality(v_tids)
      ) b
      limit p_limit - cardinality(v_tids)
    ) m;
    v_tids := v_tids || coalesce(v_more, '{}');
  end if;

  if cardinality(v_tids) > 0 then
    return query select * from app.claim_locked_jobs(v_tids, p_owner, p_lease, v_now);
  end if;
  perform app.settle_turns(p_queue, v_held, v_seen, v_kinds, v_now);
end;
$$;
revoke all on function app.claim_ready_jobs(text, integer, interval, text[], text[], text) from public;
grant execute on function app.claim_ready_jobs(text, integer, interval, text[], text[], text) to leaseq_worker;
