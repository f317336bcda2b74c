-- leaseq 0025: concurrency and rate limits, enforced when a job is admitted.
--
-- A limit caps the jobs of a kind, of a tenant, of a kind per tenant, or of a key the
-- producer names (app.jobs.limit_key): at most N running at once (concurrency), and/or at
-- most R starts per period (rate, with a burst). functions/admission.sql holds the rules;
-- this migration holds their tables and the one trigger that frees a job's slots.
--
-- Admission, not claim: a job under a limit takes a numbered slot of each of its limits
-- when it becomes claimable (at enqueue, or when a slot frees), and gives it back when it
-- ends (succeeded, dead, cancelled). A job that finds a limit full is *held*: its
-- available_at and claim_key move to app.held_until() (past every claim's index bound,
-- so no claim, turn or backlog count ever reads it) and its real due time and claim key
-- wait in app.held_jobs, whence the statement that frees a slot admits the next one.
-- Slots are rows of app.limit_slots whose primary key (bucket, purpose, slot) makes two
-- admissions of one slot impossible whatever races, transactions held open included.

alter table app.jobs
  add column limit_key text
    constraint jobs_limit_key_shape
    check (limit_key is null or (length(limit_key) between 1 and 200 and limit_key !~ '^\s*$')),
  add column limit_buckets text[];

comment on column app.jobs.limit_key is
  'The producer''s limit key (1..200 characters): the jobs of one key share its limits.';
comment on column app.jobs.limit_buckets is
  'The limits the job was admitted through (NULL: none applied when it was enqueued).';

-- The declared limits. One row per (scope, subject, source): a limit declared with its
-- handler (source code, written by app.sync_limits) and one an operator set at run time
-- (source operator, app.set_limit) may both exist; the operator's is in force.
create table app.limits (
  scope text not null
    constraint limits_scope_check check (scope in ('kind', 'tenant', 'kind_tenant', 'key')),
  kind text
    constraint limits_kind_check check (kind is null or length(kind) between 1 and 128),
  tenant_id uuid,
  limit_key text
    constraint limits_limit_key_check check (limit_key is null or length(limit_key) between 1 and 200),
  source text not null default 'operator'
    constraint limits_source_check check (source in ('operator', 'code')),
  concurrency integer
    constraint limits_concurrency_range check (concurrency is null or concurrency between 1 and 10000),
  rate_count integer
    constraint limits_rate_count_range check (rate_count is null or rate_count between 1 and 10000),
  rate_period interval
    constraint limits_rate_period_range
    check (rate_period is null or rate_period between interval '1 second' and interval '1 day'),
  burst integer,
  updated_at timestamptz not null default clock_timestamp(),
  updated_by text not null default 'owner'
    constraint limits_updated_by_check check (length(updated_by) between 1 and 200),
  constraint limits_something_check check (concurrency is not null or rate_count is not null),
  constraint limits_rate_shape check ((rate_count is null) = (rate_period is null)),
  constraint limits_burst_range
    check (burst is null or (rate_count is not null and burst between 1 and rate_count)),
  constraint limits_subject_shape check (
    case scope
      when 'kind' then kind is not null and tenant_id is null and limit_key is null
      when 'tenant' then kind is null and limit_key is null
      when 'kind_tenant' then kind is not null and limit_key is null
      else limit_key is not null and kind is null and tenant_id is null
    end)
);
create unique index limits_subject_idx
on app.limits (scope, coalesce(kind, ''),
               coalesce(tenant_id, '00000000-0000-0000-0000-000000000000'::uuid),
               coalesce(limit_key, ''), source);
comment on table app.limits is
  'Concurrency and rate limits by kind, tenant, kind per tenant or key; an operator''s row over the code''s.';
alter table app.limits enable row level security;

