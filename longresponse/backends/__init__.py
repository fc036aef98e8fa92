"""Real model backends: the engines a served model name can stand for.

A backend is a :class:`~longresponse.engine.sampling.Sampler` factory that
speaks to an engine over the network: ``chat`` (an OpenAI-compatible Chat
Completions API: vLLM, llama.cpp's server, Ollama, SGLang, OpenAI),
``responses`` (a Responses API over HTTP SSE) and ``responses-ws`` (its
WebSocket mode). :mod:`.settings` reads which names map to which engines;
:mod:`.registry` opens them and adds them to the model registry beside the
simulated models. The layer imports the engine and the protocol, never the
serve or storage layers.
"""
