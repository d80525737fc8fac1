"""loopguard for LangGraph and LangChain tools: a ``ToolNode`` whose every call goes through the
engine.

>>> from loopguard.adapters.langchain import tool_node
>>> graph.add_node("tools", tool_node([search, read_file], session=thread_id))  # doctest: +SKIP

A refused call becomes a ``ToolMessage`` with ``status="error"`` and the content
``[loopguard: refused] …`` (the tool is not run); a warning is appended to the tool's message;
``terminate`` raises :class:`loopguard.LoopTerminated` out of ``graph.invoke``.
"""

from __future__ import annotations

from typing import Any, Optional, Sequence

from langchain_core.messages import ToolMessage
from langgraph.prebuilt import ToolNode

from .. import Engine
from . import Guard, refusal, refuses


def _text(content: Any) -> str:
    return content if isinstance(content, str) else str(content)


def tool_node(
    tools: Sequence[Any],
    engine: Optional[Engine] = None,
    session: str = "default",
    guard: Optional[Guard] = None,
    **kwargs: Any,
) -> ToolNode:
    """A LangGraph ``ToolNode`` for ``tools`` guarded by loopguard (other keyword arguments go to
    ``ToolNode``). One ``session`` per conversation (thread)."""
    guard = guard if guard is not None else Guard(engine, session)

    def before(request) -> Optional[ToolMessage]:
        call = request.tool_call
        call_id = call.get("id") or guard.call_id()
        v = guard.on_call(call_id, call["name"], call.get("args") or {})
        if refuses(v):
            guard._pending.pop(call_id, None)
            return ToolMessage(
                content=refusal(v), tool_call_id=call_id, name=call["name"], status="error"
            )
        return None

    def after(request, message):
        if not isinstance(message, ToolMessage):
            return message
        call_id = request.tool_call.get("id") or message.tool_call_id
        content = _text(message.content)
        seen = guard.on_result(call_id, content, error=message.status == "error")
        if seen != content:
            message = message.model_copy(update={"content": seen})
        return message

    def wrap(request, execute):
        refused = before(request)
        return refused if refused is not None else after(request, execute(request))

    async def awrap(request, execute):
        refused = before(request)
        return refused if refused is not None else after(request, await execute(request))

    return ToolNode(tools, wrap_tool_call=wrap, awrap_tool_call=awrap, **kwargs)


__all__ = ["tool_node"]
