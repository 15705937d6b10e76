"""`headstart peer llamacpp`: serve our weights with llama.cpp (the `peer` extra)."""

from __future__ import annotations

import signal
import threading

import typer

peer_app = typer.Typer(no_args_is_help=True, help="Peer engines on the same weights (llama.cpp), for benchmarks.")


@peer_app.command("llamacpp")
def llamacpp(
    model: str = typer.Option("random:qwen2.5-coder-0.5b", help="random:<preset> (exported and converted) or a .gguf"),
    port: int = typer.Option(0, help="port on 127.0.0.1 (0: a free one)"),
    dtype: str = typer.Option("f32", help="GGUF type: f32 or f16"),
    threads: int = typer.Option(2, help="threads for prompt and decode"),
    n_ctx: int = typer.Option(4096, help="context size"),
    seed: int = typer.Option(0, help="seed of the random weights (as our engine's)"),
    convert_only: bool = typer.Option(False, help="write the GGUF (cached under the run dir), print its path, exit"),
):
    """Convert the model to GGUF with llama.cpp's converter and serve it with
    llama.cpp's OpenAI-compatible server (prompt cache on) until Ctrl-C."""
    from headstart.models import ModelLoadError
    from headstart.peer.gguf_convert import PeerUnavailable, convert_to_gguf
    from headstart.peer.llamacpp_server import LlamaCppServer

    try:
        if convert_only:
            typer.echo(convert_to_gguf(model, dtype, seed, say=typer.echo))
            return
        server = LlamaCppServer(model, port=port, gguf_type=dtype, threads=threads, n_ctx=n_ctx, seed=seed,
                                say=typer.echo)
        stop = threading.Event()
        for sig in (signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, lambda *_: stop.set())
        server.start()
        typer.echo(f"OpenAI-compatible API at {server.url}/v1 (model id 'peer'); Ctrl-C stops it")
        try:
            while not stop.wait(1.0):
                if server.proc.poll() is not None:
                    raise PeerUnavailable(f"llama_cpp.server exited with {server.proc.returncode}")
        finally:
            server.stop()
            typer.echo("llama.cpp server stopped")
    except (PeerUnavailable, ModelLoadError, ValueError) as exc:
        typer.secho(f"error: {exc}", fg=typer.colors.RED, err=True)
        raise typer.Exit(2)
