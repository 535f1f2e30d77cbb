"""How long OpenBLAS's idle threads spin before they sleep, set before NumPy loads OpenBLAS.

OpenBLAS reads `OPENBLAS_THREAD_TIMEOUT` once, when it is loaded (the first `import numpy`): after
each call its worker threads spin for 2^n cycles before they sleep, 2^28 (about 0.1 s) by default.
A spinning worker holds a core through the engine's Python between matmuls, and through the
stretches where engine.kernels.cpu_workers runs pieces on Python threads with one BLAS thread each:
there a 2-thread call just before leaves its worker spinning beside both Python workers (measured
on the OLMoE-shaped step: experts 30% slower with the long spin, 15% faster with 2^20 cycles;
bench/CPU_NOTES.md, change 7). So the engine asks for 2^20 cycles (about 0.4 ms) unless the user
set the variable, or NumPy was already loaded when the engine was imported (then the setting
would be a lie: engine.kernels.cpu_workers reads the variable to know which spin is in force).

Imported first by engine/__init__.py; the studio sets the same before its own first import.
"""

import os
import sys

SPIN_LOG2 = "20"  # OPENBLAS_THREAD_TIMEOUT the engine asks for: 2^20 cycles

if "numpy" not in sys.modules:
    os.environ.setdefault("OPENBLAS_THREAD_TIMEOUT", SPIN_LOG2)
