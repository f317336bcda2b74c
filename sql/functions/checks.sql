-- leaseq functions: argument checks shared by the queue functions.
--
-- Each check raises SQLSTATE 22023 with a message that names the argument and the range
-- it accepts. They run as part of a SECURITY DEFINER call and are executable by the
-- schema owner only. "Blank" means empty or whitespace of any kind (tabs, newlines),
-- the same test as the table's shape constraints, so a blank value is refused with
-- 22023, never 23514.

create or replace function app.raise_invalid(p_message text)
returns void
language plpgsql
immutable
set search_path = pg_catalog, pg_temp
as $$
begin
  raise exception using errcode = '22023', message = p_message;
end;
$$;
revoke all on function app.raise_invalid(text) from public;

create or replace function app.check_required(p_name text, p_value anyelement)
returns void
language plpgsql
immutable
set search_path = pg_catalog, pg_temp
as $$
begin
  if p_value is null then
    perform app.raise_invalid(p_name || ' is required (got NULL)');
  end if;
end;
$$;
revoke all on function app.check_required(text, anyelement) from public;

create or replace function app.check_owner(p_owner text)
returns void
language plpgsql
immutable
set search_path = pg_catalog, pg_temp
as $$
begin
  if p_owner is null or p_owner ~ '^\s*$' or length(p_owner) > 200 then
    perform app.raise_invalid('p_owner must be a non-blank text of at most 200 characters');
  end if;
end;
$$;
revoke all on function app.check_owner(text) from public;

create or replace function app.check_range(p_name text, p_value integer, p_min integer, p_max integer)
returns void
language plpgsql
immutable
set search_path = pg_catalog, pg_temp
as $$
begin
  if p_value is null or p_value < p_min or p_value > p_max then
    perform app.raise_invalid(format('%s must be between %s and %s (got %s)',
      p_name, p_min, p_max, coalesce(p_value::text, 'NULL')));
  end if;
end;
$$;
revoke all on function app.check_range(text, integer, integer, integer) from public;

create or replace function app.check_interval(p_name text, p_value interval, p_min interval, p_max interval)
returns void
language plpgsql
immutable
set search_path = pg_catalog, pg_temp
as $$
begin
  if p_value is null or p_value < p_min or p_value > p_max then
    perform app.raise_invalid(format('%s must be between %s and %s (got %s)',
      p_name, p_min, p_max, coalesce(p_value::text, 'NULL')));
  end if;
end;
$$;
revoke all on function app.check_interval(text, interval, interval, interval) from public;

create or replace function app.check_lease(p_lease interval)
returns void
language sql
immutable
set search_path = pg_catalog, pg_temp
as $$
  select app.check_interval('p_lease', p_lease, interval '1 second', interval '1 day')
$$;
revoke all on function app.check_lease(interval) from public;

-- The arguments every claim takes. One call per claim (per batch, not per job); the
-- checks are plain expressions and the detailed message is only built on failure.
create or replace function app.check_claim(p_owner text, p_limit integer, p_lease interval)
returns void
language plpgsql
immutable
set search_path = pg_catalog, pg_temp
as $$
begin
  if p_owner is null or p_owner ~ '^\s*$' or length(p_owner) > 200 then
    perform app.check_owner(p_owner);
  end if;
  if p_limit is null or p_limit < 1 or p_limit > 100 then
    perform app.check_range('p_limit', p_limit, 1, 100);
  end if;
  if p_lease is null or p_lease < interval '1 second' or p_lease > interval '1 day' then
    perform app.check_lease(p_lease);
  end if;
end;
$$;
revoke all on function app.check_claim(text, integer, interval) from public;

-- A failure report is never refused: whatever the worker sends becomes a JSON object
-- that fits the row, so a bad error document cannot lose the failure it describes.
create or replace function app.error_document(p_error jsonb)
returns jsonb
language sql
immutable
set search_path = pg_catalog, pg_temp
as $$
  select case
    when p_error is null then jsonb_build_object('message', null)
    when octet_length(p_error::text) > 65536 then jsonb_build_object(
      'code', 'ERROR_TRUNCATED',
      'truncated', left(p_error::text, 8192))
    when jsonb_typeof(p_error) <> 'object' then jsonb_build_object('message', p_error)
    else p_error
  end
$$;
revoke all on function app.error_document(jsonb) from public;

create or replace function app.check_filters(p_job_ids uuid[], p_kind text, p_limit integer)
returns void
language plpgsql
immutable
set search_path = pg_catalog, pg_temp
as $$
begin
  if p_job_ids is not null then
    perform app.check_range('number of job ids', cardinality(p_job_ids), 1, 1000);
    if array_position(p_job_ids, null) is not null then
      perform app.raise_invalid('p_job_ids must not contain NULL');
    end if;
  end if;
  if p_kind is not null and (btrim(p_kind) = '' or length(p_kind) > 128) then
    perform app.raise_invalid('p_kind must be a non-blank text of at most 128 characters');
  end if;
  perform app.check_range('p_limit', p_limit, 1, 1000);
end;
$$;
revoke all on function app.check_filters(uuid[], text, integer) from public;

create or replace function app.check_reason(p_reason text)
returns void
language plpgsql
immutable
set search_path = pg_catalog, pg_temp
as $$
begin
  if p_reason is not null and length(p_reason) > 500 then
    perform app.raise_invalid(format('p_reason must be at most 500 characters (got %s)',
      length(p_reason)));
  end if;
end;
$$;
revoke all on function app.check_reason(text) from public;
