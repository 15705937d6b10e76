"""`headstart`: the one entry point for every command a user runs."""

from __future__ import annotations

import sys

import typer

from cli.bench import bench_app
from cli.common import fold_list_options
from cli.replay import demo, replay
from cli.serve import serve
from headstart.eval.cli import compare_cli, eval_cli, rescore_cli
from headstart.models.cli import model_app
from headstart.peer.cli import peer_app
from headstart.tables.cli import tables_app
from loadtest.run import loadtest_cli
from services.deploy.cli import deploy_app

app = typer.Typer(add_completion=False, no_args_is_help=True, help=__doc__)
app.add_typer(bench_app, name="bench")
app.add_typer(peer_app, name="peer")
app.add_typer(tables_app, name="tables")
app.add_typer(deploy_app, name="deploy")
app.add_typer(model_app, name="model")

app.command()(replay)
app.command()(demo)
app.command()(serve)
app.command("eval", help="Execution accuracy of a serving mode on Spider/BIRD (SQLite or PostgreSQL).")(eval_cli)
app.command("eval-compare", help="Paired comparison (flips, McNemar) of several eval runs.")(compare_cli)
app.command("eval-rescore", help="Score a finished run's answers again under other rules.")(rescore_cli)
app.command("loadtest")(loadtest_cli)  # Locust scenarios against the local stack or --host


def main() -> None:
    """The console script `headstart` (pyproject.toml) and `python -m cli`."""
    app(args=fold_list_options(sys.argv[1:]), prog_name="headstart")
