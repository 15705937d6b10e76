"""soak: a modest mixed load for 30 minutes; the command samples the replica's
and the gateway's memory all along and reports whether it stays flat."""

from loadtest import completers, users

SCENARIO = {"users": 4, "spawn_rate": 1, "run_time": "30m", "max_sessions": 64}


class SoakWsTypist(users.WsTypist):
    weight = 2


class SoakGrpcTypist(users.GrpcTypist):
    weight = 2


class SoakGrpcCompleter(completers.GrpcCompleter):
    weight = 1


class SoakRestCompleter(completers.RestCompleter):
    weight = 1
