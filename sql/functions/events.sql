-- leaseq functions: the days of the audit trail (app.job_events, partitioned by UTC day).
--
-- Callers: leaseq_reaper runs app.roll_event_days on every pass; app.add_event_day and
-- app.drop_event_days are the owner's (app.prune_jobs calls the latter as the owner).
--
--   * A day's partition is app_events.job_events_YYYYMMDD, for created_at in
--     [day 00:00 UTC, next day 00:00 UTC); app.event_days has its row. Events no day
--     partition takes go to app_events.job_events_default.
--   * roll makes today's and the next p_ahead days' partitions ahead of time, closes the
--     days that are past (no event is written into a past day: created_at is the clock
--     of the transition), and ANALYZEs the parent once a day (autovacuum analyzes the
--     partitions, never a partitioned table).
--   * drop removes closed days that ended before the cutoff. A day with a hold (a redriven
--     job's events, app.event_holds) is kept until the job is pruned. The events of jobs
--     still kept (unfinished, or finished after the cutoff) are copied out first and
--     written again after the detach: with the day gone they land in the DEFAULT
--     partition, where app.prune_jobs deletes them with their job.
--   * Every DDL step waits at most lock_timeout (1 s) for its lock: a detach needs the
--     parent exclusively, and a drain that holds it (an insert in flight) must not be
--     queued behind for long. A step that cannot have its lock is left for the next
--     pass, and the pass goes on.

-- Makes the partition of one UTC day and its app.event_days row; false when the day
-- already has one. Refused (23514) when the DEFAULT partition holds events of that day.
create or replace function app.add_event_day(p_day date)
returns boolean
language plpgsql
security definer
set search_path = pg_catalog, pg_temp
as $$
begin
  if p_day is null then
    perform app.raise_invalid('p_day must be a date (got NULL)');
  end if;
  if exists (select 1 from app.event_days d where d.day = p_day) then
    return false;
  end if;
  execute format(
    'create table app_events.%I partition of app.job_events for values from (%L) to (%L)'
    ' with (autovacuum_vacuum_insert_scale_factor = 0.05,'
    ' autovacuum_vacuum_insert_threshold = 10000, autovacuum_analyze_scale_factor = 0.05)',
    'job_events_' || to_char(p_day, 'YYYYMMDD'),
    p_day::timestamp at time zone 'UTC', (p_day + 1)::timestamp at time zone 'UTC');
  insert into app.event_days (day, closed_at)
  values (p_day, case when p_day < (clock_timestamp() at time zone 'UTC')::date
                      then clock_timestamp() end);
  return true;
end;
$$;
revoke all on function app.add_event_day(date) from public;

-- The reaper's upkeep of the days: make today's and the next p_ahead days' partitions,
-- close the days past, analyze the parent once a day. A day that cannot be made now
-- (its lock not had within lock_timeout, or the DEFAULT partition holds events of it)
-- is tried again on the next pass.
create or replace function app.roll_event_days(p_ahead integer default 3)
returns table (days_added integer, days_closed integer, analyzed boolean)
language plpgsql
security definer
set search_path = pg_catalog, pg_temp
set lock_timeout = '1s'
as $$
declare
  v_today date := (clock_timestamp() at time zone 'UTC')::date;
  v_day date;
  v_added integer := 0;
  v_closed integer;
  v_analyzed boolean := false;
begin
  perform app.check_range('p_ahead', p_ahead, 0, 30);
  for v_day in
    select (v_today + n) from generate_series(0, p_ahead) as g(n)
    where not exists (select 1 from app.event_days d where d.day = v_today + n)
  loop
    begin
      if app.add_event_day(v_day) then
        v_added := v_added + 1;
      end if;
    exception when lock_not_available or check_violation or duplicate_table
                   or unique_violation then
      null;  -- next pass (or another reaper made it meanwhile)
    end;
  end loop;

  update app.event_days d set closed_at = clock_timestamp()
  where d.closed_at is null and d.day < v_today;
  get diagnostics v_closed = row_count;

  if exists (select 1 from app.event_days d where d.day = v_today and d.analyzed_at is null) then
    begin
      analyze app.job_events;
      update app.event_days d set analyzed_at = clock_timestamp() where d.day = v_today;
      v_analyzed := true;
    exception when lock_not_available then
      null;
    end;
  end if;

  days_added := v_added;
  days_closed := v_closed;
  analyzed := v_analyzed;
  return next;
end;
$$;
revoke all on function app.roll_event_days(integer) from public;
grant execute on function app.roll_event_days(integer) to leaseq_reaper;

-- Drops the closed days that ended at or before p_cutoff (see the file's head): returns
-- the days dropped, the days kept for a hold, the days whose detach did not get its lock
-- (the rest is left for the next call), and the events of kept jobs moved to DEFAULT.
create or replace function app.drop_event_days(p_cutoff timestamptz)
returns table (days_dropped integer, days_held integer, days_busy integer,
               events_moved integer)
language plpgsql
security definer
set search_path = pg_catalog, pg_temp
set lock_timeout = '1s'
as $$
declare
  v_day date;
  v_part text;
  v_kept app.job_events[];
  v_dropped integer := 0;
  v_held integer := 0;
  v_busy integer := 0;
  v_moved integer := 0;
begin
  if p_cutoff is null or p_cutoff > clock_timestamp() then
    perform app.raise_invalid(format(
      'p_cutoff must be a time not in the future (got %s)', coalesce(p_cutoff::text, 'NULL')));
  end if;
  -- A hold lasts as long as its job.
  delete from app.event_holds h
  where not exists (select 1 from app.jobs j where j.tenant_id = h.tenant_id and j.id = h.job_id);

  for v_day in
    select d.day from app.event_days d
    where d.dropped_at is null and d.closed_at is not null
      and (d.day + 1)::timestamp at time zone 'UTC' <= p_cutoff
    order by d.day
    for update skip locked  -- a day another prune is dropping is its
  loop
    if exists (select 1 from app.event_holds h where h.day = v_day) then
      v_held := v_held + 1;
      continue;
    end if;
    v_part := 'job_events_' || to_char(v_day, 'YYYYMMDD');
    -- Read before the detach, under no lock but the readers': the day is closed, so no
    -- event is added to it meanwhile.
    execute format(
      'select array_agg(e) from app_events.%I e'
      ' where exists (select 1 from app.jobs j where j.tenant_id = e.tenant_id'
      '  and j.id = e.job_id and (j.completed_at is null or j.completed_at >= $1))', v_part)
    into v_kept using p_cutoff;
    begin
      execute format('alter table app.job_events detach partition app_events.%I', v_part);
    exception when lock_not_available then
      v_busy := v_busy + 1;
      exit;  -- the drain holds the table: the next pass tries again
    end;
    if v_kept is not null then
      insert into app.job_events
      select * from unnest(v_kept);
      v_moved := v_moved + cardinality(v_kept);
    end if;
    execute format('drop table app_events.%I', v_part);
    update app.event_days d set dropped_at = clock_timestamp() where d.day = v_day;
    v_dropped := v_dropped + 1;
  end loop;

  days_dropped := v_dropped;
  days_held := v_held;
  days_busy := v_busy;
  events_moved := v_moved;
  return next;
end;
$$;
revoke all on function app.drop_event_days(timestamptz) from public;
