"""The command: serve a script file until SIGINT/SIGTERM."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import signal
import sys
from collections.abc import Sequence
from pathlib import Path

from hango_worker.provider.scripted import ScriptError
from hango_worker.testing.fake_anthropic.cache import DEFAULT_MIN_CACHEABLE_TOKENS
from hango_worker.testing.fake_anthropic.script import load_fake_script
from hango_worker.testing.fake_anthropic.server import DEFAULT_CONTEXT_WINDOW, FakeAnthropic


def serve_forever(
    port: int,
    script_path: str | Path,
    *,
    host: str = "127.0.0.1",
    api_key: str | None = None,
    chunk_delay_s: float = 0.0,
    min_cacheable_tokens: int = DEFAULT_MIN_CACHEABLE_TOKENS,
    context_window: int = DEFAULT_CONTEXT_WINDOW,
) -> None:
    """Blocking: serve a script file until SIGINT/SIGTERM, on a loop of its own
    (`asyncio.run`; from inside a running loop use `serve_script`). Raises
    ScriptError for a bad script and OSError when the port cannot be bound."""
    asyncio.run(
        serve_script(
            port,
            script_path,
            host=host,
            api_key=api_key,
            chunk_delay_s=chunk_delay_s,
            min_cacheable_tokens=min_cacheable_tokens,
            context_window=context_window,
        )
    )


async def serve_script(
    port: int,
    script_path: str | Path,
    *,
    host: str = "127.0.0.1",
    api_key: str | None = None,
    chunk_delay_s: float = 0.0,
    min_cacheable_tokens: int = DEFAULT_MIN_CACHEABLE_TOKENS,
    context_window: int = DEFAULT_CONTEXT_WINDOW,
) -> None:
    """Serve a script file on the running loop until SIGINT/SIGTERM (or cancellation).

    Prints one line, ``fake-anthropic: listening on http://HOST:PORT ...``, once
    it accepts connections. Raises ScriptError for a bad script and OSError when
    the port cannot be bound."""
    turns = load_fake_script(script_path)
    fake = FakeAnthropic(
        turns,
        api_key=api_key,
        host=host,
        port=port,
        chunk_delay_s=chunk_delay_s,
        min_cacheable_tokens=min_cacheable_tokens,
        context_window=context_window,
    )
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    installed = []
    for sig in (signal.SIGINT, signal.SIGTERM):
        with contextlib.suppress(NotImplementedError, RuntimeError, ValueError):
            loop.add_signal_handler(sig, stop.set)
            installed.append(sig)
    try:
        async with fake:
            print(
                f"fake-anthropic: listening on {fake.base_url} (script {script_path}, "
                f"{len(fake.turns)} turns; set ANTHROPIC_BASE_URL={fake.base_url})",
                flush=True,
            )
            await stop.wait()
    finally:
        for sig in installed:
            loop.remove_signal_handler(sig)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="hango-fake-anthropic",
        description="A local fake of the Anthropic Messages API that plays a script (offline).",
    )
    parser.add_argument("--port", type=int, default=8765, help="port (0: any free port)")
    parser.add_argument("--host", default="127.0.0.1", help="address to listen on")
    parser.add_argument(
        "--script", required=True, help="JSON list of turns (scripted-model format)"
    )
    parser.add_argument("--api-key", default=None, help="accept only this key (default: any)")
    parser.add_argument(
        "--chunk-delay", type=float, default=0.0, help="seconds before each SSE frame"
    )
    parser.add_argument(
        "--min-cacheable-tokens",
        type=int,
        default=DEFAULT_MIN_CACHEABLE_TOKENS,
        help="shortest prefix the prompt cache keeps (tokens ≈ characters / 4)",
    )
    parser.add_argument(
        "--context-window",
        type=int,
        default=DEFAULT_CONTEXT_WINDOW,
        help="largest prompt accepted, in the fake's tokens (larger: 400 prompt is too long)",
    )
    args = parser.parse_args(argv)
    if args.context_window < 1:
        parser.error("--context-window must be at least 1")
    try:
        serve_forever(
            args.port,
            args.script,
            host=args.host,
            api_key=args.api_key,
            chunk_delay_s=args.chunk_delay,
            min_cacheable_tokens=args.min_cacheable_tokens,
            context_window=args.context_window,
        )
    except ScriptError as e:
        print(f"fake-anthropic: {e}", file=sys.stderr)
        return 2
    except OSError as e:
        print(
            f"fake-anthropic: cannot listen on {args.host}:{args.port}: {e.strerror}",
            file=sys.stderr,
        )
        return 1
    except KeyboardInterrupt:
        pass
    return 0
