-- leaseq functions: argument checks shared by the queue functions.
--
-- Each check raises SQLSTATE 22023 with a message that names the argument and the range
-- it accepts. They run as part of a SECURITY DEFINER call and are executable by the
-- schema owner only. "Blank" (app.is_blank) means empty or made only of Unicode
-- whitespace and invisible format characters; a blank value is refused with 22023,
-- never 23514.

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

-- The one "non-blank" rule of every name-like argument (kind, operation key, owner,
-- actor, kind filters), shared with the Python model (sql/README.md lists the set):
-- blank is empty, or made only of
--   white space (Unicode White_Space): U+0009-U+000D, U+0020, U+0085, U+00A0, U+1680,
--               U+2000-U+200A, U+2028, U+2029, U+202F, U+205F, U+3000;
--   invisible format characters (Unicode 15.1 category Cf): U+00AD, U+0600-U+0605,
--               U+061C, U+06DD, U+070F, U+0890-U+0891, U+08E2, U+180E, U+200B-U+200F,
--               U+202A-U+202E, U+2060-U+2064, U+2066-U+206F, U+FEFF, U+FFF9-U+FFFB,
--               U+110BD, U+110CD, U+13430-U+1343F, U+1BCA0-U+1BCA3, U+1D173-U+1D17A,
--               U+E0001, U+E0020-U+E007F
-- (leaseq.storable.WHITE_SPACE and FORMAT_CHARACTER_RANGES are the same set; the
-- fuzz test of tests/failure/test_bad_input.py holds the two sides to it).
-- Such a value looks empty to a person (a tab-only kind filter, a zero-width-space key)
-- yet is a different value to the database. The set is spelled out, not \s, whose
-- meaning depends on the database's locale, and written as an E'' literal, whose
-- escapes mean the same whatever the caller's standard_conforming_strings. NULL gives
-- NULL: callers test for it themselves. A value whose first character is visible ASCII
-- (ascii(v) between 33 and 126) is never blank: callers that check a value per job
-- test that first and call this only otherwise (a call costs about 2 us).
create or replace function app.is_blank(p_value text)
returns boolean
language sql
immutable
set search_path = pg_catalog, pg_temp
as $$
  select p_value !~ E'[^\u0009-\u000d\u0020\u0085\u00a0\u00ad\u0600-\u0605\u061c\u06dd\u070f\u0890-\u0891\u08e2\u1680\u180e\u2000-\u200f\u2028-\u202f\u205f-\u2064\u2066-\u206f\u3000\ufeff\ufff9-\ufffb\U000110bd\U000110cd\U00013430-\U0001343f\U0001bca0-\U0001bca3\U0001d173-\U0001d17a\U000e0001\U000e0020-\U000e007f]'
$$;
revoke all on function app.is_blank(text) from public;

