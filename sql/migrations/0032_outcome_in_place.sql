-- leaseq 0032: a job's outcome is written in place (a HOT update of its row).
--
-- Until now the finished lists indexed app.jobs on completed_at and outcome, which the
-- outcome sets, so the outcome was the one update of a job row that was not HOT: it wrote
-- a new entry into each of the row's indexes, jobs_pkey and jobs_operation_key_unique
-- included, about 260 bytes of WAL and three index insertions a job. From here on no
-- index of app.jobs names a column that a job's success changes:
--
--   * Dead and cancelled jobs are listed through two generated columns, unsuccessful
--     (dead or cancelled, else NULL) and unsuccessful_at (their completed_at, else
--     NULL). Both are NULL before the outcome and stay NULL when the job succeeds, so
--     PostgreSQL, which compares the old and new values of indexed columns, keeps that
--     update HOT. jobs_dead_tenant_idx and jobs_unsuccessful_idx are rebuilt on them.
--   * Succeeded jobs are found through their 'succeeded' event, which the outcome writes
--     anyway: job_events_succeeded_idx (created_at, the job's completed_at) holds one
--     16-byte entry per succeeded job, on an append-only table whose newest page is the
--     one written; the counts read it alone, the lists and retention the event rows it
--     points to for the job's id. A succeeded job never leaves that state, so its event is its entry for
--     as long as the job is kept; app.prune_jobs deletes the event with the job.
--   * jobs_completed_idx is dropped: its readers (retention, the activity histogram, the
--     succeeded list) read the two above.
--   * A hand edit of a succeeded job's completed_at moves its 'succeeded' event with it
--     (trigger jobs_succeeded_event_follows), so retention and the lists still see the
--     time the row says. The functions never change the completion time of a succeeded
--     job, so on their paths the trigger's WHEN test is all it costs; it is an AFTER
--     trigger, which takes no row lock (0030).
--
-- Adding the two stored columns rewrites app.jobs under an exclusive lock (seconds per
-- million rows; prune the finished history first on a large table), and the new event
-- index is built on every day's partition; see docs/deploy.md, "Upgrading past
-- migration 0032".

alter table app.jobs
  add column unsuccessful app.job_state generated always as (
    case when state in ('dead', 'cancelled') then state end) stored,
  add column unsuccessful_at timestamptz generated always as (
    case when state in ('dead', 'cancelled') then completed_at end) stored;

comment on column app.jobs.unsuccessful is
  'dead or cancelled once the job ended so, else NULL: the unsuccessful lists index it, '
  'and it stays NULL when a job succeeds, so that outcome is a HOT update.';
comment on column app.jobs.unsuccessful_at is
  'completed_at of a dead or cancelled job, else NULL (indexed with unsuccessful).';

grant select (unsuccessful, unsuccessful_at) on app.jobs to authenticated;

drop index app.jobs_completed_idx;
drop index app.jobs_dead_tenant_idx;
drop index app.jobs_unsuccessful_idx;

create index jobs_dead_tenant_idx on app.jobs (tenant_id, unsuccessful_at, id)
  include (kind) where unsuccessful = 'dead';
create index jobs_unsuccessful_idx on app.jobs (unsuccessful, unsuccessful_at, id)
  include (tenant_id, kind) where unsuccessful is not null;

create index job_events_succeeded_idx on app.job_events (created_at)
  where event_type = 'succeeded';

comment on column app.jobs.outcome is
  'The final state once the job has one (succeeded, dead, cancelled), NULL before. No '
  'index names it (0032), so the outcome that sets it is a HOT update.';

create or replace function app.move_succeeded_event()
returns trigger
language plpgsql
set search_path = pg_catalog, pg_temp
as $$
begin
  update app.job_events e
  set created_at = new.completed_at
  where e.job_id = new.id and e.tenant_id = new.tenant_id
    and e.event_type = 'succeeded' and e.created_at = old.completed_at;
  return null;
end;
$$;
revoke all on function app.move_succeeded_event() from public;

create trigger jobs_succeeded_event_follows
after update of completed_at on app.jobs
for each row when (old.state = 'succeeded' and new.state = 'succeeded'
                   and new.completed_at is distinct from old.completed_at
                   and new.completed_at is not null)
execute function app.move_succeeded_event();
