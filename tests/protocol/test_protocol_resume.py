"""``response.resume`` and ``response.resumed``: a response taken up on a new connection.

An append-mode response whose connection was lost is taken up where its last
checkpoint left it: the server's ``response.resumed`` opens it on the new
connection in its state (``requires_action`` with the calls still waiting, or
``in_progress``), numbered after the checkpoint's last event, and the
response goes on from there under the usual rules, on both ends alike.
"""

from __future__ import annotations

from protocol import ErrorCode, Mode, ResponseState, Role
from protocol.events import OutputItemDone, ResponseAppend, ResponseResume, ResponseResumed
from protocol.response import RequiredAction
from tests.support.connection_pair import (
    RID,
    ConnectionPair,
    function_call,
    output,
    response,
    user,
)


def resumed(pair: ConnectionPair, at: int, *waiting: str, done: tuple[str, ...] = ()) -> None:
    """The server takes ``RID`` up at ``at``, its output the calls ``done`` then
    ``waiting``, the latter still waiting for outputs."""
    calls = [function_call(call_id) for call_id in (*done, *waiting)]
    status = "requires_action" if waiting else "in_progress"
    action = RequiredAction(call_ids=list(waiting)) if waiting else None
    fields = {"required_action": action} if action is not None else {}
    taken = response(RID, status, output=calls, **fields)
    pair.send(Role.SERVER, ResponseResumed(sequence_number=at, response=taken))


def test_a_paused_response_goes_on_where_its_checkpoint_left_it() -> None:
    pair = ConnectionPair()
    pair.send(Role.CLIENT, ResponseResume(response_id=RID))
    resumed(pair, 41, "c2", done=("c1",))
    assert pair.state() is ResponseState.REQUIRES_ACTION
    assert pair.next_sequence(RID) == 42
    # Only the call still waiting takes an output; the answered one is unknown here.
    answered = ResponseAppend(input=[output("c1")], response_id=RID)
    pair.assert_rejected(
        Role.CLIENT, answered, code=ErrorCode.UNKNOWN_CALL_ID, param="input[0].call_id"
    )
    pair.append(output("c2"), user())
    pair.resume()
    pair.call("c3")
    pair.finish()
    assert pair.state() is ResponseState.COMPLETED


def test_a_response_taken_up_in_progress_streams_on() -> None:
    pair = ConnectionPair()
    pair.send(Role.CLIENT, ResponseResume(response_id=RID))
    resumed(pair, 7, done=("c1",))
    assert pair.state() is ResponseState.IN_PROGRESS
    item = function_call("c9")
    pair.serve(OutputItemDone, output_index=1, item=item)
    assert pair.next_sequence(RID) == 9
    pair.finish()


def test_the_shipped_shape_does_not_speak_it() -> None:
    pair = ConnectionPair(Mode.SHIPPED)
    pair.assert_rejected(
        Role.CLIENT,
        ResponseResume(response_id=RID),
        code=ErrorCode.UNKNOWN_EVENT_TYPE,
        param="type",
    )


def test_a_response_live_on_the_connection_cannot_be_resumed_there() -> None:
    pair = ConnectionPair()
    pair.create(input="go")
    pair.start()
    pair.assert_rejected(
        Role.CLIENT,
        ResponseResume(response_id=RID),
        code=ErrorCode.INVALID_VALUE,
        param="response_id",
    )
    live = ResponseResumed(sequence_number=5, response=response(RID, "in_progress"))
    pair.assert_rejected(Role.SERVER, live, code=ErrorCode.INVALID_VALUE, param="response.id")


def test_a_finished_response_is_not_taken_up() -> None:
    pair = ConnectionPair()
    pair.send(Role.CLIENT, ResponseResume(response_id=RID))
    ended = ResponseResumed(sequence_number=3, response=response(RID, "completed"))
    pair.assert_rejected(Role.SERVER, ended, code=ErrorCode.INVALID_VALUE, param="response.status")
