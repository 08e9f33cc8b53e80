"""Summaries and ratios (pure).

Rules:
1. Runs are the unit of repetition: a cell's number is the median over runs, its spread the min and
   max over runs.
2. A ratio is taken per run, against the reference measured in that same run, and only then summarised:
   a noisy minute slows the contender and its reference together, so the ratio survives it.
3. Missing values (a skipped or failed cell) are ``None`` and never become zeros.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass


def percentile(values: Sequence[float], q: float) -> float:
    """The q-th percentile (0 ≤ q ≤ 100) by linear interpolation between closest ranks."""
    if not values:
        raise ValueError("percentile of no values")
    if not 0 <= q <= 100:
        raise ValueError(f"percentile {q} outside 0..100")
    ordered = sorted(values)
    rank = (len(ordered) - 1) * q / 100
    low, high = math.floor(rank), math.ceil(rank)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


@dataclass(frozen=True)
class Summary:
    median: float
    low: float
    high: float
    n: int

    def as_dict(self) -> dict[str, float | int]:
        return {"median": self.median, "min": self.low, "max": self.high, "n": self.n}


def summarize(values: Sequence[float | None]) -> Summary | None:
    present = [v for v in values if v is not None]
    if not present:
        return None
    return Summary(statistics.median(present), min(present), max(present), len(present))


def per_run_ratios(values: Sequence[float | None], reference: Sequence[float | None]) -> list[float | None]:
    """``values[i] / reference[i]`` for each run where both exist and the reference is not zero."""
    if len(values) != len(reference):
        raise ValueError("ratio over runs of different lengths")
    return [v / r if v is not None and r else None for v, r in zip(values, reference, strict=True)]
