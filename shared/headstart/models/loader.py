"""Load a causal LM and its tokenizer: a local directory, a hub id, or `random:<preset>`.

Only a hub id may touch the network; everything else is forced offline.
"""

from __future__ import annotations

import os
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import torch

from headstart.models.presets import preset_config
from headstart.paths import default_tokenizer_dir

DTYPES = {
    "float32": torch.float32,
    "bfloat16": torch.bfloat16,
    "float16": torch.float16,
    "float64": torch.float64,
}

# MKL's conditional-numerical-reproducibility mode. Measured on the 2-core
# AMD EPYC we develop on (torch 2.13 CPU, MKL 2024.2, 2 threads): the
# default dispatch runs the small-M float32 GEMMs of decoding and typing
# (2 to 8 rows) about as slowly as on one thread, twice the time of CNR
# mode's kernels (the 151936-row LM head: 90 ms against 45 ms at 2 to 8
# rows; 40 ms either way at 1 row). MKL reads the variable at its first
# call, so it is set before any model runs; a value the user set wins.
CPU_BLAS_ENV = {"MKL_CBWR": "AUTO"}

RANDOM_PREFIX = "random:"
RANDOM_INIT_STD = 0.2


class ModelLoadError(RuntimeError):
    """The model could not be loaded (bad spec, missing files, bad dtype/device)."""


@dataclass
class LoadedModel:
    """A model ready for inference, with the facts that key caches built from it."""

    model: torch.nn.Module
    tokenizer: object  # a transformers PreTrainedTokenizerFast
    model_id: str
    dtype: torch.dtype
    device: torch.device

    @property
    def dtype_name(self) -> str:
        return str(self.dtype).removeprefix("torch.")

    @property
    def config(self):
        return self.model.config

    def kv_bytes_per_token(self) -> int:
        """Bytes of K+V per cached token, all layers (for memory reports)."""
        cfg = self.model.config
        head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
        elem = torch.empty((), dtype=self.dtype).element_size()
        return 2 * cfg.num_hidden_layers * cfg.num_key_value_heads * head_dim * elem


def parse_dtype(name: str) -> torch.dtype:
    if name not in DTYPES:
        raise ModelLoadError(f"unknown dtype {name!r}; valid: {', '.join(DTYPES)}")
    return DTYPES[name]


def parse_device(name: str) -> torch.device:
    if name.startswith("cuda") and not torch.cuda.is_available():
        raise ModelLoadError(f"device {name!r} requested but CUDA is not available in this torch build")
    if not (name == "cpu" or name.startswith("cuda")):
        raise ModelLoadError(f"unknown device {name!r}; valid: cpu, cuda, cuda:N")
    return torch.device(name)


@contextmanager
def _offline():
    """Force transformers/huggingface_hub offline for local loads."""
    saved = {k: os.environ.get(k) for k in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE")}
    os.environ["HF_HUB_OFFLINE"] = "1"
    os.environ["TRANSFORMERS_OFFLINE"] = "1"
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def load_tokenizer(path: Path | str):
    from transformers import AutoTokenizer

    path = Path(path)
    if not (path / "tokenizer_config.json").is_file():
        raise ModelLoadError(f"no tokenizer at {path} (expected tokenizer_config.json there)")
    with _offline():
        return AutoTokenizer.from_pretrained(str(path))


def load_model(
    spec: str,
    dtype: str = "float32",
    device: str = "cpu",
    tokenizer_dir: Path | str | None = None,
    seed: int = 0,
) -> LoadedModel:
    """Load `spec`: `random:<preset>`, a local HF model directory, or a hub id.

    Random weights are drawn from `seed` on the CPU, so every process that
    loads the same spec gets the same weights.
    """
    torch_dtype, torch_device = parse_dtype(dtype), parse_device(device)
    if torch_device.type == "cpu":
        for name, value in CPU_BLAS_ENV.items():
            os.environ.setdefault(name, value)
    if spec.startswith(RANDOM_PREFIX):
        model, tok = _load_random(spec.removeprefix(RANDOM_PREFIX), torch_dtype, tokenizer_dir, seed)
        model_id = f"{spec}@seed{seed}"
    else:
        model, tok = _load_pretrained(spec, torch_dtype)
        model_id = spec
    model.to(torch_device)
    model.eval()
    return LoadedModel(model, tok, model_id, torch_dtype, torch_device)


def _load_random(preset: str, torch_dtype: torch.dtype, tokenizer_dir, seed: int):
    from transformers import Qwen2Config, Qwen2ForCausalLM

    tok_dir = Path(tokenizer_dir) if tokenizer_dir else default_tokenizer_dir()
    try:
        cfg_dict = preset_config(preset, tok_dir)
    except (ValueError, FileNotFoundError) as exc:
        raise ModelLoadError(str(exc)) from exc
    cfg_dict = {k: v for k, v in cfg_dict.items() if k not in ("torch_dtype", "dtype", "transformers_version")}
    # NOTE: with the real init (std 0.02) a random model repeats one token
    # whatever the prompt, so a test comparing outputs could not fail. A wider
    # init makes greedy outputs depend on every prompt token.
    cfg_dict["initializer_range"] = RANDOM_INIT_STD
    config = Qwen2Config(**cfg_dict)
    config._attn_implementation = "sdpa"
    tokenizer = load_tokenizer(tok_dir)
    generator_state = torch.random.get_rng_state()
    torch.manual_seed(seed)
    previous = torch.get_default_dtype()
    try:
        # NOTE: float16/bfloat16 defaults are not allowed by every op; build in
        # float32 then cast, which is also what makes the weights identical
        # across dtypes (same draws, then rounded).
        torch.set_default_dtype(torch.float32)
        model = Qwen2ForCausalLM(config)
    finally:
        torch.set_default_dtype(previous)
        torch.random.set_rng_state(generator_state)
    return model.to(torch_dtype), tokenizer


def _load_pretrained(spec: str, torch_dtype: torch.dtype):
    from transformers import AutoModelForCausalLM

    path = Path(spec)
    local = path.is_dir()
    if not local and (spec.startswith((".", "/", "~")) or path.suffix):
        raise ModelLoadError(f"model directory {spec!r} does not exist")
    try:
        if local:
            with _offline():
                tokenizer = load_tokenizer(path)
                model = AutoModelForCausalLM.from_pretrained(str(path), dtype=torch_dtype, attn_implementation="sdpa")
        else:  # a hub id: the only path allowed to use the network
            from transformers import AutoTokenizer

            tokenizer = AutoTokenizer.from_pretrained(spec)
            model = AutoModelForCausalLM.from_pretrained(spec, dtype=torch_dtype, attn_implementation="sdpa")
    except OSError as exc:
        raise ModelLoadError(f"could not load model {spec!r}: {exc}") from exc
    return model, tokenizer
