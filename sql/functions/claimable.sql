-- leaseq functions: app.claimable follows app.jobs.
--
-- app.claimable holds one entry per job a claim may take (pending or retry_wait), in
-- claim order, inserted when the job becomes claimable and deleted by the claim that
-- takes it (0023_hot_and_cold_jobs). These are the bodies of the two triggers that keep
-- it true for every writer of app.jobs: jobs_claimable_on_insert (a statement trigger
-- over the inserted rows: one call per enqueue, whatever the batch) and
-- jobs_claimable_on_update (a row trigger; its WHEN, in the migration, lets through only
-- a row that enters, leaves or moves within the claim order other than by a claim, so a
-- claim, a renewal, a cancel request and a successful finish never call it). A claim
-- deletes its own entries: it locked them. Internal: owner only.
--
-- A "held" set (jobs kept back by a limit) would stay out of the claim the same way: a
-- held job has no entry here until it is released. A job's named queue is carried by its
-- entry (0026_named_queues), the leading column of claimable_queue_idx.

create or replace function app.claimable_added()
returns trigger
language plpgsql
set search_path = pg_catalog, pg_temp
as $$
begin
  insert into app.claimable (tenant_id, kind, claim_key, created_at, job_id, available_at,
                             state, priority, queue)
  select a.tenant_id, a.kind, a.claim_key, a.created_at, a.id, a.available_at, a.state,
         a.priority, a.queue
  from added a
  where a.state in ('pending', 'retry_wait')
    -- Limits hook: a job a limit holds back has no entry (functions/admission.sql).
    and a.available_at < app.held_until();
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
  -- Limits hook: a job a limit holds back has no entry until admitted
  -- (functions/admission.sql).
  if new.state in ('pending', 'retry_wait') and new.available_at < app.held_until() then
    insert into app.claimable (tenant_id, kind, claim_key, created_at, job_id, available_at,
                             state, priority, queue)
    values (new.tenant_id, new.kind, new.claim_key, new.created_at, new.id, new.available_at,
            new.state, new.priority, new.queue);
  end if;
  return null;
end;
$$;
revoke all on function app.claimable_moved() from public;
