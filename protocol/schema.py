"""JSON Schemas of the wire events, generated from the msgspec Structs.

    python -m protocol.schema > protocol/schema.json

``schema.json`` is committed beside this module; a test checks it matches
the Structs, so the schema a client validates against is never stale.
"""

from __future__ import annotations

import json
from typing import Any

import msgspec

from .events import ClientEvent, ServerEvent

__all__ = ["event_schemas"]


def event_schemas() -> dict[str, Any]:
    """One document: ``ClientEvent`` and ``ServerEvent`` with shared ``$defs``."""
    (client, server), components = msgspec.json.schema_components(
        [ClientEvent, ServerEvent], ref_template="#/$defs/{name}"
    )
    return {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "title": "longresponse wire events (longresponse.append.v1 and the shipped shape)",
        "$defs": {**components, "ClientEvent": client, "ServerEvent": server},
    }


if __name__ == "__main__":  # pragma: no cover
    print(json.dumps(event_schemas(), indent=2, sort_keys=True))
