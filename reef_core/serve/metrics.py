"""Prometheus metrics, one registry per app (so tests and embedders can build many apps)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST

_LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300)
_BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512)


class Metrics:
    """The server's metrics. Label ``route`` is the route template, never the raw path."""

    content_type = CONTENT_TYPE_LATEST

    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        self.requests = Counter("reef_requests", "Inference requests by route, scenario and outcome status.",
                                ("route", "scenario", "status"), registry=r)
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
        self.reports = Counter("reef_reports_written", "Reports stored (idempotent retries excluded).",
                               ("scenario",), registry=r)
        self.upstream_errors = Counter("reef_upstream_errors", "Runtime call failures by HTTP status.",
                                       ("status",), registry=r)
        self.batch_size = Histogram("reef_writer_batch_size", "Records per group-commit transaction.",
                                    buckets=_BATCH_BUCKETS, registry=r)
        self.batch_seconds = Histogram("reef_writer_batch_seconds", "Duration of one group-commit transaction.",
                                       buckets=_LATENCY_BUCKETS, registry=r)
        self.http_errors = Counter("reef_http_errors", "Error answers by status (all routes).",
                                   ("status",), registry=r)

    def observe_batch(self, size: int, seconds: float) -> None:
        self.batch_size.observe(size)
        self.batch_seconds.observe(seconds)

    def render(self) -> bytes:
        return generate_latest(self.registry)
