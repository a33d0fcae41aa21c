"""The model layer: message types, the provider protocol and the providers.

Imports nothing from the rest of hango_worker (enforced by tests/test_layering.py).
"""

from hango_worker.provider.types import (
    Block,
    Message,
    ModelError,
    Provider,
    RawBlock,
    Request,
    Response,
    StopReason,
    TextBlock,
    TextSink,
    ThinkingBlock,
    ToolResultBlock,
    ToolSpec,
    ToolUseBlock,
    Usage,
    block_from_dict,
    message_from_dict,
)

__all__ = [
    "Block",
    "Message",
    "ModelError",
    "Provider",
    "RawBlock",
    "Request",
    "Response",
    "StopReason",
    "TextBlock",
    "TextSink",
    "ThinkingBlock",
    "ToolResultBlock",
    "ToolSpec",
    "ToolUseBlock",
    "Usage",
    "block_from_dict",
    "message_from_dict",
]
