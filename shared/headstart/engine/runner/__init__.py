"""The runner: the one owner of a model's forwards and kernels.

- `model_runner.ModelRunner`: holds the model and its kernel set; `extend`,
  `extend_rows`, `prefill`, `encode_rows` (the only code that calls the model).
- `rows.Row`, `rows.RowResult`: one cache's extension, and what the forward did to it.
- `decoder_loop`: the one forward path, the decoder layers over packed rows.
- `row_attention`: each row's attention over its own cache, read in place.
- `kernel_choice`, `auto_timing`: HEADSTART_FAST_PATH resolved for a model (`auto` timed at start).
- `ops/`: the kernel sets (`off`, `onednn`, `native`, `quant`, `inductor`).
"""

from headstart.engine.runner.model_runner import EncodedRows, ModelRunner, UnsupportedModel
from headstart.engine.runner.rows import Row, RowResult

__all__ = ["EncodedRows", "ModelRunner", "Row", "RowResult", "UnsupportedModel"]
