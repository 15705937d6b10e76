"""Save a loaded model as a Hugging Face directory another engine can read.

A `random:<preset>` model lives only in memory (weights drawn from a seed);
a peer engine needs files: `config.json`, `model.safetensors`, and the
tokenizer files it was built with. Directories are cached under the run dir,
keyed by the model id (which includes the seed), so the export runs once.
"""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

from headstart.models.loader import ModelLoadError, load_model
from headstart.paths import default_tokenizer_dir, run_dir

# What a tokenizer directory holds that transformers and llama.cpp's converter read.
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "vocab.json", "merges.txt",
                   "special_tokens_map.json", "generation_config.json", "LICENSE")
_DONE_MARK = ".export-complete"


def peer_dir() -> Path:
    """Where peer-engine files (HF exports, GGUF, converter sources) are cached."""
    path = run_dir() / "peer"
    path.mkdir(parents=True, exist_ok=True)
    return path


def export_name(spec: str, seed: int = 0) -> str:
    """A file-system-safe name for (model spec, seed)."""
    return re.sub(r"[^A-Za-z0-9._-]+", "_", f"{spec}@seed{seed}").strip("_")


def export_hf_dir(spec: str, out: Path | None = None, seed: int = 0, tokenizer_dir: Path | None = None,
                  force: bool = False) -> Path:
    """Write `spec` (float32) as a Hugging Face directory and return its path.

    The weights are saved in float32 whatever the later GGUF type, so f32 and
    f16 GGUFs round the very numbers our float32 engine uses. An existing
    complete export is reused unless `force`.

    Raises:
        ModelLoadError: the spec cannot be loaded or the tokenizer is missing.
    """
    out = Path(out) if out else peer_dir() / "hf" / export_name(spec, seed)
    if (out / _DONE_MARK).is_file() and not force:
        return out
    tok_dir = Path(tokenizer_dir) if tokenizer_dir else default_tokenizer_dir()
    if not (tok_dir / "tokenizer.json").is_file():
        raise ModelLoadError(f"no tokenizer.json in {tok_dir}: cannot export a model without its tokenizer")
    loaded = load_model(spec, dtype="float32", device="cpu", tokenizer_dir=tok_dir, seed=seed)
    if out.exists():
        shutil.rmtree(out)
    tmp = out.with_name(out.name + ".tmp")
    if tmp.exists():
        shutil.rmtree(tmp)
    tmp.mkdir(parents=True)
    loaded.model.save_pretrained(str(tmp), safe_serialization=True)
    for name in TOKENIZER_FILES:
        if (tok_dir / name).is_file():
            shutil.copy2(tok_dir / name, tmp / name)
    (tmp / "headstart_export.json").write_text(json.dumps({"spec": spec, "seed": seed, "model_id": loaded.model_id}))
    (tmp / _DONE_MARK).write_text("ok\n")
    tmp.rename(out)  # NOTE: rename last, so a killed export never looks complete
    return out
