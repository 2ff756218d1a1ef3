"""ChatScreen: the chat's commands, whether started by a key, the command palette or a slash
command, on top of ChatCore's state. `action_<name>` carries out each command of
commands.COMMANDS."""

from __future__ import annotations

import inspect
import logging
from collections.abc import Iterator
from typing import ClassVar

from textual.app import SystemCommand
from textual.binding import Binding, BindingType

from localchat.errors import InvalidParameterError, LocalchatError
from localchat.tui.attachments import load_image, split_args
from localchat.tui.chat_core import ChatCore
from localchat.tui.commands import (
    COMMANDS,
    parse_setting,
    parse_slash,
    parse_think,
    unescape,
)
from localchat.tui.export import export_conversation, settings_text
from localchat.tui.json_mode import parse_json_command
from localchat.tui.screens import (
    HelpScreen,
    InputScreen,
    ModelPicker,
    SettingsScreen,
    TextScreen,
)
from localchat.tui.widgets import ChatList, PromptBox

logger = logging.getLogger("localchat.tui")
# Esc (stop) is not in the footer: a reply's own line says it while it streams. Showing it only
# then would recompose the footer twice a reply (a layout of the screen each time), and Textual
# 8.2.8 keeps every replaced footer key alive (the footer's data-bind watchers are never pruned).
_FOOTER = {"help", "new", "regen", "chats", "quit"}


