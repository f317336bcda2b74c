-- leaseq functions: concurrency and rate limits, enforced at admission.
--
-- One file over 600 lines: the slots, the holds, the start slots, the trigger that frees
-- them and the operators' functions are one mechanism whose parts call each other, and
-- its exactness rests on reading them together.
--
-- A job under limits becomes claimable only once it is *admitted*: it holds a numbered
-- slot of every limit that applies to it (app.limit_slots, primary key (bucket, purpose,
-- slot): two jobs can never hold one slot, whatever races or transactions held open).
--   * concurrency N: purpose 'run', slots 0..N-1, taken at admission and given back when
--     the job ends (succeeded, dead, cancelled; the trigger jobs_limits_state). A retry, a
--     released lease or a give-back keeps the slot: running <= admitted <= N always.
--   * rate R per period, burst B (1..R, R when not given): purpose 'start', slots
--     0..B-1, taken at admission and given back when the job starts; a job admitted under
--     a rate limit is scheduled to its earliest allowed start, and the claim that starts
--     it takes a start slot (app.limit_starts, rows 0..B-1): a slot that started a job
--     at t starts the next one at t + period / floor(R / B) at the earliest. So in any
--     window of one period no more than B x floor(R / B) <= R jobs start, counted where
--     they start (a job admitted early and claimed late cannot start in a bunch with
--     others: its claim finds no start slot and schedules it again).
-- A job that finds a limit full is held (app.held_jobs): its available_at and claim_key
-- move to app.held_until() and it has no app.claimable entry, so no claim, turn, ready
-- count or backlog reads it; the statement that frees a slot admits the next held job in
-- the same statement (app.admit_held). The reaper's pass (app.admit_held_jobs) admits
-- whatever a race or a due time left waiting with a free slot.
--
-- Hooks in the claim path (each marked "limits hook"): app.enqueue_items calls
-- app.limit_new_jobs on the jobs it created; app.claim_locked_jobs calls
-- app.start_limited_jobs on the jobs it is about to claim; the trigger jobs_limits_state
-- (migration 0025) frees slots at every final state and re-admits a redriven job.
--
-- Held, on the claim's tables: a held job's row carries app.held_until() as its due time
-- and claim key, so the triggers of functions/claimable.sql give it no app.claimable
-- entry (and every reader of the row sees it as not due); app.admit_held writes its real
-- ones back, and the trigger adds its entry. app.cancel_jobs and app.waiting_jobs read
-- app.held_jobs beside the entries; the wait reasons read it for held_by.
--
-- Which limits apply (app.job_limit_rows): every scope at once: the job's kind, its
-- tenant, its kind within its tenant, its limit_key. Within a scope, a row naming the
-- tenant is in force over the row for every tenant (tenant_id NULL), and an operator's
-- row over the code's. A limit applies to jobs enqueued or redriven while it exists.

-- The due time of a held job: far past any real one (enqueue accepts at most 365 days
-- ahead), so that every claim, turn and ready count leaves held jobs out.
create or replace function app.held_until()
returns timestamptz
language sql
immutable
set search_path = pg_catalog, pg_temp
as $$ select timestamptz '9999-01-01 00:00:00+00' $$;
revoke all on function app.held_until() from public;

-- The limits in force for a job of this tenant, kind and key: one row per scope, with
-- the bucket (the instance of the limit the job counts in) and the name an operator
-- knows the limit by. Internal: owner only.
create or replace function app.job_limit_rows(p_tenant_id uuid, p_kind text, p_limit_key text)
returns table (bucket text, name text, concurrency integer, rate_count integer,
               rate_period interval, burst integer)
language sql
stable
set search_path = pg_catalog, pg_temp
as $$
  select case l.scope
           when 'kind' then 'kind:' || p_kind
           when 'tenant' then 'tenant:' || p_tenant_id
           when 'kind_tenant' then 'kind:' || p_kind || '/tenant:' || p_tenant_id
           else 'key:' || p_limit_key
         end,
         app.limit_name(l.scope, l.kind, l.tenant_id, l.limit_key),
         l.concurrency, l.rate_count, l.rate_period, coalesce(l.burst, l.rate_count)
  from (
    select distinct on (l.scope) l.*
    from app.limits l
    where (l.scope = 'kind' and l.kind = p_kind)
       or (l.scope = 'tenant' and l.kind is null and (l.tenant_id = p_tenant_id or l.tenant_id is null))
       or (l.scope = 'kind_tenant' and l.kind = p_kind
           and (l.tenant_id = p_tenant_id or l.tenant_id is null))
       or (l.scope = 'key' and l.limit_key = p_limit_key)
    order by l.scope, l.tenant_id is null, l.source = 'code'
  ) l
  order by 1
$$;
revoke all on function app.job_limit_rows(uuid, text, text) from public;

-- A limit's name, as set, listed and shown: kind:K, tenant:T (tenant:* for every
-- tenant), kind:K/tenant:T (or /tenant:*), key:L.
create or replace function app.limit_name(p_scope text, p_kind text, p_tenant_id uuid,
                                          p_limit_key text)
