"""Tune Studio desktop app (PySide6).

Importing the package sets how long OpenBLAS's worker threads spin after a matmul before they
sleep, unless the user set it (`OPENBLAS_THREAD_TIMEOUT`, read once when NumPy loads OpenBLAS, so
before the first `import numpy`): 2^20 cycles (about 0.4 ms) instead of OpenBLAS's 2^28 (about
0.1 s). With the long spin the worker holds the second core through every stretch of the engine's
Python between matmuls, and the UI thread waits for a core: each piece of UI work took 2x its CPU
time. With 2^20, short runs' worst UI stall fell from 22-45 ms to 14-38 ms and the demo's p99 from
15-17 to 14-15 ms, at the same training speed (bench/CPU_NOTES.md, "Changes" 6). The setting is the
engine's (engine/_blas_env.py, made when the engine is imported before NumPy; its CPU workers need
it too): the package imports the engine first, before Qt or pyqtgraph can load NumPy.
"""

import engine  # noqa: F401 - first: its import sets OpenBLAS's spin before anything loads NumPy
