"""The conversation every Python client of ``tests/clients/`` holds with the
server at its defaults, and what its answers must say.

Two user turns, each a tool loop: the simulated model calls the one function
tool (``get_weather``, once per user message: ``sim_tool_calls`` defaults to
1), the client runs it and sends its output, and the model answers quoting
every user message and tool output it read (``longresponse.backends.sim``).
The second turn continues the first the way the client does by default, so
its answer must quote both questions and both outputs.

The agent's instructions are a long house style, as an agent's system prompt
and tool schemas are: each request's new input (a tool output, a user
message) is then a few percent of the whole, and the rest is the prefix that
:func:`tests.support.prefix_reuse.assert_prefix_reused` wants reported cached.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Final

__all__ = [
    "FIRST_QUESTION",
    "INSTRUCTIONS",
    "SECOND_QUESTION",
    "TOOL_DESCRIPTION",
    "assert_answers",
    "weather_report",
]

FIRST_QUESTION: Final = "What is the weather in Oslo today?"
SECOND_QUESTION: Final = "And what should I wear there?"
TOOL_DESCRIPTION: Final = "Return the current weather report for a city."

#: About 4,000 tokens: a hundred and twenty numbered rules of a house style.
INSTRUCTIONS: Final = "You are a weather assistant. Call get_weather, then answer.\n" + "\n".join(
    f"Rule {n}: when a report for city number {n} arrives, quote its temperature, its wind "
    f"and its sky in that order, round every figure to whole units, and never guess."
    for n in range(1, 121)
)

#: The sim quotes this many characters of each user message and tool output.
QUOTED: Final = 40


def weather_report(city: str) -> str:
    """What the tool returns for ``city`` (the model quotes its first 40 characters)."""
    return f"{city} weather: snow, -3C, wind 12 km/h from the north, sky overcast"


def _quote(text: str) -> str:
    return f"«{text[:QUOTED]}»"


def assert_answers(first: str, second: str, cities: Sequence[str]) -> None:
    """Assert the two answers of the conversation: the first quotes the first
    question and the first tool output; the second quotes both questions and
    both outputs (it read the whole first turn). ``cities`` are the arguments
    the client's tool was really called with, in order: one per turn."""
    assert len(cities) == 2, cities
    assert first.startswith(f"You asked: {_quote(FIRST_QUESTION)}. I read 1 tool outputs:"), first
    assert _quote(weather_report(cities[0])) in first, first
    asked = f"You asked: {_quote(FIRST_QUESTION)} | {_quote(SECOND_QUESTION)}."
    assert second.startswith(f"{asked} I read 2 tool outputs:"), second
    for city in cities:
        assert _quote(weather_report(city)) in second, second
