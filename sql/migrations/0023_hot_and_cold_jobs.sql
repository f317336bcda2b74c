-- leaseq 0023: the job row stays cold; claimable entries and leases live in small tables.
--
-- Until now every transition rewrote app.jobs, whose ten indexes covered the claim order,
-- the ready time, leases and the waiting list: a claim and a finish changed indexed
-- columns, so neither was a HOT update, and each wrote an entry into every index. From
-- here on the claim path writes three tables:
--
--   app.jobs       the long-lived row (payload, result, history), inserted at enqueue.
--                  Its indexes name only columns that do not change before the final
--                  outcome: id and tenant (jobs_pkey), the operation key, and the new
--                  generated column `outcome` (NULL until succeeded, dead or cancelled)
--                  with completed_at for the finished lists and retention. A claim, a
--                  retry, a cancel request and a give-back change only unindexed columns
--                  (state, attempts, lease_owner, available_at, claim_key, last_error,
--                  updated_at, cancel_requested_*): HOT updates, the index entries of the
--                  row are written once at enqueue and once at its outcome.
--   app.claimable  one row per job that a claim may take (pending or retry_wait, not
--                  held back), carrying just what the claim orders and filters by. It is
--                  inserted when a job becomes claimable, deleted by the claim that takes
--                  it, never updated: a claim locks its rows, not the job rows.
--   app.leases     one row per running job: owner, token and expiry. Inserted at claim, renewed in place (expires_at has no
--                  index, so a renewal is a HOT update), deleted at the outcome or by the
--                  reaper, which scans it (it holds the running jobs only).
--
-- app.claimable follows app.jobs by triggers (jobs_claimable_on_insert, a statement
-- trigger over the new rows; jobs_claimable_on_update, a row trigger whose WHEN names
-- exactly the changes that move a job into, out of or within the claim order), so every
-- writer of app.jobs, the functions and an operator's hand edit alike, keeps it true. The
-- claim itself deletes its entries (it locked them) and turns the job running, which the
-- update trigger's WHEN leaves alone; a finish that succeeds leaves it alone too. A claim
-- that meets an entry whose job is no longer claimable (a job edited by hand) deletes it
-- and claims nothing for it.
--
-- lease_token and lease_expires_at move from app.jobs to app.leases (readers keep
-- lease_owner on the job and read the expiry from app.leases, never the token). The
-- indexes on pending and running jobs (jobs_claimable_idx, jobs_kind_claimable_idx,
-- jobs_ready_at_idx, jobs_lease_expiry_idx, jobs_waiting_idx) are replaced by the small
-- tables' own. Jobs in every state move as they are: each pending and retry_wait job gets
-- its claimable entry (its key and due time unchanged), each running job its lease (same
-- owner, token and expiry). The claim functions
-- return the new row type app.claimed_job (the job with its lease and priority); the
-- functions whose return type changed are dropped here and made again by the function
-- files. The table is rewritten (the generated column): prune the finished history first
-- on a large one and deploy in a quiet hour.

create table app.claimable (
  tenant_id uuid not null,
  kind text not null,
  claim_key timestamptz not null,
  created_at timestamptz not null,
  job_id uuid not null,
  available_at timestamptz not null,
  state app.job_state not null,
  priority smallint not null
) with (fillfactor = 100, autovacuum_vacuum_scale_factor = 0.0,
        autovacuum_vacuum_threshold = 1000, autovacuum_vacuum_insert_threshold = 1000,
        autovacuum_analyze_scale_factor = 0.05, autovacuum_vacuum_cost_delay = 0);

comment on table app.claimable is
  'One entry per job a claim may take (pending or retry_wait), in claim order; inserted '
  'when the job becomes claimable, deleted by the claim that takes it, never updated.';

create index claimable_order_idx
  on app.claimable (tenant_id, claim_key, created_at, job_id) include (available_at);
create index claimable_kind_idx
  on app.claimable (tenant_id, kind, claim_key, created_at, job_id) include (available_at);
create index claimable_ready_idx on app.claimable (available_at);

create table app.leases (
  job_id uuid not null,
  tenant_id uuid not null,
  lease_owner text not null,
  lease_token uuid not null,
  expires_at timestamptz not null,
  claimed_at timestamptz not null,
  constraint leases_pkey primary key (job_id)
) with (fillfactor = 50, autovacuum_vacuum_scale_factor = 0.0,
        autovacuum_vacuum_threshold = 1000, autovacuum_analyze_scale_factor = 0.05,
        autovacuum_vacuum_cost_delay = 0);

comment on table app.leases is
  'One row per running job: who holds it, the fencing token and when it ends. Renewals '
  'are HOT updates (no index on expires_at).';

insert into app.claimable (tenant_id, kind, claim_key, created_at, job_id, available_at,
                             state, priority)
select j.tenant_id, j.kind, j.claim_key, j.created_at, j.id, j.available_at, j.state,
       j.priority
from app.jobs j
where j.state in ('pending', 'retry_wait');

insert into app.leases (job_id, tenant_id, lease_owner, lease_token, expires_at, claimed_at)
select j.id, j.tenant_id, j.lease_owner, j.lease_token, j.lease_expires_at, j.updated_at
from app.jobs j
where j.state = 'running';

-- Functions whose return type or row type changes; the function files make them again.
drop function if exists app.finish_and_claim_jobs(text, uuid[], uuid[], uuid[], text[], jsonb[],
  interval[], integer, interval, text[], text[]);
