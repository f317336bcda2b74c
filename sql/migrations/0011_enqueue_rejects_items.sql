-- leaseq: a bad item no longer refuses a whole enqueue batch, and no job can be stored
-- with an available_at of infinity or -infinity.
--
-- app.enqueue_jobs reports an invalid item as a row of its own (status 'rejected', with
-- the 22023 message in a new column, error) and stores the valid items of the batch.
-- The extra column changes the return type, which CREATE OR REPLACE cannot do: the old
-- definition is dropped here and sql/functions/enqueue.sql creates the new one in the
-- same deploy. Only app.enqueue_job calls it, from a PL/pgSQL body (no catalog
-- dependency; it is redefined from the same file), so nothing else has to go first.
-- Between this transaction and the one that applies the function files, an enqueue
-- finds no app.enqueue_jobs (42883): deploy while producers can retry, as for any
-- migration.
drop function if exists app.enqueue_jobs(uuid[], text[], text[], jsonb[], timestamptz[],
                                         integer[], text[]);

-- A job at available_at = infinity was storable through an enqueue array the functions
-- did not index as they read it ('{{infinity}}', '[5:5]={infinity}'); with one stored,
-- app.queue_status failed for every tenant (22008: its age cannot be computed). The
-- functions now refuse such arrays and such times; the table refuses them too, so no
-- path, a future bug included, can store one. Rows already stored with a non-finite
-- available_at are first moved to the time of this migration: from then on they are
-- ready (a job meant to wait for ever is better cancelled by an operator). That is a
-- data change without a state transition, so it writes no event.
--
-- The check reads one fixed-width column of the new row: PostgreSQL evaluates it on
-- every UPDATE of a job (claims, finishes), at a cost too small to measure next to the
-- update itself. Adding it scans the table once, under the table lock this transaction
-- then holds until it commits (a few seconds for millions of jobs).
update app.jobs
set available_at = now(),
    updated_at = now()
where not isfinite(available_at);

alter table app.jobs
  add constraint jobs_available_at_finite check (isfinite(available_at));
