-- leaseq 0002: table-level fixes to the reference structure.
--
-- * events reference their job by (tenant_id, job_id), so an event can never claim a
--   job of another tenant (reference defect 17);
-- * lease tokens leave the event details for a column readers are not granted
--   (defect 9); tokens already written into details by the reference are moved;
-- * the lease-expiry index no longer leads with tenant_id, so one bounded pass can
--   release expired leases of every tenant (defect 15); per-tenant release filters it;
-- * kind, operation_key and event actor get length bounds, jobs get a correlation id
--   that flows from enqueue to execution logs, and the event vocabulary grows by the
--   operator transitions (cancelled, redriven).

alter table app.jobs
  add constraint jobs_tenant_job_unique unique (tenant_id, id),
  add constraint jobs_kind_shape check (length(kind) between 1 and 128 and kind !~ '^\s*$'),
  add constraint jobs_operation_key_shape check (length(operation_key) between 1 and 255 and operation_key !~ '^\s*$'),
  add column correlation_id text,
  add constraint jobs_correlation_id_shape check (correlation_id is null or length(correlation_id) between 1 and 200);

alter table app.job_events drop constraint if exists job_events_job_id_fkey;
alter table app.job_events
  add constraint job_events_job_fkey foreign key (tenant_id, job_id)
    references app.jobs (tenant_id, id) on delete cascade;

-- On a database upgraded from the reference, RLS is still FORCED with only SELECT
-- policies, so this UPDATE, run by a non-superuser owner, would silently match no row
-- and leave every token in the details. 0004 settles RLS; unforcing it here is enough.
alter table app.jobs no force row level security;
alter table app.job_events no force row level security;
alter table app.job_events add column lease_token uuid;
update app.job_events
set lease_token = (details ->> 'leaseToken')::uuid,
    details = details - 'leaseToken'
where details ? 'leaseToken';

alter table app.job_events drop constraint if exists job_events_event_type_check;
alter table app.job_events
  add constraint job_events_event_type_check check (event_type in (
    'created', 'claimed', 'retry_scheduled', 'succeeded', 'dead',
    'lease_expired', 'cancelled', 'redriven'
  )),
  add constraint job_events_actor_shape check (length(actor) between 1 and 200);

drop index if exists app.jobs_expired_lease_idx;
create index jobs_lease_expiry_idx
on app.jobs (lease_expires_at)
where state = 'running';
