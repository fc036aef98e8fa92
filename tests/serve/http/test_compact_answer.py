"""A compaction's answer with long strings is written a piece at a time
(``answer_body``), and reads as the answer encoded in one piece would."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import httpx
import msgspec

from longresponse.serve.http.compact import LONG_TEXT, answer_body
from protocol.items import Compaction, InputText, Message
from protocol.response import (
    InputTokensDetails,
    OutputTokensDetails,
    ResponseCompaction,
    Usage,
)


def test_the_pieces_join_into_the_answer_encoded_whole() -> None:
    """Characters JSON escapes (quotes, backslashes, control characters,
    non-ASCII, a surrogate pair's worth) on both sides of every piece's edge."""
    tricky = 'a"b\\c\nd\x01é€😀'
    long_text = (tricky * (3 * LONG_TEXT // len(tricky) + 7))[: 3 * LONG_TEXT + 5]
    answer = ResponseCompaction(
        id="resp_1",
        created_at=1,
        output=[
            Message(role="user", content=[InputText(text="short"), InputText(text=long_text)]),
            Message(role="user", content=[InputText(text=long_text[::-1])]),
            Compaction(id="cmp_1", encrypted_content="QUJD" * LONG_TEXT),
        ],
        usage=Usage(
            input_tokens=1,
            input_tokens_details=InputTokensDetails(),
            output_tokens=2,
            output_tokens_details=OutputTokensDetails(),
            total_tokens=3,
        ),
    )

    async def joined() -> tuple[bytes, int]:
        written = answer_body(answer)
        assert not isinstance(written, bytes)  # written a piece at a time
        pieces = [piece async for piece in written]
        return b"".join(pieces), len(pieces)

    body, count = asyncio.run(joined())
    assert body == msgspec.json.encode(answer)
    assert count > 3 * 3  # each long string in several pieces


def test_a_long_compaction_answer_continues_the_conversation(make_server: Any) -> None:
    server = make_server()
    text = 'a long "message"\n' * (2 * LONG_TEXT // 17)
    answer = httpx.post(
        f"{server.http_url}/v1/responses/compact",
        json={"model": "sim", "input": text},
        timeout=60,
    )
    assert answer.status_code == 200
    compacted = json.loads(answer.content)
    message, window = compacted["output"]
    assert message["content"] == [{"type": "input_text", "text": text}]
    assert window["type"] == "compaction"
    follow = httpx.post(
        f"{server.http_url}/v1/responses",
        json={"model": "sim", "input": [*compacted["output"], {"role": "user", "content": "and?"}]},
        timeout=60,
    )
    assert follow.status_code == 200, follow.text
    assert follow.json()["status"] == "completed"
