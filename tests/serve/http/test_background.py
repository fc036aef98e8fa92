"""HTTP ``background: true`` responses: the official SDK, raw HTTP for bad input.

Every streamed event is validated against the SDK's own models, and so is
every Response object. Responses that must still be running when the test
looks at them use a slow simulated model (:data:`SLOW`, minutes long) and are
cancelled by the test; nothing waits on a clock.
"""

from __future__ import annotations

import socket
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import httpx
import openai
import pydantic
import pytest
from openai.types.responses import Response as SDKResponse
from openai.types.responses import ResponseStreamEvent

from longresponse.config import ServerConfig, SimConfig
from tests.conftest import RunningServer
from tests.support.error_replies import assert_refused
from tests.support.http_clients import openai_client, post, unread_request
from tests.support.waiting import wait_for

STREAM_EVENT = pydantic.TypeAdapter(ResponseStreamEvent)
#: About 100 s of output: still running whenever the test looks.
SLOW = {"sim_output_tokens": "2000", "sim_tokens_per_second": "20"}


def checked(event: Any) -> Any:
    """``event``, once the SDK's event union accepts what it was built from."""
    STREAM_EVENT.validate_python(event.to_dict())
    return event


def checked_response(response: Any) -> Any:
    SDKResponse.model_validate(response.to_dict())
    return response


def read(events: Iterable[Any]) -> list[Any]:
    return [checked(event) for event in events]


def numbers(events: list[Any]) -> list[int]:
    return [event.sequence_number for event in events]


def test_create_answers_queued_and_a_poll_sees_it_live(server: Any) -> None:
    client = openai_client(server)
    made = checked_response(
        client.responses.create(
            model="sim", input="poll me", background=True, metadata={"sim_ttft_ms": "600000"}
        )
    )
    assert (made.status, made.background, made.store, made.output) == ("queued", True, True, [])
    live = checked_response(client.responses.retrieve(made.id))
    assert live.id == made.id
    assert live.status in ("queued", "in_progress")
    assert live.background
    cancelled = checked_response(client.responses.cancel(made.id))
    assert (cancelled.status, cancelled.output) == ("cancelled", [])
    stored = checked_response(client.responses.retrieve(made.id))
    assert (stored.status, stored.background) == ("cancelled", True)
    # Cancelling again changes nothing and answers the same.
    again = checked_response(client.responses.cancel(made.id))
    assert again.to_dict() == stored.to_dict()


def test_it_runs_to_completion_and_is_stored(server: Any) -> None:
    client = openai_client(server)
    made = client.responses.create(model="sim", input="finish me", background=True)
    assert made.status == "queued"
    # Follow it to the end: live from the start, or its kept end if it is over.
    events = read(client.responses.retrieve(made.id, stream=True))
    final = events[-1]
    assert final.type == "response.completed"
    assert len(events) == 1 or numbers(events) == list(range(len(events)))
    stored = checked_response(client.responses.retrieve(made.id))
    assert (stored.status, stored.background) == ("completed", True)
    assert "«finish me»" in stored.output_text
    assert stored.output_text == final.response.output_text
    # The stream of a finished response is replayed whole, under the same numbers.
    replayed = read(client.responses.retrieve(made.id, stream=True))
    assert numbers(replayed) == list(range(final.sequence_number + 1))
    assert [e.type for e in replayed[:2]] == ["response.created", "response.in_progress"]
    if len(events) > 1:  # followed live: the replay is what was sent
        assert [e.to_dict() for e in replayed] == [e.to_dict() for e in events]
    late = read(client.responses.retrieve(made.id, stream=True, starting_after=0))
    assert [e.to_dict() for e in late] == [e.to_dict() for e in replayed[1:]]
    assert late[-1].response.to_dict() == final.response.to_dict()
    after_the_end = client.responses.retrieve(
        made.id, stream=True, starting_after=final.sequence_number
    )
    assert read(after_the_end) == []
    with pytest.raises(openai.BadRequestError) as refused:
        client.responses.cancel(made.id)
    assert refused.value.code == "response_already_completed"
    assert refused.value.param == "response_id"
    assert "Cannot cancel a completed response." in str(refused.value)
    # A finished background response is continued like any stored one.
    follow_up = client.responses.create(
        model="sim", previous_response_id=made.id, input="and then?"
    )
    assert "«finish me»" in follow_up.output_text
    assert "«and then?»" in follow_up.output_text


