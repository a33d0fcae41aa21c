"""Live text over NOTIFY: a burst of any size and any characters arrives whole."""

from __future__ import annotations

import asyncio
import json
import uuid

import asyncpg
import pytest

from hango_worker.run.stream import MAX_PAYLOAD, TextPublisher, payloads
from hango_worker.store.sql import TEXT_CHANNEL

BURSTS = {
    "cyrillic": "Ж" * 3000,
    "emoji": "🙂" * 1500,
    "escapes": ('say "hi"\\\n\t\x01' * 800),
    "mixed": ("Привет, мир! 🙂 naïve «ok» 中文 \n" * 400),
}


@pytest.mark.parametrize("name", sorted(BURSTS))
def test_payloads_stay_under_the_limit_and_keep_every_character(name: str) -> None:
    text = BURSTS[name]
    parts = payloads("r", 17, text)
    assert len(parts) >= 2
    assert all(len(p.encode("utf-8")) <= MAX_PAYLOAD for p in parts)
    decoded = [json.loads(p) for p in parts]
    assert "".join(d["text"] for d in decoded) == text
    offsets = [d["offset"] for d in decoded]
    assert offsets == [17 + sum(len(d["text"]) for d in decoded[:i]) for i in range(len(parts))]


async def test_a_burst_over_the_notify_limit_reaches_the_listener(
    dsn: str, pool: asyncpg.Pool
) -> None:
    run_id = str(uuid.uuid4())
    text = BURSTS["cyrillic"] + BURSTS["mixed"]
    got: list[dict[str, object]] = []
    listener = await asyncpg.connect(dsn)
    try:

        def on_text(conn: object, pid: int, channel: str, payload: str) -> None:
            got.append(json.loads(payload))

        await listener.add_listener(TEXT_CHANNEL, on_text)
        publisher = TextPublisher(pool)
        publisher.add(run_id, "start: ")
        await publisher.flush()
        publisher.add(run_id, text[:1000])
        publisher.add(run_id, text[1000:])
        await publisher.flush()
        expected = "start: " + text
        async with asyncio.timeout(30):
            while sum(len(str(g["text"])) for g in got) < len(expected):
                await asyncio.sleep(0.02)
    finally:
        await listener.close()
    assert "".join(str(g["text"]) for g in got) == expected
    assert [g["offset"] for g in got][:2] == [0, len("start: ")]
