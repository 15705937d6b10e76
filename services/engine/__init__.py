"""The engine tier: a Ray Serve deployment whose replicas own typing sessions.

core.py (sessions and admission, no Ray) → stream.py (one session stream) →
deployment.py (the Serve deployment and its app). Generation streaming is in
generate.py, message building in events.py.
"""