def test_the_sdk_streams_a_finished_response_from_its_first_event(server: Any) -> None:
    """``client.responses.stream(response_id=...)`` needs ``response.created`` first."""
    client = openai_client(server)
    made = client.responses.create(model="sim", input="tell me later", background=True)
    done = client.responses.retrieve(made.id, stream=True)
    followed = read(done)  # to its end: it is finished from here on
    assert followed[-1].type == "response.completed"
    with client.responses.stream(response_id=made.id) as stream:
        replayed = list(stream)  # the SDK's own events, its snapshot built from them
        final = stream.get_final_response()
    assert [e.type for e in replayed[:2]] == ["response.created", "response.in_progress"]
    assert replayed[-1].type == "response.completed"
    assert [(e.type, e.sequence_number) for e in replayed] == [
        (e.type, e.sequence_number) for e in followed
    ]
    assert numbers(replayed) == list(range(len(replayed)))
    assert final.id == made.id
    assert final.output_text == client.responses.retrieve(made.id).output_text
    assert "«tell me later»" in final.output_text
    # starting_after is still honoured: by the SDK, which filters the replay...
    with client.responses.stream(response_id=made.id, starting_after=3) as stream:
        after = list(stream)
        assert stream.get_final_response().output_text == final.output_text
    assert numbers(after) == numbers(replayed)[4:]
    # ...and by the server, asked directly.
    raw = read(client.responses.retrieve(made.id, stream=True, starting_after=3))
    assert [e.to_dict() for e in raw] == [e.to_dict() for e in followed[4:]]


def test_a_finished_log_larger_than_the_table_keeps_its_end_alone(make_server: Any) -> None:
    """A finished log is kept whole when it fits ``--background-endings-bytes``, else
    its terminal event alone; a log trimmed while it ran replays what it held."""
    small_table = make_server(background_endings_bytes=100_000)
    client = openai_client(small_table)
    long = {"sim_output_tokens": "2000", "sim_tokens_per_second": "0"}
    events = read(
        client.responses.create(model="sim", input="x", background=True, stream=True, metadata=long)
    )
    assert len(events) > 2000  # about 400 kB of records: more than the table holds
    kept = read(client.responses.retrieve(events[0].response.id, stream=True))
    assert [e.to_dict() for e in kept] == [events[-1].to_dict()]
    short = read(client.responses.create(model="sim", input="y", background=True, stream=True))
    whole = read(client.responses.retrieve(short[0].response.id, stream=True))
    assert [e.to_dict() for e in whole] == [e.to_dict() for e in short]
    trimmed = make_server(background_log_bytes=1)
    client = openai_client(trimmed)
    events = read(client.responses.create(model="sim", input="z", background=True, stream=True))
    assert events[-1].type == "response.completed"
    late = read(client.responses.retrieve(events[-1].response.id, stream=True))
    assert [e.to_dict() for e in late] == [events[-1].to_dict()]


def test_the_stream_resumes_after_a_sequence_number_for_several_readers(server: Any) -> None:
    client = openai_client(server)
    stream = client.responses.create(
        model="sim", input="a long story", background=True, stream=True, metadata=SLOW
    )
    first = []
    for event in stream:
        first.append(checked(event))
        if event.sequence_number == 5:
            break
    stream.close()
    assert [e.type for e in first[:2]] == ["response.created", "response.in_progress"]
    assert (first[0].response.status, first[0].response.background) == ("queued", True)
    assert first[1].response.status == "in_progress"
    response_id = first[0].response.id
    resumed = client.responses.retrieve(response_id, stream=True, starting_after=5)
    from_start = client.responses.retrieve(response_id, stream=True)
    tail = [checked(next(resumed)) for _ in range(5)]
    head = [checked(next(from_start)) for _ in range(11)]
    assert numbers(tail) == [6, 7, 8, 9, 10]
    assert numbers(head) == list(range(11))
    # One log: every reader gets the same events.
    assert [e.to_dict() for e in head] == [e.to_dict() for e in first + tail]
    assert checked_response(client.responses.retrieve(response_id)).status == "in_progress"
    assert client.responses.cancel(response_id).status == "cancelled"
    for reader, seen in ((resumed, tail), (from_start, head)):
        rest = read(reader)
        end = rest[-1]
        assert end.type == "response.failed"
        assert (end.response.status, end.response.output) == ("cancelled", [])
        everything = seen + rest
        assert numbers(everything) == list(range(numbers(seen)[0], end.sequence_number + 1))
    assert client.responses.retrieve(response_id).status == "cancelled"


