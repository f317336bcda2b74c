-- leaseq 0019: what each table and the columns of the job tables are for, in the catalog.
--
-- sql/schema.sql prints these beside the tables, and psql's \d+ shows them; sql/README.md
-- keeps the whole story. Comments only: no table, row or privilege changes.

comment on table app.jobs is
  'One row per job: what to run (kind, payload), for which tenant, its state and lease. '
  'Written only by the app functions, each transition with its app.job_events row.';
comment on column app.jobs.operation_key is
  'The producer''s idempotency key: one job per (tenant_id, operation_key); enqueueing '
  'the same job again returns it, a different job under the key is refused.';
comment on column app.jobs.kind is
  'Which registered handler runs the job; claims may take or leave kinds.';
comment on column app.jobs.payload is
  'The job''s input, a JSON object, handed to the handler as stored.';
comment on column app.jobs.state is
  'pending, running (leased), retry_wait, or one of the final states succeeded, dead, '
  'cancelled.';
comment on column app.jobs.attempts is
  'Claims so far: each claim adds one, a job given back unstarted gets its claim back, '
  'a redrive starts again at 0.';
comment on column app.jobs.max_attempts is
  'Claims allowed (1..20): a last attempt that fails or whose lease expires makes the '
  'job dead.';
comment on column app.jobs.available_at is
  'Earliest time a pending or retry_wait job may be claimed (a retry''s backoff moves it).';
comment on column app.jobs.lease_owner is
  'Owner id of the worker invocation holding the lease; set exactly while running.';
comment on column app.jobs.lease_token is
  'Fences the lease: finishing or renewing needs it, so a worker whose lease expired '
  'cannot finish the next holder''s attempt. Never granted to tenant readers.';
comment on column app.jobs.lease_expires_at is
  'When the lease ends; after it the reaper makes the job retry_wait again, or dead at '
  'its last attempt.';
comment on column app.jobs.last_error is
  'Error document of the last failed attempt, NULL until one failed.';
comment on column app.jobs.result is
  'The handler''s result document once the job succeeded.';
comment on column app.jobs.completed_at is
  'When the job reached a final state; retention counts from it. NULL while not final.';
comment on column app.jobs.correlation_id is
  'The producer''s own reference for tracing (1..200 characters), stored as given.';

comment on table app.job_events is
  'The audit trail: one row per job transition, written in the same statement as the '
  'transition; pruned with its job.';
comment on column app.job_events.sequence is
  'Order of the events (identity): a job''s timeline is its events by sequence.';
comment on column app.job_events.event_type is
  'The transition: created, claimed, retry_scheduled, succeeded, dead, lease_expired, '
  'released, cancelled or redriven.';
comment on column app.job_events.actor is
  'Who made the transition: enqueue, the worker''s owner id, watchdog (the reaper), or '
  'the name an operator gave.';
comment on column app.job_events.details is
  'The transition''s facts (a JSON object); sql/README.md lists the keys of each type.';
comment on column app.job_events.lease_token is
  'The lease the transition happened under (a claim''s new one); NULL for enqueue, '
  'cancel and redrive.';

comment on table app.tenant_readers is
  'Binds a reader login (a member of authenticated) to the tenant whose jobs and events '
  'row-level security lets it see.';
comment on table app.tenant_producers is
  'Binds a member of leaseq_tenant_producer to a tenant it may enqueue for and read '
  'results of.';
comment on table app.settings is
  'The schema owner''s settings, one row: the retention floor and the worker pool''s '
  'limits. Only the owner writes it.';
comment on column app.settings.min_retention is
  'The reaper never prunes a finished job younger than this.';
comment on column app.settings.max_workers is
  'Most worker pool places at once; 0: no fan-out and no wake.';
comment on column app.settings.start_hold is
  'How long a reserved place or a wake''s ticket waits for its invocation.';
comment on column app.settings.wake_debounce is
  'Each login wakes a worker at most once per this long.';

comment on table app.tenant_turns is
  'When each tenant is next due a turn of the fair claim; NULL when it has nothing '
  'claimable.';
comment on table app.kind_turns is
  'The same turns per kind of each tenant, for claims that take or leave kinds.';
comment on table app.tenant_turn_sweep is
  'One row: the cursor of app.repair_tenant_turns, which rebuilds missing or late turns.';
comment on table app.worker_pool is
  'The places of worker invocations: reserved (owner NULL) for one on its way, or held '
  'by a running one; each expires by itself.';
comment on table app.worker_pool_state is
  'One row whose lock serialises every change of the worker pool, so it never passes its '
  'maximum.';
comment on table app.worker_wakes is
  'Each login''s last wake and the ticket it handed out, for the wake''s debounce.';
comment on table app.schema_migrations is
  'The migrations applied (leaseq.migrate), each with the SHA-256 of its file.';
comment on table app.schema_functions is
  'The function files applied, each with the SHA-256 of its text: re-applied when it changes.';
