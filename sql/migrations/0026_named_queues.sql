-- leaseq 0026: named queues, each drained by its own workers and pool, paused and resumed.
--
-- A job belongs to one queue (app.jobs.queue, 'default' unless the producer or its kind's
-- route names another). A queue's workers claim only its jobs (the claim functions' new
-- p_queue), its worker pool counts only its places (app.worker_pool.queue), and a wake
-- starts only its worker function (app.worker_wakes keyed by login and queue), so a
-- backlog of one queue never starts, nor holds room of, another queue's workers.
--
-- app.queues holds a row per queue that has a state of its own: 'default', every queue an
-- operator paused or an owner routed kinds to or limited, every queue a worker joined.
-- A queue needs no row to take jobs: a producer's queue is one by its name (checked by
-- the name rule below). A paused queue (paused_at set) has its jobs left unclaimed and
-- its pool neither fans out nor wakes; the jobs already running finish. Every pause and
-- resume is an audit row in app.queue_events, with the operator's identity (actor) and
-- the database login that made the change.
--
-- app.queue_kinds routes kinds to queues on the owner's authority: a job enqueued without
-- a queue goes to its kind's route, or to 'default'. The deploy writes the routes of the
-- kinds its template names for a queue (the former slow-kinds worker's SlowKinds), so
-- producers that know nothing of queues keep their jobs on the worker that has the
-- settings for them. Routing a kind also moves its jobs waiting in 'default'.
--
-- Queue names: 1 .. 40 characters, lowercase ASCII letters, digits, '-' and '_',
-- starting with a letter: they name Lambda functions, metric dimensions and log fields.
--
-- jobs.queue is added with a constant default (no table rewrite); its check is added NOT
-- VALID (every existing row has the default, which passes) so the migration does not
-- scan the table under its lock; new and updated rows are checked. The job row stays
-- cold (0023_hot_and_cold_jobs): the queue is carried by the job's claimable entry
-- (app.claimable.queue, written by the triggers' functions in functions/claimable.sql),
-- and the index claimable_queue_idx (queue, tenant_id, claim order) answers a queue's
-- claim, and whether a due tenant has ready work in the queue, with one probe. The
-- update trigger is made again so that a change of a waiting job's queue (a kind's new
-- route) moves its entry. Between this transaction and the function files of the same
-- deploy the previous claim, pool and enqueue functions no longer exist (42883, dropped
-- below so the new signatures do not become overloads of them): deploy while workers and
-- producers can retry, as for any migration.

create table app.queues (
  name text primary key
    constraint queues_name_check check (name ~ '^[a-z][a-z0-9_-]{0,39}$'),
  max_workers integer
    constraint queues_max_workers_range check (max_workers between 0 and 1000),
  paused_at timestamptz,
  paused_by text,
  pause_reason text,
  created_at timestamptz not null default clock_timestamp(),
  updated_at timestamptz not null default clock_timestamp(),
  constraint queues_pause_shape check (
    (paused_at is null) = (paused_by is null)
    and (pause_reason is null or paused_at is not null)
    and (paused_by is null or length(paused_by) between 1 and 200)
    and (pause_reason is null or length(pause_reason) between 1 and 500))
);
insert into app.queues (name) values ('default');
-- The claims' one read of app.queues: the paused queues' names (app.paused_queues).
create index queues_paused_idx on app.queues (name) where paused_at is not null;

create table app.queue_events (
  -- A random id, not a sequence: a sequence's position is readable by every login.
  id uuid primary key default gen_random_uuid(),
  queue text not null references app.queues (name),
  event_type text not null
    constraint queue_events_type_check check (event_type in ('paused', 'resumed')),
  actor text not null
    constraint queue_events_actor_check check (length(actor) between 1 and 200),
  login text not null default session_user,
  reason text,
  created_at timestamptz not null default clock_timestamp()
);
create index queue_events_queue_idx on app.queue_events (queue, created_at);

create table app.queue_kinds (
  kind text primary key
    constraint queue_kinds_kind_check check (length(kind) between 1 and 128),
  queue text not null references app.queues (name),
  updated_at timestamptz not null default clock_timestamp()
);

alter table app.jobs
  add column queue text not null default 'default';
alter table app.jobs
  add constraint jobs_queue_name check (queue ~ '^[a-z][a-z0-9_-]{0,39}$') not valid;

-- A tenant's readers see their jobs' queue, as every other column but the lease token.
grant select (queue) on app.jobs to authenticated;

alter table app.claimable
  add column queue text not null default 'default';
-- Readers read every column of their tenant's entries (0023_hot_and_cold_jobs): this one too.
grant select (queue) on app.claimable to authenticated;
create index claimable_queue_idx
  on app.claimable (queue, tenant_id, claim_key, created_at, job_id) include (available_at);

drop trigger jobs_claimable_on_update on app.jobs;
create trigger jobs_claimable_on_update
after update on app.jobs
for each row
when (new.state <> 'running'
      and (old.state in ('pending', 'retry_wait') or new.state in ('pending', 'retry_wait'))
      and (old.state is distinct from new.state
           or old.claim_key is distinct from new.claim_key
           or old.available_at is distinct from new.available_at
           or old.kind is distinct from new.kind
           or old.created_at is distinct from new.created_at
           or old.priority is distinct from new.priority
           or old.tenant_id is distinct from new.tenant_id
           or old.queue is distinct from new.queue))
execute function app.claimable_moved();

alter table app.worker_pool
  add column queue text not null default 'default'
    constraint worker_pool_queue_name check (queue ~ '^[a-z][a-z0-9_-]{0,39}$');
drop index app.worker_pool_one_extra_idx;
create unique index worker_pool_one_extra_idx on app.worker_pool (queue) where extra;
create index worker_pool_queue_idx on app.worker_pool (queue, expires_at);

alter table app.worker_wakes
  add column queue text not null default 'default'
    constraint worker_wakes_queue_name check (queue ~ '^[a-z][a-z0-9_-]{0,39}$');
alter table app.worker_wakes drop constraint worker_wakes_pkey;
alter table app.worker_wakes add primary key (waker, queue);

comment on table app.queues is
  'Named queues with a state of their own: paused or not, the owner''s worker limit.';
comment on column app.queues.max_workers is
  'The owner''s most worker pool places of this queue; NULL: app.settings.max_workers.';
comment on column app.queues.paused_at is
  'Set while paused: the queue''s jobs are not claimed, its pool neither fans out nor wakes.';
comment on table app.queue_events is
  'Every pause and resume of a queue, with the operator''s identity and the login.';
comment on column app.queue_events.login is
  'The database login (session_user) that made the change.';
comment on table app.queue_kinds is
  'The owner''s routes: a job enqueued without a queue goes to its kind''s queue.';
comment on column app.jobs.queue is
  'The named queue whose workers claim the job; ''default'' unless routed or named.';
comment on column app.claimable.queue is
  'The job''s queue (app.jobs.queue): a queue''s claim walks its own entries.';
comment on column app.worker_pool.queue is
  'The queue whose workers this place counts for: each queue has its own pool.';

revoke all on app.queues, app.queue_events, app.queue_kinds from public;
alter table app.queues enable row level security;
alter table app.queue_events enable row level security;
alter table app.queue_kinds enable row level security;

drop function if exists app.claim_jobs(uuid, text, integer, interval, text[], text[]);
drop function if exists app.claim_ready_jobs(text, integer, interval, text[], text[]);
drop function if exists app.claim_ready_jobs_of_kinds(text, integer, interval, text[], text[]);
drop function if exists app.finish_and_claim_jobs(text, uuid[], uuid[], uuid[], text[], jsonb[],
                                                  interval[], integer, interval, text[],
                                                  text[]);
drop function if exists app.join_worker_pool(text, text, uuid, integer, interval);
drop function if exists app.reserve_worker_places(integer, integer, interval);
drop function if exists app.wake_worker_place();
drop function if exists app.worker_pool_size();
-- The enqueue functions as 0025_job_limits left them (with p_limit_keys): they gain
-- p_queues before it.
drop function if exists app.enqueue_items(uuid[], text[], text[], jsonb[], timestamptz[],
                                          integer[], text[], integer[], text[]);
drop function if exists app.enqueue_jobs(uuid[], text[], text[], jsonb[], timestamptz[],
                                         integer[], text[], integer[], text[]);
drop function if exists app.enqueue_job(uuid, text, text, jsonb, timestamptz, integer, integer);