def test_it_survives_the_client_going_away_mid_stream(server: Any) -> None:
    client = openai_client(server)
    meta = {"sim_output_tokens": "80", "sim_tokens_per_second": "200"}
    stream = client.responses.create(
        model="sim", input="keep going", background=True, stream=True, metadata=meta
    )
    seen = []
    for event in stream:
        seen.append(checked(event))
        if len(seen) == 3:
            break
    stream.close()  # the client goes away; the response does not
    response_id = seen[0].response.id
    rest = read(client.responses.retrieve(response_id, stream=True, starting_after=2))
    end = rest[-1]
    assert end.type == "response.completed"
    assert len(rest) == 1 or numbers(rest) == list(range(3, end.sequence_number + 1))
    assert all(number > 2 for number in numbers(rest))
    stored = checked_response(client.responses.retrieve(response_id))
    assert stored.status == "completed"
    assert stored.output_text == end.response.output_text
    assert "«keep going»" in stored.output_text
    (item,) = client.responses.input_items.list(response_id).data
    assert item.content[0].text == "keep going"


def test_another_owner_gets_404(make_server: Any) -> None:
    keyed = make_server(api_keys=("key-one", "key-two"))
    one, two = openai_client(keyed, "key-one"), openai_client(keyed, "key-two")
    made = one.responses.create(model="sim", input="mine", background=True, metadata=SLOW)

    def refused_to_two() -> None:
        with pytest.raises(openai.NotFoundError):
            two.responses.retrieve(made.id)
        with pytest.raises(openai.NotFoundError):
            two.responses.retrieve(made.id, stream=True)
        with pytest.raises(openai.NotFoundError):
            two.responses.cancel(made.id)
        with pytest.raises(openai.NotFoundError):
            two.responses.delete(made.id)

    refused_to_two()  # while it runs
    assert one.responses.retrieve(made.id).status in ("queued", "in_progress")
    assert one.responses.cancel(made.id).status == "cancelled"
    refused_to_two()  # and once it is stored
    assert one.responses.retrieve(made.id).status == "cancelled"
    replayed = read(one.responses.retrieve(made.id, stream=True))
    end = replayed[-1]
    assert (end.type, end.response.status) == ("response.failed", "cancelled")
    assert replayed[0].type == "response.created"
    assert numbers(replayed) == list(range(end.sequence_number + 1))


def test_running_background_responses_are_limited(make_server: Any) -> None:
    small = make_server(max_background=1)
    client = openai_client(small)
    first = client.responses.create(model="sim", input="one", background=True, metadata=SLOW)
    with pytest.raises(openai.RateLimitError) as full:
        client.responses.create(model="sim", input="two", background=True)
    assert full.value.status_code == 429
    assert full.value.code == "too_many_background_responses"
    # Requests that are not background ones are not counted.
    assert client.responses.create(model="sim", input="now").status == "completed"
    assert small.app.parts.background.running == 1
    client.responses.cancel(first.id)  # answered once it is over: its place is free
    assert small.app.parts.background.running == 0
    second = client.responses.create(model="sim", input="two", background=True, metadata=SLOW)
    assert second.status == "queued"
    client.responses.cancel(second.id)
    assert small.app.parts.background.running == 0


def test_a_failed_background_response_is_kept(make_server: Any) -> None:
    tiny = make_server(sim=SimConfig(context_window=60))
    client = openai_client(tiny)
    made = client.responses.create(model="sim", input="word " * 200, background=True)
    assert made.status == "queued"
    # Not checked against the SDK's models: its ``error.code`` enum has no
    # ``context_length_exceeded``, the code this server gives such a failure
    # on every transport (SPEC §7).
    end = list(client.responses.retrieve(made.id, stream=True))[-1]
    assert (end.type, end.response.status) == ("response.failed", "failed")
    stored = client.responses.retrieve(made.id)
    assert stored.status == "failed"
    assert stored.error.code == "context_length_exceeded"
    with pytest.raises(openai.BadRequestError) as refused:
        client.responses.cancel(made.id)
    assert "Cannot cancel a failed response." in str(refused.value)


def test_the_log_is_bounded(make_server: Any) -> None:
    """With room for one record, a reader that starts late gets only the newest."""
    small = make_server(background_log_bytes=1)
    client = openai_client(small)
    made = client.responses.create(model="sim", input="bounded", background=True, metadata=SLOW)
    live = client.responses.retrieve(made.id, stream=True)
    while checked(next(live)).sequence_number < 5:
        pass
    late = client.responses.retrieve(made.id, stream=True, starting_after=0)
    assert checked(next(late)).sequence_number >= 5  # 1..4 are gone
    client.responses.cancel(made.id)
    for reader in (live, late):
        rest = read(reader)
        assert numbers(rest) == sorted(set(numbers(rest)))
        assert (rest[-1].type, rest[-1].response.status) == ("response.failed", "cancelled")


