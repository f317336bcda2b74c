-- leaseq 0010: indexes for the dashboard, so every page reads a bounded index range and
-- its counts come from index-only scans instead of one heap page per job.
--
-- The dashboard lists jobs of one state in that state's own order, a page at a time,
-- with a keyset cursor (the last row's sort time and id), optionally for one tenant:
--
--   state                order                      index
--   pending, retry_wait  available_at, id           jobs_waiting_idx (new); with a tenant,
--                                                   jobs_claimable_idx
--   running              lease_expires_at           jobs_lease_expiry_idx (0002)
--   dead, cancelled      completed_at desc, id desc jobs_unsuccessful_idx (new); dead of
--                                                   one tenant: jobs_dead_tenant_idx (new)
--   succeeded            completed_at desc          jobs_completed_idx (0006)
--
-- Without jobs_waiting_idx a page of the oldest pending jobs of all tenants sorts the
-- whole backlog (jobs_claimable_idx leads with tenant_id); with millions pending that is
-- seconds, with it a page reads 50 index entries. Without the other two a page of dead
-- jobs walks jobs_completed_idx past every succeeded job in between.
--
-- The INCLUDE columns are what the overview counts by (tenant, kind): with them, queue
-- depth and the finished-jobs chart are index-only scans. Without them each dead or
-- waiting job costs a heap page, and those are scattered over the table: with 1,000,000
-- finished jobs, 20,000 dead and 20,000 waiting, about 26,000 page reads per overview.
--
-- What they cost (docs/benchmarks.md, "Dashboard", has the measured figures):
--   * jobs_waiting_idx gets one entry each time a row version enters pending or
--     retry_wait: at enqueue, at a retry, at a release or redrive. Claims and completions
--     write row versions in other states, which a partial index skips. So one more btree
--     insert per enqueue (and per retry), none per claim or completion.
--   * the other two get an entry only when a job dies or is cancelled: nothing on the
--     path of jobs that succeed.
-- Created without CONCURRENTLY because migrations run in a transaction; on a large
-- table, create them CONCURRENTLY by hand first (IF NOT EXISTS then skips them).

create index if not exists jobs_waiting_idx
on app.jobs (state, available_at, id) include (tenant_id, kind)
where state in ('pending', 'retry_wait');

create index if not exists jobs_unsuccessful_idx
on app.jobs (state, completed_at, id) include (tenant_id, kind)
where state in ('dead', 'cancelled');

create index if not exists jobs_dead_tenant_idx
on app.jobs (tenant_id, completed_at, id) include (kind)
where state = 'dead';
