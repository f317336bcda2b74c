-- leaseq 0021: job priorities, aged so that no job starves.
--
-- Every job gets a priority, 1 (least urgent) .. 9 (most urgent), 5 when the producer
-- names none; the claim takes, within a tenant's turn (and a kind's turn), the job with
-- the earliest claim key first, then the oldest created. Tenants' and kinds' turns are
-- unchanged, so one tenant's urgent flood never takes another tenant's turn.
--
-- The claim key (app.jobs.claim_key) is written whenever a job becomes claimable (enqueue,
-- retry, released lease, give-back, redrive):
--
--     claim_key = available_at - (priority - 1) * app.settings.priority_step
--
-- so a job of priority p is ordered as if it had become due (p - 1) steps earlier. A job
-- is overtaken only by jobs of higher priority that became due less than (priority
-- difference) x priority_step after it: that is the aging bound (at most 8 steps, for
-- priority 1 behind 9). priority_step is the owner's setting (1 second .. 1 day, default
-- 1 minute), never a caller's argument: a producer cannot buy more than the owner allows.
-- A changed step applies to keys written from then on; keys already written keep theirs.
--
-- Claimability is still available_at <= now. A job due in the future may already have a
-- key in the past (an urgent job due in 2 minutes has a key 8 minutes ago); the claim
-- indexes carry available_at (INCLUDE) so such entries are skipped in the index walk, and
-- only future jobs due within the next (priority - 1) x step can sit before a ready one:
-- the walk never reads further ahead than that window.
--
-- jobs_claimable_idx and jobs_kind_claimable_idx are rebuilt on the key, in the same
-- places of the table as before (partial, on pending and retry_wait jobs). Built without
-- CONCURRENTLY because migrations run in a transaction: the table is locked against
-- writes while the backfill below rewrites every row (finished ones too) and the indexes
-- build, and the backfill writes WAL for every row; on a large table, prune the finished
-- history first and deploy in a quiet hour.
--
-- Existing jobs get priority 5 and the key their available_at gives them, in every state
-- (a finished job's key is never read, but stays defined). Between this transaction and
-- the function files of the same deploy the previous enqueue functions no longer exist
-- (42883, dropped below so the new signatures do not become overloads of them): deploy
-- while producers can retry, as for any migration.

alter table app.settings
  add column priority_step interval not null default interval '1 minute'
    constraint settings_priority_step_range
    check (priority_step between interval '1 second' and interval '1 day');

alter table app.jobs
  add column priority smallint not null default 5
    constraint jobs_priority_range check (priority between 1 and 9),
  add column claim_key timestamptz;

update app.jobs j
set claim_key = j.available_at
              - (j.priority - 1)
                * coalesce((select s.priority_step from app.settings s), interval '1 minute');

alter table app.jobs alter column claim_key set not null;

-- A row inserted without a key, or whose available_at or priority is changed by hand
-- without it, gets the key they give it. The function's current definition is in
-- functions/enqueue.sql (with app.priority_step); this first one reads the setting
-- itself, so the triggers work before the function files are applied.
create or replace function app.fill_claim_key()
returns trigger
language plpgsql
set search_path = pg_catalog, pg_temp
as $$
begin
  new.claim_key := new.available_at
                   - (new.priority - 1) * (select s.priority_step from app.settings s);
  return new;
end;
$$;
revoke all on function app.fill_claim_key() from public;

create trigger jobs_fill_claim_key
before insert on app.jobs
for each row when (new.claim_key is null)
execute function app.fill_claim_key();

create trigger jobs_refresh_claim_key
before update of available_at, priority on app.jobs
for each row when (new.claim_key is not distinct from old.claim_key
                   and (new.available_at is distinct from old.available_at
                        or new.priority is distinct from old.priority))
execute function app.fill_claim_key();

drop index if exists app.jobs_claimable_idx;
create index jobs_claimable_idx
on app.jobs (tenant_id, claim_key, created_at, id) include (available_at)
where state in ('pending', 'retry_wait');

drop index if exists app.jobs_kind_claimable_idx;
create index jobs_kind_claimable_idx
on app.jobs (tenant_id, kind, claim_key, created_at, id) include (available_at)
where state in ('pending', 'retry_wait');

drop function if exists app.enqueue_jobs(uuid[], text[], text[], jsonb[], timestamptz[],
                                         integer[], text[]);
drop function if exists app.enqueue_job(uuid, text, text, jsonb, timestamptz, integer);

-- Readers see a job's priority and key (app.reader_job_wait_reasons tells why it waits).
grant select (priority, claim_key) on app.jobs to authenticated;
