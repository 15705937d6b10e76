"""load_postgres_schema against a real PostgreSQL server, and DSN redaction."""

from __future__ import annotations

import psycopg
import psycopg.conninfo
import pytest

from headstart.schema import Column, ForeignKey, SchemaError, load_postgres_schema, redact_dsn
from headstart.schema.dsn import is_postgres_dsn, scrub_password

DDL = """
CREATE SCHEMA school;
CREATE TABLE school.dept (id int PRIMARY KEY, name text NOT NULL);
CREATE TABLE school.employee (
    id serial PRIMARY KEY,
    dept_id int REFERENCES school.dept (id),
    manager_id int REFERENCES school.employee (id),
    "First Name" varchar(40),
    salary numeric(10, 2)
);
CREATE TABLE school.enrollment (
    course_id int, term char(6), seats int NOT NULL, dropped int,
    PRIMARY KEY (term, course_id)
);
ALTER TABLE school.enrollment DROP COLUMN dropped;
CREATE TABLE school.grade (
    id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    t char(6), c int,
    CONSTRAINT grade_enrollment FOREIGN KEY (t, c) REFERENCES school.enrollment (term, course_id)
);
CREATE TABLE school."Audit Log" (at timestamp, payload jsonb, tags text[]);
CREATE TABLE public.elsewhere (id int PRIMARY KEY);
CREATE TABLE school.link (other_id int REFERENCES public.elsewhere (id));
CREATE VIEW school.v AS SELECT 1 AS one;
CREATE SCHEMA empty;
"""


def fk(cols, ref_table, ref_cols) -> ForeignKey:
    return ForeignKey(tuple(cols), ref_table, tuple(ref_cols))


@pytest.fixture
def school_dsn(postgres_database: str) -> str:
    with psycopg.connect(postgres_database, autocommit=True) as conn:
        conn.execute(DDL)
    return postgres_database


def dbname_of(dsn: str) -> str:
    return psycopg.conninfo.conninfo_to_dict(dsn)["dbname"]


EXPECTED_TABLES = [
    (
        "Audit Log",
        (
            Column("at", "timestamp without time zone"),
            Column("payload", "jsonb"),
            Column("tags", "text[]"),
        ),
        (),
        (),
    ),
    ("dept", (Column("id", "integer", True), Column("name", "text", True)), ("id",), ()),
    (
        "employee",
        (
            Column("id", "integer", True),
            Column("dept_id", "integer"),
            Column("manager_id", "integer"),
            Column("First Name", "character varying(40)"),
            Column("salary", "numeric(10,2)"),
        ),
        ("id",),
        (fk(["dept_id"], "dept", ["id"]), fk(["manager_id"], "employee", ["id"])),
    ),
    (
        "enrollment",
        (Column("course_id", "integer", True), Column("term", "character(6)", True), Column("seats", "integer", True)),
        ("term", "course_id"),
        (),
    ),
    (
        "grade",
        (Column("id", "bigint", True), Column("t", "character(6)"), Column("c", "integer")),
        ("id",),
        (fk(["t", "c"], "enrollment", ["term", "course_id"]),),
    ),
    ("link", (Column("other_id", "integer"),), (), ()),
]


def test_schema_with_composite_and_self_referencing_keys(school_dsn):
    schema = load_postgres_schema(school_dsn, schema_name="school")
    got = [(t.name, t.columns, t.primary_key, t.foreign_keys) for t in schema.tables]
    assert got == EXPECTED_TABLES
    assert schema.db_id == f"{dbname_of(school_dsn)}.school"
    assert schema.extras == {
        "skipped_foreign_keys": [
            "link(other_id) -> public.elsewhere: constraint 'link_other_id_fkey' references another schema"
        ]
    }


def test_public_schema_and_db_id(school_dsn):
    schema = load_postgres_schema(school_dsn)
    assert (schema.db_id, schema.table_names) == (dbname_of(school_dsn), ["elsewhere"])
    assert load_postgres_schema(school_dsn, db_id="mine").db_id == "mine"


def test_source_is_redacted(school_dsn):
    dsn = school_dsn + "&password=hunter2"  # trust auth: the password is ignored
    schema = load_postgres_schema(dsn)
    assert schema.source == redact_dsn(dsn)
    assert "hunter2" not in schema.source


@pytest.mark.parametrize(
    ("schema_name", "message"),
    [
        ("empty", "PostgreSQL schema 'empty' at {dsn} has no tables"),
        ("nope", "PostgreSQL schema 'nope' does not exist at {dsn}"),
    ],
)
def test_schema_errors(school_dsn, schema_name, message):
    with pytest.raises(SchemaError) as info:
        load_postgres_schema(school_dsn, schema_name=schema_name)
    assert str(info.value) == message.format(dsn=redact_dsn(school_dsn))


def test_connection_failure_redacts_password():
    dsn = "postgresql://alice:s3cretpw@127.0.0.1:1/db"
    with pytest.raises(SchemaError) as info:
        load_postgres_schema(dsn, connect_timeout=2)
    message = str(info.value)
    assert message.startswith(
        "cannot read PostgreSQL schema 'public' at postgresql://alice:***@127.0.0.1:1/db: "
    )
    assert "s3cretpw" not in message


@pytest.mark.parametrize(
    ("dsn", "redacted"),
    [
        ("postgresql://u:pw@h:5432/db", "postgresql://u:***@h:5432/db"),
        ("postgres://u@h/db", "postgres://u@h/db"),
        ("postgresql://h/db?sslmode=require&password=pw", "postgresql://h/db?sslmode=require&password=***"),
        ("postgresql://u:p%40ss@h1:1,h2:2/db", "postgresql://u:***@h1:1,h2:2/db"),
        ("host=h password=pw user=u", "host=h password=*** user=u"),
        ("host=h password = 'a b\\' c' user=u", "host=h password = *** user=u"),
        ("host=h user=u", "host=h user=u"),
    ],
)
def test_redact_dsn(dsn, redacted):
    assert redact_dsn(dsn) == redacted


@pytest.mark.parametrize(
    ("text", "dsn", "scrubbed"),
    [
        ("auth failed for p@ss", "postgresql://u:p%40ss@h/db", "auth failed for ***"),
        ("bad secret", "host=h password=secret", "bad ***"),
        ("nothing to hide", "postgresql://u@h/db", "nothing to hide"),
    ],
)
def test_scrub_password(text, dsn, scrubbed):
    assert scrub_password(text, dsn) == scrubbed


@pytest.mark.parametrize(
    ("spec", "is_dsn"),
    [("postgresql://h/db", True), ("POSTGRES://h/db", True), ("host=h dbname=d", False), ("world_1", False)],
)
def test_is_postgres_dsn(spec, is_dsn):
    assert is_postgres_dsn(spec) is is_dsn
