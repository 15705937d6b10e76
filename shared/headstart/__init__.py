"""headstart: LLM serving for interactive text-to-SQL that prefills while the user types."""

import os as _os

__version__ = "0.1.0"

# torch's OpenMP helpers must not spin on the cores the native kernels run on. After each parallel
# region of a torch op (a prefill's copies, RoPE's sin/cos) GNU OpenMP's helper threads busy-wait
# for the next one (GOMP_SPINCOUNT, milliseconds); the quantized kernels run on their own threads,
# one per core, so on a 2-core machine a spinning helper took a core from them and a request's
# answer tokens came 13-17% later (trained 0.5B, 3 alternating pairs, docs/benchmarks.md). Passive
# helpers sleep at once; waking them costs microseconds per region. libgomp reads this when it is
# loaded, so it is set here, before any headstart module imports torch; a value the user set wins.
_os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
