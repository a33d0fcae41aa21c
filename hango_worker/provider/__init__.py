"""The model layer: message types, the provider protocol and the providers.

Belongs here: what a model call sends and gets back, and the code that makes it.
May import: `telemetry`, `vocab`. Never imports `tool`, `agent`, `store`, `run` or
anything above them (import-linter contracts in `.importlinter`, `make lint`).
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
