"""Convert a Hugging Face directory to GGUF with llama.cpp's own converter.

The converter (`convert_hf_to_gguf.py`, its `conversion/` package and the
matching `gguf-py`) is not installed by llama-cpp-python: it ships only in
the package's source distribution (`vendor/llama.cpp`). We take it from
there: `$HEADSTART_LLAMACPP_SRC` (a llama.cpp checkout), else the sdist of the
installed llama-cpp-python version, fetched once with pip and cached under
the run dir, else the source tree a built C++ `llama-server` came from
(`headstart peer build-server`: no Python extra needed then). The converter
then runs in a subprocess of this Python.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

from headstart.peer.hf_export import export_hf_dir, export_name, peer_dir

GGUF_TYPES = ("f32", "f16", "bf16")
_CONVERTER_PARTS = ("convert_hf_to_gguf.py", "conversion/", "gguf-py/", "LICENSE")


class PeerUnavailable(RuntimeError):
    """The peer engine (llama-cpp-python, the `peer` extra) or its converter is not available."""


def llama_cpp_version() -> str:
    """The installed llama-cpp-python version; PeerUnavailable when it is not installed."""
    from importlib import metadata

    try:
        return metadata.version("llama-cpp-python")
    except metadata.PackageNotFoundError as exc:
        raise PeerUnavailable("llama-cpp-python is not installed: install the peer extra "
                              "(pip install -e '.[peer]', see docs/peer.md)") from exc


def converter_dir() -> Path:
    """A llama.cpp source folder holding convert_hf_to_gguf.py (fetched on first use)."""
    env = os.environ.get("HEADSTART_LLAMACPP_SRC")
    if env:
        path = Path(env)
        if not (path / "convert_hf_to_gguf.py").is_file():
            raise PeerUnavailable(f"HEADSTART_LLAMACPP_SRC={env} has no convert_hf_to_gguf.py")
        return path
    from headstart.peer.server_build import built_source_dir

    built = built_source_dir()  # a built C++ server's source tree holds the same converter
    try:
        version = llama_cpp_version()
    except PeerUnavailable:
        if built is None:
            raise
        return built
    path = peer_dir() / f"llama.cpp-converter-{version}"
    if (path / "convert_hf_to_gguf.py").is_file():
        return path
    if built is not None and built.name == f"llama.cpp-src-{version}":
        return built  # the same version's tree: no download
    with tempfile.TemporaryDirectory(dir=peer_dir()) as tmp:
        # The registry's ordinary client: the sdist of the very version installed.
        cmd = [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--no-binary", ":all:",
               f"llama-cpp-python=={version}", "-d", tmp]
        done = subprocess.run(cmd, capture_output=True, text=True)
        archives = list(Path(tmp).glob("llama_cpp_python-*.tar.gz"))
        if done.returncode != 0 or not archives:
            raise PeerUnavailable(f"could not fetch the llama-cpp-python {version} sdist for its converter: "
                                  f"{done.stderr.strip()[-400:]}")
        _extract_converter(archives[0], path)
    return path


def _extract_converter(archive: Path, dest: Path) -> None:
    staging = dest.with_name(dest.name + ".tmp")
    with tarfile.open(archive) as tar:
        members = []
        for m in tar.getmembers():
            _, _, inner = m.name.partition("/vendor/llama.cpp/")
            if inner and any(inner == p or inner.startswith(p) for p in _CONVERTER_PARTS) and (m.isfile() or m.isdir()):
                m.name = inner
                members.append(m)
        if not any(m.name == "convert_hf_to_gguf.py" for m in members):
            raise PeerUnavailable(f"{archive.name} has no vendor/llama.cpp/convert_hf_to_gguf.py")
        tar.extractall(staging, members=members, filter="data")
    staging.rename(dest)


def gguf_path(spec: str, gguf_type: str = "f32", seed: int = 0) -> Path:
    """Where the GGUF of (spec, seed, type) is cached."""
    return peer_dir() / "gguf" / f"{export_name(spec, seed)}-{gguf_type}.gguf"


def convert_to_gguf(spec: str, gguf_type: str = "f32", seed: int = 0, force: bool = False, say=print) -> Path:
    """The GGUF file of `spec` (exported, then converted; both cached on disk).

    Raises:
        ValueError: unknown `gguf_type`.
        PeerUnavailable: llama-cpp-python or its converter is missing, or the conversion failed.
    """
    if gguf_type not in GGUF_TYPES:
        raise ValueError(f"unknown GGUF type {gguf_type!r}; valid: {', '.join(GGUF_TYPES)}")
    out = gguf_path(spec, gguf_type, seed)
    if out.is_file() and not force:
        return out
    src = converter_dir()
    import importlib.util

    if importlib.util.find_spec("sentencepiece") is None:  # the converter imports it at its top
        raise PeerUnavailable("llama.cpp's GGUF converter needs sentencepiece: pip install 'sentencepiece>=0.2,<0.3' "
                              "(part of the peer extra)")
    hf = export_hf_dir(spec, seed=seed)
    out.parent.mkdir(parents=True, exist_ok=True)
    partial = out.with_name(out.name + ".partial")
    say(f"converting {spec} ({gguf_type}) to GGUF with {src / 'convert_hf_to_gguf.py'}")
    env = {k: v for k, v in os.environ.items() if k != "NO_LOCAL_GGUF"}  # use the converter's own gguf-py
    done = subprocess.run([sys.executable, str(src / "convert_hf_to_gguf.py"), str(hf), "--outtype", gguf_type,
                           "--outfile", str(partial)], capture_output=True, text=True, env=env, cwd=src)
    if done.returncode != 0 or not partial.is_file():
        raise PeerUnavailable(f"convert_hf_to_gguf.py failed ({done.returncode}): {done.stderr.strip()[-800:]}")
    partial.rename(out)
    return out


def model_gguf(spec: str, gguf_type: str = "f32", seed: int = 0, say=print) -> Path:
    """The GGUF file a peer serves for `spec`: a catalogue model's own file (the very weights we
    serve), a `.gguf` path as given, or a `random:<preset>` exported and converted (`convert_to_gguf`).

    Raises:
        PeerUnavailable: the file cannot be had (a catalogue model not installed, a missing path,
            a failed conversion).
    """
    from headstart.models.catalogue import catalogue_model
    from headstart.models.install import ModelInstallError, ensure_model

    if catalogue_model(spec) is not None:
        try:
            return ensure_model(spec)
        except ModelInstallError as exc:
            raise PeerUnavailable(str(exc)) from exc
    if spec.lower().endswith(".gguf"):
        path = Path(spec).expanduser()
        if not path.is_file():
            raise PeerUnavailable(f"GGUF file {spec!r} does not exist")
        return path
    return convert_to_gguf(spec, gguf_type, seed, say=say)


def is_trained_gguf(spec: str) -> bool:
    """A catalogue model or a user's .gguf file (served by llama.cpp with its own defaults), not a
    random preset converted for the comparison (served with f32 attention, as ours)."""
    from headstart.models.catalogue import catalogue_model

    return catalogue_model(spec) is not None or spec.lower().endswith(".gguf")
