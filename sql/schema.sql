-- The tables of schema app as the migrations leave them (after 0032_outcome_in_place).
--
-- Generated from a freshly migrated database by scripts/write-schema: do not edit. After adding
-- a migration, run scripts/write-schema and commit this file with it;
-- tests/migrations/test_schema_file.py fails while it is stale. Read here, change in
-- sql/migrations (sql/README.md, "Migrations"). Functions and their grants are in
-- sql/functions.
--
-- Each table, with what it and its columns are for (their comments in the catalog), is
-- followed by its keys, indexes, row-level security, policies and grants.
-- Tables:
--   app.claimable
--   app.connection_budget
--   app.event_days
--   app.event_holds
--   app.held_jobs
--   app.job_events
--   app.jobs
--   app.kind_turns
--   app.leases
--   app.limit_slots
--   app.limit_starts
--   app.limit_turns
--   app.limits
--   app.queue_events
--   app.queue_kinds
--   app.queue_workers
--   app.queues
--   app.schedules
--   app.schema_functions
--   app.schema_migrations
--   app.settings
--   app.tenant_producers
--   app.tenant_readers
--   app.tenant_turn_sweep
--   app.tenant_turns
--   app.worker_pool
--   app.worker_pool_state
--   app.worker_wakes

-- SCHEMA: app
CREATE SCHEMA app;

-- TYPE: job_state
CREATE TYPE app.job_state AS ENUM (
    'pending',
    'running',
    'retry_wait',
    'succeeded',
    'dead',
    'cancelled'
);

-- TYPE: claimed_job
CREATE TYPE app.claimed_job AS (
	id uuid,
	tenant_id uuid,
	operation_key text,
	kind text,
	payload jsonb,
	state app.job_state,
	attempts integer,
	max_attempts integer,
	available_at timestamp with time zone,
	created_at timestamp with time zone,
	correlation_id text,
	priority smallint,
	lease_owner text,
	lease_token uuid,
	lease_expires_at timestamp with time zone,
	claim_key timestamp with time zone
);

-- DOMAIN: job_payload
CREATE DOMAIN app.job_payload AS jsonb;

-- SEQUENCE: job_event_sequence
CREATE SEQUENCE app.job_event_sequence
    START WITH 1
    INCREMENT BY 1
    NO MINVALUE
    NO MAXVALUE
    CACHE 1;

-- CHECK CONSTRAINT: job_payload job_payload_is_object
ALTER DOMAIN app.job_payload
    ADD CONSTRAINT job_payload_is_object CHECK ((jsonb_typeof(VALUE) = 'object'::text)) NOT VALID;

-- ACL: SCHEMA app
GRANT USAGE ON SCHEMA app TO authenticated;
GRANT USAGE ON SCHEMA app TO leaseq_producer;
GRANT USAGE ON SCHEMA app TO leaseq_tenant_producer;
GRANT USAGE ON SCHEMA app TO leaseq_worker;
GRANT USAGE ON SCHEMA app TO leaseq_reaper;
GRANT USAGE ON SCHEMA app TO leaseq_operator;
GRANT USAGE ON SCHEMA app TO leaseq_dashboard;

-- ======================================================================================
-- app.claimable
-- ======================================================================================

-- TABLE: claimable
-- One entry per job a claim may take (pending or retry_wait), in claim order; inserted
-- when the job becomes claimable, deleted by the claim that takes it, never updated.
CREATE TABLE app.claimable (
    tenant_id uuid NOT NULL,
    kind text NOT NULL,
    -- The job's place in its tenant's claim order: available_at less the priority's steps.
    claim_key timestamp with time zone NOT NULL,
    created_at timestamp with time zone NOT NULL,
    job_id uuid NOT NULL,
    -- Earliest time a claim may take the job; the claim skips entries not yet due.
    available_at timestamp with time zone NOT NULL,
    -- pending or retry_wait, as on the job row, so a claim reads the entry alone.
    state app.job_state NOT NULL,
    priority smallint NOT NULL,
    -- The job's queue (app.jobs.queue): a queue's claim walks its own entries.
    queue text DEFAULT 'default'::text NOT NULL
)
WITH (fillfactor='100', autovacuum_vacuum_scale_factor='0.0', autovacuum_vacuum_threshold='1000', autovacuum_vacuum_insert_threshold='1000', autovacuum_analyze_scale_factor='0.05', autovacuum_vacuum_cost_delay='0');

-- INDEX: claimable_kind_idx
CREATE INDEX claimable_kind_idx ON app.claimable USING btree (tenant_id, kind, queue, claim_key, created_at, job_id) INCLUDE (available_at);

-- INDEX: claimable_order_idx
CREATE INDEX claimable_order_idx ON app.claimable USING btree (tenant_id, claim_key, created_at, job_id) INCLUDE (available_at);

-- INDEX: claimable_queue_idx
CREATE INDEX claimable_queue_idx ON app.claimable USING btree (queue, tenant_id, claim_key, created_at, job_id) INCLUDE (available_at);

-- INDEX: claimable_ready_idx
CREATE INDEX claimable_ready_idx ON app.claimable USING btree (available_at);

-- ROW SECURITY: claimable
ALTER TABLE app.claimable ENABLE ROW LEVEL SECURITY;

-- POLICY: claimable claimable_tenant_select
CREATE POLICY claimable_tenant_select ON app.claimable FOR SELECT TO authenticated USING ((tenant_id = ( SELECT app.current_tenant_id() AS current_tenant_id)));

-- ACL: columns of claimable
GRANT SELECT(tenant_id) ON TABLE app.claimable TO authenticated;
GRANT SELECT(kind) ON TABLE app.claimable TO authenticated;
GRANT SELECT(claim_key) ON TABLE app.claimable TO authenticated;
GRANT SELECT(created_at) ON TABLE app.claimable TO authenticated;
GRANT SELECT(job_id) ON TABLE app.claimable TO authenticated;
GRANT SELECT(available_at) ON TABLE app.claimable TO authenticated;
GRANT SELECT(state) ON TABLE app.claimable TO authenticated;
GRANT SELECT(priority) ON TABLE app.claimable TO authenticated;
GRANT SELECT(queue) ON TABLE app.claimable TO authenticated;

-- ======================================================================================
-- app.connection_budget
-- ======================================================================================

-- TABLE: connection_budget
-- One row: the connections the leaseq stack's own functions can open, as its last deploy
-- checked them, for the queues' registrations to add to.
CREATE TABLE app.connection_budget (
    only_row boolean DEFAULT true NOT NULL,
    stack_connections integer NOT NULL,
    proxy_percent integer,
    updated_at timestamp with time zone DEFAULT clock_timestamp() NOT NULL,
    CONSTRAINT connection_budget_only_row_check CHECK (only_row),
    CONSTRAINT connection_budget_proxy_range CHECK (((proxy_percent >= 1) AND (proxy_percent <= 100))),
    CONSTRAINT connection_budget_stack_range CHECK (((stack_connections >= 0) AND (stack_connections <= 100000)))
);

-- CONSTRAINT: connection_budget connection_budget_pkey
ALTER TABLE ONLY app.connection_budget
    ADD CONSTRAINT connection_budget_pkey PRIMARY KEY (only_row);

