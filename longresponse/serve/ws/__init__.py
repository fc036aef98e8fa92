"""The WebSocket transport: one endpoint, one session per connection, two shapes.

:mod:`.session` is the pure-ASGI endpoint and its :class:`Session`;
:mod:`.outbox` the connection's bounded queue of encoded events;
:mod:`.oversize` the frame past the size limit; :mod:`.append` append mode
(one rollout as one Response); :mod:`.shipped` the shipped shape, composing
:mod:`.lanes` (requests by ``stream_id``), :mod:`.steering` (``response.steer``
input for a segment's successor) and :mod:`.segment_cache` (the connection
cache); :mod:`.live_input` input committed into a live Response
(``response.append`` and ``response.inject``); :mod:`.admitted` what admitting a
client message produced, handed by the session to the shape that handles it.
"""
