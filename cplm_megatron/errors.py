"""Error types for bad input, shared by every package; this module imports nothing of ours.

Entry points catch `UserError` and print its one-line message with exit code 2; anything else is a
failure (exit 1) and keeps its traceback.
"""
from __future__ import annotations


class UserError(ValueError):
    """Bad input the user can fix; the message names the problem and the fix."""


class ConfigError(UserError):
    """A bad config key or value; the message names the dotted key and the fix."""


class CheckpointError(UserError):
    """A checkpoint that cannot be used as asked (missing, damaged, or from another model); the message
    names the checkpoint, what is wrong, and the fix."""
