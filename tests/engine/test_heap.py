"""engine.train.heap: the allocator keeps a step's freed buffers (set once per process, glibc only,
never over the user's own MALLOC_* settings). Each case runs in a fresh interpreter: the setting is
process-wide."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

CODE = (
    "import numpy as np\n"
    "from engine.train.heap import keep_step_buffers\n"
    "first, again = keep_step_buffers(), keep_step_buffers()\n"
    "print(first, again)\n"
)


def run(code: str, env_extra: dict | None = None) -> str:
    """stdout of `code` in a fresh interpreter at the repository root, without inherited MALLOC_* settings."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("MALLOC_")}
    env.update(env_extra or {})
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    out = subprocess.run(
        [sys.executable, "-c", code], env=env, cwd=root, capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 0, out.stderr
    return out.stdout.strip()


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's mallopt")
def test_set_once_on_linux_and_a_freed_step_buffer_is_reused_without_page_faults():
    assert run(CODE) == "True True"
    code = (
        "import resource, numpy as np\n"
        "from engine.train.heap import keep_step_buffers\n"
        "def faults():\n"
        "    a = np.ones(8 << 18, np.float32); b = np.ones(3 << 20, np.float32); del a, b\n"  # 8 + 12 MiB
        "    r0 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt\n"
        "    for _ in range(5):\n"
        "        a = np.ones(8 << 18, np.float32); b = np.ones(3 << 20, np.float32); del a, b\n"
        "    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt - r0\n"
        "before = faults(); keep_step_buffers(); after = faults()\n"
        "print(before, after)\n"
    )
    before, after = map(int, run(code).split())
    if before < 50:  # transparent huge pages fault 2 MiB at a time: too few faults to tell apart
        pytest.skip(f"only {before} page faults without the setting")
    assert after < before / 4, (before, after)  # this machine: ~1,000 faults without it, 0 with it


def test_the_users_own_allocator_settings_are_left_alone():
    assert run(CODE, {"MALLOC_TRIM_THRESHOLD_": "1000000"}) == "False False"
