"""Every size a tool can amplify is checked before the allocation (agent/files.py)."""

from __future__ import annotations

import tracemalloc

import pytest

from hango_worker.agent.files import MAX_FILE_BYTES, FileError, edit


def test_replace_all_cannot_blow_a_small_file_up() -> None:
    """Proves: a 1-character old_string in a 500 KB file, replaced everywhere by 4 KB,
    would make 2 GB; it is refused from the counts alone, never built (the peak of
    Python allocations stays near the file's own size)."""
    content = "a" * 500_000
    tracemalloc.start()
    try:
        with pytest.raises(FileError, match=r"would make /notes\.md \d+ bytes"):
            edit(content, "/notes.md", "a", "b" * 4096, True)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 10 * 1024 * 1024, f"{peak} bytes allocated: the edit was built first"


def test_an_edit_within_the_limit_is_made() -> None:
    out, n = edit("x-x-x", "/f", "x", "yy", True)
    assert (out, n) == ("yy-yy-yy", 3)
    big = "a" * (MAX_FILE_BYTES - 10)
    out, _ = edit(big + "TAIL", "/f", "TAIL", "t" * 10, False)
    assert len(out) == MAX_FILE_BYTES