returns text
language sql
immutable
set search_path = pg_catalog, pg_temp
as $$
  select case p_scope
           when 'kind' then 'kind:' || p_kind
           when 'tenant' then 'tenant:' || coalesce(p_tenant_id::text, '*')
           when 'kind_tenant' then 'kind:' || p_kind || '/tenant:' || coalesce(p_tenant_id::text, '*')
           else 'key:' || p_limit_key
         end
$$;
revoke all on function app.limit_name(text, text, uuid, text) from public;

-- The interval after which a start slot of this rate may start its next job.
create or replace function app.start_reuse(p_rate_count integer, p_rate_period interval,
                                           p_burst integer)
returns interval
language sql
immutable
set search_path = pg_catalog, pg_temp
as $$ select p_rate_period / greatest(p_rate_count / greatest(p_burst, 1), 1) $$;
revoke all on function app.start_reuse(integer, interval, integer) from public;

-- When the next start of this bucket is allowed: now if one of its B start slots is
-- unused, else the earliest slot's last start plus the reuse interval.
create or replace function app.next_start_at(p_bucket text, p_rate_count integer,
                                             p_rate_period interval, p_burst integer,
                                             p_now timestamptz)
returns timestamptz
language sql
stable
set search_path = pg_catalog, pg_temp
as $$
  select case when count(*) < p_burst then p_now
              else greatest(p_now, min(s.started_at)
                                   + app.start_reuse(p_rate_count, p_rate_period, p_burst)) end
  from app.limit_starts s
  where s.bucket = p_bucket and s.slot < p_burst
$$;
revoke all on function app.next_start_at(text, integer, interval, integer, timestamptz) from public;

-- Take one free slot numbered 0 .. p_capacity - 1 of (bucket, purpose) for a job; false
-- when all are taken. The primary key makes two holders of one slot impossible; so that
-- no admission ever waits on another transaction's uncommitted slot (a claim held open
-- that admitted the next job), a slot is tried only under a transaction-scoped advisory
-- lock (class 1819374712), taken without waiting: a slot another transaction is taking
-- is skipped. (A slot freed by an uncommitted transaction is still seen taken.)
create or replace function app.take_slot(p_bucket text, p_purpose text, p_capacity integer,
                                         p_job_id uuid, p_tenant_id uuid, p_now timestamptz)
returns boolean
language plpgsql
set search_path = pg_catalog, pg_temp
as $$
declare
  v_taken integer;
  v_slot integer;
begin
  select count(*) into v_taken
  from app.limit_slots s
  where s.bucket = p_bucket and s.purpose = p_purpose and s.slot < p_capacity;
  if v_taken >= p_capacity then
    return false;
  end if;
  for v_slot in
    select g.n
    from generate_series(0, p_capacity - 1) as g(n)
    where not exists (select 1 from app.limit_slots s
                      where s.bucket = p_bucket and s.purpose = p_purpose and s.slot = g.n)
    order by g.n
  loop
    continue when not pg_try_advisory_xact_lock(
      1819374712, hashtext(p_bucket || ' ' || p_purpose || ' ' || v_slot));
    insert into app.limit_slots (bucket, purpose, slot, job_id, tenant_id, taken_at)
    values (p_bucket, p_purpose, v_slot, p_job_id, p_tenant_id, p_now)
    on conflict do nothing;
    if found then
      return true;
    end if;
  end loop;
  return false;
end;
$$;
revoke all on function app.take_slot(text, text, integer, uuid, uuid, timestamptz) from public;

-- Admit one job through every limit in force for it: take its run and start slots,
-- bucket by bucket in name order. Returns the bucket that was full (the slots taken by
-- this call are given back) or NULL when admitted, with the earliest start its rate
-- limits allow (p_now without one), and the buckets it was admitted through.
create or replace function app.take_limit_slots(
  p_job_id uuid, p_tenant_id uuid, p_kind text, p_limit_key text, p_now timestamptz,
  out full_bucket text, out start_at timestamptz, out buckets text[])
language plpgsql
set search_path = pg_catalog, pg_temp
as $$
declare
  v_limit record;
  v_taken text[] := '{}';
begin
  start_at := p_now;
  buckets := '{}';
  for v_limit in select * from app.job_limit_rows(p_tenant_id, p_kind, p_limit_key) loop
    buckets := buckets || v_limit.bucket;
    if v_limit.concurrency is not null then
      if not app.take_slot(v_limit.bucket, 'run', v_limit.concurrency, p_job_id, p_tenant_id, p_now) then
        full_bucket := v_limit.bucket;
      else
        v_taken := v_taken || (v_limit.bucket || ' run');
      end if;
    end if;
    if full_bucket is null and v_limit.rate_count is not null then
      if not app.take_slot(v_limit.bucket, 'start', v_limit.burst, p_job_id, p_tenant_id, p_now) then
        full_bucket := v_limit.bucket;
      else
        v_taken := v_taken || (v_limit.bucket || ' start');
        start_at := greatest(start_at,
                             app.next_start_at(v_limit.bucket, v_limit.rate_count,
                                               v_limit.rate_period, v_limit.burst, p_now));
      end if;
    end if;
    if full_bucket is not null then
      delete from app.limit_slots s
      where s.job_id = p_job_id and (s.bucket || ' ' || s.purpose) = any (v_taken);
      return;
    end if;
  end loop;
