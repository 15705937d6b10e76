"""Build llama.cpp's C++ `llama-server` from the source llama-cpp-python vendors.

llama-cpp-python's own server answers one request at a time (a global lock);
llama.cpp's C++ server has parallel slots and continuous batching, which is
what a user serving several people runs. PyPI ships no binary of it, so we
build it from the very llama.cpp tree of the pinned llama-cpp-python sdist
(`vendor/llama.cpp`, fetched with pip): the same kernels as the Python
peer, and its `convert_hf_to_gguf.py` converts our weights.

Layout under the run dir (`.headstart/peer/`):
- `llama.cpp-src-<version>/`: the vendored source tree;
- `llama-server-<version>/`: the cmake build; the binary is `bin/llama-server`.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

from headstart.kernels.cpu_isa import cpu_flags
from headstart.paths import REPO_ROOT
from headstart.peer.hf_export import peer_dir

# The llama-cpp-python release whose vendored llama.cpp we build (as pinned by the `peer` extra).
PINNED_VERSION = "0.3.36"
SERVER_ENV = "HEADSTART_LLAMA_SERVER"
# Only what the server needs: no tests, examples, web UI download (no internet), OpenSSL or shared libs.
CMAKE_FLAGS = ("-DCMAKE_BUILD_TYPE=Release", "-DBUILD_SHARED_LIBS=OFF", "-DLLAMA_BUILD_SERVER=ON",
               "-DLLAMA_BUILD_TESTS=OFF", "-DLLAMA_BUILD_EXAMPLES=OFF", "-DLLAMA_BUILD_APP=OFF",
               "-DLLAMA_OPENSSL=OFF", "-DLLAMA_USE_PREBUILT_UI=OFF", "-DLLAMA_BUILD_UI=OFF")


# -march=native turns on AMX on a CPU that lists it, and with it ggml's AMX matmul kernels
# (the project asks none: GGML_AMX_* stay OFF). On an AVX-512 Xeon VM (2026-11-29) llama-server
# 0.3.36 built so died with SIGILL at its first matmul, on `tilezero` in tinygemm_kernel_amx,
# though a standalone program ran the same instructions there: so AMX stays off, and llama.cpp
# runs its AVX-512 VNNI kernels, as ours do.
NO_AMX_FLAGS = "-mno-amx-tile -mno-amx-int8 -mno-amx-bf16"


def native_flags(flags: set[str]) -> list[str]:
    """The extra cmake flags of a native build on a CPU with these feature flags (`cpu_flags`)."""
    if "amx_tile" not in flags:
        return []
    return [f"-DCMAKE_C_FLAGS={NO_AMX_FLAGS}", f"-DCMAKE_CXX_FLAGS={NO_AMX_FLAGS}"]


class BuildError(RuntimeError):
    """llama-server could not be built (a tool is missing, or cmake failed: the log says why)."""


def source_version() -> str:
    """The llama-cpp-python version whose llama.cpp we use: the installed one, else the pin."""
    from importlib import metadata

    try:
        return metadata.version("llama-cpp-python")
    except metadata.PackageNotFoundError:
        return PINNED_VERSION


def _peer_roots() -> list[Path]:
    """Where builds may live: this run dir, then the checkout's default one (tests use a temp run dir)."""
    roots = [peer_dir()]
    default = REPO_ROOT / ".headstart" / "peer"
    if default.resolve() != roots[0].resolve():
        roots.append(default)
    return roots


def source_dir(root: Path | None = None, version: str | None = None) -> Path:
    return (root or peer_dir()) / f"llama.cpp-src-{version or source_version()}"


def build_dir(root: Path | None = None, version: str | None = None) -> Path:
    return (root or peer_dir()) / f"llama-server-{version or source_version()}"


def find_llama_server() -> Path | None:
    """The built `llama-server` binary, or None: `$HEADSTART_LLAMA_SERVER`, else a build in a run dir."""
    env = os.environ.get(SERVER_ENV)
    if env:
        path = Path(env)
        return path if path.is_file() and os.access(path, os.X_OK) else None
    for root in _peer_roots():
        binary = build_dir(root) / "bin" / "llama-server"
        if binary.is_file() and os.access(binary, os.X_OK):
            return binary
    return None


