"""The gateway: client connections in, session snapshots out to the engine.

settings.py (configuration) → auth.py (tenants) → limits.py (edge limits) →
engine_link.py (one gRPC stream per session to the engine, with reconnect) →
sessions.py (each session's text, seq and listener) → service.py (what every
edge calls) → ws.py / rest.py / grpc_server.py (the edges) → app.py (one process).
"""