-- ROW SECURITY: connection_budget
ALTER TABLE app.connection_budget ENABLE ROW LEVEL SECURITY;

-- ======================================================================================
-- app.event_days
-- ======================================================================================

-- TABLE: event_days
-- One row per day partition of app.job_events made: closed once the day is past, analyzed
-- (the parent, once a day), dropped by retention.
CREATE TABLE app.event_days (
    day date NOT NULL,
    added_at timestamp with time zone DEFAULT clock_timestamp() NOT NULL,
    closed_at timestamp with time zone,
    analyzed_at timestamp with time zone,
    dropped_at timestamp with time zone
);

-- CONSTRAINT: event_days event_days_pkey
ALTER TABLE ONLY app.event_days
    ADD CONSTRAINT event_days_pkey PRIMARY KEY (day);

-- ROW SECURITY: event_days
ALTER TABLE app.event_days ENABLE ROW LEVEL SECURITY;

-- ======================================================================================
-- app.event_holds
-- ======================================================================================

-- TABLE: event_holds
-- Days of app.job_events retention must keep: a redriven job's events, until the job
-- itself is pruned.
CREATE TABLE app.event_holds (
    day date NOT NULL,
    tenant_id uuid NOT NULL,
    job_id uuid NOT NULL,
    reason text NOT NULL,
    held_at timestamp with time zone DEFAULT clock_timestamp() NOT NULL,
    CONSTRAINT event_holds_reason_check CHECK ((reason = 'redriven'::text))
);

-- CONSTRAINT: event_holds event_holds_pkey
ALTER TABLE ONLY app.event_holds
    ADD CONSTRAINT event_holds_pkey PRIMARY KEY (day, tenant_id, job_id);

-- INDEX: event_holds_job_idx
CREATE INDEX event_holds_job_idx ON app.event_holds USING btree (tenant_id, job_id);

-- ROW SECURITY: event_holds
ALTER TABLE app.event_holds ENABLE ROW LEVEL SECURITY;

-- ======================================================================================
-- app.held_jobs
-- ======================================================================================

-- TABLE: held_jobs
-- Jobs a full limit holds back, with the due time and claim key they get back at
-- admission.
CREATE TABLE app.held_jobs (
    job_id uuid NOT NULL,
    tenant_id uuid NOT NULL,
    bucket text NOT NULL,
    priority smallint NOT NULL,
    claim_key timestamp with time zone NOT NULL,
    available_at timestamp with time zone NOT NULL,
    created_at timestamp with time zone NOT NULL,
    held_at timestamp with time zone DEFAULT clock_timestamp() NOT NULL
);

-- CONSTRAINT: held_jobs held_jobs_pkey
ALTER TABLE ONLY app.held_jobs
    ADD CONSTRAINT held_jobs_pkey PRIMARY KEY (job_id);

-- INDEX: held_jobs_admission_idx
CREATE INDEX held_jobs_admission_idx ON app.held_jobs USING btree (bucket, tenant_id, claim_key, created_at, job_id) INCLUDE (available_at);

-- INDEX: held_jobs_age_idx
CREATE INDEX held_jobs_age_idx ON app.held_jobs USING btree (bucket, held_at);

-- ROW SECURITY: held_jobs
ALTER TABLE app.held_jobs ENABLE ROW LEVEL SECURITY;

-- POLICY: held_jobs held_jobs_tenant_select
CREATE POLICY held_jobs_tenant_select ON app.held_jobs FOR SELECT TO authenticated USING ((tenant_id = ( SELECT app.current_tenant_id() AS current_tenant_id)));

-- ACL: TABLE held_jobs
GRANT SELECT ON TABLE app.held_jobs TO authenticated;

-- ======================================================================================
-- app.job_events
-- ======================================================================================

