-- leaseq 0030: no row lock before every update of a job.
--
-- 0021 kept a hand-edited job's claim key in step with its available_at and priority with
-- a BEFORE UPDATE row trigger (jobs_refresh_claim_key). A BEFORE ROW trigger makes
-- PostgreSQL lock the row it is about to update and read it back before it evaluates the
-- trigger's column list or its WHEN test, so every update of app.jobs paid for a row lock,
-- the claim's and the outcome's included: one Heap/LOCK WAL record each (two a job, about
-- 108 bytes without full-page images, and a full-page image of the job's page after each
-- checkpoint), although the functions write the key themselves and the trigger's function
-- never ran on their paths.
--
-- The same repair is now an AFTER row trigger, which needs no lock: the update goes
-- through as written, and only when it changed available_at or priority without the key
-- does the trigger write the key in a second update of that row. The functions never
-- change one without the other, so on their paths the WHEN test is the whole cost.
-- The function's current definition is in functions/enqueue.sql; this first one is
-- written out so that the trigger works before the function files are applied.

drop trigger if exists jobs_refresh_claim_key on app.jobs;

create or replace function app.refresh_claim_key()
returns trigger
language plpgsql
set search_path = pg_catalog, pg_temp
as $$
begin
  update app.jobs j
  set claim_key = new.available_at
                  - (new.priority - 1) * (select s.priority_step from app.settings s)
  where j.id = new.id and j.tenant_id = new.tenant_id
    and j.claim_key is not distinct from new.claim_key;
  return null;
end;
$$;
revoke all on function app.refresh_claim_key() from public;

create trigger jobs_refresh_claim_key
after update of available_at, priority on app.jobs
for each row when (new.claim_key is not distinct from old.claim_key
                   and (new.available_at is distinct from old.available_at
                        or new.priority is distinct from old.priority))
execute function app.refresh_claim_key();
