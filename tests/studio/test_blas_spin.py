"""The app shortens OpenBLAS's spin after each matmul (studio/__init__.py): the setting is in the
environment before NumPy loads OpenBLAS (it is read only then), and a user's own value is kept."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

# Records OPENBLAS_THREAD_TIMEOUT as it is when the first module of NumPy is imported, then imports
# the app's entry module as `tune-studio` does.
PROBE = textwrap.dedent(
    """
    import importlib.abc, os, sys
    seen = []
    class Watch(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path=None, target=None):
            if name == "numpy" and not seen:
                seen.append(os.environ.get("OPENBLAS_THREAD_TIMEOUT"))
            return None
    sys.meta_path.insert(0, Watch())
    import studio.app
    import numpy
    print(seen[0])
    """
)


def timeout_when_numpy_loads(**env: str) -> str:
    clean = {k: v for k, v in os.environ.items() if k != "OPENBLAS_THREAD_TIMEOUT"}
    out = subprocess.run(
        [sys.executable, "-c", PROBE], env={**clean, **env}, capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 0, out.stderr
    return out.stdout.strip()


def test_the_spin_is_set_before_numpy_loads():
    assert timeout_when_numpy_loads() == "20"


def test_a_users_own_setting_is_kept():
    assert timeout_when_numpy_loads(OPENBLAS_THREAD_TIMEOUT="7") == "7"
