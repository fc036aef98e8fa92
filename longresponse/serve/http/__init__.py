"""The HTTP transport: the Responses API and its neighbours.

:mod:`.responses` is ``/v1/responses`` (JSON and SSE) with its resource
routes, :mod:`.sinks` its event sinks, :mod:`.background` background
responses, :mod:`.compact` ``/v1/responses/compact``, :mod:`.input_tokens`
``/v1/responses/input_tokens``, :mod:`.chat` ``/v1/chat/completions`` and
``/tokenize``, :mod:`.token_cache` the process-wide token cache.
"""
