"""Model loading: catalogue names and GGUF files (served quantized), local directories, hub ids and `random:<preset>` models."""

from headstart.models.loader import DTYPES, LoadedModel, ModelLoadError, load_model, load_tokenizer

__all__ = ["DTYPES", "LoadedModel", "ModelLoadError", "load_model", "load_tokenizer"]
