-- leaseq functions: the worker pool (tables in migrations/0014_worker_pool.sql).
--
-- A place is one worker invocation's right to drain: reserved (owner NULL, expiring
-- after a short hold: an invocation was asked for and has not started) or held by a
-- live invocation (owner = its owner id, expiring with the invocation). The pool never
-- holds more than p_max_workers places, whoever asks: racing scale-ups, duplicate
-- schedule ticks and Lambda's retried or duplicated asynchronous events all go through
-- these functions. Why it holds:
--
--   * places are added only under the row lock of app.worker_pool_state, in a
--     statement that starts after the lock was taken, so it counts every place the
--     previous holder committed (READ COMMITTED takes a snapshot per statement);
--   * every function that adds a place also updates the state row, so a caller in a
--     REPEATABLE READ or SERIALIZABLE transaction whose snapshot misses a committed
--     change fails to lock the row (40001) rather than count a stale pool;
--   * expired places are deleted, under the same lock, before counting: an invocation
--     killed at its deadline, or an event that never arrived, frees its room when its
--     place expires, without telling anyone.
--
-- The lock is held until the caller's transaction ends: call these in a transaction of
-- their own (the library's connections are in autocommit mode). Removing a place
-- (leave, release) needs no lock: a count that misses a removal only refuses room that
-- was free, it never grants room that was not.

-- An invocation's start: take a place in the pool, or learn that it must not drain.
--
--   * With p_reservation naming an unexpired reserved place (the place reserved for
--     this very invocation by reserve_worker_places or wake_worker_place): take it.
--   * An owner already in the pool (the same execution environment again, after an
--     invocation that ended without leaving) refreshes its place's expiry; a
--     reservation it names is consumed too, since its event has arrived.
--   * Otherwise a new place while the pool has room (fewer than p_max_workers places).
--   * Otherwise, for a schedule tick or a manual run only, the oldest reserved place:
--     reservations whose starts were lost never keep the schedule from draining.
--   * Otherwise false: the invocation returns at once without claiming. That is how a
--     duplicate or retried asynchronous event, and a schedule tick while invocations
--     hold every place, are kept from exceeding the maximum. A reservation is consumed once: a
--     second delivery of the same event finds it owned and gets only free room.
--
-- p_expires_in is how long the place lives without another join: the invocation's
-- time left plus a margin. p_reason records why the invocation started (schedule,
-- manual, fanout, wake).
create or replace function app.join_worker_pool(
  p_owner text,
  p_reason text,
  p_reservation uuid,
  p_max_workers integer,
  p_expires_in interval
)
returns boolean
language plpgsql
security definer
set search_path = pg_catalog, pg_temp
as $$
declare
  v_now timestamptz := clock_timestamp();
  v_expires_at timestamptz;
  v_places integer;
  v_joined boolean;
begin
  perform app.check_owner(p_owner);
  if p_reason is null or p_reason not in ('schedule', 'manual', 'fanout', 'wake') then
    perform app.raise_invalid(format(
      'p_reason must be one of schedule, manual, fanout, wake (got %s)',
      coalesce(quote_literal(p_reason), 'NULL')));
  end if;
  perform app.check_range('p_max_workers', p_max_workers, 1, 1000);
  perform app.check_interval('p_expires_in', p_expires_in, interval '1 second', interval '1 day');
  v_expires_at := v_now + p_expires_in;

  perform 1 from app.worker_pool_state s for update;
  delete from app.worker_pool p where p.expires_at <= v_now;

  -- The same execution environment again: refresh its place; the reservation it names
  -- has arrived, so it is consumed.
  update app.worker_pool p set expires_at = v_expires_at where p.owner = p_owner;
  v_joined := found;
  if p_reservation is not null then
    if v_joined then
      delete from app.worker_pool p where p.id = p_reservation and p.owner is null;
    else
      update app.worker_pool p
      set owner = p_owner, reason = p_reason, expires_at = v_expires_at
      where p.id = p_reservation and p.owner is null;
      v_joined := found;
    end if;
  end if;

  if not v_joined then
    select count(*) into v_places from app.worker_pool p;
    if v_places < p_max_workers then
      insert into app.worker_pool (owner, reason, created_at, expires_at)
      values (p_owner, p_reason, v_now, v_expires_at);
      v_joined := true;
    elsif v_places = p_max_workers and p_reason in ('schedule', 'manual') then
      -- A tick in a pool that reservations fill (starts asked for and not arrived, or
      -- lost): it takes the oldest one, so the schedule drains whatever happened to the
      -- starts. The count is unchanged; the start that arrives late finds no room.
      update app.worker_pool p
      set owner = p_owner, reason = p_reason, expires_at = v_expires_at
      where p.id = (select r.id from app.worker_pool r where r.owner is null
                    order by r.created_at, r.id limit 1);
      v_joined := found;
    end if;
  end if;

  if v_joined then
    update app.worker_pool_state s set changed_at = v_now;
  end if;
  return v_joined;
end;
$$;
revoke all on function app.join_worker_pool(text, text, uuid, integer, interval) from public;
grant execute on function app.join_worker_pool(text, text, uuid, integer, interval) to leaseq_worker;

-- An invocation's end (also after a failure): its place is free at once, rather than
-- when it would have expired.
create or replace function app.leave_worker_pool(p_owner text)
returns void
language plpgsql
security definer
set search_path = pg_catalog, pg_temp
as $$
begin
  perform app.check_owner(p_owner);
  delete from app.worker_pool p where p.owner = p_owner;
end;
$$;
revoke all on function app.leave_worker_pool(text) from public;
grant execute on function app.leave_worker_pool(text) to leaseq_worker;

-- Fan-out: up to min(p_wanted, p_max_workers - places) reserved places, each to be
-- named by the event of one new invocation (join_worker_pool's p_reservation). A
-- reservation holds its room for p_hold: longer than the event may wait for its
-- invocation, so that the event finds its place; one whose invocation never starts
-- frees its room then. p_wanted 0 reserves nothing.
create or replace function app.reserve_worker_places(
  p_wanted integer,
  p_max_workers integer,
  p_hold interval
)
returns setof uuid
language plpgsql
security definer
set search_path = pg_catalog, pg_temp
as $$
declare
  v_now timestamptz := clock_timestamp();
  v_places integer;
  v_room integer;
begin
  perform app.check_range('p_wanted', p_wanted, 0, 1000);
  perform app.check_range('p_max_workers', p_max_workers, 1, 1000);
  perform app.check_interval('p_hold', p_hold, interval '1 second', interval '1 day');
  if p_wanted = 0 then
    return;
  end if;

  perform 1 from app.worker_pool_state s for update;
  delete from app.worker_pool p where p.expires_at <= v_now;
  select count(*) into v_places from app.worker_pool p;
  v_room := least(p_wanted, p_max_workers - v_places);
  if v_room <= 0 then
    return;
  end if;
  update app.worker_pool_state s set changed_at = v_now;
  return query
  insert into app.worker_pool (owner, reason, created_at, expires_at)
  select null, 'fanout', v_now, v_now + p_hold
  from generate_series(1, v_room)
  returning id;
end;
$$;
revoke all on function app.reserve_worker_places(integer, integer, interval) from public;
grant execute on function app.reserve_worker_places(integer, integer, interval) to leaseq_worker;

-- The invocation a reservation was made for could not be started (the Invoke call
-- failed): free its room now. A place an invocation has already taken is left alone.
-- Producers may call it too, for the place their own wake reserved: it deletes only an
-- unowned reservation named by its random id, which only its reserver was told.
create or replace function app.release_worker_place(p_place uuid)
returns void
language plpgsql
security definer
set search_path = pg_catalog, pg_temp
as $$
begin
  perform app.check_required('p_place', p_place);
  delete from app.worker_pool p where p.id = p_place and p.owner is null;
end;
$$;
revoke all on function app.release_worker_place(uuid) from public;
grant execute on function app.release_worker_place(uuid)
  to leaseq_worker, leaseq_producer, leaseq_tenant_producer;

-- Wake on enqueue: when no unexpired place exists (nobody is polling and nobody is
-- starting) and the last wake is older than p_debounce, record the wake and reserve one
-- place, returning it (the caller starts one invocation naming it); else NULL.
--
-- Called after every enqueue that made a job ready, so its common answer must be cheap
-- and must not queue: an unexpired place (one index probe), or a recent wake (one row),
-- answers NULL without a lock, and so does a state row that another call holds locked
-- (SKIP LOCKED: that call is changing the pool, so a worker is on its way or running).
-- Only then, under the lock, are both conditions checked again. So 1,000 enqueues in a
-- second start at most one invocation, and none of them waits for another. (The pool
-- is empty when a wake reserves, so p_max_workers, at least 1, always has room for it.)
create or replace function app.wake_worker_place(
  p_debounce interval,
  p_hold interval,
  p_max_workers integer
)
returns uuid
language plpgsql
security definer
set search_path = pg_catalog, pg_temp
as $$
declare
  v_now timestamptz := clock_timestamp();
  v_last_wake timestamptz;
  v_place uuid;
begin
  perform app.check_interval('p_debounce', p_debounce, interval '0 seconds', interval '1 hour');
  perform app.check_interval('p_hold', p_hold, interval '1 second', interval '1 day');
  perform app.check_range('p_max_workers', p_max_workers, 1, 1000);

  if exists (select 1 from app.worker_pool p where p.expires_at > v_now) then
    return null;
  end if;
  select s.last_wake_at into v_last_wake from app.worker_pool_state s;
  if v_last_wake > v_now - p_debounce then
    return null;
  end if;

  select s.last_wake_at into v_last_wake
  from app.worker_pool_state s for update skip locked;
  if not found then
    return null;
  end if;
  v_now := clock_timestamp();
  delete from app.worker_pool p where p.expires_at <= v_now;
  if v_last_wake > v_now - p_debounce
     or exists (select 1 from app.worker_pool p) then
    return null;
  end if;
  update app.worker_pool_state s set last_wake_at = v_now, changed_at = v_now;
  insert into app.worker_pool (owner, reason, created_at, expires_at)
  values (null, 'wake', v_now, v_now + p_hold)
  returning id into v_place;
  return v_place;
end;
$$;
revoke all on function app.wake_worker_place(interval, interval, integer) from public;
grant execute on function app.wake_worker_place(interval, interval, integer)
  to leaseq_producer, leaseq_tenant_producer, leaseq_worker;

-- How full the pool is: unexpired places held by invocations (live) and reserved for
-- invocations not started yet (reserved). The worker's pool-size metric, and an
-- operator's look. Reads only; expired places are left out, not deleted.
create or replace function app.worker_pool_size()
returns table (live integer, reserved integer)
language plpgsql
stable
security definer
set search_path = pg_catalog, pg_temp
as $$
declare
  v_now timestamptz := clock_timestamp();
begin
  return query
  select (count(*) filter (where p.owner is not null))::integer,
         (count(*) filter (where p.owner is null))::integer
  from app.worker_pool p
  where p.expires_at > v_now;
end;
$$;
revoke all on function app.worker_pool_size() from public;
grant execute on function app.worker_pool_size() to leaseq_worker, leaseq_operator;
