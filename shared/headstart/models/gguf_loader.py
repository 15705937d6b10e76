"""Load a GGUF model as a `LoadedModel`: quantized on the CPU, or widened to a float model.

Quantized (`weights` "auto" on a CPU in float32, or "quantized"): the
projections keep the file's integers and run the quantized kernels of the
best instruction set this CPU has (`engine.cpu_isa`). Dequantized (a GPU,
another dtype, `weights="dequantized"`, or a CPU the kernels cannot run on):
every matrix decoded to the very floats ggml's dequantization gives, in the
requested dtype, as an ordinary Hugging Face model (the accuracy reference
the quantized serving is measured against, and what a GPU runs).

The tokenizer is the Qwen2.5 one in `../shared` (its vocabulary is the
GGUF's, checked here: the special tokens the prompts use must sit at the
same ids).
"""

from __future__ import annotations

import hashlib
import logging
from pathlib import Path

import numpy as np
import torch

from headstart.models.catalogue import catalogue_model
from headstart.models.gguf_formats import dequantize_rows
from headstart.models.loaded import LoadedModel, ModelLoadError, load_tokenizer
from headstart.paths import default_tokenizer_dir

log = logging.getLogger(__name__)

# The special tokens the chat template and the stop set use, and where the Qwen2.5 vocabulary has them.
SPECIAL_IDS = {"<|endoftext|>": 151643, "<|im_start|>": 151644, "<|im_end|>": 151645}


def load_gguf(spec: str, path: Path, dtype: torch.dtype, device: torch.device, tokenizer_dir, weights: str
              ) -> LoadedModel:
    from headstart.heap import trim_heap
    from headstart.models.gguf_model import GgufError, GgufFile, load_gguf_model

    tokenizer = load_tokenizer(Path(tokenizer_dir) if tokenizer_dir else default_tokenizer_dir())
    entry = catalogue_model(spec)
    model_id = entry.name if entry is not None else f"gguf:{path.name}:{_file_identity(path)}"
    quantized = weights == "quantized" or (weights == "auto" and device.type == "cpu" and dtype == torch.float32)
    if quantized and (device.type != "cpu" or dtype != torch.float32):
        raise ModelLoadError("quantized weights run on the CPU in float32 (activations and KV); use "
                             "weights=dequantized for another device or dtype")
    try:
        if quantized:
            kernel = _kernel(weights)
            if kernel is not None:
                model = load_gguf_model(path, kernel)
                _check_vocabulary(GgufFile(path), tokenizer)
                trim_heap()  # packing's temporaries: ~65 MiB of freed pages glibc would keep (headstart.heap)
                return LoadedModel(model, tokenizer, model_id, dtype, device, f"quantized:{kernel.name}")
        model = load_dequantized(GgufFile(path), dtype)
    except GgufError as exc:
        raise ModelLoadError(str(exc)) from exc
    model.to(device)
    model.eval()
    name = str(dtype).removeprefix("torch.")
    return LoadedModel(model, tokenizer, f"{model_id}@dequantized", dtype, device, f"dequantized:{name}")


def _kernel(weights: str):
    """The quantized kernels for this CPU, or None (auto: widen instead, and say why)."""
    from headstart.kernels.quant import QuantKernelUnavailable, load

    try:
        return load()
    except QuantKernelUnavailable as exc:
        if weights == "quantized":
            raise ModelLoadError(f"quantized weights need the quantized kernels: {exc}") from exc
        log.warning("quantized kernels unavailable (%s): the GGUF weights are widened to float32", exc)
        return None


def _file_identity(path: Path) -> str:
    """A short identity of a user's GGUF file for cache keys: its size and the
    hash of its first and last MiB (hashing gigabytes at every start is too slow)."""
    size = path.stat().st_size
    digest = hashlib.sha256(str(size).encode())
    with open(path, "rb") as f:
        digest.update(f.read(1 << 20))
        f.seek(max(0, size - (1 << 20)))
        digest.update(f.read(1 << 20))
    return digest.hexdigest()[:16]


def _check_vocabulary(file, tokenizer) -> None:
    tokens = file.value("tokenizer.ggml.tokens")
    if tokens is None:
        return
    for text, index in SPECIAL_IDS.items():
        if index >= len(tokens) or tokens[index] != text or tokenizer.convert_tokens_to_ids(text) != index:
            raise ModelLoadError(f"{file.path}: its vocabulary does not match the Qwen2.5 tokenizer "
                                 f"({text} is not id {index} in both)")


def load_dequantized(file, dtype: torch.dtype):
    """Every weight of `file` decoded to float (ggml's values), in `dtype`, as a `Qwen2ForCausalLM`."""
    from transformers import GenerationConfig, Qwen2Config, Qwen2ForCausalLM

    from headstart.models.gguf_model import qwen2_config

    config = Qwen2Config(**qwen2_config(file))
    config._attn_implementation = "sdpa"
    with torch.device("meta"):
        model = Qwen2ForCausalLM(config)
    state = {}
    for name, tensor in file.tensors.items():
        target = _hf_name(name)
        if target is None:
            continue
        rows = np.arange(tensor.data.shape[0])
        values = dequantize_rows(tensor.data, tensor.ggml_type, tensor.row_length, rows)
        if len(tensor.shape) == 1:
            values = values.reshape(-1)
        state[target] = torch.from_numpy(values).to(dtype)
    if config.tie_word_embeddings:
        state["lm_head.weight"] = state["model.embed_tokens.weight"]
    missing, unexpected = model.load_state_dict(state, strict=False, assign=True)
    missing = [m for m in missing if "rotary" not in m]
    if missing or unexpected:
        raise ModelLoadError(f"{file.path}: weights missing {missing[:5]}, unexpected {unexpected[:5]}")
    if config.tie_word_embeddings:
        model.tie_weights()
    with torch.device("cpu"):
        from transformers.models.qwen2.modeling_qwen2 import Qwen2RotaryEmbedding

        model.model.rotary_emb = Qwen2RotaryEmbedding(config=config)
    model.generation_config = GenerationConfig(bos_token_id=config.bos_token_id, eos_token_id=config.eos_token_id)
    return model


_LAYER_NAMES = {
    "attn_norm.weight": "input_layernorm.weight", "ffn_norm.weight": "post_attention_layernorm.weight",
    "attn_q.weight": "self_attn.q_proj.weight", "attn_q.bias": "self_attn.q_proj.bias",
    "attn_k.weight": "self_attn.k_proj.weight", "attn_k.bias": "self_attn.k_proj.bias",
    "attn_v.weight": "self_attn.v_proj.weight", "attn_v.bias": "self_attn.v_proj.bias",
    "attn_output.weight": "self_attn.o_proj.weight", "ffn_gate.weight": "mlp.gate_proj.weight",
    "ffn_up.weight": "mlp.up_proj.weight", "ffn_down.weight": "mlp.down_proj.weight",
}
_TOP_NAMES = {"token_embd.weight": "model.embed_tokens.weight", "output.weight": "lm_head.weight",
              "output_norm.weight": "model.norm.weight"}


def _hf_name(name: str) -> str | None:
    """The Hugging Face parameter a GGUF tensor is (None: not a weight we load)."""
    if name in _TOP_NAMES:
        return _TOP_NAMES[name]
    if name.startswith("blk."):
        _, index, rest = name.split(".", 2)
        if rest in _LAYER_NAMES:
            return f"model.layers.{index}.{_LAYER_NAMES[rest]}"
    return None