def test_a_finished_stream_is_not_kept_beyond_its_budget(make_server: Any) -> None:
    forgetful = make_server(background_endings_bytes=1)
    client = openai_client(forgetful)
    events = read(client.responses.create(model="sim", input="x", background=True, stream=True))
    assert events[-1].type == "response.completed"
    response_id = events[0].response.id
    with pytest.raises(openai.BadRequestError) as refused:
        client.responses.retrieve(response_id, stream=True)
    assert (refused.value.code, refused.value.param) == ("invalid_value", "stream")
    assert client.responses.retrieve(response_id).status == "completed"


def test_shutdown_ends_what_still_runs_failed(tmp_path: Any) -> None:
    store = f"sqlite:///{tmp_path}/responses.db"
    first = RunningServer(ServerConfig(port=0, store=store)).start()
    try:
        made = openai_client(first).responses.create(
            model="sim", input="cut short", background=True, metadata=SLOW
        )
    finally:
        first.stop()
    second = RunningServer(ServerConfig(port=0, store=store)).start()
    try:
        stored = checked_response(openai_client(second).responses.retrieve(made.id))
    finally:
        second.stop()
    assert (stored.status, stored.background) == ("failed", True)
    assert stored.error.code == "server_error"


# --- bad input, raw HTTP ---------------------------------------------------------


@pytest.mark.parametrize(
    ("body", "code", "param"),
    [
        pytest.param({"input": "x", "background": True, "store": False},
                     "unsupported_parameter", "background", id="without-store"),
        pytest.param({"input": "x", "background": "yes"}, "invalid_type", "background",
                     id="not-a-boolean"),
        pytest.param({"input": "x", "background": True, "stream_id": "a"},
                     "unknown_parameter", "stream_id", id="ws-only-field"),
    ],
)  # fmt: skip
def test_a_bad_background_create_is_refused(
    server: Any, body: dict[str, Any], code: str, param: str
) -> None:
    assert_refused(post(server, body), code, param)
    assert post(server, {"input": "x"}).status_code == 200  # nothing was left behind


def test_the_sdk_is_told_background_needs_store(server: Any) -> None:
    with pytest.raises(openai.BadRequestError) as refused:
        openai_client(server).responses.create(model="sim", input="x", background=True, store=False)
    assert (refused.value.code, refused.value.param) == ("unsupported_parameter", "background")


def test_bad_reads_deletes_and_streams(server: Any) -> None:
    base = f"{server.http_url}/v1/responses"
    plain = post(server, {"input": "not in the background"}).json()
    assert plain["background"] is False
    streamed = httpx.get(f"{base}/{plain['id']}", params={"stream": "true"})
    message = assert_refused(streamed, "invalid_value", "stream")["message"]
    assert "background=true" in message
    running = post(server, {"input": "x", "background": True, "metadata": SLOW}).json()
    assert running["status"] == "queued"
    for after in ("-1", "abc", "1.5", "99999999999999999999"):
        params = {"stream": "true", "starting_after": after}
        reply = httpx.get(f"{base}/{running['id']}", params=params)
        assert_refused(reply, "invalid_value", "starting_after")
    assert_refused(httpx.delete(f"{base}/{running['id']}"), "invalid_value", "response_id")
    assert httpx.post(f"{base}/{running['id']}/cancel").json()["status"] == "cancelled"
    assert httpx.delete(f"{base}/{running['id']}").status_code == 200
    for gone in (
        httpx.get(f"{base}/{running['id']}"),
        httpx.get(f"{base}/{running['id']}", params={"stream": "true"}),
        httpx.post(f"{base}/{running['id']}/cancel"),
    ):
        assert_refused(gone, "response_not_found", "response_id", status=404)


def test_one_key_at_its_quota_does_not_stop_another(make_server: Any) -> None:
    """keyA's running responses at its quota refuse keyA's next create (429),
    never keyB's; one of keyA's ending frees keyA's place."""
    keyed = make_server(api_keys=("key-a", "key-b"), max_background=8, max_background_per_key=2)
    a, b = openai_client(keyed, "key-a"), openai_client(keyed, "key-b")
    mine = [a.responses.create(model="sim", input="a", background=True, metadata=SLOW)]
    mine.append(a.responses.create(model="sim", input="a", background=True, metadata=SLOW))
    with pytest.raises(openai.RateLimitError) as full:
        a.responses.create(model="sim", input="a", background=True, metadata=SLOW)
    assert full.value.code == "too_many_background_responses"
    assert "this API key" in full.value.message
    theirs = b.responses.create(model="sim", input="b", background=True, metadata=SLOW)
    assert theirs.status == "queued"
    a.responses.cancel(mine[0].id)
    mine.append(a.responses.create(model="sim", input="a", background=True, metadata=SLOW))
    for made in (*mine[1:], theirs):
        (a if made in mine else b).responses.cancel(made.id)
    assert keyed.app.parts.background.running == 0