-- TABLE: job_events
-- The audit trail: one row per job transition, written in the same statement as the
-- transition; partitioned by UTC day (app_events), retention drops whole days.
CREATE TABLE app.job_events (
    -- Order of the events (app.job_event_sequence): a job's timeline is its events by
    -- sequence.
    sequence bigint NOT NULL,
    tenant_id uuid NOT NULL,
    job_id uuid NOT NULL,
    -- The transition: created, claimed, retry_scheduled, succeeded, dead, lease_expired,
    -- released, cancelled, cancel_requested or redriven.
    event_type text NOT NULL,
    -- Who made the transition: enqueue, the worker's owner id, watchdog (the reaper), or
    -- the name an operator gave.
    actor text NOT NULL,
    -- The transition's facts (a JSON object); sql/README.md lists the keys of each type.
    details jsonb DEFAULT '{}'::jsonb NOT NULL,
    created_at timestamp with time zone DEFAULT clock_timestamp() NOT NULL,
    -- The lease the transition happened under (a claim's new one); NULL for enqueue,
    -- cancel and redrive.
    lease_token uuid,
    CONSTRAINT job_events_actor_shape CHECK (((length(actor) >= 1) AND (length(actor) <= 200))),
    CONSTRAINT job_events_details_check CHECK ((jsonb_typeof(details) = 'object'::text)),
    CONSTRAINT job_events_event_type_check CHECK ((event_type = ANY (ARRAY['created'::text, 'claimed'::text, 'retry_scheduled'::text, 'succeeded'::text, 'dead'::text, 'lease_expired'::text, 'released'::text, 'cancelled'::text, 'redriven'::text, 'cancel_requested'::text])))
)
PARTITION BY RANGE (created_at);

-- SEQUENCE OWNED BY: job_event_sequence
ALTER SEQUENCE app.job_event_sequence OWNED BY app.job_events.sequence;

-- DEFAULT: job_events sequence
ALTER TABLE ONLY app.job_events ALTER COLUMN sequence SET DEFAULT nextval('app.job_event_sequence'::regclass);

-- INDEX: job_events_job_id_idx
CREATE INDEX job_events_job_id_idx ON ONLY app.job_events USING btree (job_id);

-- INDEX: job_events_succeeded_idx
CREATE INDEX job_events_succeeded_idx ON ONLY app.job_events USING btree (created_at) WHERE (event_type = 'succeeded'::text);

-- ROW SECURITY: job_events
ALTER TABLE app.job_events ENABLE ROW LEVEL SECURITY;

-- POLICY: job_events job_events_tenant_select
CREATE POLICY job_events_tenant_select ON app.job_events FOR SELECT TO authenticated USING ((tenant_id = ( SELECT app.current_tenant_id() AS current_tenant_id)));

-- ACL: columns of job_events
GRANT SELECT(sequence) ON TABLE app.job_events TO authenticated;
GRANT SELECT(tenant_id) ON TABLE app.job_events TO authenticated;
GRANT SELECT(job_id) ON TABLE app.job_events TO authenticated;
GRANT SELECT(event_type) ON TABLE app.job_events TO authenticated;
GRANT SELECT(actor) ON TABLE app.job_events TO authenticated;
GRANT SELECT(details) ON TABLE app.job_events TO authenticated;
GRANT SELECT(created_at) ON TABLE app.job_events TO authenticated;

-- ======================================================================================
-- app.jobs
-- ======================================================================================

-- TABLE: jobs
-- One row per job: what to run (kind, payload), for which tenant, its state and lease.
-- Written only by the app functions, each transition with its app.job_events row.
CREATE TABLE app.jobs (
    id uuid DEFAULT gen_random_uuid() NOT NULL,
    tenant_id uuid NOT NULL,
    -- The producer's idempotency key: one job per (tenant_id, operation_key); enqueueing
    -- the same job again returns it, a different job under the key is refused.
    operation_key text NOT NULL,
    -- Which registered handler runs the job; claims may take or leave kinds.
    kind text NOT NULL,
    -- The job's input, a JSON object, handed to the handler as stored.
    payload app.job_payload NOT NULL,
    -- pending, running (leased), retry_wait, or one of the final states succeeded, dead,
    -- cancelled.
    state app.job_state DEFAULT 'pending'::app.job_state NOT NULL,
    -- Claims so far: each claim adds one, a job given back unstarted gets its claim back,
    -- a redrive starts again at 0.
    attempts integer DEFAULT 0 NOT NULL,
    -- Claims allowed (1..20): a last attempt that fails or whose lease expires makes the
    -- job dead.
    max_attempts integer DEFAULT 6 NOT NULL,
    -- Earliest time a pending or retry_wait job may be claimed (a retry's backoff moves
    -- it).
    available_at timestamp with time zone DEFAULT clock_timestamp() NOT NULL,
    -- Owner id of the worker invocation holding the lease; set exactly while running.
    lease_owner text,
    -- Error document of the last failed attempt, NULL until one failed.
    last_error jsonb,
    -- The handler's result document once the job succeeded.
    result jsonb,
    created_at timestamp with time zone DEFAULT clock_timestamp() NOT NULL,
    updated_at timestamp with time zone DEFAULT clock_timestamp() NOT NULL,
    -- When the job reached a final state; retention counts from it. NULL while not final.
    completed_at timestamp with time zone,
    -- The producer's own reference for tracing (1..200 characters), stored as given.
    correlation_id text,
    cancel_requested_at timestamp with time zone,
    cancel_requested_by text,
    priority smallint DEFAULT 5 NOT NULL,
    claim_key timestamp with time zone NOT NULL,
    -- The final state once the job has one (succeeded, dead, cancelled), NULL before. No
    -- index names it (0032), so the outcome that sets it is a HOT update.
    outcome app.job_state GENERATED ALWAYS AS (
CASE
    WHEN (state = ANY (ARRAY['succeeded'::app.job_state, 'dead'::app.job_state, 'cancelled'::app.job_state])) THEN state
    ELSE NULL::app.job_state
END) STORED,
    -- The producer's limit key (1..200 characters): the jobs of one key share its limits.
    limit_key text,
    -- The limits the job was admitted through (NULL: none applied when it was enqueued).
    limit_buckets text[],
    -- The named queue whose workers claim the job; 'default' unless routed or named.
    queue text DEFAULT 'default'::text NOT NULL,
    -- dead or cancelled once the job ended so, else NULL: the unsuccessful lists index it,
    -- and it stays NULL when a job succeeds, so that outcome is a HOT update.
    unsuccessful app.job_state GENERATED ALWAYS AS (
CASE
    WHEN (state = ANY (ARRAY['dead'::app.job_state, 'cancelled'::app.job_state])) THEN state
    ELSE NULL::app.job_state
END) STORED,
    -- completed_at of a dead or cancelled job, else NULL (indexed with unsuccessful).
    unsuccessful_at timestamp with time zone GENERATED ALWAYS AS (
CASE
    WHEN (state = ANY (ARRAY['dead'::app.job_state, 'cancelled'::app.job_state])) THEN completed_at
    ELSE NULL::timestamp with time zone
END) STORED,
    CONSTRAINT jobs_attempts_check CHECK ((attempts >= 0)),
    CONSTRAINT jobs_available_at_finite CHECK (isfinite(available_at)),
    CONSTRAINT jobs_correlation_id_shape CHECK (((correlation_id IS NULL) OR ((length(correlation_id) >= 1) AND (length(correlation_id) <= 200)))),
    CONSTRAINT jobs_kind_shape CHECK ((((length(kind) >= 1) AND (length(kind) <= 128)) AND (kind !~ '^\s*$'::text))),
    CONSTRAINT jobs_lease_shape CHECK (((state = 'running'::app.job_state) = (lease_owner IS NOT NULL))),
    CONSTRAINT jobs_limit_key_shape CHECK (((limit_key IS NULL) OR (((length(limit_key) >= 1) AND (length(limit_key) <= 200)) AND (limit_key !~ '^\s*$'::text)))),
    CONSTRAINT jobs_max_attempts_check CHECK (((max_attempts >= 1) AND (max_attempts <= 20))),
    CONSTRAINT jobs_operation_key_shape CHECK ((((length(operation_key) >= 1) AND (length(operation_key) <= 255)) AND (operation_key !~ '^\s*$'::text))),
    CONSTRAINT jobs_priority_range CHECK (((priority >= 1) AND (priority <= 9)))
)
WITH (autovacuum_vacuum_scale_factor='0.01', autovacuum_vacuum_threshold='1000', autovacuum_analyze_scale_factor='0.02', autovacuum_vacuum_cost_delay='0', fillfactor='50');

-- CONSTRAINT: jobs jobs_operation_key_unique
ALTER TABLE ONLY app.jobs
    ADD CONSTRAINT jobs_operation_key_unique UNIQUE (tenant_id, operation_key);

-- CONSTRAINT: jobs jobs_pkey
ALTER TABLE ONLY app.jobs
    ADD CONSTRAINT jobs_pkey PRIMARY KEY (id, tenant_id);

-- CHECK CONSTRAINT: jobs jobs_cancel_request_shape
ALTER TABLE app.jobs
    ADD CONSTRAINT jobs_cancel_request_shape CHECK ((((cancel_requested_at IS NULL) = (cancel_requested_by IS NULL)) AND ((cancel_requested_by IS NULL) OR ((length(cancel_requested_by) >= 1) AND (length(cancel_requested_by) <= 200))) AND ((cancel_requested_at IS NULL) OR (state = ANY (ARRAY['running'::app.job_state, 'cancelled'::app.job_state]))))) NOT VALID;

-- CHECK CONSTRAINT: jobs jobs_queue_name
ALTER TABLE app.jobs
    ADD CONSTRAINT jobs_queue_name CHECK ((queue ~ '^[a-z][a-z0-9_-]{0,39}$'::text)) NOT VALID;

-- INDEX: jobs_dead_tenant_idx
CREATE INDEX jobs_dead_tenant_idx ON app.jobs USING btree (tenant_id, unsuccessful_at, id) INCLUDE (kind) WHERE (unsuccessful = 'dead'::app.job_state);

-- INDEX: jobs_unsuccessful_idx
CREATE INDEX jobs_unsuccessful_idx ON app.jobs USING btree (unsuccessful, unsuccessful_at, id) INCLUDE (tenant_id, kind) WHERE (unsuccessful IS NOT NULL);

-- TRIGGER: jobs jobs_claimable_on_insert
CREATE TRIGGER jobs_claimable_on_insert AFTER INSERT ON app.jobs REFERENCING NEW TABLE AS added FOR EACH STATEMENT EXECUTE FUNCTION app.claimable_added();

-- TRIGGER: jobs jobs_claimable_on_update
CREATE TRIGGER jobs_claimable_on_update AFTER UPDATE ON app.jobs FOR EACH ROW WHEN (((new.state <> 'running'::app.job_state) AND ((old.state = ANY (ARRAY['pending'::app.job_state, 'retry_wait'::app.job_state])) OR (new.state = ANY (ARRAY['pending'::app.job_state, 'retry_wait'::app.job_state]))) AND ((old.state IS DISTINCT FROM new.state) OR (old.claim_key IS DISTINCT FROM new.claim_key) OR (old.available_at IS DISTINCT FROM new.available_at) OR (old.kind IS DISTINCT FROM new.kind) OR (old.created_at IS DISTINCT FROM new.created_at) OR (old.priority IS DISTINCT FROM new.priority) OR (old.tenant_id IS DISTINCT FROM new.tenant_id) OR (old.queue IS DISTINCT FROM new.queue)))) EXECUTE FUNCTION app.claimable_moved();

-- TRIGGER: jobs jobs_fill_claim_key
CREATE TRIGGER jobs_fill_claim_key BEFORE INSERT ON app.jobs FOR EACH ROW WHEN ((new.claim_key IS NULL)) EXECUTE FUNCTION app.fill_claim_key();

-- TRIGGER: jobs jobs_limits_state
CREATE TRIGGER jobs_limits_state AFTER UPDATE OF state ON app.jobs FOR EACH ROW WHEN (((old.limit_buckets IS NOT NULL) AND (old.state IS DISTINCT FROM new.state) AND ((new.state = ANY (ARRAY['succeeded'::app.job_state, 'dead'::app.job_state, 'cancelled'::app.job_state])) OR ((old.state = ANY (ARRAY['succeeded'::app.job_state, 'dead'::app.job_state, 'cancelled'::app.job_state])) AND (new.state = 'pending'::app.job_state))))) EXECUTE FUNCTION app.limits_on_state_change();

-- TRIGGER: jobs jobs_refresh_claim_key
CREATE TRIGGER jobs_refresh_claim_key AFTER UPDATE OF available_at, priority ON app.jobs FOR EACH ROW WHEN (((NOT (new.claim_key IS DISTINCT FROM old.claim_key)) AND ((new.available_at IS DISTINCT FROM old.available_at) OR (new.priority IS DISTINCT FROM old.priority)))) EXECUTE FUNCTION app.refresh_claim_key();

-- TRIGGER: jobs jobs_succeeded_event_follows
CREATE TRIGGER jobs_succeeded_event_follows AFTER UPDATE OF completed_at ON app.jobs FOR EACH ROW WHEN (((old.state = 'succeeded'::app.job_state) AND (new.state = 'succeeded'::app.job_state) AND (new.completed_at IS DISTINCT FROM old.completed_at) AND (new.completed_at IS NOT NULL))) EXECUTE FUNCTION app.move_succeeded_event();

-- ROW SECURITY: jobs
ALTER TABLE app.jobs ENABLE ROW LEVEL SECURITY;

-- POLICY: jobs jobs_tenant_select
CREATE POLICY jobs_tenant_select ON app.jobs FOR SELECT TO authenticated USING ((tenant_id = ( SELECT app.current_tenant_id() AS current_tenant_id)));

-- ACL: columns of jobs
GRANT SELECT(id) ON TABLE app.jobs TO authenticated;
GRANT SELECT(tenant_id) ON TABLE app.jobs TO authenticated;
GRANT SELECT(operation_key) ON TABLE app.jobs TO authenticated;
GRANT SELECT(kind) ON TABLE app.jobs TO authenticated;
GRANT SELECT(payload) ON TABLE app.jobs TO authenticated;
GRANT SELECT(state) ON TABLE app.jobs TO authenticated;
GRANT SELECT(attempts) ON TABLE app.jobs TO authenticated;
GRANT SELECT(max_attempts) ON TABLE app.jobs TO authenticated;
GRANT SELECT(available_at) ON TABLE app.jobs TO authenticated;
GRANT SELECT(lease_owner) ON TABLE app.jobs TO authenticated;
GRANT SELECT(last_error) ON TABLE app.jobs TO authenticated;
GRANT SELECT(result) ON TABLE app.jobs TO authenticated;
GRANT SELECT(created_at) ON TABLE app.jobs TO authenticated;
GRANT SELECT(updated_at) ON TABLE app.jobs TO authenticated;
GRANT SELECT(completed_at) ON TABLE app.jobs TO authenticated;
GRANT SELECT(correlation_id) ON TABLE app.jobs TO authenticated;
GRANT SELECT(cancel_requested_at) ON TABLE app.jobs TO authenticated;
GRANT SELECT(cancel_requested_by) ON TABLE app.jobs TO authenticated;
GRANT SELECT(priority) ON TABLE app.jobs TO authenticated;
GRANT SELECT(claim_key) ON TABLE app.jobs TO authenticated;
GRANT SELECT(outcome) ON TABLE app.jobs TO authenticated;
GRANT SELECT(limit_key) ON TABLE app.jobs TO authenticated;
GRANT SELECT(limit_buckets) ON TABLE app.jobs TO authenticated;
GRANT SELECT(queue) ON TABLE app.jobs TO authenticated;
GRANT SELECT(unsuccessful) ON TABLE app.jobs TO authenticated;
GRANT SELECT(unsuccessful_at) ON TABLE app.jobs TO authenticated;

-- ======================================================================================
-- app.kind_turns
-- ======================================================================================

-- TABLE: kind_turns
-- The same turns per queue, tenant and kind, for claims that take or leave kinds.
CREATE TABLE app.kind_turns (
    tenant_id uuid NOT NULL,
    kind text NOT NULL,
    turn_at timestamp with time zone,
    -- The queue whose claims take this turn.
    queue text DEFAULT 'default'::text NOT NULL
);

-- CONSTRAINT: kind_turns kind_turns_pkey
ALTER TABLE ONLY app.kind_turns
    ADD CONSTRAINT kind_turns_pkey PRIMARY KEY (queue, tenant_id, kind);

-- INDEX: kind_turns_due_idx
CREATE INDEX kind_turns_due_idx ON app.kind_turns USING btree (queue, kind, turn_at, tenant_id) WHERE (turn_at IS NOT NULL);

-- ROW SECURITY: kind_turns
ALTER TABLE app.kind_turns ENABLE ROW LEVEL SECURITY;

-- ======================================================================================
-- app.leases
-- ======================================================================================

-- TABLE: leases
-- One row per running job: who holds it, the fencing token and when it ends. Renewals are
-- HOT updates (no index on expires_at).
CREATE TABLE app.leases (
    job_id uuid NOT NULL,
    tenant_id uuid NOT NULL,
    -- Owner id of the worker invocation holding the lease, as on the job row.
    lease_owner text NOT NULL,
    -- Fences the lease: finishing or renewing needs it, so a worker whose lease expired
    -- cannot finish the next holder's attempt. Never granted to tenant readers.
    lease_token uuid NOT NULL,
    -- When the lease ends; the reaper then makes the job retry_wait again, or dead at its
    -- last attempt. Renewals move it in place (HOT: no index holds it).
    expires_at timestamp with time zone NOT NULL,
    -- When the claim that holds the lease took the job.
    claimed_at timestamp with time zone NOT NULL
)
WITH (fillfactor='50', autovacuum_vacuum_scale_factor='0.0', autovacuum_vacuum_threshold='1000', autovacuum_analyze_scale_factor='0.05', autovacuum_vacuum_cost_delay='0');

-- CONSTRAINT: leases leases_pkey
ALTER TABLE ONLY app.leases
    ADD CONSTRAINT leases_pkey PRIMARY KEY (job_id);

-- ROW SECURITY: leases
ALTER TABLE app.leases ENABLE ROW LEVEL SECURITY;

-- POLICY: leases leases_tenant_select
CREATE POLICY leases_tenant_select ON app.leases FOR SELECT TO authenticated USING ((tenant_id = ( SELECT app.current_tenant_id() AS current_tenant_id)));

-- ACL: columns of leases
GRANT SELECT(job_id) ON TABLE app.leases TO authenticated;
GRANT SELECT(tenant_id) ON TABLE app.leases TO authenticated;
GRANT SELECT(lease_owner) ON TABLE app.leases TO authenticated;
GRANT SELECT(expires_at) ON TABLE app.leases TO authenticated;
GRANT SELECT(claimed_at) ON TABLE app.leases TO authenticated;

-- ======================================================================================
-- app.limit_slots
-- ======================================================================================

-- TABLE: limit_slots
-- Numbered slots of each limit, taken at admission: the primary key lets no two jobs hold
-- one.
CREATE TABLE app.limit_slots (
    bucket text NOT NULL,
    purpose text NOT NULL,
    slot integer NOT NULL,
    job_id uuid NOT NULL,
    tenant_id uuid NOT NULL,
    taken_at timestamp with time zone DEFAULT clock_timestamp() NOT NULL,
    CONSTRAINT limit_slots_purpose_check CHECK ((purpose = ANY (ARRAY['run'::text, 'start'::text]))),
    CONSTRAINT limit_slots_slot_check CHECK ((slot >= 0))
);

-- CONSTRAINT: limit_slots limit_slots_pkey
ALTER TABLE ONLY app.limit_slots
    ADD CONSTRAINT limit_slots_pkey PRIMARY KEY (bucket, purpose, slot);

-- INDEX: limit_slots_job_idx
CREATE UNIQUE INDEX limit_slots_job_idx ON app.limit_slots USING btree (job_id, bucket, purpose);

-- ROW SECURITY: limit_slots
ALTER TABLE app.limit_slots ENABLE ROW LEVEL SECURITY;

-- ======================================================================================
-- app.limit_starts
-- ======================================================================================

-- TABLE: limit_starts
-- Each rate limit's start slots and when each last started a job.
CREATE TABLE app.limit_starts (
    bucket text NOT NULL,
    slot integer NOT NULL,
    started_at timestamp with time zone NOT NULL
);

-- CONSTRAINT: limit_starts limit_starts_pkey
ALTER TABLE ONLY app.limit_starts
    ADD CONSTRAINT limit_starts_pkey PRIMARY KEY (bucket, slot);

-- ROW SECURITY: limit_starts
ALTER TABLE app.limit_starts ENABLE ROW LEVEL SECURITY;

-- ======================================================================================
-- app.limit_turns
-- ======================================================================================

-- TABLE: limit_turns
-- Per limit and tenant, the admissions since its jobs began waiting: the fewest go first.
CREATE TABLE app.limit_turns (
    bucket text NOT NULL,
    tenant_id uuid NOT NULL,
    served bigint DEFAULT 0 NOT NULL
);

-- CONSTRAINT: limit_turns limit_turns_pkey
ALTER TABLE ONLY app.limit_turns
    ADD CONSTRAINT limit_turns_pkey PRIMARY KEY (bucket, tenant_id);

-- INDEX: limit_turns_order_idx
CREATE INDEX limit_turns_order_idx ON app.limit_turns USING btree (bucket, served, tenant_id);

-- ROW SECURITY: limit_turns
ALTER TABLE app.limit_turns ENABLE ROW LEVEL SECURITY;

-- ======================================================================================
-- app.limits
-- ======================================================================================

-- TABLE: limits
-- Concurrency and rate limits by kind, tenant, kind per tenant or key; an operator's row
-- over the code's.
CREATE TABLE app.limits (
    scope text NOT NULL,
    kind text,
    tenant_id uuid,
    limit_key text,
    source text DEFAULT 'operator'::text NOT NULL,
    concurrency integer,
    rate_count integer,
    rate_period interval,
    burst integer,
    updated_at timestamp with time zone DEFAULT clock_timestamp() NOT NULL,
    updated_by text DEFAULT 'owner'::text NOT NULL,
    CONSTRAINT limits_burst_range CHECK (((burst IS NULL) OR ((rate_count IS NOT NULL) AND ((burst >= 1) AND (burst <= rate_count))))),
    CONSTRAINT limits_concurrency_range CHECK (((concurrency IS NULL) OR ((concurrency >= 1) AND (concurrency <= 10000)))),
    CONSTRAINT limits_kind_check CHECK (((kind IS NULL) OR ((length(kind) >= 1) AND (length(kind) <= 128)))),
    CONSTRAINT limits_limit_key_check CHECK (((limit_key IS NULL) OR ((length(limit_key) >= 1) AND (length(limit_key) <= 200)))),
    CONSTRAINT limits_rate_count_range CHECK (((rate_count IS NULL) OR ((rate_count >= 1) AND (rate_count <= 10000)))),
    CONSTRAINT limits_rate_period_range CHECK (((rate_period IS NULL) OR ((rate_period >= '00:00:01'::interval) AND (rate_period <= '1 day'::interval)))),
    CONSTRAINT limits_rate_shape CHECK (((rate_count IS NULL) = (rate_period IS NULL))),
    CONSTRAINT limits_scope_check CHECK ((scope = ANY (ARRAY['kind'::text, 'tenant'::text, 'kind_tenant'::text, 'key'::text]))),
    CONSTRAINT limits_something_check CHECK (((concurrency IS NOT NULL) OR (rate_count IS NOT NULL))),
    CONSTRAINT limits_source_check CHECK ((source = ANY (ARRAY['operator'::text, 'code'::text]))),
    CONSTRAINT limits_subject_shape CHECK (
CASE scope
    WHEN 'kind'::text THEN ((kind IS NOT NULL) AND (tenant_id IS NULL) AND (limit_key IS NULL))
    WHEN 'tenant'::text THEN ((kind IS NULL) AND (limit_key IS NULL))
    WHEN 'kind_tenant'::text THEN ((kind IS NOT NULL) AND (limit_key IS NULL))
    ELSE ((limit_key IS NOT NULL) AND (kind IS NULL) AND (tenant_id IS NULL))
END),
    CONSTRAINT limits_updated_by_check CHECK (((length(updated_by) >= 1) AND (length(updated_by) <= 200)))
);

-- INDEX: limits_subject_idx
CREATE UNIQUE INDEX limits_subject_idx ON app.limits USING btree (scope, COALESCE(kind, ''::text), COALESCE(tenant_id, '00000000-0000-0000-0000-000000000000'::uuid), COALESCE(limit_key, ''::text), source);

-- ROW SECURITY: limits
ALTER TABLE app.limits ENABLE ROW LEVEL SECURITY;

-- ======================================================================================
-- app.queue_events
-- ======================================================================================

-- TABLE: queue_events
-- Every pause and resume of a queue, with the operator's identity and the login.
CREATE TABLE app.queue_events (
    id uuid DEFAULT gen_random_uuid() NOT NULL,
    queue text NOT NULL,
    event_type text NOT NULL,
    actor text NOT NULL,
    -- The database login (session_user) that made the change.
    login text DEFAULT SESSION_USER NOT NULL,
    reason text,
    created_at timestamp with time zone DEFAULT clock_timestamp() NOT NULL,
    CONSTRAINT queue_events_actor_check CHECK (((length(actor) >= 1) AND (length(actor) <= 200))),
    CONSTRAINT queue_events_type_check CHECK ((event_type = ANY (ARRAY['paused'::text, 'resumed'::text])))
);

-- CONSTRAINT: queue_events queue_events_pkey
ALTER TABLE ONLY app.queue_events
    ADD CONSTRAINT queue_events_pkey PRIMARY KEY (id);

-- FK CONSTRAINT: queue_events queue_events_queue_fkey
ALTER TABLE ONLY app.queue_events
    ADD CONSTRAINT queue_events_queue_fkey FOREIGN KEY (queue) REFERENCES app.queues(name);

-- INDEX: queue_events_queue_idx
CREATE INDEX queue_events_queue_idx ON app.queue_events USING btree (queue, created_at);

-- ROW SECURITY: queue_events
ALTER TABLE app.queue_events ENABLE ROW LEVEL SECURITY;

-- ======================================================================================
-- app.queue_kinds
-- ======================================================================================

-- TABLE: queue_kinds
-- The owner's routes: a job enqueued without a queue goes to its kind's queue.
CREATE TABLE app.queue_kinds (
    kind text NOT NULL,
    queue text NOT NULL,
    updated_at timestamp with time zone DEFAULT clock_timestamp() NOT NULL,
    CONSTRAINT queue_kinds_kind_check CHECK (((length(kind) >= 1) AND (length(kind) <= 128)))
);

-- CONSTRAINT: queue_kinds queue_kinds_pkey
ALTER TABLE ONLY app.queue_kinds
    ADD CONSTRAINT queue_kinds_pkey PRIMARY KEY (kind);

-- FK CONSTRAINT: queue_kinds queue_kinds_queue_fkey
ALTER TABLE ONLY app.queue_kinds
    ADD CONSTRAINT queue_kinds_queue_fkey FOREIGN KEY (queue) REFERENCES app.queues(name);

-- ROW SECURITY: queue_kinds
ALTER TABLE app.queue_kinds ENABLE ROW LEVEL SECURITY;

-- ======================================================================================
-- app.queue_workers
-- ======================================================================================

-- TABLE: queue_workers
-- Each named queue's worker function, registered by the queue's deploy: what an enqueue
-- wakes, and what the connection budget counts.
CREATE TABLE app.queue_workers (
    queue text NOT NULL,
    function_name text NOT NULL,
    -- Database connections the queue's worker can open (its reserved concurrency).
    connections integer NOT NULL,
    -- The stack that registered the worker; only its delete unregisters it.
    stack_id text NOT NULL,
    registered_at timestamp with time zone DEFAULT clock_timestamp() NOT NULL,
    updated_at timestamp with time zone DEFAULT clock_timestamp() NOT NULL,
    CONSTRAINT queue_workers_connections_range CHECK (((connections >= 0) AND (connections <= 10000))),
    CONSTRAINT queue_workers_function_shape CHECK (((function_name ~ '^(arn:aws[a-zA-Z-]*:lambda:[a-z0-9-]+:[0-9]{12}:function:)?[A-Za-z0-9_-]{1,64}(:[A-Za-z0-9_$-]{1,128})?$'::text) AND (length(function_name) <= 170))),
    CONSTRAINT queue_workers_queue_name CHECK ((queue ~ '^[a-z][a-z0-9_-]{0,39}$'::text)),
    CONSTRAINT queue_workers_stack_shape CHECK (((length(stack_id) >= 1) AND (length(stack_id) <= 2048)))
);

-- CONSTRAINT: queue_workers queue_workers_pkey
ALTER TABLE ONLY app.queue_workers
    ADD CONSTRAINT queue_workers_pkey PRIMARY KEY (queue);

-- ROW SECURITY: queue_workers
ALTER TABLE app.queue_workers ENABLE ROW LEVEL SECURITY;

-- ======================================================================================
-- app.queues
-- ======================================================================================

-- TABLE: queues
-- Named queues with a state of their own: paused or not, the owner's worker limit.
CREATE TABLE app.queues (
    name text NOT NULL,
    -- The owner's most worker pool places of this queue; NULL: app.settings.max_workers.
    max_workers integer,
    -- Set while paused: the queue's jobs are not claimed, its pool neither fans out nor
    -- wakes.
    paused_at timestamp with time zone,
    paused_by text,
    pause_reason text,
    created_at timestamp with time zone DEFAULT clock_timestamp() NOT NULL,
    updated_at timestamp with time zone DEFAULT clock_timestamp() NOT NULL,
    CONSTRAINT queues_max_workers_range CHECK (((max_workers >= 0) AND (max_workers <= 1000))),
    CONSTRAINT queues_name_check CHECK ((name ~ '^[a-z][a-z0-9_-]{0,39}$'::text)),
    CONSTRAINT queues_pause_shape CHECK ((((paused_at IS NULL) = (paused_by IS NULL)) AND ((pause_reason IS NULL) OR (paused_at IS NOT NULL)) AND ((paused_by IS NULL) OR ((length(paused_by) >= 1) AND (length(paused_by) <= 200))) AND ((pause_reason IS NULL) OR ((length(pause_reason) >= 1) AND (length(pause_reason) <= 500)))))
);

-- CONSTRAINT: queues queues_pkey
ALTER TABLE ONLY app.queues
    ADD CONSTRAINT queues_pkey PRIMARY KEY (name);

-- INDEX: queues_paused_idx
CREATE INDEX queues_paused_idx ON app.queues USING btree (name) WHERE (paused_at IS NOT NULL);

-- ROW SECURITY: queues
ALTER TABLE app.queues ENABLE ROW LEVEL SECURITY;

-- ======================================================================================
-- app.schedules
-- ======================================================================================

-- TABLE: schedules
CREATE TABLE app.schedules (
    id uuid DEFAULT gen_random_uuid() NOT NULL,
    tenant_id uuid NOT NULL,
    name text NOT NULL,
    kind text NOT NULL,
    payload jsonb DEFAULT '{}'::jsonb NOT NULL,
    expression text NOT NULL,
    time_zone text DEFAULT 'UTC'::text NOT NULL,
    fill_limit integer DEFAULT 0 NOT NULL,
    max_attempts integer DEFAULT 6 NOT NULL,
    paused boolean DEFAULT false NOT NULL,
    source text DEFAULT 'operator'::text NOT NULL,
    next_slot timestamp with time zone NOT NULL,
    last_slot timestamp with time zone,
    last_job_id uuid,
    last_enqueued_at timestamp with time zone,
    slots_enqueued bigint DEFAULT 0 NOT NULL,
    slots_missed bigint DEFAULT 0 NOT NULL,
    created_at timestamp with time zone DEFAULT clock_timestamp() NOT NULL,
    updated_at timestamp with time zone DEFAULT clock_timestamp() NOT NULL,
    CONSTRAINT schedules_expression_check CHECK (((length(expression) >= 1) AND (length(expression) <= 200))),
    CONSTRAINT schedules_fill_limit_check CHECK (((fill_limit >= 0) AND (fill_limit <= 1000))),
    CONSTRAINT schedules_kind_check CHECK (((length(kind) >= 1) AND (length(kind) <= 128))),
    CONSTRAINT schedules_max_attempts_check CHECK (((max_attempts >= 1) AND (max_attempts <= 20))),
    CONSTRAINT schedules_name_check CHECK (((length(name) >= 1) AND (length(name) <= 128))),
    CONSTRAINT schedules_payload_check CHECK ((jsonb_typeof(payload) = 'object'::text)),
    CONSTRAINT schedules_source_check CHECK ((source = ANY (ARRAY['operator'::text, 'code'::text]))),
    CONSTRAINT schedules_time_zone_check CHECK (((length(time_zone) >= 1) AND (length(time_zone) <= 64)))
);

-- CONSTRAINT: schedules schedules_pkey
ALTER TABLE ONLY app.schedules
    ADD CONSTRAINT schedules_pkey PRIMARY KEY (id);

-- CONSTRAINT: schedules schedules_tenant_name_key
ALTER TABLE ONLY app.schedules
    ADD CONSTRAINT schedules_tenant_name_key UNIQUE (tenant_id, name);

-- INDEX: schedules_due_idx
CREATE INDEX schedules_due_idx ON app.schedules USING btree (next_slot) WHERE (NOT paused);

-- ROW SECURITY: schedules
ALTER TABLE app.schedules ENABLE ROW LEVEL SECURITY;

-- ======================================================================================
-- app.schema_functions
-- ======================================================================================

-- TABLE: schema_functions
-- The function files applied, each with the SHA-256 of its text: re-applied when it
-- changes.
CREATE TABLE app.schema_functions (
    file text NOT NULL,
    checksum text NOT NULL,
    applied_at timestamp with time zone DEFAULT clock_timestamp() NOT NULL,
    applied_by text DEFAULT CURRENT_USER NOT NULL
);

-- CONSTRAINT: schema_functions schema_functions_pkey
ALTER TABLE ONLY app.schema_functions
    ADD CONSTRAINT schema_functions_pkey PRIMARY KEY (file);

-- ======================================================================================
-- app.schema_migrations
-- ======================================================================================

-- TABLE: schema_migrations
-- The migrations applied (leaseq.migrate), each with the SHA-256 of its file.
CREATE TABLE app.schema_migrations (
    version integer NOT NULL,
    name text NOT NULL,
    checksum text NOT NULL,
    applied_at timestamp with time zone DEFAULT clock_timestamp() NOT NULL,
    applied_by text DEFAULT CURRENT_USER NOT NULL
);

-- CONSTRAINT: schema_migrations schema_migrations_pkey
ALTER TABLE ONLY app.schema_migrations
    ADD CONSTRAINT schema_migrations_pkey PRIMARY KEY (version);

-- ======================================================================================
-- app.settings
-- ======================================================================================

-- TABLE: settings
-- The schema owner's settings, one row: the retention floor and the worker pool's limits.
-- Only the owner writes it.
CREATE TABLE app.settings (
    singleton boolean DEFAULT true NOT NULL,
    -- The reaper never prunes a finished job younger than this.
    min_retention interval DEFAULT '1 day'::interval NOT NULL,
    updated_at timestamp with time zone DEFAULT clock_timestamp() NOT NULL,
    -- Most worker pool places at once; 0: no fan-out and no wake.
    max_workers integer DEFAULT 4 NOT NULL,
    -- How long a reserved place or a wake's ticket waits for its invocation.
    start_hold interval DEFAULT '00:01:30'::interval NOT NULL,
    -- Each login wakes a worker at most once per this long.
    wake_debounce interval DEFAULT '00:00:01'::interval NOT NULL,
    priority_step interval DEFAULT '00:01:00'::interval NOT NULL,
    schedule_grace interval DEFAULT '00:05:00'::interval NOT NULL,
    schedule_window interval DEFAULT '12:00:00'::interval NOT NULL,
    CONSTRAINT settings_max_workers_range CHECK (((max_workers >= 0) AND (max_workers <= 1000))),
    CONSTRAINT settings_min_retention_range CHECK (((min_retention >= '00:00:00'::interval) AND (min_retention <= '3650 days'::interval))),
    CONSTRAINT settings_one_row CHECK (singleton),
    CONSTRAINT settings_priority_step_range CHECK (((priority_step >= '00:00:01'::interval) AND (priority_step <= '1 day'::interval))),
    CONSTRAINT settings_schedule_grace_range CHECK (((schedule_grace >= '00:01:00'::interval) AND (schedule_grace <= '01:00:00'::interval))),
    CONSTRAINT settings_schedule_window_range CHECK (((schedule_window >= '00:01:00'::interval) AND (schedule_window <= '30 days'::interval))),
    CONSTRAINT settings_start_hold_range CHECK (((start_hold >= '00:00:01'::interval) AND (start_hold <= '00:15:00'::interval))),
    CONSTRAINT settings_wake_debounce_range CHECK (((wake_debounce >= '00:00:00'::interval) AND (wake_debounce <= '01:00:00'::interval)))
);

-- CONSTRAINT: settings settings_pkey
ALTER TABLE ONLY app.settings
    ADD CONSTRAINT settings_pkey PRIMARY KEY (singleton);

-- ======================================================================================
-- app.tenant_producers
-- ======================================================================================

-- TABLE: tenant_producers
-- Binds a member of leaseq_tenant_producer to a tenant it may enqueue for and read results
-- of.
CREATE TABLE app.tenant_producers (
    role_name regrole NOT NULL,
    tenant_id uuid NOT NULL,
    created_at timestamp with time zone DEFAULT clock_timestamp() NOT NULL
);

-- CONSTRAINT: tenant_producers tenant_producers_pkey
ALTER TABLE ONLY app.tenant_producers
    ADD CONSTRAINT tenant_producers_pkey PRIMARY KEY (role_name, tenant_id);

-- ======================================================================================
-- app.tenant_readers
-- ======================================================================================

-- TABLE: tenant_readers
-- Binds a reader login (a member of authenticated) to the tenant whose jobs and events
-- row-level security lets it see.
CREATE TABLE app.tenant_readers (
    role_name regrole NOT NULL,
    tenant_id uuid NOT NULL,
    created_at timestamp with time zone DEFAULT clock_timestamp() NOT NULL
);

-- CONSTRAINT: tenant_readers tenant_readers_pkey
ALTER TABLE ONLY app.tenant_readers
    ADD CONSTRAINT tenant_readers_pkey PRIMARY KEY (role_name, tenant_id);

-- ROW SECURITY: tenant_readers
ALTER TABLE app.tenant_readers ENABLE ROW LEVEL SECURITY;

-- POLICY: tenant_readers tenant_readers_self
CREATE POLICY tenant_readers_self ON app.tenant_readers FOR SELECT TO authenticated USING (((role_name)::oid = ( SELECT r.oid
   FROM pg_roles r
  WHERE (r.rolname = CURRENT_USER))));

-- ACL: TABLE tenant_readers
GRANT SELECT ON TABLE app.tenant_readers TO authenticated;

-- ======================================================================================
-- app.tenant_turn_sweep
-- ======================================================================================

-- TABLE: tenant_turn_sweep
-- One row: the cursor of app.repair_tenant_turns, which rebuilds missing or late turns.
CREATE TABLE app.tenant_turn_sweep (
    only_row boolean DEFAULT true NOT NULL,
    next_tenant_id uuid,
    swept_at timestamp with time zone,
    -- With next_tenant_id: the (queue, tenant) the next repair page starts from.
    next_queue text,
    CONSTRAINT tenant_turn_sweep_only_row_check CHECK (only_row)
);

-- CONSTRAINT: tenant_turn_sweep tenant_turn_sweep_pkey
ALTER TABLE ONLY app.tenant_turn_sweep
    ADD CONSTRAINT tenant_turn_sweep_pkey PRIMARY KEY (only_row);

-- ROW SECURITY: tenant_turn_sweep
ALTER TABLE app.tenant_turn_sweep ENABLE ROW LEVEL SECURITY;

-- ======================================================================================
-- app.tenant_turns
-- ======================================================================================

-- TABLE: tenant_turns
-- When each tenant is next due a turn of the fair claim in each queue; NULL: nothing
-- claimable.
CREATE TABLE app.tenant_turns (
    tenant_id uuid NOT NULL,
    turn_at timestamp with time zone,
    -- The queue whose claims take this turn: every queue keeps its own round robin.
    queue text DEFAULT 'default'::text NOT NULL
);

-- CONSTRAINT: tenant_turns tenant_turns_pkey
ALTER TABLE ONLY app.tenant_turns
    ADD CONSTRAINT tenant_turns_pkey PRIMARY KEY (queue, tenant_id);

-- INDEX: tenant_turns_due_idx
CREATE INDEX tenant_turns_due_idx ON app.tenant_turns USING btree (queue, turn_at, tenant_id) WHERE (turn_at IS NOT NULL);

-- ROW SECURITY: tenant_turns
ALTER TABLE app.tenant_turns ENABLE ROW LEVEL SECURITY;

-- ======================================================================================
-- app.worker_pool
-- ======================================================================================

-- TABLE: worker_pool
-- The places of worker invocations: reserved (owner NULL) for one on its way, or held by a
-- running one; each expires by itself.
CREATE TABLE app.worker_pool (
    id uuid DEFAULT gen_random_uuid() NOT NULL,
    owner text,
    reason text NOT NULL,
    created_at timestamp with time zone DEFAULT clock_timestamp() NOT NULL,
    expires_at timestamp with time zone NOT NULL,
    extra boolean DEFAULT false NOT NULL,
    -- The queue whose workers this place counts for: each queue has its own pool.
    queue text DEFAULT 'default'::text NOT NULL,
    CONSTRAINT worker_pool_extra_check CHECK (((NOT extra) OR ((owner IS NOT NULL) AND (reason = ANY (ARRAY['schedule'::text, 'manual'::text]))))),
    CONSTRAINT worker_pool_owner_check CHECK (((owner IS NULL) OR ((length(owner) >= 1) AND (length(owner) <= 200)))),
    CONSTRAINT worker_pool_queue_name CHECK ((queue ~ '^[a-z][a-z0-9_-]{0,39}$'::text)),
    CONSTRAINT worker_pool_reason_check CHECK ((reason = ANY (ARRAY['schedule'::text, 'manual'::text, 'fanout'::text, 'wake'::text])))
);

-- CONSTRAINT: worker_pool worker_pool_owner_key
ALTER TABLE ONLY app.worker_pool
    ADD CONSTRAINT worker_pool_owner_key UNIQUE (owner);

-- CONSTRAINT: worker_pool worker_pool_pkey
ALTER TABLE ONLY app.worker_pool
    ADD CONSTRAINT worker_pool_pkey PRIMARY KEY (id);

-- INDEX: worker_pool_expires_idx
CREATE INDEX worker_pool_expires_idx ON app.worker_pool USING btree (expires_at);

-- INDEX: worker_pool_one_extra_idx
CREATE UNIQUE INDEX worker_pool_one_extra_idx ON app.worker_pool USING btree (queue) WHERE extra;

-- INDEX: worker_pool_queue_idx
CREATE INDEX worker_pool_queue_idx ON app.worker_pool USING btree (queue, expires_at);

-- ROW SECURITY: worker_pool
ALTER TABLE app.worker_pool ENABLE ROW LEVEL SECURITY;

-- ======================================================================================
-- app.worker_pool_state
-- ======================================================================================

-- TABLE: worker_pool_state
-- One row whose lock serialises every change of the worker pool, so it never passes its
-- maximum.
CREATE TABLE app.worker_pool_state (
    only_row boolean DEFAULT true NOT NULL,
    changed_at timestamp with time zone,
    CONSTRAINT worker_pool_state_only_row_check CHECK (only_row)
);

-- CONSTRAINT: worker_pool_state worker_pool_state_pkey
ALTER TABLE ONLY app.worker_pool_state
    ADD CONSTRAINT worker_pool_state_pkey PRIMARY KEY (only_row);

-- ROW SECURITY: worker_pool_state
ALTER TABLE app.worker_pool_state ENABLE ROW LEVEL SECURITY;

-- ======================================================================================
-- app.worker_wakes
-- ======================================================================================

-- TABLE: worker_wakes
-- Each login's last wake and the ticket it handed out, for the wake's debounce.
CREATE TABLE app.worker_wakes (
    waker regrole NOT NULL,
    woken_at timestamp with time zone NOT NULL,
    ticket uuid,
    ticket_expires_at timestamp with time zone,
    queue text DEFAULT 'default'::text NOT NULL,
    CONSTRAINT worker_wakes_queue_name CHECK ((queue ~ '^[a-z][a-z0-9_-]{0,39}$'::text)),
    CONSTRAINT worker_wakes_ticket_check CHECK (((ticket IS NULL) = (ticket_expires_at IS NULL)))
);

-- CONSTRAINT: worker_wakes worker_wakes_pkey
ALTER TABLE ONLY app.worker_wakes
    ADD CONSTRAINT worker_wakes_pkey PRIMARY KEY (waker, queue);

-- CONSTRAINT: worker_wakes worker_wakes_ticket_key
ALTER TABLE ONLY app.worker_wakes
    ADD CONSTRAINT worker_wakes_ticket_key UNIQUE (ticket);

-- ROW SECURITY: worker_wakes
ALTER TABLE app.worker_wakes ENABLE ROW LEVEL SECURITY;
