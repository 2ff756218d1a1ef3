"""ChatApp: the Textual application around one ChatScreen (the chat, its state and its commands)."""

from __future__ import annotations

from textual.app import App

from localchat.tui.backends import ChatBackend
from localchat.tui.chat_screen import ChatScreen
from localchat.tui.conversation import Conversation
from localchat.tui.mcp_tools import McpTools
from localchat.tui.store import ConversationStore


class ChatApp(App):
    """Runs the chat on `backend`, storing conversations in `store` (in memory when None), with the
    MCP servers of `tools` (started with the chat, closed with it). The chat itself lives in
    `chat`, a ChatScreen; the app adds the styles, the command palette entries and closing the
    backend."""

    CSS_PATH = "chat.tcss"
    TITLE = "localchat"

    def __init__(
        self,
        backend: ChatBackend,
        store: ConversationStore | None = None,
        *,
        conversation: Conversation | None = None,
        resume: bool = False,
        close_backend: bool = True,
        tools: McpTools | None = None,
    ):
        super().__init__()
        self.backend = backend
        self.close_backend = close_backend
        self.chat = ChatScreen(
            backend,
            store or ConversationStore(None),
            conversation=conversation,
            resume=resume,
            tools=tools,
        )

    def get_default_screen(self) -> ChatScreen:
        return self.chat

    def get_system_commands(self, screen):
        yield from super().get_system_commands(screen)
        yield from self.chat.palette_commands()

    async def on_unmount(self) -> None:
        if self.chat.tools is not None:
            await self.chat.tools.close()
        backend = self.chat.backend  # another one after /model, then always this app's to close
        if self.close_backend or backend is not self.backend:
            await backend.close()
