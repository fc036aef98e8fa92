"""The inspector: what the server saw, per connection and rollout, served at ``/inspect``.

:mod:`.observer` keeps the observations (fed by the hot paths, never
waiting), :mod:`.records` what is kept of one rollout, :mod:`.routes` the page,
its JSON and its live feed; the page itself is package data in ``static/``.
"""
