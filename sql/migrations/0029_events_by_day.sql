-- leaseq: the audit trail partitioned by day, so retention drops a day instead of
-- deleting its rows one by one.
--
-- app.job_events becomes a table range-partitioned on created_at, one partition per UTC
-- day (app_events.job_events_YYYYMMDD, [day, day + 1)) and a DEFAULT partition
-- (app_events.job_events_default) for events no day partition takes: those of a day
-- not made ahead of time, and the events of jobs still kept that were moved out of a day
-- retention dropped. The partitions live in the schema app_events, which only the owner
-- may use: every reader goes through the parent, where row-level security holds.
--
-- The foreign key to app.jobs, the id column and the primary key go: the key's row lock
-- on the job and the second index cost WAL on every event, and a partitioned table's
-- unique key would have to include created_at anyway. The index on (tenant_id, job_id,
-- sequence) stays for the timeline reads. sequence is filled from a sequence of its own
-- (app.job_event_sequence), continuing after the highest one kept.
--
-- app.event_days records the days made (closed once past, analyzed, dropped);
-- app.event_holds the days a redriven job's events keep. The functions that keep them
-- (sql/functions/events.sql) make the days ahead; this migration makes the days of the
-- events kept and the next few, and copies every event into its day.

create schema app_events;
revoke all on schema app_events from public;
comment on schema app_events is
  'The partitions of app.job_events (one per UTC day and a DEFAULT one): the owner''s only.';

-- The old table waits in app_events while its rows are copied (there its constraints'
-- names do not take the new table's).
alter table app.job_events drop constraint job_events_job_fkey;
alter table app.job_events set schema app_events;
alter table app_events.job_events rename to job_events_unpartitioned;

create sequence app.job_event_sequence as bigint;
revoke all on sequence app.job_event_sequence from public;

create table app.job_events (
  sequence bigint not null default nextval('app.job_event_sequence'),
  tenant_id uuid not null,
  job_id uuid not null,
  event_type text not null,
  actor text not null,
  details jsonb not null default '{}'::jsonb,
  created_at timestamptz not null default clock_timestamp(),
  lease_token uuid,
  constraint job_events_actor_shape check (length(actor) between 1 and 200),
  constraint job_events_details_check check (jsonb_typeof(details) = 'object'),
  constraint job_events_event_type_check check (event_type in (
    'created', 'claimed', 'retry_scheduled', 'succeeded', 'dead', 'lease_expired',
    'released', 'cancelled', 'redriven', 'cancel_requested'))
) partition by range (created_at);
alter sequence app.job_event_sequence owned by app.job_events.sequence;

create index job_events_job_idx on app.job_events (tenant_id, job_id, sequence);

create table app_events.job_events_default partition of app.job_events default
  with (autovacuum_vacuum_insert_scale_factor = 0.05,
        autovacuum_vacuum_insert_threshold = 10000,
        autovacuum_analyze_scale_factor = 0.05);

create table app.event_days (
  day date primary key,
  added_at timestamptz not null default clock_timestamp(),
  closed_at timestamptz,
  analyzed_at timestamptz,
  dropped_at timestamptz
);
create table app.event_holds (
  day date not null,
  tenant_id uuid not null,
  job_id uuid not null,
  reason text not null check (reason in ('redriven')),
  held_at timestamptz not null default clock_timestamp(),
  primary key (day, tenant_id, job_id)
);
create index event_holds_job_idx on app.event_holds (tenant_id, job_id);
revoke all on app.event_days, app.event_holds from public;
alter table app.event_days enable row level security;
alter table app.event_holds enable row level security;

-- The days of every kept event, and today and the next three (UTC).
do $$
declare
  v_day date;
begin
  for v_day in
    select d::date
    from generate_series(
      least((select min((e.created_at at time zone 'UTC')::date)
             from app_events.job_events_unpartitioned e),
            (clock_timestamp() at time zone 'UTC')::date),
      (clock_timestamp() at time zone 'UTC')::date + 3,
      interval '1 day') as g(d)
  loop
    execute format(
      'create table app_events.%I partition of app.job_events for values from (%L) to (%L)'
      ' with (autovacuum_vacuum_insert_scale_factor = 0.05,'
      ' autovacuum_vacuum_insert_threshold = 10000, autovacuum_analyze_scale_factor = 0.05)',
      'job_events_' || to_char(v_day, 'YYYYMMDD'),
      v_day::timestamp at time zone 'UTC', (v_day + 1)::timestamp at time zone 'UTC');
    insert into app.event_days (day, closed_at)
    values (v_day, case when v_day < (clock_timestamp() at time zone 'UTC')::date
                        then clock_timestamp() end);
  end loop;
end;
$$;

insert into app.job_events (sequence, tenant_id, job_id, event_type, actor, details,
                            created_at, lease_token)
select e.sequence, e.tenant_id, e.job_id, e.event_type, e.actor, e.details, e.created_at,
       e.lease_token
from app_events.job_events_unpartitioned e;

select setval('app.job_event_sequence',
              coalesce((select max(e.sequence) from app_events.job_events_unpartitioned e), 0) + 1,
              false);

drop table app_events.job_events_unpartitioned;

alter table app.job_events enable row level security;
create policy job_events_tenant_select on app.job_events for select to authenticated
  using (tenant_id = (select app.current_tenant_id()));
grant select (sequence, tenant_id, job_id, event_type, actor, details, created_at)
  on app.job_events to authenticated;

comment on table app.job_events is
  'The audit trail: one row per job transition, written in the same statement as the '
  'transition; partitioned by UTC day (app_events), retention drops whole days.';
comment on column app.job_events.sequence is
  'Order of the events (app.job_event_sequence): a job''s timeline is its events by sequence.';
comment on column app.job_events.event_type is
  'The transition: created, claimed, retry_scheduled, succeeded, dead, lease_expired, '
  'released, cancelled, cancel_requested or redriven.';
comment on column app.job_events.actor is
  'Who made the transition: enqueue, the worker''s owner id, watchdog (the reaper), or '
  'the name an operator gave.';
comment on column app.job_events.details is
  'The transition''s facts (a JSON object); sql/README.md lists the keys of each type.';
comment on column app.job_events.lease_token is
  'The lease the transition happened under (a claim''s new one); NULL for enqueue, '
  'cancel and redrive.';
comment on table app.event_days is
  'One row per day partition of app.job_events made: closed once the day is past, '
  'analyzed (the parent, once a day), dropped by retention.';
comment on table app.event_holds is
  'Days of app.job_events retention must keep: a redriven job''s events, until the job '
  'itself is pruned.';
