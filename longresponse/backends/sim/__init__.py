"""The simulated models ``sim`` and ``sim-alt``: the mock backend beside the real ones.

:mod:`.sampler` is the deterministic sampler (and its ``sim_*`` metadata),
:mod:`.structured` its answers in JSON, :mod:`.patterns` its strings for a
schema's ``pattern``.
"""
