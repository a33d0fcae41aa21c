"""`compact_json` (provider/types.py): the store's JSON, as json.dumps would write it."""

from __future__ import annotations

import json

from hango_worker.provider.types import compact_json


def test_compact_json_is_json_dumps_compact_and_keeps_utf8() -> None:
    value = {"text": "héllo — 你好 \u2028", "n": [1, 2.5, None, True], "nested": {"a": {}}}
    got = compact_json(value)
    assert got == json.dumps(value, ensure_ascii=False, separators=(",", ":"))
    assert " " not in got.replace("héllo — 你好 ", "") and "你好" in got
    assert json.loads(got) == value