drop function if exists app.claim_ready_jobs(text, integer, interval, text[], text[]);
drop function if exists app.claim_ready_jobs_of_kinds(text, integer, interval, text[], text[]);
drop function if exists app.claim_jobs(uuid, text, integer, interval, text[], text[]);
drop function if exists app.claim_locked_jobs(uuid[], text, interval, timestamptz);

drop index app.jobs_claimable_idx;
drop index app.jobs_kind_claimable_idx;
drop index app.jobs_ready_at_idx;
drop index app.jobs_lease_expiry_idx;
drop index app.jobs_waiting_idx;
drop index app.jobs_dead_tenant_idx;
drop index app.jobs_unsuccessful_idx;

alter table app.jobs drop constraint jobs_lease_shape;
alter table app.jobs
  drop column lease_token,
  drop column lease_expires_at,
  add column outcome app.job_state generated always as (
    case when state in ('succeeded', 'dead', 'cancelled') then state end) stored,
  add constraint jobs_lease_shape check ((state = 'running') = (lease_owner is not null));

comment on column app.jobs.outcome is
  'The final state once the job has one (succeeded, dead, cancelled), NULL before: the '
  'finished lists index it, so the transitions before the outcome stay HOT updates.';

create index jobs_dead_tenant_idx on app.jobs (tenant_id, completed_at, id) include (kind)
  where outcome = 'dead';
create index jobs_unsuccessful_idx on app.jobs (outcome, completed_at, id)
  include (tenant_id, kind) where outcome in ('dead', 'cancelled');

grant select (outcome) on app.jobs to authenticated;

-- The claim returns the job with its lease: the row type of the claim functions.
create type app.claimed_job as (
  id uuid,
  tenant_id uuid,
  operation_key text,
  kind text,
  payload jsonb,
  state app.job_state,
  attempts integer,
  max_attempts integer,
  available_at timestamptz,
  created_at timestamptz,
  correlation_id text,
  priority smallint,
  lease_owner text,
  lease_token uuid,
  lease_expires_at timestamptz,
  claim_key timestamptz
);

-- The triggers that keep app.claimable in step with app.jobs. Their current definitions
-- are in functions/claimable.sql; these first ones are the same.
create or replace function app.claimable_added()
returns trigger
language plpgsql
set search_path = pg_catalog, pg_temp
as $$
begin
  insert into app.claimable (tenant_id, kind, claim_key, created_at, job_id, available_at,
                             state, priority)
  select a.tenant_id, a.kind, a.claim_key, a.created_at, a.id, a.available_at, a.state,
         a.priority
  from added a
  where a.state in ('pending', 'retry_wait');
  return null;
end;
$$;
revoke all on function app.claimable_added() from public;

create or replace function app.claimable_moved()
returns trigger
language plpgsql
set search_path = pg_catalog, pg_temp
as $$
begin
  if old.state in ('pending', 'retry_wait') then
    -- SKIP LOCKED: an entry a claim has locked is that claim's to delete; it finds the
    -- job no longer claimable, or claims it, and deletes the entry either way.
    delete from app.claimable c
    where c.ctid = any (array(
      select q.ctid
      from app.claimable q
      where q.tenant_id = old.tenant_id and q.claim_key = old.claim_key
        and q.created_at = old.created_at and q.job_id = old.id
      for update skip locked));
  end if;
  if new.state in ('pending', 'retry_wait') then
    insert into app.claimable (tenant_id, kind, claim_key, created_at, job_id, available_at,
                             state, priority)
    values (new.tenant_id, new.kind, new.claim_key, new.created_at, new.id, new.available_at,
            new.state, new.priority);
  end if;
  return null;
end;
$$;
revoke all on function app.claimable_moved() from public;

create trigger jobs_claimable_on_insert
after insert on app.jobs
referencing new table as added
for each statement execute function app.claimable_added();

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
           or old.tenant_id is distinct from new.tenant_id))
execute function app.claimable_moved();

-- Row-level security as on app.jobs: readers see their tenants' rows, never a token.
alter table app.claimable enable row level security;
alter table app.leases enable row level security;
create policy claimable_tenant_select on app.claimable for select to authenticated
  using (tenant_id = (select app.current_tenant_id()));
create policy leases_tenant_select on app.leases for select to authenticated
  using (tenant_id = (select app.current_tenant_id()));
revoke all on app.claimable, app.leases from public;
grant select (tenant_id, kind, claim_key, created_at, job_id, available_at, state,
              priority)
  on app.claimable to authenticated;
grant select (job_id, tenant_id, lease_owner, expires_at, claimed_at)
  on app.leases to authenticated;

-- What each column of the two small tables is for, read in sql/schema.sql beside them.
comment on column app.claimable.claim_key is
  'The job''s place in its tenant''s claim order: available_at less the priority''s steps.';
comment on column app.claimable.available_at is
  'Earliest time a claim may take the job; the claim skips entries not yet due.';
comment on column app.claimable.state is
  'pending or retry_wait, as on the job row, so a claim reads the entry alone.';
comment on column app.leases.lease_owner is
  'Owner id of the worker invocation holding the lease, as on the job row.';
comment on column app.leases.lease_token is
  'Fences the lease: finishing or renewing needs it, so a worker whose lease expired '
  'cannot finish the next holder''s attempt. Never granted to tenant readers.';
comment on column app.leases.expires_at is
  'When the lease ends; the reaper then makes the job retry_wait again, or dead at its '
  'last attempt. Renewals move it in place (HOT: no index holds it).';
comment on column app.leases.claimed_at is
  'When the claim that holds the lease took the job.';
