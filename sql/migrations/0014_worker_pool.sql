-- leaseq 0014: the worker pool, a database-side count of the worker invocations that are
-- running or starting, so that fan-out and wake-on-enqueue never exceed a maximum.
--
-- A worker that finds more work than it can drain starts more worker invocations
-- (Lambda's asynchronous Invoke), and an enqueue on an idle queue starts one. Neither
-- knows how many are running: duplicate schedule ticks, Lambda's own retries of an
-- asynchronous event and two workers scaling up at the same moment would each start
-- more. app.worker_pool is the one count they all go through (functions/pool.sql):
--
--   * a *place* is one invocation's right to drain. It is either reserved (owner NULL:
--     a worker or an enqueue asked for an invocation that has not started yet; it
--     expires after a short hold, so an event that never arrives frees its room) or
--     held (owner = the worker's owner id; it expires with the invocation: its time
--     left plus a margin, so an invocation killed at its deadline frees its room
--     without saying so);
--   * every function deletes the expired places before it counts, so nothing has to
--     sweep them;
--   * a place is added only while fewer places than the maximum exist, under the row
--     lock of app.worker_pool_state, so racing joins and reservations cannot overshoot.
--
-- app.worker_pool_state is one row: its lock serialises every change of the pool, and
-- it holds the time of the last wake for the debounce (1,000 enqueues in a second start
-- one invocation) and of the last change. Every change updates the row, so a caller in a
-- REPEATABLE READ transaction whose snapshot misses a committed change gets a
-- serialization failure (40001) when it locks the row, instead of counting stale places.
--
-- The table stays small: at most the maximum (1..1000) live rows, plus the dead rows of
-- one insert and one delete per invocation, which autovacuum reclaims. The index on
-- expires_at serves both the delete of expired places and the wake's probe for an
-- unexpired one.

create table app.worker_pool (
  id uuid primary key default gen_random_uuid(),
  owner text,
  reason text not null,
  created_at timestamptz not null default clock_timestamp(),
  expires_at timestamptz not null,
  constraint worker_pool_owner_key unique (owner),
  constraint worker_pool_reason_check
    check (reason in ('schedule', 'manual', 'fanout', 'wake')),
  constraint worker_pool_owner_check
    check (owner is null or length(owner) between 1 and 200)
);

create index worker_pool_expires_idx on app.worker_pool (expires_at);

create table app.worker_pool_state (
  only_row boolean primary key default true check (only_row),
  last_wake_at timestamptz,
  changed_at timestamptz
);
insert into app.worker_pool_state (only_row) values (true);

-- Only the owner (the SECURITY DEFINER functions) reads or writes them: a runtime role
-- that could insert a place, or delete one, could start invocations past the maximum.
revoke all on app.worker_pool, app.worker_pool_state from public;
alter table app.worker_pool enable row level security;
alter table app.worker_pool_state enable row level security;
