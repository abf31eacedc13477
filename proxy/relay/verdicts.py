"""What the plugins' command chain decides about a client's command, carried out: pass it on,
rewritten or not, or answer it here (``Reject``, ``AnswerOk``, a plugin that failed)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from proxy.hooks import AnswerOk, CommandInfo, PluginError, Reject, Rewrite
from proxy.protocol.constants import Err
from proxy.protocol.framing import encode_packet
from proxy.protocol.packets import make_ok
from proxy.session.intake import Command
from proxy.sessionlog import outcome

if TYPE_CHECKING:
    from proxy.relay.relay import Relay

__all__ = ["run_command_hooks"]


async def run_command_hooks(s: Relay, cmd: Command) -> Command | None:
    """The plugins' verdict on ``cmd``: the command to send (maybe rewritten), or None when it
    was answered here (rejected, answered OK, or a plugin failed)."""
    try:
        info = s.parts.info
        verdict = await s.parts.hooks.run_command_chain(info, CommandInfo.for_session(info, cmd.code, cmd.payload, cmd.complete))
    except PluginError as exc:
        s.log.error("%s", exc, **outcome("plugin_error", Err.UNKNOWN_ERROR[0]))
        await s.answer_error(cmd, *Err.UNKNOWN_ERROR, str(exc))
        return None
    if verdict is None:
        return cmd
    if isinstance(verdict, Rewrite):
        raw, last_seq = encode_packet(verdict.payload, 0)
        if not cmd.complete or (last_seq - 1) & 0xFF != cmd.seq_end:
            # Plugins see only the head of a spooled command; and the client's sequence ids
            # must still match the response.
            await s.answer_error(cmd, *Err.UNKNOWN_ERROR, "plugin rewrite of a command this large is not supported")
            return None
        return Command(verdict.payload, raw, cmd.seq_end, len(verdict.payload))
    if isinstance(verdict, Reject):
        await s.answer_error(cmd, verdict.code, verdict.sqlstate, verdict.message)
    elif isinstance(verdict, AnswerOk):
        ok = make_ok(s.tracking.status_word(), verdict.affected_rows, verdict.last_insert_id, verdict.warnings, verdict.info.encode())
        await s.send_client(ok, cmd.seq_end + 1)
    return None
