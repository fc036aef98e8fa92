"""Whether an upstream serves the model its backend names: asked once, at start.

Theory of operation
-------------------
Two settings of a backend can be wrong in a way no turn reports well:
``upstream_model`` naming a model the engine does not have (llama.cpp's
server answers whatever ``model`` it is sent, with the one it loaded: a
wrong name serves silently), and a ``base_url`` whose path is not the
engine's API root (every turn fails with a 404). Neither is the client's
doing and neither mends itself: the operator has to change the setting.

So each backend's :class:`ServedModel` asks its upstream once, when the
server starts (:meth:`ServedModel.check`, run by the app's lifespan through
``registry.check_backends``, beside serving): ``GET {base_url}/models``,
which OpenAI, vLLM, llama.cpp, Ollama, SGLang and another longresponse
serve. The configured name is served when the list holds it as an ``id``,
as one of llama.cpp's ``aliases`` (its ``--alias``), or as Ollama's
``NAME:latest``. What it finds is logged once (logger
``longresponse.backends.served_model``):

- the name is not in the list: ERROR, naming what the engine serves and the
  setting to change (``upstream_model``, or llama-server's ``--alias``);
- 404: ERROR, the path is not the API root: ``base_url`` to change;
- 401 or 403: ERROR, the credentials (``api_key_env``);
- served: INFO;
- no answer (the engine not up yet, a timeout, another status, not a list):
  WARNING, and the question stays open. A chat backend then reads the
  ``model`` its engine's first answer names (:meth:`ServedModel.answered_as`):
  a name that is neither the configured one nor a dated snapshot of it
  (OpenAI answers ``gpt-4o`` as ``gpt-4o-2024-08-06``) is the same ERROR.

Nothing is refused: the server serves on, and each turn that fails is
reported as it always is (``longresponse.engine.failures``). The check
sends the API key as the turns do, and never logs it.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from typing import Any, Final, Literal
from urllib.parse import urlsplit

import httpx
import msgspec

from ..config import BackendConfig
from .settings import shown_url
from .tls import client_context

__all__ = ["MAX_LISTED", "ServedModel", "serves"]

log = logging.getLogger(__name__)

#: Names of what an engine serves quoted in a message, at most.
MAX_LISTED: Final = 5


def serves(model: str, names: Iterable[str]) -> bool:
    """Whether an upstream listing ``names`` serves ``model``: by that name,
    or as Ollama's ``NAME:latest`` for a name without a tag."""
    listed = set(names)
    return model in listed or (":" not in model and f"{model}:latest" in listed)


