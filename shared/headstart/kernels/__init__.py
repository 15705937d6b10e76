"""headstart's C++ kernels for the CPU: built per instruction set, loaded through ctypes.

- `cpu_isa`: the instruction-set levels and the one this CPU runs (`HEADSTART_CPU_ISA` restricts it);
- `build`: compile a source once per level and cache the library;
- `packing`: quantized matrices (`IntGroups`) in the kernels' blocked layout;
- `quant` (quant.cpp): quantized linear layers and attention, the same bits on every level;
- `attention_args`: the attention kernels' argument marshalling (shared with the engine's float kernel).

Nothing here imports the engine or the model loaders: both build on it.
"""
