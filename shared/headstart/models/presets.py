"""Random-weight model presets: real Qwen2.5 architectures, random weights.

There are no weights on development machines. A `random:<preset>` model has
the real shapes (so timing is honest) and the real tokenizer, with weights
drawn from a fixed seed so every process (every Ray replica, every cold run)
builds the same model bit for bit.
"""

from __future__ import annotations

import json
from pathlib import Path

# Files in ../shared/models/qwen2.5-coder-tokenizer holding the real configs.
_CONFIG_FILES = {
    "qwen2.5-coder-0.5b": "config-0.5b.json",
    "qwen2.5-coder-1.5b": "config-1.5b.json",
    "qwen2.5-coder-3b": "config-3b.json",
    "qwen2.5-coder-7b": "config-7b.json",
}

# A few-MB model for tests: the real vocabulary (the tokenizer must fit) with
# tiny hidden sizes. Two KV heads keep grouped-query attention exercised.
_TINY = {
    "architectures": ["Qwen2ForCausalLM"],
    "model_type": "qwen2",
    "hidden_size": 32,
    "intermediate_size": 64,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 8,
    "max_position_embeddings": 32768,
    "rope_theta": 1000000.0,
    "rms_norm_eps": 1e-6,
    "tie_word_embeddings": True,
    "vocab_size": 151936,
    "hidden_act": "silu",
    "bos_token_id": 151643,
    "eos_token_id": 151645,
}

PRESET_NAMES = ("tiny", *_CONFIG_FILES)


def preset_config(name: str, tokenizer_dir: Path) -> dict:
    """The config dict of a preset. Unknown name → ValueError listing the valid ones."""
    if name == "tiny":
        return dict(_TINY)
    if name not in _CONFIG_FILES:
        raise ValueError(f"unknown model preset {name!r}; valid presets: {', '.join(PRESET_NAMES)}")
    path = tokenizer_dir / _CONFIG_FILES[name]
    if not path.is_file():
        raise FileNotFoundError(f"preset {name!r} needs {path}, which does not exist (set --tokenizer-dir)")
    return json.loads(path.read_text())
