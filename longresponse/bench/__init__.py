"""Benchmarks: transports side by side, stream throughput, paused rollouts at scale.

``longresponse bench``             :mod:`.compare` runs simulated agent rollouts through
                                   every transport and reuse switch; :mod:`.report`
                                   writes ``turns.json``, ``summary.md`` and the plots.
``longresponse bench-throughput``  :mod:`.throughput`: one connection, model unthrottled.
``longresponse bench-scale``       :mod:`.scale`: many concurrent paused rollouts.
``longresponse soak``              :mod:`.soak`: mixed shapes for minutes, RSS over time.
``longresponse bench-engine``      :mod:`.engine`: llama.cpp behind the gateway, side by
                                   side with the client talking to it directly.

Under :mod:`.compare`, each module importing only those before it:
:mod:`.options` (transports, workload, flags), :mod:`.conversation` (request
bodies, turn records, wire sizes), :mod:`.trio_transports`,
:mod:`.sdk_transports` and :mod:`.agents_transports` (driving one rollout),
:mod:`.measure` (rows, batches, the echo floor). Under :mod:`.report`:
:mod:`.analysis` (medians, targets) and :mod:`.plots`. :mod:`.scrape` reads
the server's ``/metrics`` for all three commands.

:mod:`.echo` is the floor all of them compare against: a bare WebSocket echo
endpoint on the same stack. The submodules are imported on use (by the
command line), so serving the echo endpoint does not import the others.
"""

__all__ = [
    "agents_transports",
    "analysis",
    "compare",
    "conversation",
    "echo",
    "engine",
    "measure",
    "options",
    "plots",
    "report",
    "scale",
    "scrape",
    "sdk_transports",
    "soak",
    "soak_report",
    "throughput",
    "trio_transports",
]
