"""What admitting a client message produced, handed to the code that handles it.

The protocol core calls a shape's ``admit`` between its own checks and
recording the event (``Connection.receive_event``); what admission found (the
response the event targets, the admitted items) is returned in one
:class:`Admitted` value, which the session hands to the shape's ``handle``.
Nothing of it is kept on the shape between the two calls.
"""

from __future__ import annotations

import dataclasses

from protocol import ResponseTrack
from protocol.events import ClientEvent

from ...engine.admission import Admission
from ..continuation import Continuation
from ..input_budget import Hold

__all__ = ["Admitted"]


@dataclasses.dataclass(frozen=True, slots=True)
class Admitted:
    """One client event as admitted: the event to record (its items possibly
    redacted), the response it targets, and its admission, if it brought input."""

    event: ClientEvent
    #: The response the event targets, as the protocol core found it
    #: (``None`` for a create).
    track: ResponseTrack | None = None
    #: The admitted items of an append, inject or steer.
    admission: Admission | None = None
    #: The bytes of live input the items hold (``longresponse.serve.input_budget``).
    hold: Hold | None = None
    #: An append-mode create's start: the known prefix its input begins with.
    continuation: Continuation | None = None
