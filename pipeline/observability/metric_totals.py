"""Reading the deployment's metric totals back from Redis (written by :mod:`shardfuse.pipeline.observability.metrics`):
counters,
and histograms with their buckets made cumulative, summed over series and turned into quantiles."""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from shardfuse.pipeline.observability.metrics import (
    BUCKETS_KEY,
    BUCKETS_S,
    COUNTERS_KEY,
    INF,
    SUMS_KEY,
    Labels,
    Series,
)


@dataclass(frozen=True, slots=True)
class Histogram:
    """One histogram: ``buckets`` are ``(upper bound, observations at or below it)``, ascending, the last
    one ``+inf`` (its count is every observation)."""

    buckets: tuple[tuple[float, int], ...]
    sum: float = 0.0

    @property
    def count(self) -> int:
        return self.buckets[-1][1] if self.buckets else 0

    def quantile(self, q: float) -> float | None:
        """The ``q`` quantile (0 < q < 1), interpolated linearly inside its bucket as Prometheus's
        ``histogram_quantile`` does (the first bucket starts at 0); the highest finite bound when it falls in
        the ``+inf`` bucket; None with no observations."""
        if not 0 < q < 1:
            raise ValueError(f"a quantile is between 0 and 1, got {q}")
        total = self.count
        if total == 0:
            return None
        rank = q * total
        lower, below = 0.0, 0
        for upper, cumulative in self.buckets:
            if cumulative >= rank:
                if math.isinf(upper):
                    return lower
                inside = cumulative - below
                return lower + (upper - lower) * ((rank - below) / inside if inside else 1.0)
            lower, below = upper, cumulative
        return lower


def cumulative(per_bucket: Mapping[float, int], bounds: Iterable[float] = ()) -> Histogram:
    """A histogram from per-bucket counts (each observation counted in one bucket only), with a bucket for
    each of ``bounds`` too, empty or not."""
    bounds = sorted(set(per_bucket) | set(bounds) | {math.inf})
    running, buckets = 0, []
    for bound in bounds:
        running += per_bucket.get(bound, 0)
        buckets.append((bound, running))
    return Histogram(tuple(buckets))


def _matches(labels: Labels, wanted: Mapping[str, object]) -> bool:
    have = dict(labels)
    return all(have.get(k) == str(v) for k, v in wanted.items())


@dataclass(frozen=True, slots=True)
class MetricTotals:
    """Every series' total, as read at one moment."""

    counters: dict[Series, float] = field(default_factory=dict)
    histograms: dict[Series, Histogram] = field(default_factory=dict)

    def counter(self, name: str, **labels: object) -> float:
        """The sum of ``name``'s series that carry ``labels`` (all of them when none are given)."""
        return sum(v for (n, ls), v in self.counters.items() if n == name and _matches(ls, labels))

    def histogram(self, name: str, **labels: object) -> Histogram:
        """``name``'s series that carry ``labels``, merged into one histogram."""
        per_bucket: dict[float, int] = {}
        total = 0.0
        for (n, ls), hist in self.histograms.items():
            if n != name or not _matches(ls, labels):
                continue
            below = 0
            for bound, cumulative_count in hist.buckets:
                per_bucket[bound] = per_bucket.get(bound, 0) + cumulative_count - below
                below = cumulative_count
            total += hist.sum
        merged = cumulative(per_bucket)
        return Histogram(merged.buckets, total)

    def breakdown(self, name: str, label: str, **labels: object) -> dict[str, float]:
        """``name``'s totals by the value of ``label`` (among series carrying ``labels``)."""
        out: dict[str, float] = {}
        for (n, ls), v in self.counters.items():
            if n == name and _matches(ls, labels):
                key = dict(ls).get(label, "")
                out[key] = out.get(key, 0) + v
        return out


def _series(raw: bytes | str) -> tuple[Series, list[Any]]:
    name, labels, *rest = json.loads(raw)
    return (str(name), tuple((str(k), str(v)) for k, v in labels)), rest


def parse_totals(counters: Mapping[Any, Any], buckets: Mapping[Any, Any], sums: Mapping[Any, Any], *,
                 bounds: Iterable[float] = BUCKETS_S) -> MetricTotals:
    """Totals from the three hashes' contents (fields and values as Redis returns them). Every series of a
    histogram gets the same buckets (``bounds`` and any other bound one of them holds), as Prometheus expects:
    Redis holds only the buckets that were observed."""
    out_counters = {_series(f)[0]: float(v) for f, v in counters.items()}
    per_series: dict[Series, dict[float, int]] = {}
    for raw, count in buckets.items():
        series, (upper,) = _series(raw)
        bound = math.inf if upper == INF else float(upper)
        per_series.setdefault(series, {})[bound] = int(count)
    sum_of = {_series(f)[0]: float(v) for f, v in sums.items()}
    by_name: dict[str, set[float]] = {}
    for (name, _), counts in per_series.items():
        by_name.setdefault(name, set(bounds)).update(counts)
    histograms = {series: Histogram(cumulative(counts, by_name[series[0]]).buckets, sum_of.get(series, 0.0))
                  for series, counts in per_series.items()}
    return MetricTotals(out_counters, histograms)


def read_totals(client: Any, *, bounds: Iterable[float] = BUCKETS_S) -> MetricTotals:
    """The totals every process has flushed so far (one round trip)."""
    pipe = client.pipeline(transaction=False)
    for key in (COUNTERS_KEY, BUCKETS_KEY, SUMS_KEY):
        pipe.hgetall(key)
    counters, buckets, sums = pipe.execute()
    return parse_totals(counters, buckets, sums, bounds=bounds)


def label_names(series: Iterable[Series]) -> list[str]:
    """Every label name the series use, sorted (the exporter's label set of one metric family)."""
    return sorted({k for _, labels in series for k, _ in labels})
