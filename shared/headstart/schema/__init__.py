"""Database schemas: the data model, loaders and the CREATE TABLE renderer."""

from headstart.schema.dsn import is_postgres_dsn, redact_dsn
from headstart.schema.model import Column, ForeignKey, Schema, SchemaError, Table
from headstart.schema.postgres import load_postgres_schema
from headstart.schema.render import (
    TABLE_SEPARATOR,
    quote_identifier,
    render_create_tables,
    render_table,
)
from headstart.schema.resolve import ResolvedDatabase, resolve_database
from headstart.schema.spider_json import load_spider_schema, load_spider_tables
from headstart.schema.sqlite import load_sqlite_schema

__all__ = [
    "TABLE_SEPARATOR",
    "Column",
    "ForeignKey",
    "ResolvedDatabase",
    "Schema",
    "SchemaError",
    "Table",
    "is_postgres_dsn",
    "load_postgres_schema",
    "load_spider_schema",
    "load_spider_tables",
    "load_sqlite_schema",
    "quote_identifier",
    "redact_dsn",
    "render_create_tables",
    "render_table",
    "resolve_database",
]
