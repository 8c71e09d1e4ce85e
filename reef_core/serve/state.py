"""Per-app serving state computed once at start-up (nothing here is redone per request)."""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field

from ..kernel import Reef
from ..observe import ExperienceRecord
from .metrics import Metrics
from .scenarios import ScenarioRegistry
from .writer import RecordWriter


@dataclass
class ServeState:
    """What the request path needs, resolved once: kernel, writer, metrics, runtime facts."""

    reef: Reef
    writer: RecordWriter
    metrics: Metrics
    runtime_dialect: str
    runtime_name: str
    default_scenario: str
    max_body_bytes: int
    max_json_depth: int
    default_max_tokens: int
    #: which scenarios exist; ``admit`` on the request path (see ``reef_core.serve.scenarios``)
    scenarios: ScenarioRegistry
    started: bool = False
    #: inference requests running now (streams until their record is queued)
    inflight: int = 0
    #: {receipt: scenario} of the streams this process is answering: their receipts went out with
    #: the headers, their records are stored when they end (a report quoting one meanwhile is told so)
    streaming: dict[str, str] = field(default_factory=dict)

    def dead_workers(self) -> list[str]:
        """Background workers that died while serving (the record writer, the learning loop's
        tasks). Each one catches its own failures, so a dead one means the process must restart."""
        if not self.started:
            return []
        dead = ["reef-record-writer"] if self.writer.died else []
        dead += self.reef.releases.dead_tasks()
        if self.reef.learning is not None:
            dead += self.reef.learning.dead_tasks()
        return dead

    async def drain(self, timeout: float = 10.0) -> None:
        """Wait until no inference request is running (their records are queued), or timeout."""
        deadline = time.monotonic() + timeout
        while self.inflight > 0 and time.monotonic() < deadline:
            await asyncio.sleep(0.01)

    @classmethod
    def build(cls, reef: Reef, metrics: Metrics) -> ServeState:
        def stored(record) -> None:
            metrics.records.labels(record.status).inc()
            if reef.observed("record_stored"):
                reef.emit("record_stored", record=ExperienceRecord.from_row(record))

        writer = RecordWriter(reef.store, on_stored=stored, on_batch=metrics.observe_batch)
        runtime = reef.runtime
        scenarios = ScenarioRegistry.from_settings(reef.settings)
        metrics.pin_scenarios(scenarios.pinned)
        metrics.watch_refused_releases(lambda: reef.releases.refused_releases().keys())
        # Its startup hook runs after the release chain's recovery, so the scenarios of releases
        # recovery just recorded count as stored too.
        reef.register(scenarios, name="reef.scenarios")
        reef.register(metrics, name="reef.metrics")  # candidate_evaluated: the learning series
        return cls(
            reef=reef,
            writer=writer,
            metrics=metrics,
            runtime_dialect=runtime.dialect,
            runtime_name=reef.runtime_name,
            default_scenario=reef.settings.server.default_scenario,
            max_body_bytes=reef.settings.server.max_body_bytes,
            max_json_depth=reef.settings.server.max_json_depth,
            default_max_tokens=int(runtime.default_max_tokens),
            scenarios=scenarios,
        )
