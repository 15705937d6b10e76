"""`headstart peer ...`: serve our weights with llama.cpp (C++ `llama-server` or llama-cpp-python)."""

from __future__ import annotations

import signal
import threading

import typer

from headstart.models.catalogue import DEFAULT_MODEL

peer_app = typer.Typer(no_args_is_help=True, help="Peer engines on the same weights (llama.cpp), for benchmarks.")


@peer_app.command("llamacpp")
def llamacpp(
    model: str = typer.Option(DEFAULT_MODEL, help="a catalogue model (its own GGUF file, served as it is), a .gguf "
                                                  "file, or random:<preset> (exported and converted)"),
    port: int = typer.Option(0, help="port on 127.0.0.1 (0: a free one)"),
    dtype: str = typer.Option("f32", help="GGUF type: f32 or f16"),
    threads: int = typer.Option(2, help="threads for prompt and decode"),
    server: str = typer.Option("auto", help="cpp (llama-server, parallel slots), python (llama-cpp-python, one "
                                            "request at a time) or auto (cpp when built)"),
    parallel: int = typer.Option(1, "--parallel", "-np", help="slots of the C++ server (concurrent requests)"),
    cache_type: str = typer.Option("auto", help="attention numerics of the C++ server: default (llama.cpp's own: KV "
                                                "f16, flash attention auto), f32 (KV f32, flash attention off), f16, "
                                                "or auto (default for a trained GGUF, f32 for a random preset)"),
    seed: int = typer.Option(0, help="seed of the random weights (as our engine's)"),
    convert_only: bool = typer.Option(False, help="write the GGUF (cached under the run dir), print its path, exit"),
):
    """Serve the model's GGUF file (a trained model's own; a random preset converted with llama.cpp's
    converter) with llama.cpp's OpenAI-compatible server (prompt cache on) until Ctrl-C."""
    from headstart.models import ModelLoadError
    from headstart.peer.gguf_convert import PeerUnavailable, model_gguf
    from headstart.peer.llama_server_cpp import peer_server

    try:
        if convert_only:
            typer.echo(model_gguf(model, dtype, seed, say=typer.echo))
            return
        proc = peer_server(model, server=server, parallel=parallel, threads=threads, gguf_type=dtype, seed=seed,
                           port=port, cache_type=cache_type, say=typer.echo)
        stop = threading.Event()
        for sig in (signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, lambda *_: stop.set())
        proc.start()
        typer.echo(f"OpenAI-compatible API at {proc.url}/v1 (model id 'peer'); Ctrl-C stops it")
        try:
            while not stop.wait(1.0):
                if proc.proc.poll() is not None:
                    raise PeerUnavailable(f"{proc.describe()} exited with {proc.proc.returncode}")
        finally:
            proc.stop()
            typer.echo(f"{proc.describe()} stopped")
    except (PeerUnavailable, ModelLoadError, ValueError) as exc:
        typer.secho(f"error: {exc}", fg=typer.colors.RED, err=True)
        raise typer.Exit(2)


@peer_app.command("build-server")
def build_server(
    jobs: int = typer.Option(2, help="parallel compile jobs"),
    native: bool = typer.Option(True, help="-DGGML_NATIVE=ON: kernels for this CPU (off: a portable build)"),
    force: bool = typer.Option(False, help="rebuild even when the binary exists"),
):
    """Build llama.cpp's C++ `llama-server` (parallel slots) from the llama.cpp that
    llama-cpp-python vendors, under the run dir; print the binary's path."""
    from headstart.peer.server_build import BuildError, build_llama_server

    try:
        typer.echo(build_llama_server(jobs=jobs, native=native, force=force, say=typer.echo))
    except BuildError as exc:
        typer.secho(f"error: {exc}", fg=typer.colors.RED, err=True)
        raise typer.Exit(2)
