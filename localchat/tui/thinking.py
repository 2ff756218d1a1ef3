"""The TUI's name for the reasoning splitter, shared with the server (`localchat/reasoning.py`)."""

from localchat.reasoning import CLOSE, OPEN, ThinkSplitter

__all__ = ["CLOSE", "OPEN", "ThinkSplitter"]
