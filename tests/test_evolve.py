"""`evolve` (provider/types.py): `dataclasses.replace` for the hot path's dataclasses."""

from __future__ import annotations

from dataclasses import dataclass, field, replace

import pytest

from hango_worker.agent.middleware import ModelRequest
from hango_worker.agent.state import State
from hango_worker.provider.types import Message, Request, TextBlock, evolve


def _request() -> Request:
    return Request(model="m", messages=[Message("user", [TextBlock("hi")])], max_tokens=7)


def test_evolve_copies_like_replace() -> None:
    r = _request()
    got = evolve(r, max_tokens=9, temperature=0.5)
    assert got == replace(r, max_tokens=9, temperature=0.5)
    assert got is not r and r.max_tokens == 7  # the original is untouched
    assert got.messages is r.messages  # shallow, as replace


def test_evolve_refuses_an_unknown_field() -> None:
    with pytest.raises(TypeError, match="no field"):
        evolve(_request(), max_token=9)


def test_evolve_of_a_frozen_dataclass() -> None:
    req = ModelRequest(request=_request(), state=State("r", "s", "a", "t"))
    got = req.with_request(max_tokens=3).rewrite_system(lambda b: b)
    assert got.request.max_tokens == 3 and len(got.system_rewrites) == 1
    assert req.request.max_tokens == 7 and req.system_rewrites == ()


def test_evolve_runs_post_init_through_replace() -> None:
    @dataclass
    class Checked:
        n: int
        seen: list[int] = field(default_factory=list)

        def __post_init__(self) -> None:
            if self.n < 0:
                raise ValueError("negative")

    with pytest.raises(ValueError, match="negative"):
        evolve(Checked(1), n=-1)
