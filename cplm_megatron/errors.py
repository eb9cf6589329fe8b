"""Error types for bad input, shared by every package; this module imports nothing of ours.

Entry points catch `UserError` and print its one-line message with exit code 2; anything else is a
failure (exit 1) and keeps its traceback.
"""
from __future__ import annotations

from typing import Any


class UserError(ValueError):
    """Bad input the user can fix; the message names the problem and the fix."""


class ConfigError(UserError):
    """A bad config key or value; the message names the dotted key and the fix."""


class CheckpointError(UserError):
    """A checkpoint that cannot be used as asked (missing, damaged, or from another model); the message
    names the checkpoint, what is wrong, and the fix."""


def check_version(path: object, data: dict[str, Any], kind: str, supported: int, error: type[Exception],
                  fix: str) -> int:
    """A record file's format version (1 when it records none); `error` naming the file, both versions and the
    fix when this code does not read that version."""
    version = data.get("version", 1)
    if version != supported:
        raise error(f"{path} is {kind} of version {version}; this cplm_megatron reads version {supported}: {fix}")
    return version
