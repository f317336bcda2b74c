-- leaseq 0031: the audit trail's index holds the job id alone.
--
-- Every event writes one entry into its day's copy of job_events_job_idx, two a job in a
-- drain, so the key's width is WAL: (tenant_id, job_id, sequence) is a 48-byte index
-- tuple, (job_id) a 24-byte one: about 47 bytes less WAL a job. Job ids are random UUIDs
-- made by the enqueue, so an id finds its job's few events and hardly anything else; the
-- reads still name the tenant, now checked on the row, and sort a job's events by
-- sequence themselves. A job's events share one key, so deduplication keeps them in one
-- posting list and the index is smaller too.
--
-- The new index is built on every partition before the old one is dropped; on a large
-- trail the build holds off the drain's writes to each partition while it builds (the
-- days kept are the retention's).

create index job_events_job_id_idx on app.job_events (job_id);
drop index app.job_events_job_idx;
