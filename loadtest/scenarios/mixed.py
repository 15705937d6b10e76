"""mixed: typists (WebSocket, gRPC) beside one-shot completion callers (gRPC, REST, OpenAI streaming),
data producers (REST, gRPC) pushing rows into data sessions and a flash subscriber timing
its pushes to the flash answers of their data version (the local stack runs
the flash worker), and one noisy tenant at its limits (`loadtest.noisy`)."""

from loadtest import completers, data_users, noisy, users

SCENARIO = {"users": 8, "spawn_rate": 2, "run_time": "90s", "max_sessions": 64}


class MixedWsTypist(users.WsTypist):
    weight = 3


class MixedGrpcTypist(users.GrpcTypist):
    weight = 3


class MixedGrpcCompleter(completers.GrpcCompleter):
    weight = 1


class MixedRestCompleter(completers.RestCompleter):
    weight = 1


class MixedOpenAIStreamer(completers.OpenAIStreamer):
    fixed_count = 1  # one OpenAI SDK-like client, timed at the client, whatever N


class MixedDataProducer(data_users.DataProducer):
    fixed_count = 1  # one of the N users, whatever N: a push a second is the load meant


class MixedGrpcDataProducer(data_users.GrpcDataProducer):
    fixed_count = 1


class MixedFlashSubscriber(data_users.FlashSubscriber):
    fixed_count = 1


class MixedNoisyTenant(noisy.NoisyTenant):
    fixed_count = 1  # one tenant at its limits beside the others
