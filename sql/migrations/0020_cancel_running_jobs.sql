-- leaseq 0020: an operator may cancel a running job, fenced.
--
-- Until now only pending and retry_wait jobs could be cancelled: a running job belonged
-- to its worker until it finished or its lease expired. From here on a cancel of a
-- running job records a cancel request on the job (who asked, when), and the job's
-- worker learns it from the statements it already sends (functions/claim.sql,
-- functions/finish.sql, functions/expiry.sql):
--
--   * app.renew_job_lease_status renews the lease as app.renew_job_lease does and also
--     answers whether a cancel was requested (no extra round trip);
--   * every outcome a worker records for such a job (success, retry, failure, give-back)
--     ends it 'cancelled', never retried; the reaper ends a job whose lease expired with
--     the request set 'cancelled' too;
--   * the request itself is audited ('cancel_requested', with the operator's identity),
--     and so is the end ('cancelled').
--
-- Both new columns are NULL except on a running job with a request (and on the
-- cancelled job it became). The shape check is added NOT VALID: every existing row has
-- both columns NULL, which the check allows, so there is nothing to validate and the
-- table is not scanned under an exclusive lock. The widened event type check is added
-- NOT VALID for the same reason: every existing event passed the narrower one.

alter table app.jobs
  add column cancel_requested_at timestamptz,
  add column cancel_requested_by text;

alter table app.jobs
  add constraint jobs_cancel_request_shape check (
    (cancel_requested_at is null) = (cancel_requested_by is null)
    and (cancel_requested_by is null or length(cancel_requested_by) between 1 and 200)
    and (cancel_requested_at is null or state in ('running', 'cancelled'))
  ) not valid;

alter table app.job_events drop constraint job_events_event_type_check;
alter table app.job_events
  add constraint job_events_event_type_check check (event_type in (
    'created', 'claimed', 'retry_scheduled', 'succeeded', 'dead',
    'lease_expired', 'released', 'cancelled', 'redriven', 'cancel_requested'
  )) not valid;

-- Tenant readers read their jobs through app.reader_get_job with their own rights: the
-- request is theirs to see, as the events that record it are.
grant select (cancel_requested_at, cancel_requested_by) on app.jobs to authenticated;

-- The job reads gain the request's two columns, and app.queue_status a count of running
-- jobs with a request (functions/read.sql): a function's result columns cannot change
-- in place, so the previous forms go here.
drop function if exists app.get_job(uuid);
drop function if exists app.reader_get_job(uuid);
drop function if exists app.queue_status(uuid);