-- The one "plain text" rule of every name-like value a function stores (kind, operation
-- key, correlation id, owner, actor, reason), shared with the Python model
-- (leaseq.storable.UNSAFE_CHARACTER_RANGES; sql/README.md lists the set). Such values
-- are written as they are into log lines, metric dimensions, the dashboard and the
-- command line's tables, so none may hold
--   control characters (Unicode Cc): U+0001-U+001F and U+007F-U+009F (tab, newline,
--               carriage return, escape, NEL; U+0000 cannot be in a text at all);
--   format characters (Cf), the list of app.is_blank above: invisible ones (zero-width
--               space, joiners, BOM) and the bidirectional controls (U+061C, U+200E,
--               U+200F, U+202A-U+202E, U+2066-U+2069), which reorder what a reader sees;
--   the line and paragraph separators U+2028 and U+2029.
-- A newline or an escape sequence in a kind would start a new line, or recolour the
-- terminal, in every plain-text log and listing that shows it; a right-to-left override
-- would show "fdp.exe" as "exe.pdf". Answers NULL when the value holds none (or is
-- NULL), else how it breaks the rule, naming the first such character by code point and
-- position (1-based, in characters), to complete a sentence that starts with the
-- value's name. Callers that check a value per job test it against '[^ -~]' first (a
-- value of printable ASCII only holds none of them) and call this only otherwise.
create or replace function app.character_problem(p_value text)
returns text
language sql
immutable
set search_path = pg_catalog, pg_temp
as $$
  select case when p_value ~ E'[\u0001-\u001f\u007f-\u009f\u00ad\u0600-\u0605\u061c\u06dd\u070f\u0890-\u0891\u08e2\u180e\u200b-\u200f\u2028-\u202e\u2060-\u2064\u2066-\u206f\ufeff\ufff9-\ufffb\U000110bd\U000110cd\U00013430-\U0001343f\U0001bca0-\U0001bca3\U0001d173-\U0001d17a\U000e0001\U000e0020-\U000e007f]' then
    (select 'must not contain control, format (invisible or bidirectional) or line '
            || 'separator characters (found U+' || upper(lpad(h.hex, greatest(4, length(h.hex)), '0'))
            || ' at character ' || strpos(p_value, h.c) || '; remove it)'
     from (select f.c, to_hex(ascii(f.c)) as hex
           from (select substring(p_value from E'[\u0001-\u001f\u007f-\u009f\u00ad\u0600-\u0605\u061c\u06dd\u070f\u0890-\u0891\u08e2\u180e\u200b-\u200f\u2028-\u202e\u2060-\u2064\u2066-\u206f\ufeff\ufff9-\ufffb\U000110bd\U000110cd\U00013430-\U0001343f\U0001bca0-\U0001bca3\U0001d173-\U0001d17a\U000e0001\U000e0020-\U000e007f]') as c) f) h)
  end
$$;
revoke all on function app.character_problem(text) from public;

-- An array argument must be one-dimensional and indexed from 1 (or empty, or NULL,
-- where the caller allows that): the functions read element i as array[i] next to
-- unnest(), and for '{{x}}' or '[5:5]={x}' the subscript reads NULL while unnest()
-- still yields the element, so a per-item check would pass over a value that is then
-- stored. Called once per array, never per element; the batch functions first test
-- every array in one plain expression and call this (about 2-6 us a call) only to name
-- the argument when that test fails.
create or replace function app.check_array(p_name text, p_value anyarray)
returns void
language plpgsql
immutable
set search_path = pg_catalog, pg_temp
as $$
begin
  if array_ndims(p_value) <> 1 or array_lower(p_value, 1) <> 1 then
    perform app.raise_invalid(format(
      '%s must be a one-dimensional array indexed from 1 (got dimensions %s)',
      p_name, array_dims(p_value)));
  end if;
end;
$$;
revoke all on function app.check_array(text, anyarray) from public;

-- Why a JSON document (payload, result or error) cannot be stored, or NULL when it can:
-- larger than p_max_bytes as JSON text, nested more than 100 levels below its top, or
-- holding a number whose text, as PostgreSQL writes it back, is longer than 1000
-- characters. jsonb accepts the last two, but a standard JSON decoder does not read
-- them back (Python's json refuses integers of more than 4300 digits and gives up some
-- way below 1000 levels): a stored one would break every worker or producer reading
-- the row. The answer completes a sentence that starts with the document's name.
-- p_text is the document's JSON text, which callers have already built for their size
-- check (building it again costs about 3 ms for 256 KiB).
--
-- Cheap first: a document of at most 200 bytes can neither nest 101 levels
-- ([[...1...]] needs 203) nor hold a 1001-character number, so callers that check one
-- per job skip the call below that size. A number that long has a run of at least
-- 500 digits, and a regular expression over the text (about 1 ms for 256 KiB) rules
-- that out for almost every document. Only a document with such a run (in a string,
-- say) pays for the exact test: its numbers, collected by one jsonpath scan, as text
-- (up to about 20 ms for 256 KiB of small numbers).
create or replace function app.document_problem(p_document jsonb, p_text text, p_max_bytes integer)
returns text
language plpgsql
immutable
set search_path = pg_catalog, pg_temp
as $$
declare
  v_bytes integer := octet_length(p_text);
