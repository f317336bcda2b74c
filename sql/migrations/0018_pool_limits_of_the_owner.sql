-- leaseq 0018: the worker pool's limits are the schema owner's, not the caller's.
--
-- Until now every pool function took its limits from its caller: join_worker_pool and
-- reserve_worker_places counted against the p_max_workers they were given, with holds
-- of up to a day, and wake_worker_place took the debounce, the hold and the maximum
-- from any producer. A worker login could reserve 1,000 places for a day, after which a
-- schedule tick found the pool "full" and stopped draining; a tenant-bound producer
-- could reserve a place for a day, after which every wake of every tenant answered NULL.
-- From here on (functions/pool.sql):
--
--   * app.settings holds the limits, in its one row that only the owner writes (the
--     deploy's migrations custom resource writes them from the template's MaxWorkers and
--     WakeDebounceSeconds; locally the command line, as the owner of its embedded
--     server): max_workers (0..1000), start_hold, the longest a reserved place waits for
--     its invocation (1 s..15 min: a hold is minutes, never days), and wake_debounce
--     (0 s..1 h). The existing row gets today's defaults: 4 (the template's MaxWorkers),
--     90 s and 1 s. A caller's p_max_workers and p_hold can only narrow them.
--   * A schedule tick joins whatever places others hold: it takes the oldest reservation
--     of a pool at (or above) its maximum, and when there is none (every place held by a
--     running invocation) one extra place, marked by worker_pool.extra. The unique index
--     below allows one such place at a time, and only a tick may hold it
--     (worker_pool_extra_check), so the pool never holds more than the maximum + 1 and
--     fan-out (which counts the extra place too) never more than the maximum. The + 1 is
--     the tick's connection that the connection budget already keeps.
--   * A wake reserves no room any more: it hands its caller a ticket (app.worker_wakes,
--     one row per login), and the invocation it starts joins with free room like any
--     other. Each login is debounced on its own and serialised by an advisory lock of
--     its own, taken without waiting, so one producer's wakes (or a transaction it keeps
--     open) never hold back another's, and a producer never takes the pool's lock.
--     worker_pool_state.last_wake_at, the old shared debounce, goes.
--
-- Between this migration and the function files of the same deploy the previous
-- wake_worker_place(interval, interval, integer) no longer exists: an enqueue function
-- of the previous release logs its wake as failed (42883) and the schedule drains.

alter table app.settings
  add column max_workers integer not null default 4
    constraint settings_max_workers_range check (max_workers between 0 and 1000),
  add column start_hold interval not null default interval '90 seconds'
    constraint settings_start_hold_range
    check (start_hold between interval '1 second' and interval '15 minutes'),
  add column wake_debounce interval not null default interval '1 second'
    constraint settings_wake_debounce_range
    check (wake_debounce between interval '0 seconds' and interval '1 hour');

alter table app.worker_pool
  add column extra boolean not null default false,
  add constraint worker_pool_extra_check
    check (not extra or (owner is not null and reason in ('schedule', 'manual')));

-- At most one extra place: the index holds only the extra one, and its key is constant.
create unique index worker_pool_one_extra_idx on app.worker_pool (extra) where extra;

-- The wakes of each login: when it last woke a worker (its debounce) and the ticket of
-- the start it asked for, until the woken invocation joins or the hold ends.
create table app.worker_wakes (
  waker regrole primary key,
  woken_at timestamptz not null,
  ticket uuid,
  ticket_expires_at timestamptz,
  constraint worker_wakes_ticket_key unique (ticket),
  constraint worker_wakes_ticket_check check ((ticket is null) = (ticket_expires_at is null))
);
revoke all on app.worker_wakes from public;
alter table app.worker_wakes enable row level security;

alter table app.worker_pool_state drop column last_wake_at;

drop function if exists app.wake_worker_place(interval, interval, integer);
