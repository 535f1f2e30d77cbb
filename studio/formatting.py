"""Numbers for people: byte sizes, parameter counts and durations as the pages show them."""

from __future__ import annotations


def human_bytes(n: float) -> str:
    """1536 -> '1.5 KiB'."""
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if n < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} TiB"


def human_count(n: int, exact: bool = False) -> str:
    """77824 -> '77.82 K' (exact: '77,824 (77.82 K)')."""
    for div, unit in ((1e9, "B"), (1e6, "M"), (1e3, "K")):
        if n >= div:
            short = f"{n / div:.2f} {unit}"
            return f"{n:,} ({short})" if exact else short
    return str(n)