end;
$$;
revoke all on function app.take_limit_slots(uuid, uuid, text, text, timestamptz) from public;

-- Hold a job (pending or retry_wait, its row locked or new in this transaction) behind
-- a full bucket: its due time and claim key go to app.held_jobs, its row gets
-- app.held_until(). Its tenant gets a turn in the bucket's fair order if it has none,
-- level with the tenant admitted least there (a newcomer neither jumps the queue nor
-- waits for others' history).
create or replace function app.hold_job(p_job_id uuid, p_bucket text, p_buckets text[],
                                        p_now timestamptz)
returns void
language plpgsql
set search_path = pg_catalog, pg_temp
as $$
declare
  v_tenant uuid;
  v_step interval := app.priority_step();
begin
  insert into app.held_jobs (job_id, tenant_id, bucket, priority, claim_key, available_at,
                             created_at, held_at)
  select j.id, j.tenant_id, p_bucket, j.priority, j.claim_key, j.available_at, j.created_at, p_now
  from app.jobs j
  where j.id = p_job_id
  on conflict (job_id) do update set bucket = excluded.bucket
  returning tenant_id into v_tenant;

  update app.jobs j
  set available_at = app.held_until(),
      claim_key = app.held_until() - (j.priority - 1) * v_step,
      limit_buckets = p_buckets
  where j.id = p_job_id and j.tenant_id = v_tenant;

  insert into app.limit_turns (bucket, tenant_id, served)
  values (p_bucket, v_tenant,
          coalesce((select min(t.served) from app.limit_turns t where t.bucket = p_bucket), 0))
  on conflict (bucket, tenant_id) do nothing;
end;
$$;
revoke all on function app.hold_job(uuid, text, text[], timestamptz) from public;

-- Limits hook of the enqueue (and of a redrive, through the trigger): admit or hold each
-- of these new claimable jobs. Returns the ids held, which the caller leaves out of its
-- turn wake-up. One probe of app.limits when no limit exists at all.
create or replace function app.limit_new_jobs(p_job_ids uuid[])
returns uuid[]
language plpgsql
set search_path = pg_catalog, pg_temp
as $$
declare
  v_now timestamptz := clock_timestamp();
  v_step interval;
  v_job record;
  v_admit record;
  v_held uuid[] := '{}';
  v_kinds text[];
  v_tenants uuid[];
  v_every_tenant boolean;
  v_keys boolean;
  v_admit_buckets text[];
begin
  if p_job_ids is null or not exists (select 1 from app.limits) then
    return v_held;
  end if;
  -- What the limits name, read once: only jobs that one of them may govern are looked at
  -- one by one, so a batch of unlimited kinds costs this one read of app.limits.
  select coalesce(array_agg(distinct l.kind) filter (where l.kind is not null), '{}'),
         coalesce(array_agg(distinct l.tenant_id) filter (where l.scope = 'tenant'), '{}'),
         coalesce(bool_or(l.scope = 'tenant' and l.tenant_id is null), false),
         coalesce(bool_or(l.scope = 'key'), false)
  into v_kinds, v_tenants, v_every_tenant, v_keys
  from app.limits l;
  v_step := app.priority_step();
  for v_job in
    select j.id, j.tenant_id, j.kind, j.limit_key, j.available_at, j.priority
    from app.jobs j
    where j.id = any (p_job_ids) and j.state in ('pending', 'retry_wait')
      and (j.kind = any (v_kinds) or j.tenant_id = any (v_tenants) or v_every_tenant
           or (v_keys and j.limit_key is not null))
    order by j.claim_key, j.created_at, j.id
  loop
    -- A job due later takes no slot before it is due: it waits held, and the first
    -- freeing statement or reaper pass after its due time admits it.
    if v_job.available_at > v_now then
      select array_agg(r.bucket order by r.bucket) into v_admit_buckets
      from app.job_limit_rows(v_job.tenant_id, v_job.kind, v_job.limit_key) r;
      if v_admit_buckets is not null then
        perform app.hold_job(v_job.id, v_admit_buckets[1], v_admit_buckets, v_now);
        v_held := v_held || v_job.id;
      end if;
      continue;
    end if;
    select * into v_admit
    from app.take_limit_slots(v_job.id, v_job.tenant_id, v_job.kind, v_job.limit_key, v_now);
    if cardinality(v_admit.buckets) = 0 then
      continue;
    end if;
    if v_admit.full_bucket is not null then
      perform app.hold_job(v_job.id, v_admit.full_bucket, v_admit.buckets, v_now);
      v_held := v_held || v_job.id;
    elsif v_admit.start_at > v_job.available_at then
      update app.jobs j
      set limit_buckets = v_admit.buckets,
          available_at = v_admit.start_at,
          claim_key = v_admit.start_at - (j.priority - 1) * v_step
      where j.id = v_job.id and j.tenant_id = v_job.tenant_id;
    else
      update app.jobs j set limit_buckets = v_admit.buckets
      where j.id = v_job.id and j.tenant_id = v_job.tenant_id;
    end if;
  end loop;
  return v_held;
end;
$$;
revoke all on function app.limit_new_jobs(uuid[]) from public;

-- Admit up to p_count held jobs of a bucket, fairly across tenants: the tenant admitted
-- least in this bucket since its jobs began waiting goes first, and within a tenant the
-- job first in claim order (priority with aging, then age), due now. A held job that
-- another of its limits still holds back moves to that limit's queue. Returns the
-- number admitted. Each admitted job is claimable at its own due time, or its earliest
-- allowed start, and its tenant and kind get their turns (app.wake_tenants).
create or replace function app.admit_held(p_bucket text, p_count integer)
returns integer
language plpgsql
set search_path = pg_catalog, pg_temp
as $$
declare
  v_now timestamptz := clock_timestamp();
  v_step interval;
  v_tries integer := 0;
  v_admitted integer := 0;
  v_pick record;
  v_admit record;
  v_at timestamptz;
begin
  if p_count < 1 then
    return 0;
  end if;
  v_step := app.priority_step();
  while v_admitted < p_count and v_tries < p_count + 8 loop
    v_tries := v_tries + 1;
    select h.job_id, h.tenant_id, h.available_at, h.priority, j.kind, j.limit_key, j.queue
    into v_pick
    from app.limit_turns t
    cross join lateral (
      select h.job_id, h.tenant_id, h.available_at, h.priority
      from app.held_jobs h
      where h.bucket = t.bucket and h.tenant_id = t.tenant_id and h.available_at <= v_now
      order by h.claim_key, h.created_at, h.job_id
      limit 1
    ) h
    join app.jobs j on j.id = h.job_id and j.tenant_id = h.tenant_id
    where t.bucket = p_bucket
      and j.state in ('pending', 'retry_wait')
    order by t.served, t.tenant_id
    limit 1
    for update of j skip locked;
    exit when not found;

    select * into v_admit
    from app.take_limit_slots(v_pick.job_id, v_pick.tenant_id, v_pick.kind, v_pick.limit_key, v_now);
    if v_admit.full_bucket = p_bucket then
      exit;  -- taken meanwhile by another admission: nothing free here any more
    elsif v_admit.full_bucket is not null then
      perform app.hold_job(v_pick.job_id, v_admit.full_bucket, v_admit.buckets, v_now);
    else
      v_at := greatest(v_pick.available_at, v_admit.start_at);
      delete from app.held_jobs h where h.job_id = v_pick.job_id;
      update app.jobs j
      set available_at = v_at,
          claim_key = v_at - (j.priority - 1) * v_step,
          limit_buckets = case when cardinality(v_admit.buckets) = 0 then null
                               else v_admit.buckets end,
          updated_at = v_now
      where j.id = v_pick.job_id and j.tenant_id = v_pick.tenant_id;
      perform app.wake_tenants(array[v_pick.queue], array[v_pick.tenant_id], array[v_at],
                               array[v_pick.kind]);
      v_admitted := v_admitted + 1;
    end if;
    update app.limit_turns t set served = t.served + 1
    where t.bucket = p_bucket and t.tenant_id = v_pick.tenant_id;
    delete from app.limit_turns t
    where t.bucket = p_bucket and t.tenant_id = v_pick.tenant_id
      and not exists (select 1 from app.held_jobs h
                      where h.bucket = p_bucket and h.tenant_id = v_pick.tenant_id);
  end loop;
  return v_admitted;
end;
$$;
revoke all on function app.admit_held(text, integer) from public;

-- How many more jobs a bucket can admit now (1000 for a bucket no limit governs any
-- more: its held jobs are let go), for the job that is first in its queue.
create or replace function app.bucket_room(p_bucket text)
returns integer
language plpgsql
stable
set search_path = pg_catalog, pg_temp
as $$
declare
  v_job record;
  v_limit record;
  v_room integer := 1000;
begin
  select j.tenant_id, j.kind, j.limit_key into v_job
  from app.held_jobs h join app.jobs j on j.id = h.job_id and j.tenant_id = h.tenant_id
  where h.bucket = p_bucket
  limit 1;
  if not found then
    return 0;
  end if;
  select * into v_limit
  from app.job_limit_rows(v_job.tenant_id, v_job.kind, v_job.limit_key) r
  where r.bucket = p_bucket;
  if not found then
    return v_room;
  end if;
  if v_limit.concurrency is not null then
    v_room := least(v_room, v_limit.concurrency - (
      select count(*) from app.limit_slots s
      where s.bucket = p_bucket and s.purpose = 'run' and s.slot < v_limit.concurrency));
  end if;
  if v_limit.rate_count is not null then
    v_room := least(v_room, v_limit.burst - (
      select count(*) from app.limit_slots s
      where s.bucket = p_bucket and s.purpose = 'start' and s.slot < v_limit.burst));
  end if;
  return greatest(v_room, 0);
end;
$$;
revoke all on function app.bucket_room(text) from public;

-- The trigger jobs_limits_state (migration 0025): a job admitted through limits ended
-- (succeeded, dead, cancelled): its slots are given back and, in the same statement,
-- the next held job of each of those buckets admitted; a held job that ended (cancelled)
-- leaves its queue. A redriven job (final -> pending) is admitted or held anew.
create or replace function app.limits_on_state_change()
returns trigger
language plpgsql
set search_path = pg_catalog, pg_temp
as $$
declare
  v_bucket text;
  v_held text;
begin
  if new.state in ('succeeded', 'dead', 'cancelled') then
    delete from app.held_jobs h where h.job_id = new.id returning h.bucket into v_held;
    if v_held is not null then
      delete from app.limit_turns t
      where t.bucket = v_held and t.tenant_id = new.tenant_id
        and not exists (select 1 from app.held_jobs h
                        where h.bucket = v_held and h.tenant_id = new.tenant_id);
    end if;
    for v_bucket in
      with freed as (
        delete from app.limit_slots s where s.job_id = new.id returning s.bucket
      )
      select distinct f.bucket from freed f order by 1
    loop
      perform app.admit_held(v_bucket, app.bucket_room(v_bucket));
    end loop;
  elsif new.state = 'pending' then
    perform app.limit_new_jobs(array[new.id]);
  end if;
  return null;
end;
$$;
revoke all on function app.limits_on_state_change() from public;

-- Limits hook of the claim (app.claim_locked_jobs): of the jobs a claim locked, those
-- under a rate limit start (each time they start: first, retried, given back) only with
-- a start slot of each such limit (a row of
-- app.limit_starts whose last start is a reuse interval ago, locked SKIP LOCKED, so two
-- claims never share one). Those that get one start: the slot records the start, their
-- admission slot is given back and the next held job of the bucket admitted, scheduled
-- to its earliest start. Those that do not stay admitted, scheduled again to the
-- earliest start their limits allow, and are not claimed. Returns the ids to claim, in
-- the order given. One primary-key probe per job when none was admitted through limits.
create or replace function app.start_limited_jobs(p_ids uuid[], p_now timestamptz)
returns uuid[]
language plpgsql
set search_path = pg_catalog, pg_temp
as $$
declare
  v_job record;
  v_limit record;
  v_slot integer;
  v_ok boolean;
  v_slots text[];
  v_at timestamptz;
  v_refused uuid[] := '{}';
  v_step interval;
  v_bucket text;
begin
  -- One primary-key probe per job (the LIMIT keeps each probe a probe): written as
  -- `j.id = any (p_ids)` under EXISTS, the planner expected an early match and scanned
  -- the whole job table instead, on every claim of jobs under no limit.
  if not exists (select 1
                 from unnest(p_ids) as u(id)
                 cross join lateral (select j.limit_buckets from app.jobs j
                                     where j.id = u.id limit 1) j
                 where j.limit_buckets is not null) then
    return p_ids;
  end if;
  v_step := app.priority_step();
  -- Every start of a job admitted through limits counts: its first, and each retry's,
  -- a released lease's or a give-back's start again.
  for v_job in
    select j.id, j.tenant_id, j.kind, j.limit_key, j.priority, j.queue
    from unnest(p_ids) with ordinality as u(id, n)
    cross join lateral (select j.id, j.tenant_id, j.kind, j.limit_key, j.priority, j.queue,
                               j.limit_buckets
                        from app.jobs j where j.id = u.id limit 1) j
    where j.limit_buckets is not null
    order by u.n
  loop
    v_ok := true;
    v_slots := '{}';
    v_at := p_now;
    for v_limit in
      select r.*
      from app.job_limit_rows(v_job.tenant_id, v_job.kind, v_job.limit_key) r
      where r.rate_count is not null
    loop
      -- The bucket's start slots, made on first use (or a raised burst) by one claim at
      -- a time, which none waits for: another claim making them skips, and finds none.
      if (select count(*) from app.limit_starts s
          where s.bucket = v_limit.bucket and s.slot < v_limit.burst) < v_limit.burst
         and pg_try_advisory_xact_lock(1819374713, hashtext(v_limit.bucket)) then
        insert into app.limit_starts (bucket, slot, started_at)
        select v_limit.bucket, g.n, '-infinity'
        from generate_series(0, v_limit.burst - 1) as g(n)
        on conflict do nothing;
      end if;
      select s.slot into v_slot
      from app.limit_starts s
      where s.bucket = v_limit.bucket
        and s.slot < v_limit.burst
        and s.started_at <= p_now - app.start_reuse(v_limit.rate_count, v_limit.rate_period,
                                                    v_limit.burst)
      order by s.started_at, s.slot
      limit 1
      for update skip locked;
      if found then
        v_slots := v_slots || (v_limit.bucket || ' ' || v_slot);
      else
        v_ok := false;
        v_at := greatest(v_at, app.next_start_at(v_limit.bucket, v_limit.rate_count,
                                                 v_limit.rate_period, v_limit.burst, p_now));
      end if;
    end loop;
    if v_ok then
      update app.limit_starts s set started_at = p_now
      where (s.bucket || ' ' || s.slot) = any (v_slots);
      for v_bucket in
        with freed as (
          delete from app.limit_slots s
          where s.job_id = v_job.id and s.purpose = 'start'
          returning s.bucket
        )
        select f.bucket from freed f order by 1
      loop
        perform app.admit_held(v_bucket, app.bucket_room(v_bucket));
      end loop;
    else
      -- A start slot another claim holds is a moment away, not a period.
      if v_at <= p_now then
        v_at := p_now + interval '100 milliseconds';
      end if;
      update app.jobs j
      set available_at = v_at,
          claim_key = v_at - (j.priority - 1) * v_step
      where j.id = v_job.id and j.tenant_id = v_job.tenant_id;
      perform app.wake_tenants(array[v_job.queue], array[v_job.tenant_id], array[v_at],
                               array[v_job.kind]);
      v_refused := v_refused || v_job.id;
    end if;
  end loop;
  return array(select u.id from unnest(p_ids) with ordinality as u(id, n)
               where u.id <> all (v_refused) order by u.n);
end;
$$;
revoke all on function app.start_limited_jobs(uuid[], timestamptz) from public;

-- The reaper's pass: admit held jobs wherever a slot is free (a race between a hold and
-- a free, a held job that became due, a limit raised or removed). One probe per bucket
-- with held jobs (a loose scan of held_jobs_admission_idx), at most p_limit admissions.
create or replace function app.admit_held_jobs(p_limit integer default 1000)
returns integer
language plpgsql
security definer
set search_path = pg_catalog, pg_temp
as $$
declare
  v_bucket text;
  v_total integer := 0;
  v_room integer;
