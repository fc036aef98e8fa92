"""Benchmarks: transports side by side, stream throughput, paused rollouts at scale.

``longresponse bench``             :mod:`.compare` runs simulated agent rollouts through
                                   every transport and reuse switch; :mod:`.report`
                                   writes ``turns.json``, ``summary.md`` and the plots.
``longresponse bench-throughput``  :mod:`.throughput`: one connection, model unthrottled.
``longresponse bench-scale``       :mod:`.scale`: many concurrent paused rollouts.

:mod:`.echo` is the floor all of them compare against: a bare WebSocket echo
endpoint on the same stack. The submodules are imported on use (by the
command line), so serving the echo endpoint does not import the others.
"""

__all__ = ["compare", "echo", "report", "scale", "throughput"]