def built_source_dir() -> Path | None:
    """The source tree a found llama-server was built from (it holds the GGUF converter), or None."""
    binary = find_llama_server()
    if binary is None:
        return None
    src = binary.parent.parent.with_name(binary.parent.parent.name.replace("llama-server-", "llama.cpp-src-", 1))
    return src if (src / "convert_hf_to_gguf.py").is_file() else None


def fetch_sdist(version: str, dest: Path) -> Path:
    """Download the llama-cpp-python `version` sdist into `dest` with pip (the registry's own client)."""
    cmd = [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--no-binary", ":all:",
           f"llama-cpp-python=={version}", "-d", str(dest)]
    done = subprocess.run(cmd, capture_output=True, text=True)
    archives = list(dest.glob("llama_cpp_python-*.tar.gz"))
    if done.returncode != 0 or not archives:
        raise BuildError(f"could not fetch the llama-cpp-python {version} sdist: {done.stderr.strip()[-400:]}")
    return archives[0]


def ensure_source(version: str | None = None, say=print) -> Path:
    """The full vendored llama.cpp tree (fetched and extracted once)."""
    version = version or source_version()
    dest = source_dir(version=version)
    if (dest / "CMakeLists.txt").is_file():
        return dest
    say(f"fetching the llama-cpp-python {version} sdist for its vendored llama.cpp")
    with tempfile.TemporaryDirectory(dir=peer_dir()) as tmp:
        archive = fetch_sdist(version, Path(tmp))
        with tarfile.open(archive) as tar:
            members = []
            for m in tar.getmembers():
                _, _, inner = m.name.partition("/vendor/llama.cpp/")
                if inner and (m.isfile() or m.isdir()):
                    m.name = inner
                    members.append(m)
            staging = Path(tmp) / "llama.cpp"
            tar.extractall(staging, members=members, filter="data")
        if not (staging / "CMakeLists.txt").is_file():
            raise BuildError(f"{archive.name} has no vendor/llama.cpp/CMakeLists.txt")
        staging.rename(dest)
    return dest


def build_llama_server(jobs: int = 2, native: bool = True, force: bool = False, say=print) -> Path:
    """Build `llama-server` (Release, `-DGGML_NATIVE=ON` unless not `native`) and return its path.

    Raises:
        BuildError: cmake or a C++ compiler is missing, the source cannot be fetched, or the build failed.
    """
    missing = [tool for tool in ("cmake",) if shutil.which(tool) is None]
    if not any(shutil.which(cxx) for cxx in ("c++", "g++", "clang++")):
        missing.append("a C++ compiler (g++ or clang++)")
    if missing:
        raise BuildError(f"building llama-server needs {' and '.join(missing)}: install them "
                         "(Debian: apt-get install cmake g++) and run this again")
    version = source_version()
    binary = build_dir(version=version) / "bin" / "llama-server"
    if binary.is_file() and not force:
        return binary
    src = ensure_source(version, say=say)
    build = build_dir(version=version)
    log = peer_dir() / "logs" / f"build-llama-server-{version}.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    configure = ["cmake", "-S", str(src), "-B", str(build), f"-DGGML_NATIVE={'ON' if native else 'OFF'}", *CMAKE_FLAGS,
                 *(native_flags(cpu_flags()) if native else [])]
    compile_ = ["cmake", "--build", str(build), "--target", "llama-server", "-j", str(jobs)]
    say(f"building llama-server {version} in {build} (log: {log}); this takes many minutes on 2 cores")
    with open(log, "w") as out:
        for cmd in (configure, compile_):
            out.write("$ " + " ".join(cmd) + "\n")
            out.flush()
            if subprocess.run(cmd, stdout=out, stderr=subprocess.STDOUT).returncode != 0:
                raise BuildError(f"{' '.join(cmd[:2])} failed: {log.read_text(errors='replace')[-1500:]}")
    if not binary.is_file():
        raise BuildError(f"the build finished without {binary}; see {log}")
    return binary
