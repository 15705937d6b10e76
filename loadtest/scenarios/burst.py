"""burst: typists ramp far past what the replicas admit (the stack runs with few
sessions per replica). Admission must refuse the extra users at once
(`rejected` events: RESOURCE_EXHAUSTED / 429, their latency is the rejection
latency) while the admitted ones are served; nothing may time out."""

from loadtest import users

SCENARIO = {"users": 40, "spawn_rate": 20, "run_time": "60s", "max_sessions": 4}


class BurstWsTypist(users.WsTypist):
    weight = 1


class BurstGrpcTypist(users.GrpcTypist):
    weight = 1
