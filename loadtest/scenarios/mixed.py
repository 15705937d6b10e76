"""mixed: typists (WebSocket, gRPC) beside one-shot completion callers (gRPC, REST)."""

from loadtest import users

SCENARIO = {"users": 8, "spawn_rate": 2, "run_time": "90s", "max_sessions": 64}


class MixedWsTypist(users.WsTypist):
    weight = 3


class MixedGrpcTypist(users.GrpcTypist):
    weight = 3


class MixedGrpcCompleter(users.GrpcCompleter):
    weight = 1


class MixedRestCompleter(users.RestCompleter):
    weight = 1