begin
  if p_limit is null or p_limit < 1 or p_limit > 10000 then
    perform app.check_range('p_limit', p_limit, 1, 10000);
  end if;
  for v_bucket in
    with recursive buckets as (
      (select h.bucket from app.held_jobs h order by h.bucket limit 1)
      union all
      select n.bucket
      from buckets b
      cross join lateral (select h.bucket from app.held_jobs h where h.bucket > b.bucket
                          order by h.bucket limit 1) n
    )
    select b.bucket from buckets b
  loop
    exit when v_total >= p_limit;
    v_room := least(app.bucket_room(v_bucket), p_limit - v_total);
    if v_room > 0 then
      v_total := v_total + app.admit_held(v_bucket, v_room);
    end if;
  end loop;
  return v_total;
end;
$$;
revoke all on function app.admit_held_jobs(integer) from public;
grant execute on function app.admit_held_jobs(integer) to leaseq_reaper, leaseq_operator;

-- Check a limit's arguments; 22023 with what to do otherwise.
create or replace function app.check_limit(
  p_scope text, p_kind text, p_tenant_id uuid, p_limit_key text,
  p_concurrency integer, p_rate_count integer, p_rate_period interval, p_burst integer)
returns void
language plpgsql
set search_path = pg_catalog, pg_temp
as $$
begin
  if p_scope is null or p_scope not in ('kind', 'tenant', 'kind_tenant', 'key') then
    perform app.raise_invalid(format('p_scope must be kind, tenant, kind_tenant or key (got %s)',
                                     coalesce(p_scope, 'NULL')));
  end if;
  if p_scope in ('kind', 'kind_tenant')
     and (p_kind is null or length(p_kind) > 128 or app.is_blank(p_kind)) then
    perform app.raise_invalid('a kind limit needs p_kind, a non-blank text of at most 128 characters');
  end if;
  if p_scope in ('tenant', 'key') and p_kind is not null then
    perform app.raise_invalid(format('a %s limit takes no p_kind', p_scope));
  end if;
  if p_scope = 'kind' and p_tenant_id is not null then
    perform app.raise_invalid('a kind limit takes no p_tenant_id: use scope kind_tenant for a kind within a tenant');
  end if;
  if p_scope = 'key' and (p_limit_key is null or length(p_limit_key) > 200 or app.is_blank(p_limit_key)) then
    perform app.raise_invalid('a key limit needs p_limit_key, a non-blank text of at most 200 characters');
  end if;
  if p_scope <> 'key' and p_limit_key is not null then
    perform app.raise_invalid(format('a %s limit takes no p_limit_key', p_scope));
  end if;
  if p_scope = 'key' and p_tenant_id is not null then
    perform app.raise_invalid('a key limit takes no p_tenant_id: a key is shared by every tenant that names it');
  end if;
  if p_concurrency is null and p_rate_count is null then
    perform app.raise_invalid('a limit needs a concurrency, a rate, or both');
  end if;
  if p_concurrency is not null and p_concurrency not between 1 and 10000 then
    perform app.raise_invalid(format('concurrency must be between 1 and 10000 (got %s): a limit of '
                                     'less than 1 would never admit a job; remove the limit, or '
                                     'cancel the jobs, instead', p_concurrency));
  end if;
  if (p_rate_count is null) <> (p_rate_period is null) then
    perform app.raise_invalid('a rate needs both a count and a period');
  end if;
  if p_rate_count is not null and p_rate_count not between 1 and 10000 then
    perform app.raise_invalid(format('rate must allow 1 to 10000 starts per period (got %s): a '
                                     'rate of less than 1 would never start a job', p_rate_count));
  end if;
  if p_rate_period is not null
     and p_rate_period not between interval '1 second' and interval '1 day' then
    perform app.raise_invalid(format('rate period must be between 1 second and 1 day (got %s)',
                                     p_rate_period));
  end if;
  if p_burst is not null and (p_rate_count is null or p_burst not between 1 and p_rate_count) then
    perform app.raise_invalid(format('burst must be between 1 and the rate''s count (got %s)',
                                     p_burst));
  end if;
