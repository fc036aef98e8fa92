"""``/metrics``: the server's phase times and pipeline work, in Prometheus format.

Each app has its own registry (several servers may share a process in tests).
Phase times are histograms labelled by ``phase`` and ``transport``; the
pipeline's work counters are read at scrape time.

:class:`LoopLagMonitor` measures the event loop's responsiveness: a task
(owned by the app's lifespan) asks to be woken every
:data:`LOOP_LAG_INTERVAL` seconds and records how late each wake-up came, in
the histogram ``longresponse_event_loop_lag_seconds``; the gauge
``longresponse_event_loop_lag_max_seconds`` holds the worst lag of the last
:data:`LOOP_LAG_WINDOW` wake-ups. A request that holds the loop shows there
as lag for every connection.
"""

from __future__ import annotations

import asyncio
import collections
import time
from collections.abc import Iterator
from typing import Final

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    ProcessCollector,
    generate_latest,
)
from prometheus_client.core import CounterMetricFamily
from prometheus_client.registry import Collector

from ..engine.admission import Counters
from ..engine.timing import TurnTiming
from .transport import Transport

__all__ = [
    "CONTENT_TYPE",
    "LOOP_LAG_INTERVAL",
    "LOOP_LAG_WINDOW",
    "STEER_DROP_REASONS",
    "LoopLagMonitor",
    "ServerMetrics",
]

#: How often the loop-lag monitor asks to be woken, in seconds.
LOOP_LAG_INTERVAL: Final = 0.05
#: Wake-ups over which ``longresponse_event_loop_lag_max_seconds`` is the worst.
LOOP_LAG_WINDOW: Final = 200
#: Why accepted steers were dropped (``longresponse_steers_dropped_total{reason}``):
#: the client closed the connection or it was lost; the server dropped a
#: reader that stopped reading.
STEER_DROP_REASONS: Final = ("connection_closed", "slow_reader")

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
        self.steers_dropped_total = Counter(
            "longresponse_steers_dropped",
            "Accepted response.steer input dropped with its connection, never delivered "
            "nor handed back, by why the connection ended.",
            ["reason"],
            registry=self.registry,
        )
        for reason in STEER_DROP_REASONS:  # at 0 from the start, for alerts
            self.steers_dropped_total.labels(reason)
        self._phase_children: dict[Transport, tuple[tuple[str, Histogram], ...]] = {}
        self.registry.register(_PipelineWork(counters))
        # process_cpu_seconds_total and friends, for the bench's CPU figures.
        ProcessCollector(registry=self.registry)

        self.loop_lag = Histogram(
            "longresponse_event_loop_lag_seconds",
            "How late the event loop woke a task that slept a fixed interval.",
            buckets=_BUCKETS,
            registry=self.registry,
        )
        self.loop_lag_max = Gauge(
            "longresponse_event_loop_lag_max_seconds",
            f"The worst event-loop lag of the last {LOOP_LAG_WINDOW} wake-ups.",
            registry=self.registry,
        )

    def observe_turn(self, transport: Transport, timing: TurnTiming) -> None:
        children = self._phase_children.get(transport)
        if children is None:  # the labelled children, looked up once per transport
            children = tuple(
                (phase, self.phase_seconds.labels(phase, transport)) for phase in TurnTiming.PHASES
            )
            self._phase_children[transport] = children
        for phase, child in children:
            child.observe(getattr(timing, phase))

    def response_finished(self, transport: Transport, status: str) -> None:
        self.responses.labels(transport, status).inc()

    def steers_dropped(self, reason: str, count: int) -> None:
        """``count`` accepted steers were dropped with their connection (``reason``,
        one of :data:`STEER_DROP_REASONS`)."""
        self.steers_dropped_total.labels(reason).inc(count)

    def render(self) -> bytes:
        return generate_latest(self.registry)


class LoopLagMonitor:
    """Sleeps ``interval`` seconds again and again, recording how late it wakes."""

    def __init__(self, metrics: ServerMetrics, interval: float = LOOP_LAG_INTERVAL) -> None:
        self.metrics = metrics
        self.interval = interval
        self._recent: collections.deque[float] = collections.deque(maxlen=LOOP_LAG_WINDOW)

    async def run(self) -> None:
        """Measure until cancelled (the lifespan cancels it at shutdown)."""
        while True:
            asked = time.monotonic() + self.interval
            await asyncio.sleep(self.interval)
            self.observe(max(0.0, time.monotonic() - asked))

    @property
    def recent(self) -> tuple[float, float]:
        """The last lag and the worst of the window, in seconds (0 before any)."""
        return (self._recent[-1], max(self._recent)) if self._recent else (0.0, 0.0)

    def observe(self, lag: float) -> None:
        self._recent.append(lag)
        self.metrics.loop_lag.observe(lag)
        self.metrics.loop_lag_max.set(max(self._recent))
