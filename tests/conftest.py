"""Shared pytest configuration: fixtures that several test files use."""

pytest_plugins = ["tests.pg_fixture", "tests.redis_fixture", "tests.engine_fixture", "tests.serve_fixture"]
