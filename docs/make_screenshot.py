"""Regenerate docs/images/chat.svg, the picture of `localchat chat` in the README.

The real chat on the real engine (the default model unless MODEL is given, greedy), driven headless by
Textual's Pilot: two turns, so the second reply's line shows the prefix cache at work, then Textual's own
SVG screenshot. Nothing is stored (the conversation lives in memory).

    python docs/make_screenshot.py [MODEL] [--out docs/images/chat.svg]
"""

from __future__ import annotations

import argparse
import asyncio
import os
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

TURNS = ("Write a Python function that checks whether a word is a palindrome.",
         "Now explain it in two sentences.")
SIZE = (110, 38)


async def main(model: str | None, out: Path) -> None:
    from localchat.config import EngineConfig
    from localchat.tui.app import ChatApp
    from localchat.tui.conversation import DEFAULT_SETTINGS, Conversation
    from localchat.tui.engine_backend import EngineBackend
    from localchat.tui.store import ConversationStore
    from localchat.tui.widgets import PromptBox

    settings = {**DEFAULT_SETTINGS, "temperature": 0.0, "max_tokens": 120}
    app = ChatApp(EngineBackend(EngineConfig(model=model, max_model_len=2048)), ConversationStore(None),
                  conversation=Conversation(settings=settings))
    async with app.run_test(size=SIZE) as pilot:
        chat = app.chat
        for text in TURNS:
            prompt = app.query_one(PromptBox)
            prompt.load_text(text)
            await pilot.press("enter")
            await pilot.pause()
            while not chat.ready.is_set() or chat.generating:
                await pilot.pause(0.1)
        await pilot.pause(0.5)
        out.parent.mkdir(parents=True, exist_ok=True)
        app.save_screenshot(filename=out.name, path=str(out.parent))
    print(f"wrote {out}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model", nargs="?", default=None)
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "images" / "chat.svg")
    args = parser.parse_args()
    asyncio.run(main(args.model, args.out))
