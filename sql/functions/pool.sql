-- leaseq functions: the worker pool (tables in migrations/0014_worker_pool.sql and
-- migrations/0018_pool_limits_of_the_owner.sql).
--
-- A place is one worker invocation's right to drain: reserved (owner NULL, expiring
-- after a short hold: a busy worker asked for an invocation that has not started) or
-- held by a live invocation (owner = its owner id, expiring with the invocation).
--
-- The limits are the schema owner's: app.settings.max_workers, .start_hold and
-- .wake_debounce, which only the owner writes (app.set_worker_pool_limits). A caller's
-- p_max_workers and p_hold can narrow them, never widen them, so a worker login that
-- asks for 1,000 places held for a day gets at most the owner's maximum, held for at
-- most the owner's hold. The pool never holds more than the maximum, plus the one extra
-- place a schedule tick may take when running invocations hold every place
-- (worker_pool.extra; a unique index allows one). Why the count holds, whoever asks:
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
-- their own (the library's connections are in autocommit mode). Only worker logins take
-- it: a wake (which producers call) reserves no room and takes no lock of the pool's.
-- Removing a place (leave, release) needs no lock: a count that misses a removal only
-- refuses room that was free, it never grants room that was not.
--
-- Each named queue has a pool of its own (migration 0026_named_queues): a place belongs to
-- one queue (worker_pool.queue), and joins, fan-outs and wakes count, reserve and wake only
-- the places of their p_queue ('default' when not given), under its limit: the queue's own
-- max_workers (app.queues, the owner's) or else the owner's max_workers, narrowed by the
-- caller's p_max_workers. One queue's backlog never starts, nor holds room of, another
-- queue's workers. A paused queue's pool takes no join (the worker returns without
-- claiming), reserves nothing and wakes nothing; its places already held live out their
-- invocations. The one lock of app.worker_pool_state still serialises every change of
-- every pool: changes are one per invocation start or fan-out, never per job.

-- The owner's limits (app.settings), for the pool functions; 55000 when the row is gone.
create or replace function app.pool_limits(
  out max_workers integer,
  out start_hold interval,
  out wake_debounce interval
)
language plpgsql
stable
set search_path = pg_catalog, pg_temp
as $$
begin
  select s.max_workers, s.start_hold, s.wake_debounce
  into max_workers, start_hold, wake_debounce
  from app.settings s;
  if not found then
    raise exception using
      errcode = '55000',
      message = 'app.settings has no row, so the worker pool''s limits are unknown',
      hint = 'Restore it as the schema owner: insert into app.settings default values.';
  end if;
end;
$$;
revoke all on function app.pool_limits() from public;

-- One queue's most places: its own max_workers (app.queues), else the owner's. Internal.
create or replace function app.queue_max_workers(p_queue text)
returns integer
language sql
stable
set search_path = pg_catalog, pg_temp
as $$
  select coalesce((select q.max_workers from app.queues q where q.name = p_queue),
                  (select l.max_workers from app.pool_limits() l));
$$;
revoke all on function app.queue_max_workers(text) from public;

-- The owner sets the pool's limits: the deploy (from the template's MaxWorkers and
-- WakeDebounceSeconds), the command line on its embedded server, or an operator with the
-- owner's login. A NULL argument keeps that limit; the answer is the limits now in
-- force. Runs with the caller's rights and is granted to nobody, so only the owner (who
-- alone may update app.settings) can change them.
create or replace function app.set_worker_pool_limits(
  p_max_workers integer default null,
  p_start_hold interval default null,
  p_wake_debounce interval default null
)
returns table (max_workers integer, start_hold interval, wake_debounce interval)
language plpgsql
set search_path = pg_catalog, pg_temp
as $$
begin
  if p_max_workers is not null then
    perform app.check_range('p_max_workers', p_max_workers, 0, 1000);
  end if;
  if p_start_hold is not null then
    perform app.check_interval('p_start_hold', p_start_hold, interval '1 second',
                               interval '15 minutes');
  end if;
  if p_wake_debounce is not null then
    perform app.check_interval('p_wake_debounce', p_wake_debounce, interval '0 seconds',
                               interval '1 hour');
  end if;
  return query
  update app.settings s
  set max_workers = coalesce(p_max_workers, s.max_workers),
      start_hold = coalesce(p_start_hold, s.start_hold),
      wake_debounce = coalesce(p_wake_debounce, s.wake_debounce),
      updated_at = clock_timestamp()
  returning s.max_workers, s.start_hold, s.wake_debounce;
  if not found then
    raise exception using
      errcode = '55000',
      message = 'app.settings has no row, so the worker pool''s limits cannot be set',
      hint = 'Restore it as the schema owner: insert into app.settings default values.';
  end if;
