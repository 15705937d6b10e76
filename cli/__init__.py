"""The `headstart` command: the top layer, above the library (`headstart`), `services`, `bench` and `loadtest`.

`cli.app` builds the command and its groups; a file per job:

- `cli.common`: the option help texts and helpers every command file shares;
- `cli.replay`: `headstart replay` and `headstart demo` (a typing trace against one engine, in process);
- `cli.enter_report`: what the engine was doing at Enter (the demo's line under the session's TTFT);
- `cli.serve`: `headstart serve` (the local stack, `services.launcher`);
- `cli.bench`: `headstart bench ...` (the benchmarks in `bench/`).

The library's own command groups (`model`, `peer`, `tables`, `eval`) stay beside the code they drive
(`headstart/*/cli.py`) and use nothing above the library; `deploy` is `services.deploy.cli`, `loadtest`
is `loadtest.run`. Nothing under `headstart` imports this package (tests/test_package_boundaries.py).
"""
