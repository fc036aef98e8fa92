"""The byte budget of input held by live responses, per response and per API key.

Theory of operation
-------------------
Input sent into a live response (``response.append``, ``response.inject``,
``response.steer``) is held by the server until the model takes it in: in the
rollout's inbox until the turn that reads it drains it into the context, or
queued by the shipped shape's steering until a successor commits it. Until
then nothing but this budget bounds it (issue 28, item 6: 150 appends of
8 MiB into a rollout waiting for its first token were all kept, +1.2 GiB).

- :class:`InputBudget` is the server's (one, shared by every connection):
  the bytes each API key holds across its connections, within
  ``--max-live-input-bytes-per-key``.
- :class:`InputLedger` is a connection's (:meth:`InputBudget.open`): the
  bytes each of its responses holds, within ``--max-live-input-bytes``. A
  response lives on one connection, so its count lives there too.
- :class:`Hold` is one accepted message's bytes (its size as received, a
  bound on the items it brought): taken by :meth:`InputLedger.hold` before
  the message is recorded, given back once by :meth:`Hold.release` when the
  input is consumed (drained into the context, committed by a successor,
  handed back) or, at the latest, when its connection ends
  (:meth:`InputLedger.close`).

A message that would take its response or its key past the budget is refused
``input_budget_exceeded`` (429, param ``input``): nothing is recorded, what
was accepted before stays, and the connection stays usable. The counts are
this module's alone.
"""

from __future__ import annotations

from protocol import ErrorCode, RemoteProtocolError

from ..config import MAX_LIVE_INPUT_BYTES, MAX_LIVE_INPUT_BYTES_PER_KEY

__all__ = ["Hold", "InputBudget", "InputLedger"]


class InputBudget:
    """The server's budget of live input: bytes held per API key (see the module docstring)."""

    def __init__(
        self,
        per_response: int = MAX_LIVE_INPUT_BYTES,
        per_key: int = MAX_LIVE_INPUT_BYTES_PER_KEY,
    ) -> None:
        self.per_response = per_response
        self.per_key = per_key
        #: Bytes held by each key now (a key holding none is not listed).
        self._by_key: dict[str, int] = {}

    def held(self, owner: str) -> int:
        """Bytes of live input API key ``owner`` holds now, across its connections."""
        return self._by_key.get(owner, 0)

    @property
    def total(self) -> int:
        """Bytes of live input held now, every key together."""
        return sum(self._by_key.values())

    def open(self, owner: str) -> InputLedger:
        """The ledger of a connection of API key ``owner`` (``""``: keys off)."""
        return InputLedger(self, owner)

    def _take(self, owner: str, nbytes: int) -> None:
        self._by_key[owner] = self._by_key.get(owner, 0) + nbytes

    def _give_back(self, owner: str, nbytes: int) -> None:
        left = self._by_key.get(owner, 0) - nbytes
        if left > 0:
            self._by_key[owner] = left
        else:
            self._by_key.pop(owner, None)


class InputLedger:
    """One connection's live input: bytes held per response, and its holds."""

    def __init__(self, budget: InputBudget, owner: str) -> None:
        self._budget = budget
        self._owner = owner
        #: Bytes held per response id (a response holding none is not listed).
        self._by_response: dict[str, int] = {}
        #: The holds not yet released (released all together when the connection ends).
        self._holds: set[Hold] = set()

    def held(self, response_id: str) -> int:
        """Bytes of input response ``response_id`` holds now."""
        return self._by_response.get(response_id, 0)

    def hold(self, response_id: str, nbytes: int) -> Hold:
        """Take ``nbytes`` of input for response ``response_id``.

        Raises :class:`RemoteProtocolError` ``input_budget_exceeded`` (429, param
        ``input``) if the response or the key would hold more than its budget;
        nothing is taken then.
        """
        budget = self._budget
        response_held = self.held(response_id)
        if response_held + nbytes > budget.per_response:
            raise RemoteProtocolError(
                f"Response {response_id!r} already holds {response_held} bytes of input "
                f"the model has not taken in; {nbytes} more would pass its limit of "
                f"{budget.per_response} (--max-live-input-bytes). Send it once the "
                "response has read what it holds.",
                code=ErrorCode.INPUT_BUDGET_EXCEEDED,
                param="input",
                status=429,
            )
        key_held = budget.held(self._owner)
        if key_held + nbytes > budget.per_key:
            raise RemoteProtocolError(
                f"This API key's live responses already hold {key_held} bytes of input "
                f"the model has not taken in; {nbytes} more would pass its limit of "
                f"{budget.per_key} (--max-live-input-bytes-per-key). Send it once they "
                "have read what they hold.",
                code=ErrorCode.INPUT_BUDGET_EXCEEDED,
                param="input",
                status=429,
            )
        self._by_response[response_id] = response_held + nbytes
        budget._take(self._owner, nbytes)
        hold = Hold(self, response_id, nbytes)
        self._holds.add(hold)
        return hold

    def close(self) -> None:
        """The connection ended: every hold still taken is released."""
        for hold in list(self._holds):
            hold.release()

    def _release(self, hold: Hold) -> None:
        self._holds.discard(hold)
        left = self._by_response.get(hold.response_id, 0) - hold.nbytes
        if left > 0:
            self._by_response[hold.response_id] = left
        else:
            self._by_response.pop(hold.response_id, None)
        self._budget._give_back(self._owner, hold.nbytes)


class Hold:
    """One accepted message's bytes of input, held until :meth:`release`."""

    __slots__ = ("_ledger", "nbytes", "response_id")

    def __init__(self, ledger: InputLedger, response_id: str, nbytes: int) -> None:
        self._ledger: InputLedger | None = ledger
        self.response_id = response_id
        self.nbytes = nbytes

    def release(self) -> None:
        """The input is consumed (or will never be): its bytes are given back.
        Releasing again does nothing."""
        ledger, self._ledger = self._ledger, None
        if ledger is not None:
            ledger._release(self)