def test_the_maximum_duration_ends_a_response_incomplete(make_server: Any) -> None:
    """Past ``--background-max-duration`` a running response ends ``incomplete``
    (reason ``max_duration``) with the output written so far, billed and stored."""
    short = make_server(background_max_duration=0.5)
    client = openai_client(short)
    made = client.responses.create(model="sim", input="forever", background=True, metadata=SLOW)
    events = list(client.responses.retrieve(made.id, stream=True))
    end = events[-1]
    assert (end.type, end.response.status) == ("response.incomplete", "incomplete")
    assert end.response.incomplete_details.reason == "max_duration"
    assert any(event.type == "response.output_text.delta" for event in events)
    stored = client.responses.retrieve(made.id)
    assert (stored.status, stored.incomplete_details.reason) == ("incomplete", "max_duration")
    assert short.app.parts.background.running == 0


def lingering(port: int, peer: int) -> list[str]:
    """The states of the server's end (``port``) of the connection from the
    client's ``peer`` port while it is closing (``/proc/net/tcp``: FIN-WAIT-1
    04, FIN-WAIT-2 05, CLOSING 0B, LAST-ACK 09). Other connections to the
    server (the SDK's, closed by its keep-alive timeout) are not looked at."""
    closing = {"04", "05", "09", "0B"}
    rows = Path("/proc/net/tcp").read_text().splitlines()[1:]
    return [
        state
        for _, local, remote, state, *_ in (row.split() for row in rows)
        if int(local.rsplit(":", 1)[1], 16) == port
        and int(remote.rsplit(":", 1)[1], 16) == peer
        and state in closing
    ]


def ending(sock: socket.socket) -> str:
    """Read ``sock`` to its end: ``reset`` or ``closed`` (a clean end)."""
    try:
        while sock.recv(1 << 20):
            pass
    except ConnectionResetError:
        return "reset"
    return "closed"


@pytest.mark.slow  # waits out the slow-reader timeout
def test_a_follower_that_never_reads_is_cut_off(
    make_server: Any, caplog: pytest.LogCaptureFixture
) -> None:
    """A ``GET ?stream=true`` whose client never reads is dropped once a write
    has waited ``--slow-reader-timeout`` (it stayed connected, pinning the log),
    while the response runs on. The client reads nothing (a reader that started
    reading would be a fast one). The connection is reset: what the server had
    handed to the kernel is dropped with it, and no socket of the server's is
    left in FIN-WAIT-1 holding it (issue 28: 2.8 MB stayed so, and the client
    saw its socket open 40 s later)."""
    import logging

    caplog.set_level(logging.INFO, logger="longresponse.serve.seam")
    slow = make_server(api_keys=("key-a",), slow_reader_timeout=0.5)
    client = openai_client(slow, "key-a")
    loud = {"sim_output_tokens": "2000000", "sim_tokens_per_second": "0"}
    made = client.responses.create(model="sim", input="x" * 2000, background=True, metadata=loud)
    follow = (
        b"GET /v1/responses/%s?stream=true HTTP/1.1\r\nHost: 127.0.0.1\r\n"
        b"Authorization: Bearer key-a\r\n\r\n" % made.id.encode()
    )
    with unread_request(slow.port, follow) as sock:
        # Reading nothing: the send buffers fill, then a write waits 0.5 s.
        wait_for(
            lambda: any("slow background stream reader" in m for m in caplog.messages),
            "the server to cut the reader off",
            30,
            interval=0.05,
        )
        peer = sock.getsockname()[1]
        wait_for(lambda: not lingering(slow.port, peer), "the server's socket to be gone", 5)
        assert ending(sock) == "reset"  # not a clean end after the data
        # Dropping the reader does not stop the response: it runs on to its own end
        # (its output budget, on a fast machine before the buffers even fill).
        status = client.responses.retrieve(made.id)
        assert status.status in ("in_progress", "incomplete"), status.status
        if status.status == "incomplete":
            assert status.incomplete_details.reason == "max_output_tokens"
    if client.responses.retrieve(made.id).status == "in_progress":
        client.responses.cancel(made.id)
