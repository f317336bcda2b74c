-- leaseq 0010: tenants take turns in the fair claim; the oldest ready job has an index.
--
-- The fair claim (app.claim_ready_jobs) used to find its tenants with a loose index scan
-- over jobs_claimable_idx that visited every tenant with any pending or retry_wait job,
-- also jobs due only much later, and stopped at the first 10,000 tenants in tenant_id
-- order. So a claim cost about 4 microseconds per such tenant (800 ms with 200,000
-- tenants whose jobs were due next month), and a tenant sorting after 10,000 busy ones
-- was never served. The oldest-ready-age metric read the same listing and missed the
-- same tenants.
--
-- app.tenant_turns keeps, per tenant, when it is next due a turn: turn_at is never later
-- than the tenant's next claimable job (or than the moment it was last served, while it
-- has more ready work), and NULL when it has nothing claimable. The claim reads only the
-- turns that are due (tenant_turns_due_idx, turn_at <= now), oldest turn first, so its
-- cost does not depend on tenants whose work is all in the future; a served tenant's
-- turn moves to "now", behind every tenant waiting longer (round robin). How the turn
-- is kept exact under concurrency is told beside app.claim_ready_jobs and
-- app.wake_tenants (functions/claim.sql); sql/README.md has the whole picture.
--
-- app.tenant_turn_sweep is the cursor of app.repair_tenant_turns, which the reaper
-- calls to rebuild a missing or too-late turn from the jobs table, a bounded page of
-- tenants per call: a defect can then delay a job, never lose it.
--
-- jobs_ready_at_idx orders the claimable jobs by available_at, so the oldest ready job
-- of all tenants is the index's first live entry (app.oldest_ready_at). It is partial:
-- a job gets an entry when it is enqueued or becomes claimable again (retry, release),
-- not when it is claimed or finished. It indexes the expression available_at at time
-- zone 'UTC' (the same order), not the column: an index on the column would also serve
-- the per-tenant queries' "order by available_at limit 1", and with few tenants the
-- planner took it for them, walking every tenant's ready jobs (and the entries of jobs
-- claimed since the last vacuum) to find one tenant's first; measured in a no-op drain
-- of 10 tenants, 0.1 ms of server time per job. Only oldest_ready_at names the
-- expression.

create table app.tenant_turns (
  tenant_id uuid primary key,
  turn_at timestamptz
);

create index tenant_turns_due_idx on app.tenant_turns (turn_at, tenant_id)
  where turn_at is not null;

create table app.tenant_turn_sweep (
  only_row boolean primary key default true check (only_row),
  next_tenant_id uuid,
  swept_at timestamptz
);
insert into app.tenant_turn_sweep (only_row) values (true);

-- Only the owner (the SECURITY DEFINER functions) reads or writes them.
revoke all on app.tenant_turns, app.tenant_turn_sweep from public;
alter table app.tenant_turns enable row level security;
alter table app.tenant_turn_sweep enable row level security;

create index jobs_ready_at_idx on app.jobs ((available_at at time zone 'UTC'))
  where state in ('pending', 'retry_wait');

-- Every tenant with claimable work gets its turn at its oldest claimable job. (A job
-- enqueued by the previous functions after this and before the new function files are
-- applied is found by the reaper's next sweep of app.repair_tenant_turns.)
insert into app.tenant_turns (tenant_id, turn_at)
select j.tenant_id, min(j.available_at)
from app.jobs j
where j.state in ('pending', 'retry_wait')
group by j.tenant_id;
