"""Counters and histograms read from ``/metrics`` scrapes (Prometheus's text format) and added up across
pools: what ``shardfuse status`` shows of a deployment's metrics. Pure: no I/O (the scrapes are text).

Each pool's scrape already holds the exact sums over its own processes
(:mod:`shardfuse.pipeline.observability.multiprocess`), and no two pools count the same work, so the sum of
the pools' scrapes is the deployment's total: what ``sum(...)`` over those series gives in Prometheus.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from prometheus_client.metrics import MetricWrapperBase
from prometheus_client.parser import text_string_to_metric_families

Labels = tuple[tuple[str, str], ...]
Series = tuple[str, Labels]
# A metric object of pipeline.observability.metrics, or its family name.
Metric = MetricWrapperBase | str


def family_name(metric: Metric) -> str:
    """The family name of a metric object (``shardfuse_events`` for the ``shardfuse_events_total`` counter)."""
    if isinstance(metric, str):
        return metric
    return str(next(iter(metric.describe())).name)


@dataclass(frozen=True, slots=True)
class Histogram:
    """One histogram: ``buckets`` are ``(upper bound, observations at or below it)``, ascending, the last
    one ``+inf`` (its count is every observation)."""

    buckets: tuple[tuple[float, float], ...]
    sum: float = 0.0

    @property
    def count(self) -> float:
        return self.buckets[-1][1] if self.buckets else 0

    def per_bucket(self) -> dict[float, float]:
        """Observations in each bucket alone (not cumulative)."""
        out, below = {}, 0.0
        for bound, cumulative_count in self.buckets:
            out[bound] = cumulative_count - below
            below = cumulative_count
        return out

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
        lower, below = 0.0, 0.0
        for upper, cumulative_count in self.buckets:
            if cumulative_count >= rank:
                if math.isinf(upper):
                    return lower
                inside = cumulative_count - below
                return lower + (upper - lower) * ((rank - below) / inside if inside else 1.0)
            lower, below = upper, cumulative_count
        return lower


def cumulative(per_bucket: Mapping[float, float], total: float = 0.0) -> Histogram:
    """A histogram from per-bucket counts (each observation counted in one bucket only)."""
    running, buckets = 0.0, []
    for bound in sorted(set(per_bucket) | {math.inf}):
        running += per_bucket.get(bound, 0)
        buckets.append((bound, running))
    return Histogram(tuple(buckets), total)


def merge_histograms(histograms: Iterable[Histogram]) -> Histogram:
    per_bucket: dict[float, float] = {}
    total = 0.0
    for hist in histograms:
        for bound, count in hist.per_bucket().items():
            per_bucket[bound] = per_bucket.get(bound, 0) + count
        total += hist.sum
    return cumulative(per_bucket, total)


def _matches(labels: Labels, wanted: Mapping[str, object]) -> bool:
    have = dict(labels)
    return all(have.get(k) == str(v) for k, v in wanted.items())


@dataclass(frozen=True, slots=True)
class MetricTotals:
    """Every counter and histogram series, by family name and labels."""

    counters: dict[Series, float] = field(default_factory=dict)
    histograms: dict[Series, Histogram] = field(default_factory=dict)

    def counter(self, metric: Metric, **labels: object) -> float:
        """The sum of the counter's series that carry ``labels`` (all of them when none are given)."""
        name = family_name(metric)
        return sum(v for (n, ls), v in self.counters.items() if n == name and _matches(ls, labels))

    def histogram(self, metric: Metric, **labels: object) -> Histogram:
        """The histogram's series that carry ``labels``, merged into one."""
        name = family_name(metric)
        return merge_histograms(h for (n, ls), h in self.histograms.items() if n == name and _matches(ls, labels))

    def breakdown(self, metric: Metric, label: str, **labels: object) -> dict[str, float]:
        """The counter's totals by the value of ``label`` (among series carrying ``labels``)."""
        name, out = family_name(metric), dict[str, float]()
        for (n, ls), v in self.counters.items():
            if n == name and _matches(ls, labels):
                key = dict(ls).get(label, "")
                out[key] = out.get(key, 0.0) + v
        return out

    def histogram_counts(self, metric: Metric, label: str) -> dict[str, float]:
        """The histogram's observations by the value of ``label``."""
        name, out = family_name(metric), dict[str, float]()
        for (n, ls), hist in self.histograms.items():
            if n == name:
                key = dict(ls).get(label, "")
                out[key] = out.get(key, 0.0) + hist.count
        return out


def _labels(sample_labels: Mapping[str, str], *, drop: str = "") -> Labels:
    return tuple(sorted((k, v) for k, v in sample_labels.items() if k != drop))


def parse_scrape(text: str) -> MetricTotals:
    """The counters and histograms of one scrape (gauges and ``_created`` samples are left out)."""
    counters: dict[Series, float] = {}
    buckets: dict[Series, dict[float, float]] = {}
    sums: dict[Series, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if family.type == "counter" and sample.name == f"{family.name}_total":
                series = (family.name, _labels(sample.labels))
                counters[series] = counters.get(series, 0.0) + sample.value
            elif family.type == "histogram" and sample.name == f"{family.name}_bucket":
                series = (family.name, _labels(sample.labels, drop="le"))
                buckets.setdefault(series, {})[float(sample.labels["le"])] = sample.value
            elif family.type == "histogram" and sample.name == f"{family.name}_sum":
                sums[(family.name, _labels(sample.labels))] = sample.value
    histograms = {series: Histogram(tuple(sorted(counts.items())), sums.get(series, 0.0))
                  for series, counts in buckets.items()}
    return MetricTotals(counters, histograms)


def add_up(totals: Iterable[MetricTotals]) -> MetricTotals:
    """Several scrapes' totals added up, series by series."""
    counters: dict[Series, float] = {}
    histograms: dict[Series, list[Histogram]] = {}
    for one in totals:
        for series, value in one.counters.items():
            counters[series] = counters.get(series, 0.0) + value
        for series, hist in one.histograms.items():
            histograms.setdefault(series, []).append(hist)
    return MetricTotals(counters, {series: merge_histograms(hists) for series, hists in histograms.items()})