end;
$$;
revoke all on function app.set_worker_pool_limits(integer, interval, interval) from public;

-- An invocation's start: take a place in the pool, or learn that it must not drain.
-- The maximum is the owner's max_workers, or p_max_workers where that is lower.
--
--   * With p_reservation naming an unexpired reserved place (the place reserved for
--     this very invocation by reserve_worker_places): take it.
--   * With p_reservation naming a wake's ticket (wake_worker_place): the ticket is
--     consumed (its waker may wake again after its debounce) and the invocation joins
--     as below; a ticket holds no room.
--   * An owner already in the pool (the same execution environment again, after an
--     invocation that ended without leaving) refreshes its place's expiry; a
--     reservation it names is consumed too, since its event has arrived.
--   * Otherwise a new place while the pool has room (fewer places than the maximum).
--   * Otherwise, for a schedule tick or a manual run only, whatever the others hold:
--     the oldest reserved place (reservations whose starts were lost, or that a worker
--     login made to fill the pool, never keep the schedule from draining); and when
--     every place is held by a running invocation, the extra place, one for the whole
--     pool. Fan-out counts the extra place as any other, so it never starts beyond the
--     maximum; the pool holds at most the maximum + 1, the tick's connection that the
--     connection budget keeps.
--   * Otherwise false: the invocation returns at once without claiming. That is how a
--     duplicate or retried asynchronous event, and a second tick while a tick holds the
--     extra place, are kept from exceeding the maximum. A reservation is consumed once:
--     a second delivery of the same event finds it owned and gets only free room.
--
-- p_expires_in is how long the place lives without another join: the invocation's
-- time left plus a margin, at most 16 minutes (Lambda's longest invocation, 15, and a
-- margin), so no place outlives an invocation by much. p_reason records why the
-- invocation started (schedule, manual, fanout, wake).
create or replace function app.join_worker_pool(
  p_owner text,
  p_reason text,
  p_reservation uuid,
  p_max_workers integer,
  p_expires_in interval,
  p_queue text default 'default'
)
returns boolean
language plpgsql
security definer
set search_path = pg_catalog, pg_temp
as $$
declare
  v_now timestamptz := clock_timestamp();
  v_expires_at timestamptz;
  v_max integer;
  v_places integer;
  v_joined boolean;
  v_taken boolean;
begin
  perform app.check_owner(p_owner);
  if p_reason is null or p_reason not in ('schedule', 'manual', 'fanout', 'wake') then
    perform app.raise_invalid(format(
      'p_reason must be one of schedule, manual, fanout, wake (got %s)',
      coalesce(quote_literal(p_reason), 'NULL')));
  end if;
  perform app.check_range('p_max_workers', p_max_workers, 1, 1000);
  perform app.check_interval('p_expires_in', p_expires_in, interval '1 second',
                             interval '16 minutes');
  perform app.ensure_queue(p_queue);
  if p_queue = any (app.paused_queues()) then
    return false;
  end if;
  v_max := least(p_max_workers, app.queue_max_workers(p_queue));
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
      v_taken := found;
    else
      update app.worker_pool p
      set owner = p_owner, reason = p_reason, expires_at = v_expires_at
      where p.id = p_reservation and p.owner is null and p.queue = p_queue;
      v_taken := found;
      v_joined := v_taken;
    end if;
    if not v_taken then
      -- A wake's ticket, unless its waker's row is locked (a wake of that login under
      -- way): never wait for a login's transaction. A ticket left expires by itself.
      perform 1 from app.worker_wakes w where w.ticket = p_reservation
      for update skip locked;
      if found then
        update app.worker_wakes w set ticket = null, ticket_expires_at = null
        where w.ticket = p_reservation;
      end if;
    end if;
  end if;

  if not v_joined then
    select count(*) into v_places from app.worker_pool p where p.queue = p_queue;
    if v_places < v_max then
      insert into app.worker_pool (owner, reason, created_at, expires_at, queue)
      values (p_owner, p_reason, v_now, v_expires_at, p_queue);
      v_joined := true;
    elsif p_reason in ('schedule', 'manual') then
      -- A tick in a pool at (or above) its maximum: it takes the oldest reservation, so
      -- the schedule drains whatever happened to the starts (the count is unchanged;
      -- the start that arrives late finds no room) ...
      update app.worker_pool p
      set owner = p_owner, reason = p_reason, expires_at = v_expires_at
      where p.id = (select r.id from app.worker_pool r
                    where r.owner is null and r.queue = p_queue
                    order by r.created_at, r.id limit 1);
      v_joined := found;
      -- ... or, with every place held by a running invocation, the extra place.
      if not v_joined and not exists (select 1 from app.worker_pool p
                                      where p.extra and p.queue = p_queue) then
        insert into app.worker_pool (owner, reason, created_at, expires_at, extra, queue)
        values (p_owner, p_reason, v_now, v_expires_at, true, p_queue);
        v_joined := true;
      end if;
    end if;
  end if;

  if v_joined then
    update app.worker_pool_state s set changed_at = v_now;
  end if;
  return v_joined;
