"""Prometheus metrics, one registry per app (so tests and embedders can build many apps).

The ``scenario`` label is bounded: clients name scenarios, and a label value per scenario
would grow ``/metrics`` (and every scraper's storage) with each new name. Pinned scenarios
(configured, default, token-listed) keep their own series, so do the first
``SCENARIO_LABELS`` others seen; later ones are counted under ``OTHER_SCENARIO``.
"""

from __future__ import annotations

import copy
import threading
from collections.abc import Callable, Iterable, Iterator
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST
from prometheus_client.metrics_core import GaugeMetricFamily, Metric

from ..hookspecs import hookimpl

_LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300)
_BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512)

#: scenarios besides the pinned ones that get a ``scenario`` label value of their own
SCENARIO_LABELS = 100
#: the label value of every scenario past the bound (never a valid scenario name: those start
#: with a letter or a digit)
OTHER_SCENARIO = "_other"
#: step metric names kept per recipe in ``reef_recipe_step_metric`` (the first ones seen)
RECIPE_METRIC_NAMES = 64


class _ScenarioBounded:
    """A labelled metric whose ``labels(...)`` passes the ``scenario`` value through the bound,
    so no call site can add an unbounded series. Everything else is the metric's own."""

    def __init__(self, metric: Any, index: int, bound: Callable[[str], str]):
        self._metric = metric
        self._index = index
        self._bound = bound

    def labels(self, *values: str) -> Any:
        bounded = list(values)
        bounded[self._index] = self._bound(bounded[self._index])
        return self._metric.labels(*bounded)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._metric, name)


class _ScenarioFiltered:
    """A collector showing ``registry`` without the samples of scenarios ``allowed`` refuses."""

    def __init__(self, registry: CollectorRegistry, allowed: Callable[[str], bool]):
        self._registry = registry
        self._allowed = allowed

    def collect(self) -> Iterator[Metric]:
        for metric in self._registry.collect():
            kept = [s for s in metric.samples if "scenario" not in s.labels or self._allowed(s.labels["scenario"])]
            if len(kept) != len(metric.samples):
                metric = copy.copy(metric)
                metric.samples = kept
            yield metric


class _RefusedReleases:
    """``reef_release_refused{scenario}``, computed at scrape time from the release chain."""

    _help = ("1 for a scenario whose release chain holds a release this server refused (an id, a path or a file "
             "it may not use); it keeps serving its last good release. The log and GET /reef/scenarios/{s} say why.")

    def __init__(self, refused: Callable[[], Iterable[str]], label: Callable[[str], str]):
        self._refused = refused
        self._label = label

    def describe(self) -> Iterator[Metric]:
        yield GaugeMetricFamily("reef_release_refused", self._help, labels=("scenario",))

    def collect(self) -> Iterator[Metric]:
        counts: dict[str, int] = {}
        for scenario in self._refused():
            label = self._label(scenario)
            counts[label] = counts.get(label, 0) + 1
        family = GaugeMetricFamily("reef_release_refused", self._help, labels=("scenario",))
        for label, count in sorted(counts.items()):
            family.add_metric([label], count)
        yield family


