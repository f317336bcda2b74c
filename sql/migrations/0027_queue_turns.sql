-- leaseq 0027: the fair claim's turns, per queue.
--
-- Until now a tenant had one turn (app.tenant_turns) and one per kind (app.kind_turns)
-- whatever the queue of its jobs: the workers of two queues moved the same turns, so a
-- busy queue's claims pushed a tenant behind others in a quiet queue's round robin, and a
-- tenant counted as idle only with nothing ready in any queue. Each queue now keeps its
-- own round robin: a turn is keyed by (queue, tenant_id), a kind's turn by (queue,
-- tenant_id, kind), and a queue's claim reads and moves only its own queue's turns
-- (sql/functions/turns.sql tells the rules, claim.sql the claim).
--
-- claimable_kind_idx takes the queue after the kind, so that a queue's claim with a kind
-- filter walks exactly its own entries of the kind, in claim order, and the reaper's
-- repair finds every (tenant, kind, queue) by a loose scan. The index count of
-- app.claimable is unchanged.
--
-- Every turn of today becomes the queue 'default''s (the column's default), and every
-- (queue, tenant) and (queue, tenant, kind) with claimable entries gets a turn no later
-- than its oldest entry (a turn of 'default' that is already earlier is kept as it is),
-- so no claimable job waits for the reaper's repair after the upgrade. Between this transaction and the function files of the same deploy, the
-- previous turn functions no longer exist (42883: dropped below so that the new
-- signatures do not become overloads of them): deploy while workers and producers can
-- retry, as for any migration.

drop function if exists app.wake_tenants(uuid[], timestamptz[], text[]);
drop function if exists app.settle_turns(uuid[], uuid[], text[], timestamptz);
drop function if exists app.next_claimable_at(uuid, text);

alter table app.tenant_turns
  add column queue text not null default 'default';
alter table app.tenant_turns drop constraint tenant_turns_pkey;
alter table app.tenant_turns add primary key (queue, tenant_id);
drop index app.tenant_turns_due_idx;
create index tenant_turns_due_idx on app.tenant_turns (queue, turn_at, tenant_id)
  where turn_at is not null;

alter table app.kind_turns
  add column queue text not null default 'default';
alter table app.kind_turns drop constraint kind_turns_pkey;
alter table app.kind_turns add primary key (queue, tenant_id, kind);
drop index app.kind_turns_due_idx;
create index kind_turns_due_idx on app.kind_turns (queue, kind, turn_at, tenant_id)
  where turn_at is not null;

drop index app.claimable_kind_idx;
create index claimable_kind_idx
  on app.claimable (tenant_id, kind, queue, claim_key, created_at, job_id)
  include (available_at);

-- The repair sweep's cursor is a (queue, tenant) now.
alter table app.tenant_turn_sweep add column next_queue text;

insert into app.tenant_turns as tt (queue, tenant_id, turn_at)
select c.queue, c.tenant_id, min(c.available_at)
from app.claimable c
group by c.queue, c.tenant_id
on conflict (queue, tenant_id) do update
  set turn_at = least(tt.turn_at, excluded.turn_at);

insert into app.kind_turns as kt (queue, tenant_id, kind, turn_at)
select c.queue, c.tenant_id, c.kind, min(c.available_at)
from app.claimable c
group by c.queue, c.tenant_id, c.kind
on conflict (queue, tenant_id, kind) do update
  set turn_at = least(kt.turn_at, excluded.turn_at);

comment on table app.tenant_turns is
  'When each tenant is next due a turn of the fair claim in each queue; NULL: nothing claimable.';
comment on column app.tenant_turns.queue is
  'The queue whose claims take this turn: every queue keeps its own round robin.';
comment on table app.kind_turns is
  'The same turns per queue, tenant and kind, for claims that take or leave kinds.';
comment on column app.kind_turns.queue is
  'The queue whose claims take this turn.';
comment on column app.tenant_turn_sweep.next_queue is
  'With next_tenant_id: the (queue, tenant) the next repair page starts from.';
