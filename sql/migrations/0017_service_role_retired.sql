-- leaseq 0017: service_role leaves new databases.
--
-- service_role was the one runtime group of the first releases (0004). Since 0010 it
-- holds nothing of its own: it is a member of leaseq_producer, leaseq_worker,
-- leaseq_reaper and leaseq_operator, so that logins made before the duty groups keep
-- working. A member therefore still holds all four duties (prune every finished job,
-- cancel any tenant's jobs, enqueue into any tenant), which is what the duty groups
-- exist to prevent. 0004 cannot be changed (migrations are forward-only) and still
-- creates the role in every new database; this migration removes it again:
--
-- * First, whatever earlier releases granted it directly in this schema is revoked
--   (0004-0007 and the reference schema granted EXECUTE; 0010 took away USAGE). Its
--   members have held their rights through the duty groups since 0010, so this takes
--   nothing from them. The function files used to do this on every apply; they no
--   longer name the role, which may not exist.
-- * Then the role is dropped if no role uses it (a member that inherits its rights or
--   may SET ROLE to it; its creator's ADMIN OPTION alone does not count) and nothing in
--   any database of the cluster depends on it (roles are cluster-wide: another database
--   may still grant to it). A fresh database thus ends without service_role.
-- * Otherwise it stays, marked deprecated (its comment), as the upgrade path for the
--   logins still in it: sql/README.md, "Upgrading from service_role", moves each to
--   the group of its duty; once none is left, DROP ROLE service_role. It also stays
--   when the owner may not drop it (an administrator created it, and the owner holds
--   neither CREATEROLE with ADMIN on it nor, before PostgreSQL 16, CREATEROLE); an
--   administrator drops it then.

do $$
declare
  v_role oid := (select r.oid from pg_catalog.pg_roles r where r.rolname = 'service_role');
  v_members text;
  v_dependents bigint;
begin
  if v_role is null then
    return;
  end if;

  revoke all on schema app from service_role;
  revoke all on all tables in schema app from service_role;
  revoke all on all sequences in schema app from service_role;
  revoke all on all functions in schema app from service_role;

  -- Members that get its rights (inherit) or may SET ROLE to it. From PostgreSQL 16 the
  -- role that created it is granted ADMIN OPTION alone (neither inherit nor set): that
  -- administers it and uses nothing, so it does not count. Before 16 the two columns do
  -- not exist and every membership counts (read through jsonb, which works on both).
  select string_agg(m.member::regrole::text, ', ' order by m.member::regrole::text)
  into v_members
  from pg_catalog.pg_auth_members m
  where m.roleid = v_role
    and (coalesce((pg_catalog.to_jsonb(m) ->> 'inherit_option')::boolean, true)
         or coalesce((pg_catalog.to_jsonb(m) ->> 'set_option')::boolean, true));
  -- Ownership, privileges, policies and default privileges naming it, in this database
  -- or any other (pg_shdepend is shared); what was revoked above is already gone.
  select count(*) into v_dependents
  from pg_catalog.pg_shdepend d
  where d.refclassid = 'pg_catalog.pg_authid'::regclass and d.refobjid = v_role;

  if v_members is null and v_dependents = 0 then
    begin
      drop role service_role;
      return;
    exception when insufficient_privilege or dependent_objects_still_exist then
      raise notice 'service_role is deprecated and unused, but % may not drop it: an administrator can (DROP ROLE service_role)', current_user;
    end;
  elsif v_members is not null then
    raise notice 'service_role is deprecated; its members (%) still hold every runtime duty: move each to the group of its duty (sql/README.md, Upgrading from service_role), then DROP ROLE service_role', v_members;
  else
    raise notice 'service_role is deprecated; it is kept because another database of this cluster still grants to it';
  end if;

  begin
    comment on role service_role is
      'deprecated (leaseq 0017): the legacy runtime group, a member of leaseq_producer, leaseq_worker, leaseq_reaper and leaseq_operator. Move each member to the group of its duty, then DROP ROLE service_role.';
  exception when insufficient_privilege then
    null;  -- the notice above says it all; a comment is not worth failing the upgrade
  end;
end
$$;
