"""ChatCore: the state of the chat with one model (the session, the backend as it loads, the reply
being written, the status bar) and what changes it. ChatScreen (chat_screen.py) adds the commands on
top."""

from __future__ import annotations

import asyncio
import contextlib
import logging

from textual.app import ComposeResult
from textual.containers import Horizontal, Vertical
from textual.screen import Screen
from textual.widgets import Footer
from textual.worker import Worker

from localchat.errors import LocalchatError
from localchat.tui.attachments import Attachment, shown_text
from localchat.tui.backends import ChatBackend, ReplyStats
from localchat.tui.conversation import Conversation
from localchat.tui.mcp_tools import McpTools
from localchat.tui.messages import (
    STOP_HINT,
    AssistantMessage,
    ConversationView,
    Notice,
    UserMessage,
)
from localchat.tui.reply_writer import ReplyWriter
from localchat.tui.session import CONTEXT_WARNING, ChatSession
from localchat.tui.status_bar import ChatState, StatusBar, StatusInfo
from localchat.tui.store import ConversationStore
from localchat.tui.tool_round import ToolRound
from localchat.tui.widgets import ChatList, LoadingPanel, PromptBox

logger = logging.getLogger("localchat.tui")
WELCOME = """Chat with {model} ({how}).

Enter sends · Shift+Enter or Ctrl+J adds a line · Up recalls earlier prompts
Esc stops a reply · F1 or /help lists keys and slash commands · Ctrl+P opens the command palette
Ctrl+B shows your conversations · Ctrl+Q quits"""
# A turn ends after this many rounds of tool calls, whatever the model asks for next.
MAX_TOOL_ROUNDS = 10


