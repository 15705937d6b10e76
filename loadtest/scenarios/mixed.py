"""mixed: typists (WebSocket, gRPC) beside one-shot completion callers (gRPC, REST),
data producers (REST, gRPC) pushing rows into data sessions and a flash subscriber timing
its pushes to the flash answers of their data version (the local stack runs
the flash worker), and one noisy tenant at its limits (`loadtest.noisy`)."""

from loadtest import noisy, users

SCENARIO = {"users": 8, "spawn_rate": 2, "run_time": "90s", "max_sessions": 64}


class MixedWsTypist(users.WsTypist):
    weight = 3


class MixedGrpcTypist(users.GrpcTypist):
    weight = 3


class MixedGrpcCompleter(users.GrpcCompleter):
    weight = 1


class MixedRestCompleter(users.RestCompleter):
    weight = 1


class MixedDataProducer(users.DataProducer):
    fixed_count = 1  # one of the N users, whatever N: a push a second is the load meant


class MixedGrpcDataProducer(users.GrpcDataProducer):
    fixed_count = 1


class MixedFlashSubscriber(users.FlashSubscriber):
    fixed_count = 1


class MixedNoisyTenant(noisy.NoisyTenant):
    fixed_count = 1  # one tenant at its limits beside the others
