"""`python -m headstart.eval run ...` / `... compare DIR1 DIR2` / `... rescore DIR`: the eval commands without the main CLI."""

import typer

from headstart.eval.cli import compare_cli, eval_cli, rescore_cli

app = typer.Typer(add_completion=False, no_args_is_help=True)
app.command("run")(eval_cli)
app.command("compare")(compare_cli)
app.command("rescore")(rescore_cli)

if __name__ == "__main__":
    app()