begin
  if p_document is null or v_bytes <= 200 then
    return null;
  end if;
  if v_bytes > p_max_bytes then
    return format('must be at most %s bytes as JSON text (got %s)', p_max_bytes, v_bytes);
  end if;
  if jsonb_path_exists(p_document, '$.**{101}') then
    return 'must nest at most 100 levels below its top level';
  end if;
  if v_bytes > 1000
     and p_text ~ '[0-9]{250}[0-9]{250}'
     and jsonb_path_query_array(p_document, 'strict $.** ? (@.type() == "number")')::text
         ~ '[-.0-9]{250}[-.0-9]{250}[-.0-9]{250}[-.0-9]{251}' then
    return 'numbers must be at most 1000 characters as JSON text';
  end if;
  return null;
end;
$$;
revoke all on function app.document_problem(jsonb, text, integer) from public;

-- The owner rule (a worker's name, stored as lease_owner and as the actor of its
-- events, which tenant readers see): non-blank, at most 200 characters, plain text
-- (app.character_problem).
create or replace function app.check_owner(p_owner text)
returns void
language plpgsql
immutable
set search_path = pg_catalog, pg_temp
as $$
begin
  if p_owner is null or app.is_blank(p_owner) or length(p_owner) > 200 then
    perform app.raise_invalid('p_owner must be a non-blank text of at most 200 characters');
  end if;
  if app.character_problem(p_owner) is not null then
    perform app.raise_invalid('p_owner ' || app.character_problem(p_owner));
  end if;
end;
$$;
revoke all on function app.check_owner(text) from public;

-- The operator's name on the events of redrive and cancel: the owner rule (non-blank,
-- at most 200 characters, app.character_problem), under its own name.
create or replace function app.check_actor(p_actor text)
returns void
language plpgsql
immutable
set search_path = pg_catalog, pg_temp
as $$
begin
  if p_actor is null or app.is_blank(p_actor) or length(p_actor) > 200 then
    perform app.raise_invalid('p_actor must be a non-blank text of at most 200 characters');
  end if;
  if app.character_problem(p_actor) is not null then
    perform app.raise_invalid('p_actor ' || app.character_problem(p_actor));
  end if;
end;
$$;
revoke all on function app.check_actor(text) from public;

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
  if p_owner is null or length(p_owner) > 200 or p_owner ~ '[^ -~]'
     or (ascii(p_owner) not between 33 and 126 and app.is_blank(p_owner)) then
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

-- A claim's kind filter: the kinds to claim (p_kinds) or the kinds to leave
-- (p_exclude_kinds), never both; NULL for both means every kind. A filter names 1 .. 100
-- kinds (each costs the claim an index probe or two), each a valid kind (non-blank, at
-- most 128 characters: the enqueue rule without app.character_problem, as a filter only
-- selects, and must still reach the jobs of kinds stored before enqueue held kinds to
-- it), in a one-dimensional array indexed from 1.
-- An empty list is refused rather than read as "nothing" or "everything": a worker
-- configured with one by mistake would otherwise claim nothing, or all. Called by the
-- claims only when a filter is given, so an unfiltered claim pays nothing for it; a
-- filtered worker sends the same filter with every claim, so the checks are plain
-- expressions, one loop over the kinds and no query (a few microseconds).
create or replace function app.check_kind_filter(p_kinds text[], p_exclude_kinds text[])
returns void
language plpgsql
immutable
set search_path = pg_catalog, pg_temp
as $$
declare
  v_name text := case when p_kinds is not null then 'p_kinds' else 'p_exclude_kinds' end;
  v_kinds text[] := coalesce(p_kinds, p_exclude_kinds);
  v_kind text;
  v_n integer := 0;
begin
  if p_kinds is not null and p_exclude_kinds is not null then
    perform app.raise_invalid('p_kinds and p_exclude_kinds cannot both be set: claim some '
      'kinds only (p_kinds) or every kind but some (p_exclude_kinds), or pass NULL for '
      'both to claim every kind');
  end if;
  if v_kinds is null then
    return;
  end if;
  if array_ndims(v_kinds) <> 1 or array_lower(v_kinds, 1) <> 1 then
    perform app.check_array(v_name, v_kinds);
  end if;
  if cardinality(v_kinds) < 1 or cardinality(v_kinds) > 100 then
    perform app.raise_invalid(format('%s must name 1 to 100 kinds (got %s); pass NULL for '
      'no filter', v_name, cardinality(v_kinds)));
  end if;
  foreach v_kind in array v_kinds loop
    v_n := v_n + 1;
    if v_kind is null or length(v_kind) > 128
       or (ascii(v_kind) not between 33 and 126 and app.is_blank(v_kind)) then
      perform app.raise_invalid(format('%s element %s must be a job kind: a non-blank text '
        'of at most 128 characters', v_name, v_n));
    end if;
  end loop;
