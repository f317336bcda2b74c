-- leaseq 0002: table-level fixes to the reference structure, and the keys and storage
-- settings of the hot path.
--
-- * events reference their job by (tenant_id, job_id), so an event can never claim a
--   job of another tenant (reference defect 17);
-- * lease tokens leave the event details for a column readers are not granted
--   (defect 9); tokens already written into details by the reference are moved;
-- * the lease-expiry index no longer leads with tenant_id, so one bounded pass can
--   release expired leases of every tenant (defect 15); per-tenant release filters it;
-- * kind, operation_key and event actor get length bounds, jobs get a correlation id
--   that flows from enqueue to execution logs, and the event vocabulary grows by the
--   worker's give-back and the operator transitions (released, cancelled, redriven).
--
-- Keys, measured with bench/ (docs/benchmarks.md): every state change of a job is a
-- non-HOT update (state is in the partial indexes' predicates), so each index on
-- app.jobs costs a btree insert per claim and per completion, and each index on
-- app.job_events one per audit row. With the reference keys plus a unique
-- (tenant_id, id) for the foreign key, a no-op job wrote about 2.2 KB of WAL, half of
-- it index inserts; with the keys below, about 1.6 KB.
-- * app.jobs: the primary key is (id, tenant_id). It finds a job by id (id leads) and
--   it is what the tenant-aware events foreign key references, so no separate unique
--   (tenant_id, id) index is needed. Job ids are random UUIDs the server generates
--   (clients never choose them), so uniqueness of the pair is uniqueness of the id.
-- * app.job_events: the primary key is (tenant_id, job_id, sequence), which is also the
--   timeline index that readers and the cascading delete use; the reference's separate
--   sequence key, timeline index and unique (tenant_id, id) index go. Event ids stay
--   random UUIDs filled by default.
--
-- Storage: fillfactor 80 keeps a job's new versions on its page (smaller WAL records,
-- no page hunting); autovacuum runs on 1% of changed rows rather than 20%, without
-- cost-based sleeping, so dead versions are reclaimed while they are few. job_events
-- is insert-mostly: it is vacuumed by insert count so its visibility map stays current.

-- On a database upgraded from the reference, RLS is still FORCED with only SELECT
-- policies, so the UPDATE below, run by a non-superuser owner, would silently match no
-- row and leave every token in the details. 0004 settles RLS; unforcing it here is enough.
alter table app.jobs no force row level security;
alter table app.job_events no force row level security;

alter table app.job_events drop constraint if exists job_events_job_id_fkey;

alter table app.jobs
  drop constraint jobs_pkey,
  add constraint jobs_pkey primary key (id, tenant_id),
  add constraint jobs_kind_shape check (length(kind) between 1 and 128 and kind !~ '^\s*$'),
  add constraint jobs_operation_key_shape check (length(operation_key) between 1 and 255 and operation_key !~ '^\s*$'),
  add column correlation_id text,
  add constraint jobs_correlation_id_shape check (correlation_id is null or length(correlation_id) between 1 and 200);

alter table app.job_events
  drop constraint if exists job_events_id_unique,
  drop constraint job_events_pkey,
  add constraint job_events_pkey primary key (tenant_id, job_id, sequence);
drop index if exists app.job_events_job_timeline_idx;

alter table app.job_events
  add constraint job_events_job_fkey foreign key (tenant_id, job_id)
    references app.jobs (tenant_id, id) on delete cascade;

alter table app.job_events add column lease_token uuid;
update app.job_events
set lease_token = (details ->> 'leaseToken')::uuid,
    details = details - 'leaseToken'
where details ? 'leaseToken';

alter table app.job_events drop constraint if exists job_events_event_type_check;
alter table app.job_events
  add constraint job_events_event_type_check check (event_type in (
    'created', 'claimed', 'retry_scheduled', 'succeeded', 'dead',
    'lease_expired', 'released', 'cancelled', 'redriven'
  )),
  add constraint job_events_actor_shape check (length(actor) between 1 and 200);

drop index if exists app.jobs_expired_lease_idx;
create index jobs_lease_expiry_idx
on app.jobs (lease_expires_at)
where state = 'running';

alter table app.jobs set (
  fillfactor = 80,
  autovacuum_vacuum_scale_factor = 0.01,
  autovacuum_vacuum_threshold = 1000,
  autovacuum_analyze_scale_factor = 0.02,
  autovacuum_vacuum_cost_delay = 0
);
alter table app.job_events set (
  autovacuum_vacuum_insert_scale_factor = 0.05,
  autovacuum_vacuum_insert_threshold = 10000,
  autovacuum_analyze_scale_factor = 0.05
);
