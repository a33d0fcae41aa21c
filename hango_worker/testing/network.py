"""Keep a test suite off the network: the real Anthropic API above all."""

from __future__ import annotations

import ipaddress
import os
from urllib.parse import urlsplit


def is_loopback_url(url: str) -> bool:
    host = urlsplit(url).hostname or ""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def require_loopback_anthropic() -> None:
    """Raise unless ANTHROPIC_BASE_URL is unset or points at this machine."""
    url = os.environ.get("ANTHROPIC_BASE_URL")
    if url and not is_loopback_url(url):
        raise RuntimeError(
            f"ANTHROPIC_BASE_URL={url!r} is not a loopback address: tests must not reach "
            "the real API; unset it or point it at a fake server"
        )