end;
$$;
revoke all on function app.check_limit(text, text, uuid, text, integer, integer, interval, integer) from public;

-- An operator sets a limit at run time (source operator, in force over the code's for
-- the same subject): concurrency and/or rate (p_rate_count per p_rate_period, burst
-- p_burst). A raised limit admits held jobs at once; a lowered one admits no more until
-- the jobs admitted drop below it (running jobs are never stopped). Returns its name.
create or replace function app.set_limit(
  p_actor text,
  p_scope text,
  p_kind text default null,
  p_tenant_id uuid default null,
  p_limit_key text default null,
  p_concurrency integer default null,
  p_rate_count integer default null,
  p_rate_period interval default null,
  p_burst integer default null
)
returns text
language plpgsql
security definer
set search_path = pg_catalog, pg_temp
as $$
begin
  perform app.check_actor(p_actor);
  perform app.check_limit(p_scope, p_kind, p_tenant_id, p_limit_key, p_concurrency,
                          p_rate_count, p_rate_period, p_burst);
  insert into app.limits as l (scope, kind, tenant_id, limit_key, source, concurrency,
                               rate_count, rate_period, burst, updated_at, updated_by)
  values (p_scope, p_kind, p_tenant_id, p_limit_key, 'operator', p_concurrency,
          p_rate_count, p_rate_period, p_burst, clock_timestamp(), p_actor)
  on conflict (scope, coalesce(kind, ''),
               coalesce(tenant_id, '00000000-0000-0000-0000-000000000000'::uuid),
               coalesce(limit_key, ''), source)
  do update set concurrency = excluded.concurrency, rate_count = excluded.rate_count,
                rate_period = excluded.rate_period, burst = excluded.burst,
                updated_at = excluded.updated_at, updated_by = excluded.updated_by;
  perform app.admit_held_jobs(10000);
  return app.limit_name(p_scope, p_kind, p_tenant_id, p_limit_key);
