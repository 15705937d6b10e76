"""Kernel sets: the weight-bound parts of a decoder layer, one ops object per set.

The runner's decoder loop (`runner.decoder_loop`) runs attention itself and
calls the installed ops object for the rest of each layer (`qkv`, `post`,
`head`; or the whole layer, `decoder_layer`, for `quant`). Which set a
model's runner installs is `HEADSTART_FAST_PATH` resolved for that model
(`runner.kernel_choice`):

| name | ops | file |
|---|---|---|
| `off` | the model's own modules (the reference) | `eager.py` |
| `onednn` | oneDNN packed matmuls | `onednn.py` |
| `native` | headstart's AVX-512 kernels for forwards of a few tokens, oneDNN above | `native.py` (+ `screened_head.py`, `huge_pages.py`) |
| `quant` | a GGUF model's integer kernels, a decoder layer per call | `quant.py` |
| `inductor` | `torch.compile`d layer blocks | `inductor.py` |
| `auto` | one of `off`, `onednn`, `native`, timed at start (`runner.auto_timing`) | |
"""

# the values HEADSTART_FAST_PATH takes (`auto` resolves to one of the others)
KERNEL_SETS = ("off", "auto", "onednn", "native", "inductor", "quant")