end;
$$;
revoke all on function app.join_worker_pool(text, text, uuid, integer, interval, text) from public;
grant execute on function app.join_worker_pool(text, text, uuid, integer, interval, text) to leaseq_worker;

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

-- Fan-out: up to min(p_wanted, maximum - places) reserved places, each to be named by
-- the event of one new invocation (join_worker_pool's p_reservation); the maximum is
-- the owner's max_workers, or p_max_workers where that is lower. A reservation holds
-- its room for the owner's start_hold (or p_hold where that is shorter): longer than
-- the event may wait for its invocation, so that the event finds its place; one whose
-- invocation never starts frees its room then. p_wanted 0 reserves nothing.
create or replace function app.reserve_worker_places(
  p_wanted integer,
  p_max_workers integer,
  p_hold interval,
  p_queue text default 'default'
)
returns setof uuid
language plpgsql
security definer
set search_path = pg_catalog, pg_temp
as $$
declare
  v_now timestamptz := clock_timestamp();
  v_max integer;
  v_hold interval;
  v_places integer;
  v_room integer;
begin
  perform app.check_range('p_wanted', p_wanted, 0, 1000);
  perform app.check_range('p_max_workers', p_max_workers, 1, 1000);
  perform app.check_interval('p_hold', p_hold, interval '1 second', interval '1 day');
  perform app.check_queue('p_queue', p_queue);
  if p_wanted = 0 or p_queue = any (app.paused_queues()) then
    return;
  end if;
  select least(p_max_workers, app.queue_max_workers(p_queue)), least(p_hold, l.start_hold)
  into v_max, v_hold
  from app.pool_limits() l;

  perform 1 from app.worker_pool_state s for update;
  delete from app.worker_pool p where p.expires_at <= v_now;
  select count(*) into v_places from app.worker_pool p where p.queue = p_queue;
  v_room := least(p_wanted, v_max - v_places);
  if v_room <= 0 then
    return;
  end if;
  update app.worker_pool_state s set changed_at = v_now;
  return query
  insert into app.worker_pool (owner, reason, created_at, expires_at, queue)
  select null, 'fanout', v_now, v_now + v_hold, p_queue
  from generate_series(1, v_room)
  returning id;
end;
$$;
revoke all on function app.reserve_worker_places(integer, integer, interval, text) from public;
grant execute on function app.reserve_worker_places(integer, integer, interval, text) to leaseq_worker;

-- The invocation a reservation or a wake's ticket was made for could not be started
-- (the Invoke call failed): free its room now, or consume the ticket (its waker's
-- debounce still runs). A place an invocation has already taken is left alone.
-- Producers may call it too, for the ticket of their own wake: it acts only on an
-- unowned reservation or a ticket named by its random id, which only its reserver was
-- told, and it never waits for another login's wake.
create or replace function app.release_worker_place(p_place uuid)
returns void
language plpgsql
security definer
set search_path = pg_catalog, pg_temp
as $$
begin
  perform app.check_required('p_place', p_place);
  delete from app.worker_pool p where p.id = p_place and p.owner is null;
  if not found then
    perform 1 from app.worker_wakes w where w.ticket = p_place for update skip locked;
    if found then
      update app.worker_wakes w set ticket = null, ticket_expires_at = null
      where w.ticket = p_place;
    end if;
  end if;
end;
$$;
revoke all on function app.release_worker_place(uuid) from public;
grant execute on function app.release_worker_place(uuid)
  to leaseq_worker, leaseq_producer, leaseq_tenant_producer;

-- Wake on enqueue: when no unexpired place exists (nobody is polling and no fan-out is
-- starting), the calling login's last wake is older than the owner's wake_debounce and
-- its last ticket has been used or has expired, record the wake and return a new ticket
-- (the caller starts one invocation naming it, which joins with free room); else NULL.
-- The caller chooses nothing: the debounce, the ticket's life (the owner's start_hold)
-- and whether to wake at all (max_workers 0: never) are the owner's.
--
-- Each login has its own debounce and ticket (app.worker_wakes, by session_user, which
-- SET ROLE does not change), so what one producer's wakes do, or a transaction it keeps
-- open, never holds back another login's wake: a tenant's producer cannot turn the wake
-- off for the other tenants. A ticket holds no room in the pool, so no wake can fill
-- it, and no wake takes the pool's lock.
--
-- Called after every enqueue that made a job ready, so its common answer must be cheap
-- and must not queue: an unexpired place (one index probe), or a recent wake of the
-- login (one row), answers NULL without a lock, and so does an advisory lock of the
-- login that another call holds (taken without waiting: that call is waking a worker).
-- Only then, under the lock, are the login's conditions checked again. So 1,000
-- enqueues of one login in a second start at most one invocation, and none of them
-- waits for another.
create or replace function app.wake_worker_place(p_queue text default 'default')
returns uuid
language plpgsql
security definer
set search_path = pg_catalog, pg_temp
as $$
declare
  v_now timestamptz := clock_timestamp();
  v_max integer;
  v_hold interval;
  v_debounce interval;
  v_login oid;
  v_woken_at timestamptz;
  v_ticket_expires_at timestamptz;
  v_ticket uuid;