class ServedModel:
    """One backend's question to its upstream (see the module docstring)."""

    def __init__(self, config: BackendConfig, key: str | None = None) -> None:
        self.config = config
        self._key = key  # sent as the turns send it; never logged
        root = config.base_url.rstrip("/")
        for scheme, http in (("ws://", "http://"), ("wss://", "https://")):
            if root.startswith(scheme):
                root = http + root[len(scheme) :]
        self.url = f"{root}/models"
        parts = urlsplit(root)
        #: Where the upstream is, for messages (never the URL's credentials).
        self.where = f"{parts.hostname}:{parts.port}" if parts.port else str(parts.hostname)
        #: ``pending`` until the check has run; ``open`` when it had no answer
        #: (a chat backend's first answer decides); ``settled`` once decided.
        self.verdict: Literal["pending", "open", "settled"] = "pending"

    async def check(self) -> None:
        """Ask the upstream which models it serves and log what that says of the
        configuration (module docstring), once. Never raises."""
        headers = {"authorization": f"Bearer {self._key}"} if self._key else {}
        timeout = httpx.Timeout(self.config.connect_timeout)
        try:
            async with httpx.AsyncClient(
                headers=headers, timeout=timeout, verify=client_context()
            ) as client:
                answer = await client.get(self.url)
        except (httpx.HTTPError, httpx.InvalidURL) as exc:
            self._unanswered(f"it could not be reached ({type(exc).__name__})")
            return
        status = answer.status_code
        if status == 404:
            self._settle_wrong(self._wrong_path())
        elif status in (401, 403):
            self._settle_wrong(self._refused(status))
        elif status != 200:
            self._unanswered(f"it answered HTTP {status}")
        elif (listed := _listed(answer.content)) is None:
            self._unanswered("its answer is not a list of models")
        elif serves(self.config.model, [name for name, _ in listed]):
            self.verdict = "settled"
            log.info(
                "model %r: the upstream at %s serves %r",
                self.config.name,
                self.where,
                self.config.model,
            )
        else:
            self._settle_wrong(self._not_listed(listed))

    def answered_as(self, model: str) -> None:
        """An answer of the upstream names the ``model`` that wrote it: while the
        check found no answer (``open``), the first one decides, once."""
        if self.verdict != "open" or not model:
            return
        configured = self.config.model
        if model == configured or model.startswith(f"{configured}-"):
            self.verdict = "settled"
            return
        self._settle_wrong(
            f"model {self.config.name!r}: the upstream at {self.where} answers as {model!r}, "
            f"not {configured!r}: it does not serve that name. {self._fix_name(model)}"
        )

    # --- the messages ---------------------------------------------------------------

    def _settle_wrong(self, message: str) -> None:
        self.verdict = "settled"
        log.error("%s", message)

    def _unanswered(self, why: str) -> None:
        self.verdict = "open"
        then = (
            "its first answer's model is checked instead"
            if self.config.kind == "chat"
            else "it is checked again at the next start"
        )
        log.warning(
            "model %r: could not ask the upstream at %s which models it serves (GET %s: %s); %s",
            self.config.name,
            self.where,
            shown_url(self.url),
            why,
            then,
        )

    def _table(self) -> str:
        return f"[models.{self.config.name}] of the --config file"

    def _fix_name(self, served: str, llama: bool = False) -> str:
        fix = (
            f"Set upstream_model = {_quoted(served)} in {self._table()} "
            f"(or --upstream-model for the flags)"
        )
        if llama:
            fix += f", or start llama-server with --alias {self.config.model}"
        return fix + "."

    def _not_listed(self, listed: list[tuple[str, bool]]) -> str:
        names = [name for name, _ in listed]
        shown = ", ".join(repr(name) for name in names[:MAX_LISTED])
        if len(names) > MAX_LISTED:
            shown += f" and {len(names) - MAX_LISTED} more"
        llama = any(is_llama for _, is_llama in listed)
        first = names[0] if names else "NAME"
        return (
            f"model {self.config.name!r}: the upstream at {self.where} does not serve "
            f"{self.config.model!r} (it serves {shown or 'nothing'}). "
            f"{self._fix_name(first, llama)}"
        )

    def _wrong_path(self) -> str:
        endpoint = "/chat/completions" if self.config.kind == "chat" else "/responses"
        return (
            f"model {self.config.name!r}: the upstream at {self.where} has no "
            f"{urlsplit(self.url).path} (HTTP 404): base_url "
            f"{shown_url(self.config.base_url)!r} is not its API root. Set base_url in "
            f"{self._table()} (or --upstream for the flags) to the URL its {endpoint} "
            "is under, such as http://HOST:PORT/v1."
        )

    def _refused(self, status: int) -> str:
        if self.config.api_key_env:
            fix = f"check the key the variable {self.config.api_key_env} holds"
        else:
            fix = f"set api_key_env in {self._table()} to the variable holding its key"
        return (
            f"model {self.config.name!r}: the upstream at {self.where} refused the "
            f"server's credentials (HTTP {status}); {fix}."
        )


def _quoted(name: str) -> str:
    return msgspec.json.encode(name).decode()  # a JSON string is a TOML basic string


def _listed(body: bytes) -> list[tuple[str, bool]] | None:
    """The names an upstream's ``GET /models`` lists (each ``id`` and llama.cpp's
    ``aliases``), each with whether llama.cpp serves it; None if it is no list."""
    try:
        answer: Any = msgspec.json.decode(body)
    except (msgspec.DecodeError, RecursionError, UnicodeError):
        return None
    data = answer.get("data") if isinstance(answer, dict) else None
    if not isinstance(data, list):
        return None
    listed: list[tuple[str, bool]] = []
    for entry in data:
        if not isinstance(entry, dict):
            continue
        llama = entry.get("owned_by") == "llamacpp"
        aliases = entry.get("aliases")
        for name in [entry.get("id"), *(aliases if isinstance(aliases, list) else [])]:
            if isinstance(name, str) and name and (name, llama) not in listed:
                listed.append((name, llama))
    return listed