-- The slots taken: purpose run (a concurrency slot, held from admission to the job's end)
-- or start (a rate limit's admission, held from admission to the job's start). The
-- bucket names one instance of a limit: kind:K, tenant:T, kind:K/tenant:T or key:L.
create table app.limit_slots (
  bucket text not null,
  purpose text not null constraint limit_slots_purpose_check check (purpose in ('run', 'start')),
  slot integer not null constraint limit_slots_slot_check check (slot >= 0),
  job_id uuid not null,
  tenant_id uuid not null,
  taken_at timestamptz not null default clock_timestamp(),
  constraint limit_slots_pkey primary key (bucket, purpose, slot)
);
create unique index limit_slots_job_idx on app.limit_slots (job_id, bucket, purpose);
comment on table app.limit_slots is
  'Numbered slots of each limit, taken at admission: the primary key lets no two jobs hold one.';
alter table app.limit_slots enable row level security;

-- A rate limit's recent starts: slot s of bucket b last started a job at started_at, and
-- may start the next one a reuse interval later; a claim takes a slot row with SKIP
-- LOCKED, so concurrent claims never share one.
create table app.limit_starts (
  bucket text not null,
  slot integer not null,
  started_at timestamptz not null,
  constraint limit_starts_pkey primary key (bucket, slot)
);
comment on table app.limit_starts is
  'Each rate limit''s start slots and when each last started a job.';
alter table app.limit_starts enable row level security;

-- Jobs held back by a limit: the bucket that was full, and the due time and claim key the
-- job gets back when admitted.
create table app.held_jobs (
  job_id uuid not null constraint held_jobs_pkey primary key,
  tenant_id uuid not null,
  bucket text not null,
  priority smallint not null,
  claim_key timestamptz not null,
  available_at timestamptz not null,
  created_at timestamptz not null,
  held_at timestamptz not null default clock_timestamp()
);
create index held_jobs_admission_idx
on app.held_jobs (bucket, tenant_id, claim_key, created_at, job_id) include (available_at);
create index held_jobs_age_idx on app.held_jobs (bucket, held_at);
comment on table app.held_jobs is
  'Jobs a full limit holds back, with the due time and claim key they get back at admission.';
alter table app.held_jobs enable row level security;
create policy held_jobs_tenant_select on app.held_jobs for select to authenticated
  using (tenant_id = (select app.current_tenant_id()));
grant select on app.held_jobs to authenticated;

-- Fair admission within a limit: how many jobs of each tenant it admitted since the
-- tenant's jobs started waiting in it; the tenant admitted least goes first.
create table app.limit_turns (
  bucket text not null,
  tenant_id uuid not null,
  served bigint not null default 0,
  constraint limit_turns_pkey primary key (bucket, tenant_id)
);
create index limit_turns_order_idx on app.limit_turns (bucket, served, tenant_id);
comment on table app.limit_turns is
  'Per limit and tenant, the admissions since its jobs began waiting: the fewest go first.';
alter table app.limit_turns enable row level security;

-- The trigger's function; its current definition is in functions/admission.sql. This
-- first one does nothing, so the trigger exists before the function files are applied
-- (no job has limit_buckets before them).
create or replace function app.limits_on_state_change()
returns trigger
language plpgsql
set search_path = pg_catalog, pg_temp
as $$
begin
  return null;
end;
$$;
revoke all on function app.limits_on_state_change() from public;

-- Fires only for jobs admitted through a limit, and only when they end or are redriven:
-- every other job, and every claim, renewal and retry, never calls it.
create trigger jobs_limits_state
after update of state on app.jobs
for each row
when (old.limit_buckets is not null and old.state is distinct from new.state
      and (new.state in ('succeeded', 'dead', 'cancelled')
           or (old.state in ('succeeded', 'dead', 'cancelled') and new.state = 'pending')))
execute function app.limits_on_state_change();

grant select (limit_key, limit_buckets) on app.jobs to authenticated;

-- The enqueue functions gain p_limit_keys (functions/enqueue.sql creates them): the
-- signatures without it go, so that no overload makes a call of the old shape
-- ambiguous. Between this transaction and the function files an enqueue finds no
-- app.enqueue_jobs (42883): deploy while producers can retry, as for any migration.
drop function if exists app.enqueue_jobs(uuid[], text[], text[], jsonb[], timestamptz[],
                                         integer[], text[], integer[]);
drop function if exists app.enqueue_items(uuid[], text[], text[], jsonb[], timestamptz[],
                                          integer[], text[], integer[]);

-- The wait reasons gain held_by, the limit that holds a job back (functions/read.sql
-- creates them again with it).
drop function if exists app.job_wait_reasons(uuid[]);
drop function if exists app.reader_job_wait_reasons(uuid[]);