end;
$$;
revoke all on function app.check_kind_filter(text[], text[]) from public;

-- A failure report is never refused: whatever the worker sends becomes a JSON object
-- that fits the row, so a bad error document cannot lose the failure it describes. One
-- that could not be stored or read back (over 65,536 bytes, nested more than 100
-- levels, or holding a number longer than 1000 characters: app.document_problem)
-- becomes a truncated copy of its text, which any decoder reads, saying why.
create or replace function app.error_document(p_error jsonb)
returns jsonb
language plpgsql
immutable
set search_path = pg_catalog, pg_temp
as $$
declare
  v_text text;
  v_problem text;
begin
  if p_error is null then
    return jsonb_build_object('message', null);
  end if;
  v_text := p_error::text;
  if octet_length(v_text) > 200 then
    v_problem := app.document_problem(p_error, v_text, 65536);
  end if;
  if v_problem is not null then
    return jsonb_build_object(
      'code', 'ERROR_TRUNCATED',
      'problem', 'the error document ' || v_problem,
      'truncated', left(v_text, 8192));
  end if;
  if jsonb_typeof(p_error) <> 'object' then
    return jsonb_build_object('message', p_error);
  end if;
  return p_error;
end;
$$;
revoke all on function app.error_document(jsonb) from public;

-- The operator functions' filters. p_kind, like the claims' kind filter, is not held to
-- app.character_problem: it selects, so that jobs of kinds stored before enqueue held
-- kinds to it can still be redriven, cancelled and listed.
create or replace function app.check_filters(p_job_ids uuid[], p_kind text, p_limit integer)
returns void
language plpgsql
immutable
set search_path = pg_catalog, pg_temp
as $$
begin
  if p_job_ids is not null then
    perform app.check_array('p_job_ids', p_job_ids);
    perform app.check_range('number of job ids', cardinality(p_job_ids), 1, 1000);
    if array_position(p_job_ids, null) is not null then
      perform app.raise_invalid('p_job_ids must not contain NULL');
    end if;
  end if;
  if p_kind is not null and (app.is_blank(p_kind) or length(p_kind) > 128) then
    perform app.raise_invalid('p_kind must be a non-blank text of at most 128 characters');
  end if;
  perform app.check_range('p_limit', p_limit, 1, 1000);
end;
$$;
revoke all on function app.check_filters(uuid[], text, integer) from public;

-- An operator's reason, stored in the events of redrive, cancel and a queue's pause and
-- shown on the job's timeline: at most 500 characters of plain text
-- (app.character_problem: a reason is one line, like the dashboard's field for it), or
-- NULL.
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
  if app.character_problem(p_reason) is not null then
    perform app.raise_invalid('p_reason ' || app.character_problem(p_reason));
  end if;
end;
$$;
revoke all on function app.check_reason(text) from public;

-- A queue's name: 1 .. 40 characters, lowercase ASCII letters, digits, '-' and '_',
-- starting with a letter (app.queues' and app.jobs' name rule); 22023 otherwise.
create or replace function app.check_queue(p_name text, p_queue text)
returns void
language plpgsql
immutable
set search_path = pg_catalog, pg_temp
as $$
begin
  if p_queue is null or p_queue !~ '^[a-z][a-z0-9_-]{0,39}$' then
    perform app.raise_invalid(format(
      '%s must be a queue name: 1 to 40 lowercase letters, digits, ''-'' or ''_'', '
      'starting with a letter (got %s)',
      p_name, coalesce(quote_literal(left(p_queue, 60)), 'NULL')));
  end if;
end;
$$;
revoke all on function app.check_queue(text, text) from public;
