"""``/metrics``: the server's phase times and pipeline work, in Prometheus format.

Each app has its own registry (several servers may share a process in tests).
Phase times are histograms labelled by ``phase`` and ``transport``; the
pipeline's work counters are read at scrape time.
"""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Histogram,
    ProcessCollector,
    generate_latest,
)
from prometheus_client.core import CounterMetricFamily
from prometheus_client.registry import Collector

from ..engine.admission import Counters
from ..engine.timing import TurnTiming

__all__ = ["CONTENT_TYPE", "ServerMetrics"]

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

_BUCKETS = (
    0.0001,
    0.00025,
    0.0005,
    0.001,
    0.0025,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
    10.0,
)


class _PipelineWork(Collector):
    def __init__(self, counters: Counters) -> None:
        self.counters = counters

    def collect(self) -> Iterator[CounterMetricFamily]:
        work = CounterMetricFamily(
            "longresponse_pipeline_work",
            "Work done by the request pipeline, by kind (what each reuse switch saves).",
            labels=["kind"],
        )
        for kind in (
            "items_validated",
            "tool_schemas_checked",
            "items_classified",
            "secrets_found",
            "tokens_rendered",
            "items_rendered",
            "resolutions",
        ):
            work.add_metric([kind], getattr(self.counters, kind))
        yield work


class ServerMetrics:
    """The registry behind ``/metrics`` and the observations fed into it."""

    def __init__(self, counters: Counters) -> None:
        self.registry = CollectorRegistry()
        self.phase_seconds = Histogram(
            "longresponse_phase_seconds",
            "Server time of one turn's phase.",
            ["phase", "transport"],
            buckets=_BUCKETS,
            registry=self.registry,
        )
        self.responses = Counter(
            "longresponse_responses",
            "Responses finished, by transport and status.",
            ["transport", "status"],
            registry=self.registry,
        )
        self.registry.register(_PipelineWork(counters))
        # process_cpu_seconds_total and friends, for the bench's CPU figures.
        ProcessCollector(registry=self.registry)

    def observe_turn(self, transport: str, timing: TurnTiming) -> None:
        for phase in TurnTiming.PHASES:
            self.phase_seconds.labels(phase, transport).observe(getattr(timing, phase))

    def response_finished(self, transport: str, status: str) -> None:
        self.responses.labels(transport, status).inc()

    def render(self) -> bytes:
        return generate_latest(self.registry)
