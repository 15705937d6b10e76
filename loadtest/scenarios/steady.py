"""steady: N typists, half on the WebSocket and half on gRPC, over several tenants and databases."""

from loadtest import users

SCENARIO = {"users": 8, "spawn_rate": 2, "run_time": "60s", "max_sessions": 64}


class SteadyWsTypist(users.WsTypist):
    weight = 1


class SteadyGrpcTypist(users.GrpcTypist):
    weight = 1
