"""Byte counts as people read them: binary multiples with their IEC names (KiB, MiB, GiB, TiB), since every size
sift prints is counted in powers of 1,024."""

from __future__ import annotations


def binary_bytes(n: float | None) -> str:
    """`n` bytes as `812 B`, `77.8 KiB`, `329.6 MiB` …; `-` for None."""
    if n is None:
        return "-"
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} TiB"  # unreachable: the loop returns at TiB
