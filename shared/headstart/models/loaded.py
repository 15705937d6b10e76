"""What a loaded model is (`LoadedModel`), its errors, and the parsing of dtype and device names.

Shared by every loader (`loader`: random presets, Hugging Face models;
`gguf_loader`: GGUF files) without importing any of them.
"""

from __future__ import annotations

import os
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import torch

DTYPES = {
    "float32": torch.float32,
    "bfloat16": torch.bfloat16,
    "float16": torch.float16,
    "float64": torch.float64,
}

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
    # how the weights are held: "float32"/"bfloat16"/... (the dtype), "quantized:<kernels>" (a GGUF
    # model on the CPU: its own integers, `models.gguf_model`), or "dequantized:<dtype>" (a GGUF
    # model widened: GPUs, other dtypes, the accuracy reference)
    weights: str = ""

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


# Python copies of the vocabulary and merges that transformers' BPE tokenizers (Qwen2Tokenizer and
# its kin) keep after building the Rust tokenizer from them, and never read again: for Qwen2.5's
# 151k-token vocabulary about a million Python objects, ~78 MiB of a replica's RSS with the JSON
# parsing's freed pages (measured; docs/benchmarks.md, "Replica RSS").
_BUILD_ONLY_TOKENIZER_ATTRS = ("_vocab", "_merges")


def load_tokenizer(path: Path | str):
    """The Hugging Face tokenizer in `path` (offline), without its build-only Python copies."""
    from transformers import AutoTokenizer

    from headstart.heap import trim_heap

    path = Path(path)
    if not (path / "tokenizer_config.json").is_file():
        raise ModelLoadError(f"no tokenizer at {path} (expected tokenizer_config.json there)")
    with _offline():
        tokenizer = AutoTokenizer.from_pretrained(str(path))
    if getattr(tokenizer, "_tokenizer", None) is not None:  # the Rust tokenizer holds its own vocabulary
        for name in _BUILD_ONLY_TOKENIZER_ATTRS:
            if isinstance(getattr(tokenizer, name, None), (dict, list)):
                setattr(tokenizer, name, type(getattr(tokenizer, name))())
    trim_heap()
    return tokenizer