end;
$$;
revoke all on function app.set_limit(text, text, text, uuid, text, integer, integer, interval, integer) from public;
grant execute on function app.set_limit(text, text, text, uuid, text, integer, integer, interval, integer) to leaseq_operator;

-- An operator removes its limit (the code's, if any, is in force again); held jobs it no
-- longer governs are admitted. True when a row was removed.
create or replace function app.remove_limit(
  p_scope text,
  p_kind text default null,
  p_tenant_id uuid default null,
  p_limit_key text default null
)
returns boolean
language plpgsql
security definer
set search_path = pg_catalog, pg_temp
as $$
declare
  v_found boolean;
begin
  delete from app.limits l
  where l.scope = p_scope and l.source = 'operator'
    and l.kind is not distinct from p_kind
    and l.tenant_id is not distinct from p_tenant_id
    and l.limit_key is not distinct from p_limit_key;
  v_found := found;
  perform app.admit_held_jobs(10000);
  return v_found;
end;
$$;
revoke all on function app.remove_limit(text, text, uuid, text) from public;
grant execute on function app.remove_limit(text, text, uuid, text) to leaseq_operator;

-- The limits declared with the handlers become exactly these (source code): kinds'
-- limits, each for the kind as a whole (p_per_tenant false) or for the kind within each
-- tenant. Operators' rows are left alone. Returns each limit's name and what happened.
create or replace function app.sync_limits(
  p_kinds text[],
  p_per_tenant boolean[],
  p_concurrency integer[],
  p_rate_counts integer[],
  p_rate_periods interval[],
  p_bursts integer[]
)
returns table (name text, status text)
language plpgsql
security definer
set search_path = pg_catalog, pg_temp
as $$
#variable_conflict use_column
declare
  v_count integer := coalesce(cardinality(p_kinds), 0);
  v_item record;
begin
  perform app.check_range('number of limits', v_count, 0, 1000);
  if coalesce(cardinality(p_per_tenant), 0) <> v_count
     or coalesce(cardinality(p_concurrency), 0) <> v_count
     or coalesce(cardinality(p_rate_counts), 0) <> v_count
     or coalesce(cardinality(p_rate_periods), 0) <> v_count
     or coalesce(cardinality(p_bursts), 0) <> v_count then
    perform app.raise_invalid('limit arrays must all have the same length');
  end if;
  for v_item in
    select * from unnest(p_kinds, p_per_tenant, p_concurrency, p_rate_counts, p_rate_periods,
                         p_bursts) as u(kind, per_tenant, concurrency, rate_count, rate_period, burst)
  loop
    perform app.check_limit(case when v_item.per_tenant then 'kind_tenant' else 'kind' end,
                            v_item.kind, null, null, v_item.concurrency, v_item.rate_count,
                            v_item.rate_period, v_item.burst);
  end loop;

  return query
  with wanted as (
    select case when u.per_tenant then 'kind_tenant' else 'kind' end as scope, u.*
    from unnest(p_kinds, p_per_tenant, p_concurrency, p_rate_counts, p_rate_periods, p_bursts)
      as u(kind, per_tenant, concurrency, rate_count, rate_period, burst)
  ), removed as (
    delete from app.limits l
    where l.source = 'code'
      and not exists (select 1 from wanted w where w.scope = l.scope and w.kind = l.kind)
    returning app.limit_name(l.scope, l.kind, l.tenant_id, l.limit_key) as name
  ), put as (
    insert into app.limits as l (scope, kind, source, concurrency, rate_count, rate_period,
                                 burst, updated_at, updated_by)
    select w.scope, w.kind, 'code', w.concurrency, w.rate_count, w.rate_period, w.burst,
           clock_timestamp(), 'code'
    from wanted w
    on conflict (scope, coalesce(kind, ''),
                 coalesce(tenant_id, '00000000-0000-0000-0000-000000000000'::uuid),
                 coalesce(limit_key, ''), source)
    do update set concurrency = excluded.concurrency, rate_count = excluded.rate_count,
                  rate_period = excluded.rate_period, burst = excluded.burst,
                  updated_at = excluded.updated_at
    returning app.limit_name(l.scope, l.kind, l.tenant_id, l.limit_key) as name
  )
  select p.name, 'put'::text from put p
  union all
  select r.name, 'removed'::text from removed r
  order by 1;
  perform app.admit_held_jobs(10000);
end;
$$;
revoke all on function app.sync_limits(text[], boolean[], integer[], integer[], interval[], integer[]) from public;
grant execute on function app.sync_limits(text[], boolean[], integer[], integer[], interval[], integer[]) to leaseq_operator;

-- The limits declared, each with whether it is in force (an operator's row shadows the
-- code's of the same subject).
create or replace function app.list_limits()
returns table (name text, scope text, kind text, tenant_id uuid, limit_key text,
               source text, concurrency integer, rate_count integer, rate_period interval,
               burst integer, in_force boolean, updated_at timestamptz, updated_by text)
language sql
stable
security definer
set search_path = pg_catalog, pg_temp
as $$
  select app.limit_name(l.scope, l.kind, l.tenant_id, l.limit_key), l.scope, l.kind,
         l.tenant_id, l.limit_key, l.source, l.concurrency, l.rate_count, l.rate_period,
         coalesce(l.burst, l.rate_count),
         l.source = 'operator' or not exists (
           select 1 from app.limits o
           where o.source = 'operator' and o.scope = l.scope
             and o.kind is not distinct from l.kind
             and o.tenant_id is not distinct from l.tenant_id
             and o.limit_key is not distinct from l.limit_key),
         l.updated_at, l.updated_by
  from app.limits l
  order by 1, l.source desc
$$;
revoke all on function app.list_limits() from public;
grant execute on function app.list_limits() to leaseq_operator, leaseq_dashboard;

-- Each limit instance (bucket) in use, with the name of the limit it is an instance of:
-- its admitted and running jobs, the jobs it holds back and the oldest one's wait. For leaseq status, the dashboard and the reaper's
-- metrics; reads the slots and held jobs of the buckets in use (an operator's read:
-- counting 100,000 held jobs reads their index entries).
create or replace function app.limit_status()
returns table (bucket text, name text, admitted bigint, running bigint, blocked bigint,
               oldest_blocked_at timestamptz)
language sql
stable
security definer
set search_path = pg_catalog, pg_temp
as $$
  with buckets as (
    select distinct s.bucket from app.limit_slots s
    union
    select b.bucket from app.limit_turns b
  )
  select b.bucket,
         -- The limit it is an instance of: the bucket itself when a limit names it, else
         -- the limit for every tenant (kind:K/tenant:*, tenant:*).
         case when exists (select 1 from app.limits l
                           where app.limit_name(l.scope, l.kind, l.tenant_id, l.limit_key) = b.bucket)
              then b.bucket
              else regexp_replace(b.bucket, 'tenant:[0-9a-f-]{36}$', 'tenant:*') end,
         (select count(distinct s.job_id) from app.limit_slots s where s.bucket = b.bucket),
         (select count(distinct s.job_id)
          from app.limit_slots s join app.jobs j on j.id = s.job_id and j.tenant_id = s.tenant_id
          where s.bucket = b.bucket and j.state = 'running'),
         (select count(*) from app.held_jobs h where h.bucket = b.bucket),
         (select min(h.held_at) from app.held_jobs h where h.bucket = b.bucket)
  from buckets b
  order by 1
$$;
revoke all on function app.limit_status() from public;
grant execute on function app.limit_status() to leaseq_operator, leaseq_dashboard, leaseq_reaper;