class ChatCore(Screen):
    """Chat with one model. The backend starts (loads) in the background when the screen mounts,
    and the MCP servers of `tools` with it; messages typed meanwhile wait for both. Every message
    is stored as soon as it exists."""

    def __init__(
        self,
        backend: ChatBackend,
        store: ConversationStore,
        *,
        conversation: Conversation | None = None,
        resume: bool = False,
        tools: McpTools | None = None,
    ):
        super().__init__()
        self.backend = backend
        self.tools = tools
        self.tools_ready = asyncio.Event()  # set once the MCP servers started or failed to
        self.store = store
        self.session = ChatSession(backend, store, conversation)
        self.resume = resume
        self.state = ChatState.LOADING
        self.ready = asyncio.Event()  # set once the backend started or failed to
        self.load_error: str | None = None
        self.reply_worker: Worker | None = None
        self._blink_stopped = False  # the prompt's cursor is still while a reply runs
        self.reply_stats = ReplyStats()  # the latest reply's figures, for the status bar
        self.context_tokens: int | None = None  # what the conversation takes, for the status bar
        self._warned_conversation: Conversation | None = None
        self.attached: list[Attachment] = []  # /image pictures waiting for the next message

    def compose(self) -> ComposeResult:
        with Horizontal(id="body"):
            yield ChatList(id="chats")
            with Vertical(id="main"):
                yield ConversationView(id="messages")
                yield PromptBox(id="prompt")
        yield StatusBar(id="status")
        yield Footer()

    async def on_mount(self) -> None:
        last = self.store.last_id() if self.resume else None
        if last is not None:
            self.session.open(last)
        await self.render_conversation()
        if last is not None:
            await self.say_json_mode()
        await self.refresh_chat_list()
        self.query_one(PromptBox).focus()
        self.refresh_status()
        self.run_worker(self._load(), group="load", exit_on_error=False)
        if self.tools is not None:
            self.run_worker(self._start_tools(), group="tools", exit_on_error=False)
        else:
            self.tools_ready.set()

    # --- loading ----------------------------------------------------------------------------------
    async def _load(self) -> None:
        what = "Connecting to" if self.backend.description.startswith("http") else "Loading"
        panel = LoadingPanel(f"{what} {self.backend.model_name}", id="loading")
        await self.query_one("#main").mount(panel, before=0)
        try:
            await self.backend.start(panel.step)
        except Exception as exc:  # shown in the conversation; the app stays up
            self.load_error = (
                exc.message if isinstance(exc, LocalchatError) else f"{type(exc).__name__}: {exc}"
            )
            self.state = ChatState.ERROR
            await self.add_notice(
                f"Could not start {self.backend.model_name}: {self.load_error}", error=True
            )
        else:
            self.state = ChatState.IDLE
            await self.update_context_tokens()
        finally:
            await panel.remove()
            self.ready.set()
            self.refresh_status()

    async def _start_tools(self) -> None:
        """Start the MCP servers; a server that fails is said in the chat and left out."""
        assert self.tools is not None
        try:
            await self.tools.start()
            for server in self.tools.failed:
                await self.add_notice(
                    f"MCP server {server.name} did not start: {server.error}", error=True
                )
            self.session.tools = self.tools.openai_tools() or None
            if self.tools.by_name:
                self.notify(f"{len(self.tools.by_name)} MCP tools ready: /tools lists them.")
        finally:
            self.tools_ready.set()

    # --- the conversation view --------------------------------------------------------------------
    @property
    def messages_view(self) -> ConversationView:
        return self.query_one(ConversationView)

    async def render_conversation(self) -> None:
        """Show the current conversation from scratch."""
        messages = self.session.conversation.messages
        await self.messages_view.show(
            messages, WELCOME.format(model=self.backend.model_name, how=self.backend.description)
        )
        self.query_one(PromptBox).set_history([m.content for m in messages if m.role == "user"])

    async def add_notice(self, text: str, *, error: bool = False) -> None:
        await self.messages_view.add(Notice(text, error=error))

    async def refresh_chat_list(self) -> None:
        await self.query_one(ChatList).show(
            self.store.list_conversations(), self.session.conversation.id
        )

    # --- status -----------------------------------------------------------------------------------
    async def update_context_tokens(self) -> None:
        """Count the tokens of the history as it stands (for the status bar)."""
        if self.state in (ChatState.LOADING, ChatState.ERROR):
            return
        try:
            self.context_tokens = await self.backend.count_prompt_tokens(self.session.request())
        except LocalchatError:
            self.context_tokens = None

    def refresh_status(self, stats: ReplyStats | None = None) -> None:
        """Give the status bar the figures as they are now; it repaints only if one changed. Called
        where they change (state changes, paints of a reply, the end of a reply), never on a
        timer."""
        if stats is not None and stats.context_tokens is not None:
            self.context_tokens = stats.context_tokens
        engine = self.backend.stats() if self.state is not ChatState.LOADING else None
        limit, max_tokens = (
            self.backend.max_model_len,
            self.session.conversation.settings.get("max_tokens") or 0,
        )
        context = self.context_tokens
        info = StatusInfo(
            model=self.backend.model_name,
            state=self.state,
            ttft=self.reply_stats.ttft,
            tokens_per_s=self.reply_stats.tokens_per_s,
            context_tokens=context,
            max_model_len=limit,
            context_warning=bool(
                limit and context is not None and context + max_tokens > CONTEXT_WARNING * limit
            ),
            kv_cache_usage=engine.kv_cache_usage if engine else None,
            prefix_cache_hits=engine.prefix_cache_hits if engine else None,
            spec_acceptance=(
                engine.spec_accepted_tokens / engine.spec_draft_tokens
                if engine and engine.spec_draft_tokens
                else None
            ),
            spec_drafted=engine.spec_draft_tokens if engine else None,
            json_mode=self.session.json_mode.label if self.session.json_mode else None,
        )
        for bar in self.query(StatusBar):  # none while the app shuts down
            bar.info = info

    def set_state(self, state: ChatState) -> None:
        self.state = state
        self.refresh_status()
        self._sync_cursor()

    def _sync_cursor(self) -> None:
        """While a reply streams, the prompt's cursor stops blinking: each blink is a frame (~5 ms,
        2 a second) taken from the engine's cores. The footer stays as it is (see chat_screen's
        _FOOTER): Esc works while `generating`, which check_action reads at each key press."""
        if self.generating != self._blink_stopped:
            self._blink_stopped = self.generating
            self.query_one(PromptBox).cursor_blink = not self.generating

    @property
    def generating(self) -> bool:
        return self.reply_worker is not None and not self.reply_worker.is_finished

    def check_action(self, action: str, parameters: tuple) -> bool | None:
        if action == "stop":
            return self.generating
        return True

    def on_worker_state_changed(self) -> None:
        self._sync_cursor()  # still while a reply runs

    async def switch_model(self, name: str) -> None:
        """Chat on with the model `name`, the conversation unchanged: the current backend is
        closed (its memory handed back) before the new one loads."""
        new = self.backend.for_model(name)  # an unknown name raises here: nothing changes
        await self.stop_reply()
        self.workers.cancel_group(self, "load")
        old, self.backend, self.session.backend = self.backend, new, new
        self.state, self.load_error, self.ready = ChatState.LOADING, None, asyncio.Event()
        self.context_tokens, self.reply_stats = None, ReplyStats()
        self.refresh_status()
        app = self.app
        if old is not getattr(app, "backend", None) or getattr(app, "close_backend", True):
            await old.close()
        if self.session.conversation.messages:
            await self.add_notice(f"Switched to {new.model_name}; the conversation goes on.")
        else:
            await self.render_conversation()
        self.run_worker(self._load(), group="load", exit_on_error=False)

    async def open_conversation(self, conversation_id: int) -> None:
        await self.stop_reply()
        if self.session.open(conversation_id) is None:
            self.notify("That conversation no longer exists.", severity="error")
        await self._after_switch()
        await self.say_json_mode()

    async def say_json_mode(self) -> None:
        """After a stored conversation opens: say that its /json mode is on again, if it is."""
        if self.session.json_mode is not None:
            await self.add_notice(self.session.json_mode.notice())

    async def _after_switch(self) -> None:
        await self.render_conversation()
        await self.refresh_chat_list()
        await self.update_context_tokens()
        self.refresh_status()

    # --- sending and replying ---------------------------------------------------------------------
    async def send(self, text: str) -> None:
        """Add a user message (with the pictures `/image` attached) and start the reply to it."""
        new = self.session.conversation.id is None
        images, self.attached = self.attached, []
        message = self.session.add_user(text, images)
        await self.messages_view.add(
            UserMessage(
                shown_text(message.content, message.meta),
                len(self.session.conversation.messages) - 1,
            )
        )
        if new:
            await self.refresh_chat_list()
        self.start_reply()

    def start_reply(self) -> None:
        self.reply_worker = self.run_worker(
            self._reply(), group="reply", exclusive=True, exit_on_error=False
        )
        self.set_state(ChatState.GENERATING if self.ready.is_set() else self.state)

    async def _reply(self) -> None:
        view = AssistantMessage()
        await self.messages_view.add(view)
        self.reply_stats = ReplyStats()
        if not self.ready.is_set():
            view.set_meta("waiting for the model to load…" + STOP_HINT)
            await self.ready.wait()
        if self.load_error is not None:
            await view.remove()
            await self.add_notice(
                f"No reply: the model did not start ({self.load_error})", error=True
            )
            return
        if not self.tools_ready.is_set():
            view.set_meta("waiting for the MCP servers…" + STOP_HINT)
            await self.tools_ready.wait()
        self.set_state(ChatState.GENERATING)
        try:
            await self._reply_and_tools(view)
        finally:
            self.set_state(ChatState.IDLE)

    async def _reply_and_tools(self, view: AssistantMessage) -> None:
        """The reply; while it asks for MCP tools, the calls (each approved by the user) and the
        reply to their results."""
        for round_number in range(MAX_TOOL_ROUNDS + 1):
            writer = await self._write_reply(view, follow_up=round_number > 0)
            calls = writer.message.tool_calls if writer is not None else []
            if not calls or self.tools is None or writer is None or writer.stopped or writer.error:
                return
            if round_number == MAX_TOOL_ROUNDS:
                await self.add_notice(
                    f"The model asked for tools {MAX_TOOL_ROUNDS} times in a row: its last calls "
                    "were not run.",
                    error=True,
                )
                return
            if not await ToolRound(self, self.tools).run(calls):
                await self.add_notice("Stopped at the tool call.")
                return
            view = AssistantMessage()
            await self.messages_view.add(view)

    async def _write_reply(
        self, view: AssistantMessage, *, follow_up: bool = False
    ) -> ReplyWriter | None:
        """Write one reply into `view` (None: it could not start)."""
        try:
            plan = await self.session.plan_turn(follow_up=follow_up)
        except asyncio.CancelledError:
            await view.remove()
            await self.add_notice("Stopped before the first token.")
            return None
        except LocalchatError as exc:
            await view.remove()
            await self.add_notice(f"Error: {exc.message}", error=True)
            return None
        if plan.dropped:
            await self.messages_view.add(
                Notice(
                    f"⚠ {plan.dropped} earlier message(s) no longer fit in the context "
                    f"({self.backend.max_model_len} tokens) and are left out of the prompt "
                    "from now on."
                ),
                before=view,
            )
        self.context_tokens = plan.prompt_tokens
        self._maybe_warn(plan.context_used)
        writer = ReplyWriter(self.session, self.backend, view, self.refresh_status)
        self.reply_stats = writer.stats
        await writer.write(plan.request, self)
        if writer.error:
            await self.add_notice(f"Error: {writer.error}", error=True)
        elif writer.empty and writer.stopped:
            await self.add_notice("Stopped before the first token.")
        self.refresh_status(writer.stats)
        return writer

    def _maybe_warn(self, context_used: float | None) -> None:
        conversation = self.session.conversation
        if (
            context_used is not None
            and context_used > CONTEXT_WARNING
            and self._warned_conversation is not conversation
        ):
            self._warned_conversation = conversation
            self.notify(
                f"This chat fills {context_used:.0%} of the context; soon the oldest turns will be "
                "left out of the prompt.",
                title="Context nearly full",
                severity="warning",
                timeout=8,
            )

    async def stop_reply(self) -> None:
        """Stop the running reply (the engine request is aborted; the partial reply is kept)."""
        worker = self.reply_worker
        if worker is not None and not worker.is_finished:
            worker.cancel()
            # a cancelled or failed worker has said so in the chat
            with contextlib.suppress(Exception):
                await worker.wait()
