"""The server process's own figures, read from its ``/metrics``.

Theory of operation
-------------------
Every bench reads a few figures of the server process around what it
measures: its CPU time (``process_cpu_seconds_total``) and its resident
memory (``process_resident_memory_bytes``), both from prometheus_client's
process collector, exposed in the Prometheus text format on ``GET /metrics``.

The text is parsed by prometheus_client's own parser
(:func:`prometheus_client.parser.text_string_to_metric_families`), and the
unlabelled samples are looked up by their *sample* name. The names differ
for counters: the parser calls the family ``process_cpu_seconds`` but its
sample keeps the exposed name ``process_cpu_seconds_total``; gauges are the
same either way (``process_resident_memory_bytes``).

This module imports nothing else of the bench: the benches import it.
"""

from __future__ import annotations

from typing import Final

import httpx
from prometheus_client.parser import text_string_to_metric_families

__all__ = [
    "PROCESS_CPU_SECONDS",
    "PROCESS_RESIDENT_BYTES",
    "read_samples",
    "server_cpu_seconds",
    "unlabelled_samples",
]

#: The sample of the server process's CPU time (user + system), in seconds.
PROCESS_CPU_SECONDS: Final = "process_cpu_seconds_total"
#: The sample of the server process's resident memory, in bytes.
PROCESS_RESIDENT_BYTES: Final = "process_resident_memory_bytes"


def unlabelled_samples(text: str) -> dict[str, float]:
    """Every sample without labels in the exposition ``text``, by sample name."""
    return {
        sample.name: sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if not sample.labels
    }


async def read_samples(http: httpx.AsyncClient, http_url: str, *names: str) -> dict[str, float]:
    """The unlabelled samples ``names`` of the server at ``http_url`` (``http://host:port``).

    Raises ``httpx.HTTPError`` if ``/metrics`` cannot be fetched, ``RuntimeError``
    if a sample is missing from it.
    """
    response = await http.get(f"{http_url}/metrics")
    response.raise_for_status()
    samples = unlabelled_samples(response.text)
    missing = [name for name in names if name not in samples]
    if missing:
        raise RuntimeError(f"{http_url}/metrics has no {', '.join(missing)}")
    return {name: samples[name] for name in names}


async def server_cpu_seconds(http: httpx.AsyncClient, http_url: str) -> float:
    """The server process's ``process_cpu_seconds_total`` (see :func:`read_samples`)."""
    return (await read_samples(http, http_url, PROCESS_CPU_SECONDS))[PROCESS_CPU_SECONDS]
