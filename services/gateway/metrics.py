"""Prometheus metrics of one gateway (its own registry: no global state).

Names follow Prometheus's conventions: base units in the name (`_seconds`,
`_bytes`, `_ratio`, `_tokens`), counters end in `_total` (prometheus_client
adds it to a Counter's name), durations are histograms in seconds.
docs/operations.md lists them, with the names they had before issue 45.
"""

from __future__ import annotations

from collections import deque

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

RTT_BUCKETS = (0.0005, 0.001, 0.002, 0.004, 0.008, 0.016, 0.032, 0.064, 0.128, 0.256, 0.512, 1.0)
TTFT_BUCKETS = (0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0, 5.0)
ANSWER_BUCKETS = (0.05, 0.1, 0.2, 0.5, 1.0, 2.0, 5.0, 10.0, 20.0, 60.0)
RATIO_BUCKETS = (0.0, 0.25, 0.5, 0.75, 0.9, 0.95, 0.99, 1.0)
TOKEN_BUCKETS = (0, 1, 2, 4, 8, 16, 32, 64, 128, 256, 512)


class GatewayMetrics:
    def __init__(self):
        self.registry = CollectorRegistry()
        self.messages = Counter("headstart_gateway_messages", "client messages", ["edge", "type"], registry=self.registry)
        self.errors = Counter("headstart_gateway_errors", "errors sent to clients", ["edge", "code"], registry=self.registry)
        self.snapshot_rtt = Histogram(
            "headstart_gateway_snapshot_rtt_seconds", "gateway→replica→gateway time of one snapshot (ack)",
            buckets=RTT_BUCKETS, registry=self.registry)
        self.ttft = Histogram("headstart_gateway_ttft_seconds", "engine TTFT of submits",
                              buckets=TTFT_BUCKETS, registry=self.registry)
        # Every answer (typed submits, completions, OpenAI calls): what a person waits for, and how
        # much of the prompt the cache held when they pressed Enter (the Grafana dashboard's panels).
        self.answer = Histogram("headstart_gateway_answer_seconds", "engine time from submit to the complete answer",
                                ["edge"], buckets=ANSWER_BUCKETS, registry=self.registry)
        self.cached_ratio = Histogram("headstart_gateway_submit_cached_ratio",
                                      "prompt tokens in the cache at submit / prompt tokens", ["edge"],
                                      buckets=RATIO_BUCKETS, registry=self.registry)
        self.computed_at_submit = Histogram("headstart_gateway_submit_computed_tokens",
                                            "prompt tokens computed after submit", ["edge"],
                                            buckets=TOKEN_BUCKETS, registry=self.registry)
        self.sessions = Gauge("headstart_gateway_sessions", "open sessions", registry=self.registry)
        self.connections = Gauge("headstart_gateway_connections",
                                 "WebSocket connections, gRPC Type streams and event subscribers held now",
                                 registry=self.registry)
        self.sessions_reaped = Counter("headstart_gateway_sessions_reaped",
                                       "sessions the reaper closed: idle (nobody used it for session_idle_s) or "
                                       "leaked (its connection ended without closing it)", ["reason"],
                                       registry=self.registry)
        self.disconnects = Counter("headstart_gateway_client_disconnects",
                                   "requests whose client left before the answer (generation cancelled)",
                                   ["edge"], registry=self.registry)
        self.completions = Counter("headstart_gateway_completions", "one-shot completions by how they ended",
                                   ["outcome"], registry=self.registry)
        self.checked_answers = Counter("headstart_gateway_checked_answers", "execution-checked answers (candidates) "
                                       "by outcome: greedy (the greedy SQL's result won), changed (another "
                                       "candidate's), failed (no candidate's SQL ran)", ["outcome"],
                                       registry=self.registry)
        # Data sessions (services/gateway/data_service.py)
        self.data_sessions_opened = Counter("headstart_gateway_data_sessions_opened", "data sessions opened",
                                            registry=self.registry)
        self.data_rows_pushed = Counter("headstart_gateway_data_rows_pushed", "rows accepted, logged and forwarded",
                                        registry=self.registry)
        self.data_rows_dropped = Counter("headstart_gateway_data_rows_dropped",
                                         "pushed rows a replica dropped unprocessed (its buffer was full)",
                                         registry=self.registry)
        self.data_queries = Counter("headstart_gateway_data_queries", "data queries by who answered: flash "
                                    "(stored answer at the current version) or model", ["source"],
                                    registry=self.registry)
        self.data_rebuilds = Counter("headstart_gateway_data_rebuilds",
                                     "data sessions reopened from the rows log on a replica that lacked them",
                                     registry=self.registry)
        self.reconnects = Counter("headstart_gateway_engine_reconnects", "engine streams reopened", registry=self.registry)
        self.engine_streams = Counter("headstart_gateway_engine_streams", "engine session streams opened, by path: "
                                      "direct (the replica's own port) or proxy (Serve's)", ["path"],
                                      registry=self.registry)

        # Raw recent samples for in-process benchmarks (the histogram only has buckets).
        self.rtt_samples: deque[float] = deque(maxlen=100_000)

    def observe_rtt(self, seconds: float) -> None:
        self.snapshot_rtt.observe(seconds)
        self.rtt_samples.append(seconds)

    def observe_result(self, edge: str, result) -> None:
        """An engine Result (types_pb2.Result): its answer time and cache figures."""
        self.answer.labels(edge).observe(result.total_ms / 1000.0)
        if result.prompt_tokens:
            self.cached_ratio.labels(edge).observe(result.cached_tokens_at_submit / result.prompt_tokens)
        self.computed_at_submit.labels(edge).observe(result.computed_tokens_at_submit)

    def observe_ttft(self, ttft_ms: float) -> None:
        """An engine result's TTFT (the wire carries milliseconds; the metric is in seconds)."""
        self.ttft.observe(ttft_ms / 1000.0)

    def observe_choice(self, choice) -> None:
        """An engine Choice (types_pb2.Choice): which answer the check kept."""
        self.checked_answers.labels("failed" if choice.error else "changed" if choice.index else "greedy").inc()

    def render(self) -> bytes:
        return generate_latest(self.registry)
