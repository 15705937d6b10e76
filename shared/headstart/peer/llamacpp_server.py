"""Start and stop llama.cpp's OpenAI-compatible server (llama-cpp-python).

`LlamaCppServer` runs `python -m llama_cpp.server` on a GGUF of the same
weights as ours, in its own process group, and waits until it answers. The
settings a fair comparison needs are set here, not left to defaults:
- prompt caching on (`--cache`, a RAM cache of KV states keyed by token
  prefix; the context's own longest-prefix reuse is always on);
- `--logits_all false`: its default computes the LM head on every prompt
  position, which no serving engine does;
- `--interrupt_requests false`: by default a new request aborts the one
  streaming, which would cut other users' answers short;
- the same threads for prompt and decode;
- K and V in f32 (`--type_k/--type_v 0`), as our float32 engine keeps them.

llama-cpp-python's server runs one request at a time (a global lock): it has
no parallel slots and no continuous batching. Concurrent requests queue.
llama.cpp's C++ `llama-server` has both; `llama_server_cpp.py` runs it when
it was built (`headstart peer build-server`). `PeerProcess` is what the two
share: a process group started, waited for, stopped.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx

from headstart.peer.gguf_convert import PeerUnavailable, llama_cpp_version, model_gguf
from headstart.peer.hf_export import peer_dir


def free_port() -> int:
    """A TCP port free right now on 127.0.0.1 (the server binds it a moment later)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class PeerProcess:
    """A peer server process: its command, its port, started and stopped as one process group."""

    kind = "?"
    parallel = 1

    def __init__(self, gguf: Path, port: int, threads: int, name: str, say=print):
        self.gguf, self.threads, self.say = gguf, threads, say
        self.port = port or free_port()
        self.log_path = peer_dir() / "logs" / f"{name}-{self.port}.log"
        self.proc: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def command(self) -> list[str]:
        raise NotImplementedError

    def describe(self) -> str:
        """Which server this is, for tables: e.g. `llama-server (C++) -np 4`."""
        raise NotImplementedError

    def ready(self) -> bool:
        """Whether the server answers (and has loaded the model)."""
        return httpx.get(f"{self.url}/v1/models", timeout=2.0).status_code == 200

    def start(self, timeout_s: float = 300.0):
        """Start the server and wait until it is ready.

        Raises:
            PeerUnavailable: the process exited or did not answer in time (its log tail says why).
        """
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        log = open(self.log_path, "wb")
        env = dict(os.environ, OMP_NUM_THREADS=str(self.threads))
        self.proc = subprocess.Popen(self.command(), stdout=log, stderr=subprocess.STDOUT, env=env,
                                     start_new_session=True)
        log.close()
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise PeerUnavailable(f"{self.describe()} exited with {self.proc.returncode}: {self._log_tail()}")
            try:
                if self.ready():
                    self.say(f"{self.describe()} ready on {self.url} ({self.gguf.name}, {self.threads} threads)")
                    return self
            except httpx.HTTPError:
                pass
            time.sleep(0.3)
        self.stop()
        raise PeerUnavailable(f"{self.describe()} did not answer within {timeout_s:.0f} s: {self._log_tail()}")

    def stop(self, grace_s: float = 10.0) -> None:
        """Stop the server (SIGTERM to its process group, SIGKILL after `grace_s`)."""
        if self.proc is None or self.proc.poll() is not None:
            return
        pgid = os.getpgid(self.proc.pid)
        os.killpg(pgid, signal.SIGTERM)
        try:
            self.proc.wait(grace_s)
        except subprocess.TimeoutExpired:
            os.killpg(pgid, signal.SIGKILL)
            self.proc.wait()

    @contextlib.contextmanager
    def paused(self):
        """The server stopped (SIGSTOP to its process group) for the block, then resumed: a
        benchmark times our engine with no peer sharing its cores. An idle llama-server is not
        idle on the CPU (its threads poll for work: our 1.5B decode step took 28-29 ms beside it,
        25-26 ms without)."""
        running = self.proc is not None and self.proc.poll() is None
        if running:
            os.killpg(os.getpgid(self.proc.pid), signal.SIGSTOP)
        try:
            yield
        finally:
            if running and self.proc.poll() is None:
                os.killpg(os.getpgid(self.proc.pid), signal.SIGCONT)

    def _log_tail(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-1500:]
        except OSError:
            return "(no log)"

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


class LlamaCppServer(PeerProcess):
    """One llama_cpp.server process serving `model` (a `random:<preset>` spec or a GGUF path)."""

    kind = "python"

    def __init__(self, model: str, port: int = 0, gguf_type: str = "f32", threads: int = 2, n_ctx: int = 4096,
                 seed: int = 0, log_path: Path | None = None, say=print):
        llama_cpp_version()  # PeerUnavailable early when the extra is missing
        self.model, self.gguf_type, self.n_ctx = model, gguf_type, n_ctx
        gguf = model_gguf(model, gguf_type, seed, say=say)
        super().__init__(gguf, port, threads, "llamacpp", say=say)
        self.log_path = log_path or self.log_path

    def describe(self) -> str:
        return "llama-cpp-python server (one request at a time)"

    def command(self) -> list[str]:
        return [sys.executable, "-m", "llama_cpp.server", "--model", str(self.gguf), "--model_alias", "peer",
                "--host", "127.0.0.1", "--port", str(self.port),
                "--n_threads", str(self.threads), "--n_threads_batch", str(self.threads),
                "--n_ctx", str(self.n_ctx), "--cache", "true", "--cache_type", "ram",
                "--logits_all", "false", "--interrupt_requests", "false", "--verbose", "false",
                # K and V in f32 (GGML_TYPE_F32 = 0), as ours: its default f16 cache rounds them (docs/peer.md:
                # the text mismatch); flash attention stays off (its default), which on CPU is f16 too
                "--type_k", "0", "--type_v", "0"]

    def tokenize(self, text: str) -> list[int]:
        """The server's own tokens for `text` (special tokens parsed, as its completions do)."""
        r = httpx.post(f"{self.url}/extras/tokenize", json={"input": text}, timeout=60.0)
        r.raise_for_status()
        return r.json()["tokens"]
