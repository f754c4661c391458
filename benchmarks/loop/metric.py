"""What a benchmark reports: one `Metric` per number, with its unit and which direction is better.

The runner uses these to label tables and plots and to word the ferroloop/peer ratio row; the
benchmark modules use them to declare their output before they run.
"""

from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass(frozen=True)
class Metric:
    key: str  # the key in the dict a benchmark's run() returns
    title: str  # table heading
    unit: str
    higher_is_better: bool
    cases: tuple[str, ...] = ()  # the case labels it is reported for; empty: every case

    @property
    def direction(self) -> str:
        return "higher is better" if self.higher_is_better else "lower is better"

    def applies_to(self, case: str) -> bool:
        return not self.cases or case in self.cases


def percentile(samples: list[float], q: float) -> float:
    """Nearest-rank percentile (q in 0..100) of a non-empty list; no interpolation, no numpy."""
    ordered = sorted(samples)
    rank = min(len(ordered), max(1, math.ceil(q / 100 * len(ordered))))
    return ordered[rank - 1]
