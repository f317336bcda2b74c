-- leaseq functions: claim and renew leases.
--
-- Claims lock the oldest ready rows with FOR UPDATE SKIP LOCKED, so concurrent claimers
-- never wait on, nor double-claim, each other's rows. A lease is 1 second .. 1 day; a
-- claim takes 1 .. 100 jobs.
--
-- The claim functions plan their statements once per session (plan_cache_mode =
-- force_generic_plan). PL/pgSQL plans a statement with parameters again for every call
-- for as long as the generic plan's estimate looks costlier, and the claim statements
-- always look costlier generically (their LIMIT and due-time cut-off are parameters):
-- measured with bench/, planning was about 15% of the server's CPU per job in a no-op
-- drain. Their best plan does not depend on the values (walk jobs_claimable_idx of one
-- tenant in (available_at, created_at, id) order, lock with SKIP LOCKED, stop at the
-- limit); tests/sql/test_query_plans.py checks exactly those plans on a large table.

-- Claim rows this transaction has already locked FOR UPDATE: one INSERT ... SELECT of
-- 'claimed' audit rows, then one UPDATE. The audit rows come first so that the foreign
-- key check of each finds its job row already locked FOR UPDATE by the claim and takes
-- no second row lock (one heap LOCK WAL record per job fewer). Internal: owner only.
create or replace function app.claim_locked_jobs(
  p_ids uuid[],
  p_owner text,
  p_lease interval,
  p_now timestamptz
)
returns setof app.jobs
language plpgsql
set search_path = pg_catalog, pg_temp
set plan_cache_mode = force_generic_plan
as $$
declare
  v_tokens uuid[];
begin
  select array_agg(gen_random_uuid()) into v_tokens from unnest(p_ids);

  insert into app.job_events (tenant_id, job_id, event_type, actor, lease_token, details, created_at)
  select j.tenant_id, j.id, 'claimed', p_owner, c.token,
         jsonb_build_object('attempt', j.attempts + 1, 'leaseExpiresAt', p_now + p_lease),
         p_now
  from unnest(p_ids, v_tokens) as c(id, token)
  join app.jobs j on j.id = c.id;

  return query
  with claimed as (
    update app.jobs j
    set state = 'running',
        attempts = j.attempts + 1,
        lease_owner = p_owner,
        lease_token = c.token,
        lease_expires_at = p_now + p_lease,
        updated_at = p_now
    from unnest(p_ids, v_tokens) as c(id, token)
    where j.id = c.id
    returning j.*
  )
  select * from claimed c order by c.available_at, c.created_at, c.id;
end;
$$;
revoke all on function app.claim_locked_jobs(uuid[], text, interval, timestamptz) from public;

-- Claims take the oldest ready rows with FOR UPDATE SKIP LOCKED in a subquery whose
-- LIMIT applies to rows this transaction actually locked, so concurrent claimers walk
-- past each other instead of queueing on the same rows; claim_locked_jobs then writes
-- all their 'claimed' audit rows with one INSERT ... SELECT and updates them with one
-- UPDATE. Argument checks are plain expressions; the helper that raises the detailed
-- message only runs when one fails.
create or replace function app.claim_jobs(
  p_tenant_id uuid,
  p_owner text,
  p_limit integer default 10,
  p_lease interval default interval '30 seconds'
)
returns setof app.jobs
language plpgsql
security definer
set search_path = pg_catalog, pg_temp
set plan_cache_mode = force_generic_plan
as $$
declare
  v_now timestamptz := clock_timestamp();
  v_ids uuid[];
begin
  if p_tenant_id is null then
    perform app.check_required('p_tenant_id', p_tenant_id);
  end if;
  perform app.check_claim(p_owner, p_limit, p_lease);

  select array_agg(c.id) into v_ids
  from (
    select j.id
    from app.jobs j
    where j.tenant_id = p_tenant_id
      and j.state in ('pending', 'retry_wait')
      and j.available_at <= v_now
    order by j.available_at, j.created_at, j.id
    for update skip locked
    limit p_limit
  ) c;
  if v_ids is null then
    return;
  end if;
  return query select * from app.claim_locked_jobs(v_ids, p_owner, p_lease, v_now);
end;
$$;
revoke all on function app.claim_jobs(uuid, text, integer, interval) from public, service_role;
grant execute on function app.claim_jobs(uuid, text, integer, interval) to leaseq_worker;

-- Tenants with claimable work, in tenant_id order, found by a loose index scan over
-- jobs_claimable_idx: one index probe per tenant (its first entry carries both the
-- tenant and its oldest available_at), never a scan of the backlog.
-- oldest_ready_at is the tenant's oldest pending/retry_wait available_at; a tenant
-- whose work is all in the future is left out.
create or replace function app.ready_tenants(p_limit integer default 100)
returns table (tenant_id uuid, oldest_ready_at timestamptz)
language plpgsql
stable
security definer
set search_path = pg_catalog, pg_temp
set plan_cache_mode = force_generic_plan
as $$
#variable_conflict use_column
declare
  v_now timestamptz := clock_timestamp();
