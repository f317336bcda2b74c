-- leaseq 0015: claims by kind, so that slow kinds can have a worker of their own.
--
-- app.claim_ready_jobs, app.finish_and_claim_jobs and app.claim_jobs take the kinds to
-- claim (p_kinds) or the kinds to leave alone (p_exclude_kinds); NULL for both claims
-- every kind, as before. Two new arguments change the signatures, which CREATE OR
-- REPLACE cannot do: the old definitions are dropped here and the function files create
-- the new ones in the same deploy. The new arguments come last and default to NULL, so
-- every call written for the old signatures still means the same. app.wake_tenants
-- (internal) gains the kinds of the jobs it wakes for.
--
-- Why turns per kind. The fair claim serves tenants in the order of their turn
-- (app.tenant_turns, 0012) and moves a served tenant's turn to "now", behind the others.
-- With one turn per tenant, two workers of disjoint kinds would share that order: a
-- tenant whose quick jobs the main worker serves on every round would have its turn
-- moved to "now" again and again, and the slow worker, which serves the oldest turns
-- first, would reach it only when no other tenant with slow work waits, which may be
-- never. A worker that claims some kinds must also not pick tenants whose ready work
-- is all of other kinds: with many of them first in turn order, each claim would spend
-- its picks on them and find nothing. So a claim with a kind filter keeps a turn per
-- tenant and kind:
--
--   app.kind_turns (tenant_id, kind, turn_at): turn_at is when that kind of that tenant
--   is next due a turn, never later than its next claimable job of the kind (or than
--   the moment a claim of that kind last served the tenant, while it has ready work);
--   NULL when it has no claimable job of the kind. The same wake-up rules as the
--   tenant's turn keep it so (functions/claim.sql): producers lower it (wake_tenants,
--   under the same advisory locks), a claim with a kind filter moves it later.
--
-- A claim with a kind filter reads only the due turns of its kinds, and rotates only
-- them; a claim without one reads and rotates the tenants' turns, as before. Workers of
-- disjoint kinds therefore keep two round robins that never move each other's turns.
-- The due turns of a kind are kind_turns_due_idx's range for that kind, so a claim's
-- cost follows the tenants with ready work of its kinds.
--
-- jobs_kind_claimable_idx orders a tenant's claimable jobs of one kind as claims take
-- them, so a filtered claim reads the jobs of its kinds and walks past no job of other
-- kinds (a tenant's backlog of slow jobs costs the main worker nothing). Like
-- jobs_claimable_idx it is partial: one entry when a job is enqueued or made claimable
-- again (retry, release, redrive), none per claim or completion.
--
-- Created without CONCURRENTLY because migrations run in a transaction; on a large
-- table, create the index CONCURRENTLY by hand first (IF NOT EXISTS then skips it).
-- Between this transaction and the one that applies the function files, claims and
-- enqueues find no function of the signature they call (42883): deploy while workers
-- and producers can retry, as for any migration.

create index if not exists jobs_kind_claimable_idx
on app.jobs (tenant_id, kind, available_at, created_at, id)
where state in ('pending', 'retry_wait');

create table app.kind_turns (
  tenant_id uuid not null,
  kind text not null,
  turn_at timestamptz,
  primary key (tenant_id, kind)
);

create index kind_turns_due_idx on app.kind_turns (kind, turn_at, tenant_id)
  where turn_at is not null;

-- Only the owner (the SECURITY DEFINER functions) reads or writes it.
revoke all on app.kind_turns from public;
alter table app.kind_turns enable row level security;

-- Every kind of every tenant with claimable jobs gets its turn at its oldest claimable
-- job (the reaper's sweep, app.repair_tenant_turns, rebuilds any that goes missing).
insert into app.kind_turns (tenant_id, kind, turn_at)
select j.tenant_id, j.kind, min(j.available_at)
from app.jobs j
where j.state in ('pending', 'retry_wait')
group by j.tenant_id, j.kind;

drop function if exists app.claim_ready_jobs(text, integer, interval);
drop function if exists app.claim_jobs(uuid, text, integer, interval);
drop function if exists app.finish_and_claim_jobs(text, uuid[], uuid[], uuid[], text[],
                                                  jsonb[], interval[], integer, interval);
drop function if exists app.wake_tenants(uuid[], timestamptz[]);