class Metrics:
    """The server's metrics. Label ``route`` is the route template, never the raw path; label
    ``scenario`` is bounded (see ``scenario_label``)."""

    content_type = CONTENT_TYPE_LATEST

    def __init__(self, scenario_labels: int = SCENARIO_LABELS) -> None:
        self.scenario_labels = scenario_labels
        self._pinned: frozenset[str] = frozenset()
        self._labelled: set[str] = set()
        self._label_lock = threading.Lock()
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        self.requests = _ScenarioBounded(
            Counter("reef_requests", "Inference requests by route, scenario and outcome status.",
                    ("route", "scenario", "status"), registry=r), 1, self.scenario_label)
        self.latency = Histogram("reef_request_latency_seconds",
                                 "Inference latency from request start to the last byte.",
                                 ("route", "stream"), buckets=_LATENCY_BUCKETS, registry=r)
        self.first_byte = Histogram("reef_stream_first_event_seconds",
                                    "Time from request start to the first streamed event.",
                                    ("route",), buckets=_LATENCY_BUCKETS, registry=r)
        self.records = Counter("reef_records_written", "Records made durable, by status.",
                               ("status",), registry=r)
        self.record_failures = Counter("reef_record_write_failures", "Records the store refused.",
                                       registry=r)
        self.reports = _ScenarioBounded(
            Counter("reef_reports_written", "Reports stored (idempotent retries excluded).",
                    ("scenario",), registry=r), 0, self.scenario_label)
        self.upstream_errors = Counter("reef_upstream_errors", "Runtime call failures by HTTP status.",
                                       ("status",), registry=r)
        self.batch_size = Histogram("reef_writer_batch_size", "Records per group-commit transaction.",
                                    buckets=_BATCH_BUCKETS, registry=r)
        self.batch_seconds = Histogram("reef_writer_batch_seconds", "Duration of one group-commit transaction.",
                                       buckets=_LATENCY_BUCKETS, registry=r)
        self.http_errors = Counter("reef_http_errors", "Error answers by status (all routes).",
                                   ("status",), registry=r)

        self.candidates = _ScenarioBounded(
            Counter("reef_candidates_evaluated", "Candidates the evaluator decided on, by recipe and outcome "
                    "(select, reject, undecided, error).", ("scenario", "recipe", "outcome"), registry=r), 0,
            self.scenario_label)
        self.recipe_metric = _ScenarioBounded(
            Gauge("reef_recipe_step_metric", "The latest evaluated candidate's step metrics, as its recipe "
                  "reported them (metadata.<recipe>.metrics: losses, norms, clip fractions, counts).",
                  ("scenario", "recipe", "name"), registry=r), 0, self.scenario_label)
        self.lineage_resets = _ScenarioBounded(
            Counter("reef_lineage_resets", "Learner lineages reset to the serving release by a step: the gate "
                    "found the head significantly worse, its KL to serving passed the bound, or it ran more than "
                    "max_staleness steps ahead of serving.", ("scenario", "recipe"),
                    registry=r), 0, self.scenario_label)
        self.already_decided = _ScenarioBounded(
            Counter("reef_gate_already_decided", "Candidates the gate did not evaluate again: their artifact "
                    "(content hash) was already rejected or left undecided against the same serving release.",
                    ("scenario", "recipe"), registry=r), 0, self.scenario_label)
        self.skipped = _ScenarioBounded(
            Counter("reef_candidates_skipped", "Batches a recipe proposed nothing from, by kind (nothing_to_learn, "
                    "warm_up, no_usable_rollout, stale, not_training, other).", ("scenario", "recipe", "kind"),
                    registry=r), 0, self.scenario_label)
        self.stale_rollouts = _ScenarioBounded(
            Counter("reef_lineage_rollouts_stale", "Rollouts a weight recipe dropped: sampled from a release more "
                    "than max_staleness lineage steps behind the lineage head.", ("scenario", "recipe"),
                    registry=r), 0, self.scenario_label)
        self._metric_names: dict[str, set[str]] = {}
        self._metric_names_lock = threading.Lock()

    @hookimpl
    def candidate_evaluated(self, candidate: Any, evaluation: Any, decision: Any) -> None:
        """Count the decision and expose the candidate's numeric step metrics (a recipe's
        ``metadata[<recipe>]["metrics"]``: top-level numbers only, at most
        ``RECIPE_METRIC_NAMES`` names per recipe so a recipe cannot grow the series unbounded)."""
        self.candidates.labels(candidate.scenario, candidate.recipe, decision.outcome).inc()
        lineage = (candidate.metadata or {}).get("lineage")
        if isinstance(lineage, dict) and lineage.get("reset"):
            self.lineage_resets.labels(candidate.scenario, candidate.recipe).inc()
        if (getattr(evaluation, "metrics", None) or {}).get("already_decided"):
            self.already_decided.labels(candidate.scenario, candidate.recipe).inc()
        if isinstance(lineage, dict) and _count(lineage.get("rollouts_stale")):
            self.stale_rollouts.labels(candidate.scenario, candidate.recipe).inc(_count(lineage["rollouts_stale"]))
        section = (candidate.metadata or {}).get(candidate.recipe)
        values = section.get("metrics") if isinstance(section, dict) else None
        if not isinstance(values, dict):
            return
        with self._metric_names_lock:
            names = self._metric_names.setdefault(candidate.recipe, set())
            for name, value in values.items():
                if not isinstance(value, (int, float)) or not isinstance(name, str):
                    continue
                if name not in names and len(names) >= RECIPE_METRIC_NAMES:
                    continue
                names.add(name)
                self.recipe_metric.labels(candidate.scenario, candidate.recipe, name).set(float(value))

    @hookimpl
    def candidate_skipped(self, scenario: str, recipe: str, reason: str, kind: str, counts: dict[str, int]) -> None:
        """Count a batch a recipe proposed nothing from, by kind, and the stale rollouts it dropped."""
        self.skipped.labels(scenario, recipe, kind).inc()
        if _count(counts.get("rollouts_stale")):
            self.stale_rollouts.labels(scenario, recipe).inc(_count(counts["rollouts_stale"]))

    def pin_scenarios(self, names: Iterable[str]) -> None:
        """Scenarios that always keep their own label value (configured, default, token-listed)."""
        self._pinned = frozenset(names)

    def scenario_label(self, scenario: str) -> str:
        """The ``scenario`` label value for ``scenario``: its name when pinned or among the first
        ``scenario_labels`` others seen, else ``OTHER_SCENARIO``. Any thread."""
        if scenario in self._pinned or scenario in self._labelled:
            return scenario
        with self._label_lock:
            if scenario in self._labelled:
                return scenario
            if len(self._labelled) < self.scenario_labels:
                self._labelled.add(scenario)
                return scenario
        return OTHER_SCENARIO

    def watch_refused_releases(self, refused: Callable[[], Iterable[str]]) -> None:
        """Expose ``reef_release_refused``: 1 for each scenario ``refused()`` names (those whose
        chain holds a release this server refused and does not serve), read at each scrape."""
        self.registry.register(_RefusedReleases(refused, self.scenario_label))

    def observe_batch(self, size: int, seconds: float) -> None:
        self.batch_size.observe(size)
        self.batch_seconds.observe(seconds)

    def render(self, scenario_allowed: Callable[[str], bool] | None = None) -> bytes:
        """The Prometheus text; with ``scenario_allowed``, samples labelled with a scenario it
        refuses are left out (a token limited to scenarios sees only theirs)."""
        if scenario_allowed is None:
            return generate_latest(self.registry)
        return generate_latest(_ScenarioFiltered(self.registry, scenario_allowed))


def _count(value: Any) -> int:
    """A non-negative count from a recipe's metadata (anything else: 0)."""
    return int(value) if isinstance(value, int) and not isinstance(value, bool) and value > 0 else 0