class ChatScreen(ChatCore):
    """The chat screen: ChatCore plus its keys, slash commands and palette entries."""

    BINDINGS: ClassVar[list[BindingType]] = [
        Binding(c.key, c.action, c.label, show=c.name in _FOOTER)
        for c in COMMANDS
        if c.key and c.name != "quit"
    ]

    async def on_prompt_box_submitted(self, event: PromptBox.Submitted) -> None:
        await self.submit(event.text)

    async def submit(self, text: str) -> None:
        """Handle what the prompt box sent: a slash command, or a message (refused while a reply
        runs)."""
        prompt = self.query_one(PromptBox)
        prompt.remember(text)
        try:
            parsed = parse_slash(text)
            if parsed is not None:
                command, args = parsed
                method = getattr(self, f"action_{command.action}")
                result = method(args) if command.usage else method()
                if inspect.isawaitable(result):
                    await result
                prompt.clear()
                return
        except LocalchatError as exc:  # the command stays in the box, to be fixed
            self.notify(exc.message, severity="error")
            return
        except Exception as exc:  # a failed command is a message, never a crash
            logger.exception("command failed")
            self.notify(f"{type(exc).__name__}: {exc}", severity="error")
            return
        if self.generating:
            self.notify("A reply is being written: Esc stops it.", severity="warning")
            return
        prompt.clear()
        await self.send(unescape(text))

    # --- commands: conversation changes (each stops a running reply first) ------------------------
    def palette_commands(self) -> Iterator[SystemCommand]:
        for command in COMMANDS:
            if command.palette and command.name != "quit":
                yield SystemCommand(
                    command.label,
                    f"{command.help}  —  /{command.name} {command.usage}".strip(),
                    getattr(self, f"action_{command.action}"),
                )

    async def action_new_chat(self) -> None:
        await self.stop_reply()
        self.session.new_conversation()
        await self._after_switch()

    async def action_clear_chat(self) -> None:
        await self.stop_reply()
        self.session.clear()
        await self._after_switch()

    async def action_regenerate(self) -> None:
        await self.stop_reply()
        if not self.session.drop_last_reply():
            self.notify("Nothing to regenerate yet.", severity="warning")
            return
        await self.render_conversation()
        self.start_reply()

    async def action_edit(self, args: str = "") -> None:
        users = self.session.conversation.user_indices()
        if not users:
            self.notify("No message to edit yet.", severity="warning")
            return
        try:
            position = users[int(args) - 1 if int(args) > 0 else int(args)] if args else users[-1]
        except (ValueError, IndexError):
            raise InvalidParameterError(
                f"/edit takes a message number from 1 to {len(users)}"
            ) from None
        original = self.session.conversation.messages[position].content

        async def resend(text: str | None) -> None:
            if text is None or not text.strip():
                return
            await self.stop_reply()
            self.session.branch(position, text)
            await self._after_switch()
            self.start_reply()

        self.app.push_screen(
            InputScreen(
                f"Edit message {users.index(position) + 1} and resend (a new branch)",
                original,
                multiline=True,
            ),
            resend,
        )

    async def action_delete_chat(self, conversation_id: int | None = None) -> None:
        current = self.session.conversation
        target = current.id if conversation_id is None else conversation_id
        if target is not None:
            if target == current.id:
                await self.stop_reply()
            self.store.delete(target)
        if target == current.id:
            self.session.new_conversation()
        await self._after_switch()
        self.notify("Conversation deleted.")

    async def action_rename(self, args: str = "", conversation_id: int | None = None) -> None:
        target = conversation_id or self.session.conversation.id

        async def apply(title: str | None) -> None:
            if not title or not title.strip():
                return
            if target is None or target == self.session.conversation.id:
                self.session.rename(title.strip())
            else:
                self.store.rename(target, title.strip())
            await self.refresh_chat_list()

        if args:
            await apply(args)
        else:
            conversation = self.session.conversation
            if target is not None:
                stored = self.store.load(target)
                assert stored is not None  # the chat list offers only stored conversations
                conversation = stored
            current = conversation.title
            self.app.push_screen(InputScreen("Rename the conversation", current), apply)

    async def on_chat_list_action(self, event: ChatList.Action) -> None:
        if event.action == "open":
            await self.open_conversation(event.conversation_id)
            self.query_one(PromptBox).focus()
        elif event.action == "rename":
            await self.action_rename(conversation_id=event.conversation_id)
        elif event.action == "delete":
            await self.action_delete_chat(event.conversation_id)

    # --- commands: settings -----------------------------------------------------------------------
    def action_set(self, args: str = "") -> None:
        conversation = self.session.conversation
        if not args:

            def apply(settings: dict | None) -> None:
                if settings is not None:
                    conversation.settings.update(settings)
                    self.session.save_settings()
                    self.notify("Settings saved.")

            self.app.push_screen(SettingsScreen(conversation.settings), apply)
            return
        name, _, rest = args.strip().partition(" ")
        if name.lower() == "speculative":  # the engine's, not a sampling parameter
            if not rest.strip():
                raise InvalidParameterError(
                    "/set speculative needs ngram, suffix, off or a JSON config",
                    param="speculative",
                )
            self.notify(f"speculative decoding: {self.backend.set_speculative(rest)}")
            return
        name, value = parse_setting(args, conversation.settings)
        conversation.settings[name] = value
        self.session.save_settings()
        self.notify(f"{name} = {value}")

    async def action_system(self, args: str = "") -> None:
        async def apply(text: str | None) -> None:
            if text is None:
                return
            text = text.strip()
            self.session.conversation.system_prompt = None if text.lower() in ("", "none") else text
            self.session.save_settings()
            await self.update_context_tokens()
            self.refresh_status()
            self.notify(
                "System prompt "
                + ("removed." if not self.session.conversation.system_prompt else "set.")
            )

        if args:
            await apply(args)
        else:
            self.app.push_screen(
                InputScreen(
                    "System prompt", self.session.conversation.system_prompt or "", multiline=True
                ),
                apply,
            )

    def action_think(self, args: str = "") -> None:
        self.session.conversation.think = parse_think(args)
        self.session.save_settings()
        think = self.session.conversation.think
        self.notify(f"enable_thinking: {'default' if think is None else args.strip()}")

    async def action_json(self, args: str = "") -> None:
        """`/json`, `/json SCHEMA.json`, `/json off` (the conversation keeps it: resumed, it is on
        again); a file or schema that will not do is said in the chat, and the mode stays as it
        was."""
        try:
            mode = parse_json_command(args)
        except LocalchatError as exc:
            await self.add_notice(exc.message, error=True)
            return
        self.session.json_mode = mode  # kept with the conversation
        self.refresh_status()
        await self.add_notice(
            "JSON off: replies are free text again." if mode is None else mode.notice()
        )

    async def action_image(self, args: str = "") -> None:
        """`/image PATH [text]`: attach the picture to the next message, or send it with `text`
        at once; a file that will not do, or a model that takes no images, is said in the chat."""
        try:
            path, text = split_args(args)
            if self.backend.takes_images is False:
                raise InvalidParameterError(
                    f"/image: {self.backend.model_name} takes no images (not a vision-language "
                    "model)",
                    param="image",
                )
            image = load_image(path)
        except LocalchatError as exc:
            await self.add_notice(exc.message, error=True)
            return
        if text and self.generating:
            self.notify("A reply is being written: Esc stops it.", severity="warning")
            return
        self.attached.append(image)
        if text:
            await self.send(text)
            return
        note = " (kept as a smaller JPEG)" if image.scaled else ""
        await self.add_notice(f"{image.marker}{note} goes with your next message.")

    async def action_model(self, args: str = "") -> None:
        if args:
            await self.switch_model(args)
            return
        choices = await self.backend.model_choices()
        if not choices:
            self.notify("No model to pick from: `localchat pull` one.", severity="warning")
            return

        async def apply(name: str | None) -> None:
            if name and name != self.backend.model_name:
                try:
                    await self.switch_model(name)
                except LocalchatError as exc:
                    self.notify(exc.message, severity="error")

        self.app.push_screen(ModelPicker(choices, self.backend.model_name), apply)

    def action_tools(self) -> None:
        if self.tools is None:
            self.notify("No tools: start the chat with --mcp servers.json.", severity="warning")
            return
        self.app.push_screen(TextScreen("MCP servers and tools", self.tools.listing()))

    def action_show_settings(self) -> None:
        session = self.session
        json_mode = session.json_mode.label if session.json_mode else None
        text = settings_text(session.conversation, self.backend, self.store.path, json_mode)
        self.app.push_screen(TextScreen("Settings", text))

    async def action_show_prompt(self) -> None:
        if not self.ready.is_set() or self.load_error:
            self.notify("The model is not ready.", severity="warning")
            return
        messages = self.session.conversation.messages
        if messages and messages[-1].role == "assistant":  # what the model saw for its last reply
            title, request = (
                "The exact prompt of the last reply",
                self.session.request(end=len(messages) - 1),
            )
        else:
            title, request = "The exact prompt of the next reply", self.session.request()
        self.app.push_screen(TextScreen(title, await self.backend.render_prompt(request)))

    # --- commands: the rest -----------------------------------------------------------------------
    def action_help(self) -> None:
        if not isinstance(self.app.screen, HelpScreen):
            self.app.push_screen(HelpScreen())

    async def action_stop(self) -> None:
        await self.stop_reply()

    def action_quit(self) -> None:
        self.app.exit()

    def action_copy_reply(self) -> None:
        reply = self.session.conversation.last_reply()
        if reply is None:
            self.notify("No reply to copy yet.", severity="warning")
            return
        self.app.copy_to_clipboard(reply.content)
        self.notify(f"Copied the last reply ({len(reply.content)} characters).")

    def action_save(self, args: str = "") -> None:
        try:
            markdown, json_path = export_conversation(self.session.conversation, args)
        except OSError as exc:
            self.notify(f"Could not save: {exc}", severity="error")
            return
        self.notify(f"Saved {markdown} and {json_path}", timeout=6)

    async def action_toggle_chats(self) -> None:
        chats = self.query_one(ChatList)
        chats.display = not chats.display
        if chats.display:
            await self.refresh_chat_list()
            chats.focus()
        else:
            self.query_one(PromptBox).focus()