begin
  if p_limit is null or p_limit < 1 or p_limit > 10000 then
    perform app.check_range('p_limit', p_limit, 1, 10000);
  end if;
  return query
  with recursive tenants as (
    (select j.tenant_id, j.available_at
     from app.jobs j
     where j.state in ('pending', 'retry_wait')
     order by j.tenant_id, j.available_at
     limit 1)
    union all
    select following.tenant_id, following.available_at
    from tenants t
    cross join lateral (
      select j.tenant_id, j.available_at
      from app.jobs j
      where j.state in ('pending', 'retry_wait')
        and j.tenant_id > t.tenant_id
      order by j.tenant_id, j.available_at
      limit 1
    ) following
  )
  select t.tenant_id, t.available_at
  from tenants t
  where t.available_at <= v_now
  limit p_limit;
end;
$$;
revoke all on function app.ready_tenants(integer) from public, service_role;
grant execute on function app.ready_tenants(integer) to leaseq_worker;

-- Fair claim across tenants, for scheduled workers that serve everyone.
-- Up to p_limit ready tenants are served, the one waiting longest first. Each locks a
-- share of ceil(limit / tenants) candidates, and the batch takes them round by round:
-- every tenant's first job, then every tenant's second, and so on; shares left unused
-- by small tenants are then refilled from the others. So while no more than p_limit
-- tenants have ready work, every one of them gets at least one job into every batch: a
-- backlog of any size in one tenant delays another tenant's job by at most one batch.
-- Locked candidates beyond the limit (a share's rounding) unlock at commit.
create or replace function app.claim_ready_jobs(
  p_owner text,
  p_limit integer default 10,
  p_lease interval default interval '30 seconds'
)
returns setof app.jobs
language plpgsql
security definer
set search_path = pg_catalog, pg_temp
set plan_cache_mode = force_generic_plan
as $$
declare
  v_now timestamptz := clock_timestamp();
  v_tenants uuid[];
  v_share integer;
  v_ids uuid[];
  v_more uuid[];
begin
  perform app.check_claim(p_owner, p_limit, p_lease);

  select array_agg(r.tenant_id order by r.oldest_ready_at, r.tenant_id)
  into v_tenants
  from (
    select rt.tenant_id, rt.oldest_ready_at
    from app.ready_tenants(10000) rt
    order by rt.oldest_ready_at, rt.tenant_id
    limit p_limit
  ) r;
  if v_tenants is null then
    return;
  end if;
  v_share := ceil(p_limit::numeric / cardinality(v_tenants));

  select array_agg(c.id) into v_ids
  from (
    select ranked.id
    from unnest(v_tenants) with ordinality as t(tenant_id, pos)
    cross join lateral (
      select picked.id,
             row_number() over (order by picked.available_at, picked.created_at, picked.id)
               as round
      from (
        select j.id, j.available_at, j.created_at
        from app.jobs j
        where j.tenant_id = t.tenant_id
          and j.state in ('pending', 'retry_wait')
          and j.available_at <= v_now
        order by j.available_at, j.created_at, j.id
        for update skip locked
        limit v_share
      ) picked
    ) ranked
    order by ranked.round, t.pos
    limit p_limit
  ) c;
  v_ids := coalesce(v_ids, '{}');

  if cardinality(v_ids) < p_limit and cardinality(v_tenants) > 1 then
    select array_agg(c.id) into v_more
    from (
      select picked.id
      from unnest(v_tenants) with ordinality as t(tenant_id, pos)
      cross join lateral (
        select j.id
        from app.jobs j
        where j.tenant_id = t.tenant_id
          and j.state in ('pending', 'retry_wait')
          and j.available_at <= v_now
          and j.id <> all (v_ids)
        order by j.available_at, j.created_at, j.id
        for update skip locked
        limit p_limit - cardinality(v_ids)
      ) picked
      limit p_limit - cardinality(v_ids)
    ) c;
    v_ids := v_ids || coalesce(v_more, '{}');
  end if;

  if cardinality(v_ids) = 0 then
    return;
  end if;
  return query select * from app.claim_locked_jobs(v_ids, p_owner, p_lease, v_now);
end;
$$;
revoke all on function app.claim_ready_jobs(text, integer, interval) from public, service_role;
grant execute on function app.claim_ready_jobs(text, integer, interval) to leaseq_worker;

create or replace function app.renew_job_lease(
  p_tenant_id uuid,
  p_job_id uuid,
  p_owner text,
  p_token uuid,
  p_lease interval default interval '30 seconds'
)
returns boolean
language plpgsql
security definer
set search_path = pg_catalog, pg_temp
as $$
declare
  v_now timestamptz := clock_timestamp();
  v_renewed boolean;
begin
  perform app.check_required('p_tenant_id', p_tenant_id);
  perform app.check_required('p_job_id', p_job_id);
  perform app.check_owner(p_owner);
  perform app.check_required('p_token', p_token);
  perform app.check_lease(p_lease);

  update app.jobs
  set lease_expires_at = v_now + p_lease,
      updated_at = v_now
  where tenant_id = p_tenant_id
    and id = p_job_id
    and state = 'running'
    and lease_owner = p_owner
    and lease_token = p_token
    and lease_expires_at > v_now
  returning true into v_renewed;

  return coalesce(v_renewed, false);
end;
$$;
revoke all on function app.renew_job_lease(uuid, uuid, text, uuid, interval) from public, service_role;
grant execute on function app.renew_job_lease(uuid, uuid, text, uuid, interval) to leaseq_worker;