begin
  if p_queue is null or p_queue !~ '^[a-z][a-z0-9_-]{0,39}$' then
    perform app.check_queue('p_queue', p_queue);
  end if;
  select app.queue_max_workers(p_queue), l.start_hold, l.wake_debounce
  into v_max, v_hold, v_debounce
  from app.pool_limits() l;
  if v_max < 1 then
    return null;
  end if;
  if exists (select 1 from app.worker_pool p
             where p.queue = p_queue and p.expires_at > v_now) then
    return null;
  end if;
  if exists (select 1 from app.queues q where q.name = p_queue and q.paused_at is not null) then
    return null;
  end if;
  select r.oid into v_login from pg_catalog.pg_roles r where r.rolname = session_user;
  select w.woken_at, w.ticket_expires_at into v_woken_at, v_ticket_expires_at
  from app.worker_wakes w where w.waker = v_login and w.queue = p_queue;
  if v_woken_at > v_now - v_debounce or v_ticket_expires_at > v_now then
    return null;
  end if;

  -- One wake of this login and queue at a time (class 1819374719, a hash of the login's
  -- OID and the queue): another call holds it, so a worker is on its way (or, on a hash
  -- collision with another queue, that queue's; this one's tick then drains it).
  if not pg_try_advisory_xact_lock(1819374719, hashtext(v_login::text || '/' || p_queue)) then
    return null;
  end if;
  -- Again, in statements that start after the lock: the previous holder has committed.
  v_now := clock_timestamp();
  select w.woken_at, w.ticket_expires_at into v_woken_at, v_ticket_expires_at
  from app.worker_wakes w where w.waker = v_login and w.queue = p_queue;
  if v_woken_at > v_now - v_debounce or v_ticket_expires_at > v_now then
    return null;
  end if;
  v_ticket := gen_random_uuid();
  insert into app.worker_wakes as w (waker, woken_at, ticket, ticket_expires_at, queue)
  values (v_login, v_now, v_ticket, v_now + v_hold, p_queue)
  on conflict (waker, queue) do update
  set woken_at = excluded.woken_at, ticket = excluded.ticket,
      ticket_expires_at = excluded.ticket_expires_at;
  return v_ticket;
end;
$$;
revoke all on function app.wake_worker_place(text) from public;
grant execute on function app.wake_worker_place(text)
  to leaseq_producer, leaseq_tenant_producer, leaseq_worker;

-- How full the pool is: unexpired places held by invocations (live) and reserved for
-- invocations not started yet (reserved). The worker's pool-size metric, and an
-- operator's look. Reads only; expired places are left out, not deleted.
create or replace function app.worker_pool_size(p_queue text default null)
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
  where p.expires_at > v_now and p.queue = coalesce(p_queue, p.queue);
end;
$$;
revoke all on function app.worker_pool_size(text) from public;
grant execute on function app.worker_pool_size(text) to leaseq_worker, leaseq_operator;
