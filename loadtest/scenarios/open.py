"""open: an open-loop load (vLLM `bench serve`'s and guidellm's `constant` /
`poisson` profiles): OpenAI streaming chat completions arrive at `--rate` per
second (`--arrival fixed|poisson`) whatever the answers' pace, their question
and answer lengths from `--lengths IN:OUT` (repeat; taken in turn, each a
row of its own in the report). One Locust user makes the arrivals; `--users`
does not apply. What it measures: TTFT, ITL and the complete answer at the
client as the offered load stays fixed, where a closed loop would slow its
users down with the server."""

from loadtest import completers

SCENARIO = {"users": 1, "spawn_rate": 1, "run_time": "60s", "max_sessions": 64}


class OpenLoop(completers.OpenLoopClient):
    fixed_count = 1
