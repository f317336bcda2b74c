-- leaseq functions: schedule expressions, parsed and evaluated (the owner's helpers).
--
-- What schedules.sql's functions read a schedule's expression with: its parse
-- (app.schedule_spec), its time zone's check, and its slots in a span of time
-- (app.schedule_slots, app.next_schedule_slot). None of them reads or writes a table;
-- none is granted to any group: the schedules' own functions, which run as the owner,
-- call them. A file of its own because this is the one place of the SQL that knows
-- cron's grammar and the clock's turns, apart from what a schedule is and who may
-- change one.
--
-- Expressions (app.schedule_spec):
--   * five-field cron: minute (0-59) hour (0-23) day-of-month (1-31) month (1-12 or
--     jan-dec) day-of-week (0-7 or sun-sat, 0 and 7 both Sunday); each field *, a number,
--     a range a-b, a step */n, a-b/n or a/n, or a comma-separated list of these. When both
--     day fields are restricted (neither starts with *) a day matches either; otherwise
--     both. Read in the schedule's IANA time zone.
--   * @yearly (@annually), @monthly, @weekly, @daily (@midnight), @hourly: the cron
--     expressions 0 0 1 1 *, 0 0 1 * *, 0 0 * * 0, 0 0 * * *, 0 * * * *.
--   * @every <n><unit>[<n><unit>...], units d h m s (@every 5m, @every 1h30m): slots at
--     whole multiples of the interval since 1970-01-01 00:00 UTC, whatever the time zone.
--     At least 1 minute (the reaper ticks once a minute; finer schedules are refused) and
--     at most 366 days.
--   Refused (22023), with what was wrong: anything else, numbers out of their field's
--   range, unknown time zones, and cron expressions that can never fire (0 0 30 2 *).
--
-- Time zones and daylight saving time (app.schedule_slots): a slot is a local wall-clock
-- time of the schedule's zone.
--   * A local time the clocks skip (02:30 on a spring-forward day in Europe/Berlin) fires
--     once, as far past the jump as it was past the last time before it: 03:30 CEST. A
--     slot that lands on one the schedule has anyway is the same slot (one job).
--   * A local time the clocks repeat (02:30 on the autumn day) fires once, at its first
--     occurrence (CEST), unless the hour field is *: then the schedule keeps its pace
--     through both passes of the repeated hour (*/15 * * * * fires 8 times in it).
--
-- One cron field as the sorted set of its values. p_names are the field's names in order
-- of their values from p_min (jan..dec, sun..sat), NULL for a numeric field.
create or replace function app.cron_field(p_expression text, p_text text, p_field text,
                                          p_min integer, p_max integer, p_names text[])
returns integer[]
language plpgsql
immutable
set search_path = pg_catalog, pg_temp
as $$
declare
  v_part text;
  v_match text[];
  v_low integer;
  v_high integer;
  v_step integer;
  v_values integer[] := '{}';
  v_bound text[];
begin
  foreach v_part in array string_to_array(lower(p_text), ',') loop
    v_match := regexp_match(v_part,
      '^(\*|([0-9]{1,4}|[a-z]{3})(-([0-9]{1,4}|[a-z]{3}))?)(/([0-9]{1,4}))?$');
    if v_match is null then
      perform app.raise_invalid(format(
        'schedule expression %L: the %s field %L is not a number, a range a-b, a step */n '
        'or a list of these', p_expression, p_field, p_text));
    end if;
    v_bound := array[v_match[2], v_match[4]];
    for i in 1 .. 2 loop
      if v_bound[i] is not null and v_bound[i] !~ '^[0-9]+$' then
        if p_names is null or array_position(p_names, v_bound[i]) is null then
          perform app.raise_invalid(format(
            'schedule expression %L: %L is not a value of the %s field (use %s to %s%s)',
            p_expression, v_bound[i], p_field, p_min, p_max,
            case when p_names is null then ''
                 else ' or ' || p_names[1] || '-' || p_names[cardinality(p_names)] end));
        end if;
        v_bound[i] := (array_position(p_names, v_bound[i]) - 1 + p_min)::text;
      end if;
    end loop;
    if v_match[1] = '*' then
      v_low := p_min;
      v_high := p_max;
    else
      v_low := v_bound[1]::integer;
      v_high := coalesce(v_bound[2]::integer,
                         case when v_match[6] is not null then p_max else v_low end);
    end if;
    v_step := coalesce(v_match[6]::integer, 1);
    if v_low not between p_min and p_max or v_high not between p_min and p_max then
      perform app.raise_invalid(format(
        'schedule expression %L: the %s field %L is out of range: use %s to %s',
        p_expression, p_field, p_text, p_min, p_max));
    end if;
    if v_low > v_high then
      perform app.raise_invalid(format(
        'schedule expression %L: the %s field''s range %L runs backwards: write the lower '
        'value first', p_expression, p_field, v_part));
    end if;
    if v_step < 1 then
      perform app.raise_invalid(format(
        'schedule expression %L: the %s field''s step must be at least 1 (got %s)',
        p_expression, p_field, v_step));
    end if;
    v_values := v_values || array(select generate_series(v_low, v_high, v_step));
  end loop;
  return array(select distinct v from unnest(v_values) v order by 1);
end;
$$;
revoke all on function app.cron_field(text, text, text, integer, integer, text[]) from public;

-- An expression taken apart: either every_seconds (an @every interval) or the cron sets,
-- with whether the day fields and the hour field start with * (see the file's header).
-- Raises 22023 for anything malformed, finer than a minute, or that can never fire.
create or replace function app.schedule_spec(
  p_expression text,
  out every_seconds bigint,
  out minutes integer[],
  out hours integer[],
  out days integer[],
  out months integer[],
  out weekdays integer[],
  out days_star boolean,
  out weekdays_star boolean,
  out hours_star boolean
)
language plpgsql
immutable
set search_path = pg_catalog, pg_temp
as $$
declare
  v_text text := lower(btrim(p_expression));
  v_fields text[];
  v_part text[];
begin
  if p_expression is null or v_text = '' then
    perform app.raise_invalid('schedule expression is required: a five-field cron '
                              'expression such as ''*/5 * * * *'', or ''@every 10m''');
  end if;
  if length(p_expression) > 200 then
    perform app.raise_invalid('schedule expression must have at most 200 characters');
  end if;
  if v_text like '@every%' then
    if v_text !~ '^@every\s+([0-9]{1,9}[dhms])+$' then
      perform app.raise_invalid(format(
        'schedule expression %L: an interval is @every followed by numbers with units d, '
        'h, m or s, such as @every 10m or @every 1h30m', p_expression));
    end if;
    every_seconds := 0;
    for v_part in
      select regexp_matches(regexp_replace(v_text, '^@every\s+', ''), '([0-9]+)([dhms])', 'g')
    loop
      every_seconds := every_seconds + v_part[1]::bigint * case v_part[2]
        when 'd' then 86400 when 'h' then 3600 when 'm' then 60 else 1 end;
    end loop;
    if every_seconds < 60 then
      perform app.raise_invalid(format(
        'schedule expression %L: schedules finer than a minute are not supported (the '
        'reaper ticks once a minute); use @every 1m or more, or a job that loops',
        p_expression));
    end if;
    if every_seconds > 366 * 86400 then
      perform app.raise_invalid(format(
        'schedule expression %L: an interval must be at most 366 days', p_expression));
    end if;
    return;
  end if;
  v_text := case v_text
    when '@yearly' then '0 0 1 1 *' when '@annually' then '0 0 1 1 *'
    when '@monthly' then '0 0 1 * *' when '@weekly' then '0 0 * * 0'
    when '@daily' then '0 0 * * *' when '@midnight' then '0 0 * * *'
    when '@hourly' then '0 * * * *' else v_text end;
  if v_text like '@%' then
    perform app.raise_invalid(format(
      'schedule expression %L: unknown macro; use @yearly, @annually, @monthly, @weekly, '
      '@daily, @midnight, @hourly or @every <interval>', p_expression));
  end if;
  v_fields := regexp_split_to_array(v_text, '\s+');
  if cardinality(v_fields) <> 5 then
    perform app.raise_invalid(format(
      'schedule expression %L has %s fields; cron expressions have five: minute hour '
      'day-of-month month day-of-week (no seconds, no year)', p_expression,
      cardinality(v_fields)));
  end if;
  minutes := app.cron_field(p_expression, v_fields[1], 'minute', 0, 59, null);
  hours := app.cron_field(p_expression, v_fields[2], 'hour', 0, 23, null);
  days := app.cron_field(p_expression, v_fields[3], 'day-of-month', 1, 31, null);
  months := app.cron_field(p_expression, v_fields[4], 'month', 1, 12,
    array['jan','feb','mar','apr','may','jun','jul','aug','sep','oct','nov','dec']);
  weekdays := app.cron_field(p_expression, v_fields[5], 'day-of-week', 0, 7,
    array['sun','mon','tue','wed','thu','fri','sat']);
  if 7 = any (weekdays) then  -- 7 is Sunday too
    weekdays := array(select distinct case when w = 7 then 0 else w end
                      from unnest(weekdays) w order by 1);
  end if;
  days_star := v_fields[3] like '*%';
  weekdays_star := v_fields[5] like '*%';
  hours_star := v_fields[2] = '*';
  -- Restricted days of the month with any day of the week: some month must have one.
  if weekdays_star and not exists (
      select 1 from unnest(months) m, unnest(days) d
      where d <= case when m = 2 then 29 when m in (4, 6, 9, 11) then 30 else 31 end) then
    perform app.raise_invalid(format(
      'schedule expression %L can never fire: none of its months has any of its days of '
      'the month', p_expression));
  end if;
  return;
end;
$$;
revoke all on function app.schedule_spec(text) from public;

-- Refuse (22023) a time zone PostgreSQL does not know by its IANA name.
create or replace function app.check_time_zone(p_time_zone text)
returns void
language plpgsql
stable
set search_path = pg_catalog, pg_temp
as $$
begin
  if p_time_zone is null or length(p_time_zone) > 64
     or not exists (select 1 from pg_catalog.pg_timezone_names z where z.name = p_time_zone) then
    perform app.raise_invalid(format(
      'time zone %L is not an IANA time zone name this database knows; use a name such as '
      'UTC or Europe/Berlin', p_time_zone));
  end if;
end;
$$;
revoke all on function app.check_time_zone(text) from public;

-- The slots of an expression read in p_time_zone that are after p_after and at most
-- p_until, in order, at most p_limit of them (see the header for daylight saving time).
-- The same from an expression taken apart (app.schedule_spec's columns, in order), so a
-- caller that needs several ranges of one schedule parses it once.
create or replace function app.spec_slots(p_every_seconds bigint, p_minutes integer[],
                                          p_hours integer[], p_days integer[],
                                          p_months integer[], p_weekdays integer[],
                                          p_days_star boolean, p_weekdays_star boolean,
                                          p_hours_star boolean, p_time_zone text,
                                          p_after timestamptz, p_until timestamptz,
                                          p_limit integer)
returns setof timestamptz
language plpgsql
stable
set search_path = pg_catalog, pg_temp
as $$
declare
  v_spec record;
  v_day date;
  v_last date;
  v_count integer := 0;
  v_rows integer;
  v_start timestamptz;
  v_end timestamptz;
  v_hour integer;
  v_hour_start timestamptz;
begin
  if p_after is null or p_until is null or p_until <= p_after or p_limit < 1 then
    return;
  end if;
  select p_every_seconds as every_seconds, p_minutes as minutes, p_hours as hours,
         p_days as days, p_months as months, p_weekdays as weekdays,
         p_days_star as days_star, p_weekdays_star as weekdays_star,
         p_hours_star as hours_star
  into v_spec;
  if v_spec.every_seconds is not null then
    return query
    select to_timestamp((k * v_spec.every_seconds)::double precision)
    from generate_series(
      floor(extract(epoch from p_after) / v_spec.every_seconds)::bigint + 1,
      floor(extract(epoch from least(p_until, p_after + interval '400 years'))
            / v_spec.every_seconds)::bigint) k
    limit p_limit;
    return;
  end if;
  -- A day earlier than p_after's local date: a slot after p_after may have an earlier
  -- local time (the first pass of a repeated hour).
  v_day := (p_after at time zone p_time_zone)::date - 1;
  v_last := (least(p_until, p_after + interval '20 years') at time zone p_time_zone)::date + 1;
  while v_day <= v_last loop
    if extract(month from v_day)::integer = any (v_spec.months)
       and (case when v_spec.days_star or v_spec.weekdays_star
                 then extract(day from v_day)::integer = any (v_spec.days)
                      and extract(dow from v_day)::integer = any (v_spec.weekdays)
                 else extract(day from v_day)::integer = any (v_spec.days)
                      or extract(dow from v_day)::integer = any (v_spec.weekdays) end) then
      -- The day's first and next day's first instants. A day that is 24 hours long has
      -- no clock change: its slots are plain arithmetic from its midnight. The rest (the
      -- two days a year of a zone with daylight saving time) read each wall time in the
      -- zone. Days wholly outside (p_after, p_until], with room for a clock change, are
      -- skipped.
      v_start := v_day::timestamp at time zone p_time_zone;
      v_end := (v_day + 1)::timestamp at time zone p_time_zone;
      if v_end <= p_after - interval '3 hours' or v_start > p_until + interval '3 hours' then
        v_day := v_day + 1;
        continue;
      end if;
      if v_end - v_start = interval '24 hours' then
        -- Hour by hour (the sets are sorted), so a search for the next slot reads one
        -- hour's minutes, not the day's.
        foreach v_hour in array v_spec.hours loop
          v_hour_start := v_start + make_interval(hours => v_hour);
          continue when v_hour_start + interval '59 minutes' <= p_after;
          exit when v_hour_start > p_until;
          return query
          select v_hour_start + make_interval(mins => m)
          from unnest(v_spec.minutes) m
          where v_hour_start + make_interval(mins => m) > p_after
            and v_hour_start + make_interval(mins => m) <= p_until
          order by m
          limit p_limit - v_count;
          get diagnostics v_rows = row_count;
          v_count := v_count + v_rows;
          if v_count >= p_limit then
            return;
          end if;
        end loop;
      else
        return query
          with wall as (
            select v_day + make_time(h, m, 0) as local
            from unnest(v_spec.hours) h, unnest(v_spec.minutes) m
          ), placed as (
            -- "local at time zone" is the later instant of a repeated time (and, for a
            -- skipped one, the instant as far past the jump as it was past the last time
            -- before it); "earlier" is the other reading of a repeated time.
            select w.local, i.later,
                   i.later + ((i.later at time zone p_time_zone) - (i.later at time zone 'UTC'))
                           - (((i.later - interval '3 hours') at time zone p_time_zone)
                              - ((i.later - interval '3 hours') at time zone 'UTC')) as earlier
            from wall w, lateral (select w.local at time zone p_time_zone as later) i
          ), slots as (
            select case when p.earlier < p.later and (p.earlier at time zone p_time_zone) = p.local
                        then p.earlier else p.later end as slot
            from placed p
            union
            select p.later
            from placed p
            where v_spec.hours_star and p.earlier < p.later
              and (p.earlier at time zone p_time_zone) = p.local
          )
          select s.slot from slots s
          where s.slot > p_after and s.slot <= p_until
          order by s.slot
          limit p_limit - v_count;
        get diagnostics v_rows = row_count;
        v_count := v_count + v_rows;
        if v_count >= p_limit then
          return;
        end if;
      end if;
    end if;
    v_day := v_day + 1;
  end loop;
end;
$$;
revoke all on function app.spec_slots(bigint, integer[], integer[], integer[], integer[], integer[], boolean, boolean, boolean, text, timestamptz, timestamptz, integer) from public;

-- The same, from the expression (parsed on every call).
create or replace function app.schedule_slots(p_expression text, p_time_zone text,
                                              p_after timestamptz, p_until timestamptz,
                                              p_limit integer)
returns setof timestamptz
language sql
stable
set search_path = pg_catalog, pg_temp
as $$
  select s
  from app.schedule_spec(p_expression) p,
       lateral app.spec_slots(p.every_seconds, p.minutes, p.hours, p.days, p.months,
                              p.weekdays, p.days_star, p.weekdays_star, p.hours_star,
                              p_time_zone, p_after, p_until, p_limit) s;
$$;
revoke all on function app.schedule_slots(text, text, timestamptz, timestamptz, integer) from public;

-- The first slot after p_after ('infinity' if none within 20 years, which a checked
-- expression never gives).
create or replace function app.next_schedule_slot(p_expression text, p_time_zone text,
                                                  p_after timestamptz)
returns timestamptz
language sql
stable
set search_path = pg_catalog, pg_temp
as $$
  select coalesce(
    (select s from app.schedule_slots(p_expression, p_time_zone, p_after,
                                      p_after + interval '20 years', 1) s),
    'infinity'::timestamptz);
$$;
revoke all on function app.next_schedule_slot(text, text, timestamptz) from public;
