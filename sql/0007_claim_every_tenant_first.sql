-- leaseq 0007: a fair claim serves every ready tenant before any tenant's second job.
--
-- 0003's app.claim_ready_jobs gave each ready tenant a share of ceil(limit / tenants)
-- and cut the candidates at p_limit in tenant order. When the number of ready tenants
-- does not divide the limit (6 to 9 tenants for a batch of 10), the first tenants'
-- shares filled the batch and the last tenants got nothing; the last one is the tenant
-- whose oldest ready job is the newest, so a newcomer with a single job could wait
-- behind other tenants' backlogs for many batches.
--
-- Now the candidates are taken round by round: every tenant's first job, then every
-- tenant's second, and so on, up to p_limit. While no more than p_limit tenants have
-- ready work, each of them gets at least one job into every batch. The refill of
-- unused shares and everything else are unchanged; the signature, and so the grants,
-- stay as they are.

create or replace function app.claim_ready_jobs(
  p_owner text,
  p_limit integer default 10,
  p_lease interval default interval '30 seconds'
)
returns setof app.jobs
language plpgsql
security definer
set search_path = ''
as $$
declare
  v_now timestamptz := clock_timestamp();
  v_tenants uuid[];
  v_share integer;
  v_ids uuid[] := '{}';
  v_more uuid[];
begin
  perform app.check_owner(p_owner);
  perform app.check_range('p_limit', p_limit, 1, 100);
  perform app.check_lease(p_lease);

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

  -- Each tenant's share is locked (SKIP LOCKED) and ranked within the tenant; the
  -- batch takes rank 1 of every tenant first. Locked candidates beyond the limit
  -- (at most one share's rounding per tenant) stay unclaimed and unlock at commit.
  select coalesce(array_agg(c.id), '{}') into v_ids
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

  if cardinality(v_ids) < p_limit and cardinality(v_tenants) > 1 then
    select coalesce(array_agg(c.id), '{}') into v_more
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
    v_ids := v_ids || v_more;
  end if;

  if cardinality(v_ids) = 0 then
    return;
  end if;

  return query
  with claimed as (
    update app.jobs j
    set state = 'running',
        attempts = j.attempts + 1,
        lease_owner = p_owner,
        lease_token = gen_random_uuid(),
        lease_expires_at = v_now + p_lease,
        updated_at = v_now
    where j.id = any (v_ids)
    returning j.*
  ), audit as (
    insert into app.job_events (tenant_id, job_id, event_type, actor, lease_token, details, created_at)
    select c.tenant_id, c.id, 'claimed', p_owner, c.lease_token,
           jsonb_build_object('attempt', c.attempts, 'leaseExpiresAt', c.lease_expires_at),
           v_now
    from claimed c
  )
  select * from claimed c order by c.available_at, c.created_at, c.id;
end;
$$;
