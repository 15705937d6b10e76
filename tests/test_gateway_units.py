"""Gateway logic without servers: tokens, tenants, rate limits, edge checks."""

from __future__ import annotations

import pytest

from headstart.client.errors import ApiError, grpc_status, http_status
from services.gateway.auth import ANONYMOUS, Authenticator, parse_token_specs
from services.gateway.limits import MAX_TABLES, RateLimiter, check_seq, check_size, check_tables, check_text
from services.gateway.sessions import SessionRegistry, engine_session_id


@pytest.mark.parametrize("specs, expected", [
    (["abc"], {"abc": "tenant0"}),
    (["alice=t1", "bob=t2"], {"t1": "alice", "t2": "bob"}),
    ([], {}),
])
def test_parse_token_specs(specs, expected):
    assert parse_token_specs(specs) == expected


@pytest.mark.parametrize("tokens, header, expected", [
    ({}, None, ANONYMOUS),
    ({"t1": "alice"}, "Bearer t1", "alice"),
    ({"t1": "alice"}, "bearer t1", "alice"),
    ({"t1": "alice"}, "Bearer t2", "UNAUTHENTICATED"),
    ({"t1": "alice"}, "Basic t1", "UNAUTHENTICATED"),
    ({"t1": "alice"}, None, "UNAUTHENTICATED"),
])
def test_authenticator(tokens, header, expected):
    auth = Authenticator(tokens)
    try:
        got = auth.tenant(header)
    except ApiError as exc:
        got = exc.code
    assert got == expected


def test_rate_limiter_refills():
    now = [0.0]
    limiter = RateLimiter(rate=2.0, burst=3, clock=lambda: now[0])
    taken = []
    for t in (0.0, 0.0, 0.0, 0.0, 0.5, 0.5, 1.5, 1.5, 1.5):
        now[0] = t
        try:
            limiter.take()
            taken.append(True)
        except ApiError as exc:
            assert exc.code == "RATE_LIMITED"
            taken.append(False)
    assert taken == [True, True, True, False, True, False, True, True, False]


@pytest.mark.parametrize("check, value, code", [
    (lambda v: check_size(v, 10), 11, "MESSAGE_TOO_LARGE"),
    (lambda v: check_text(v, 3), "abcd", "TEXT_TOO_LONG"),
    (lambda v: check_text(v, 3), 7, "INVALID_ARGUMENT"),
    (lambda v: check_text(v, 3), "\ud800", "INVALID_ARGUMENT"),
    (check_seq, 0, "INVALID_ARGUMENT"),
    (check_seq, True, "INVALID_ARGUMENT"),
    (check_seq, 1.5, "INVALID_ARGUMENT"),
    (check_seq, 2**62, "INVALID_ARGUMENT"),
    (check_seq, 2**62 - 1, "INVALID_ARGUMENT"),  # a jump past 2^32 from 0: it would wedge the session (issue 29)
    (lambda v: check_seq(v, 10), 10 + 2**32 + 1, "INVALID_ARGUMENT"),
    (check_tables, "city", "INVALID_ARGUMENT"),
    (check_tables, ["city", ""], "INVALID_ARGUMENT"),
    (check_tables, ["city", 3], "INVALID_ARGUMENT"),
    (check_tables, ["t" * 257], "INVALID_ARGUMENT"),
    (check_tables, [f"t{i}" for i in range(MAX_TABLES + 1)], "INVALID_ARGUMENT"),
])
def test_edge_checks(check, value, code):
    with pytest.raises(ApiError) as err:
        check(value)
    assert err.value.code == code


@pytest.mark.parametrize("tables, expected", [
    (None, None),
    ([], None),  # the whole schema, as an empty repeated field says
    (["country", "city"], ["country", "city"]),
    (("city",), ["city"]),
    (["no_such_table"], ["no_such_table"]),  # whether the db has it is the engine's answer
])
def test_check_tables_passes_a_selection_through(tables, expected):
    assert check_tables(tables) == expected


def test_registry_scopes_ids_by_tenant():
    registry = SessionRegistry(max_per_tenant=1)
    session = registry.create("alice", "world_1", ephemeral=False)
    with pytest.raises(ApiError) as other:
        registry.get("bob", session.session_id)
    with pytest.raises(ApiError) as full:
        registry.create("alice", "world_1", ephemeral=False)
    assert (other.value.code, full.value.code) == ("NOT_FOUND", "RESOURCE_EXHAUSTED")
    assert registry.get("alice", session.session_id) is session
    assert engine_session_id("alice", "x") != engine_session_id("bob", "x")


@pytest.mark.parametrize("code, grpc_name, http", [
    ("TEXT_TOO_LONG", "INVALID_ARGUMENT", 413),
    ("NOT_FOUND", "NOT_FOUND", 404),
    ("RESOURCE_EXHAUSTED", "RESOURCE_EXHAUSTED", 429),
    ("WHATEVER", "INTERNAL", 500),
])
def test_code_mapping(code, grpc_name, http):
    assert (grpc_status(code).name, http_status(code)) == (grpc_name, http)


def test_seqs_move_forward_by_at_most_2_to_the_32_per_message():
    assert check_seq(2**32) == 2**32 and check_seq(2**32 + 10, 10) == 2**32 + 10
    assert check_seq(3, 50) == 3  # older ones pass: the caller ignores them (or calls them stale)


@pytest.mark.parametrize("retry_after_s, header, trailer", [
    (None, None, ()), (0.2, "1", (("grpc-retry-pushback-ms", "200"),)), (2.5, "3", (("grpc-retry-pushback-ms", "2500"),))])
def test_a_retry_hint_rides_every_edge(retry_after_s, header, trailer):
    """INGESTION_BEHIND's retry hint: REST's Retry-After (whole seconds, up) and body, gRPC's pushback
    trailer (ms), read back by the client."""
    import json

    from headstart.client.errors import ApiError, retry_from_metadata, retry_metadata
    from services.gateway.rest import error_response

    exc = ApiError("INGESTION_BEHIND", "behind", retry_after_s=retry_after_s)
    response = error_response(exc)
    assert response.status_code == 503 and response.headers.get("Retry-After") == header
    assert json.loads(response.body).get("retry_after_s") == retry_after_s
    assert retry_metadata(exc) == trailer
    assert retry_from_metadata(trailer) == retry_after_s
    assert retry_from_metadata((("grpc-retry-pushback-ms", "soon"),)) is None
