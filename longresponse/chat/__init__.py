"""Chat Completions, one package: its wire types, the mapping to the engine's
items, and the server acting as a chat engine (with its prefix cache).

:mod:`.wire` declares the requests, answers and stream chunks once
(:mod:`.upstream`: what only an engine sends, its records and errors);
:mod:`.mapping` turns messages into items and back; :mod:`.engine` serves one
completion from a sampler, its prompt rendered and its prefix cache kept
(:mod:`.prefix_cache`). The server's ``/v1/chat/completions`` endpoint
(``serve.http.chat``) and the ``chat`` backend (``backends.chat``) both use it.
"""
