"""loopguard for Microsoft Agent Framework (``agent-framework-core``), as function middleware.

>>> from loopguard.adapters.agent_framework import LoopGuard
>>> agent = Agent(client=client, tools=[read_file], middleware=[LoopGuard()])  # doctest: +SKIP

Every function tool call goes through the engine before it runs and its result after (a tool
that raises is a failed result): a refused call is not run, and its function result is
``[loopguard: refused] …`` (Agent Framework lets function middleware set a call's result but
not mark it failed: the framework keeps that mark, ``exception``, for tools that raise, and then
shows the model ``Error: Function failed.``); a warning is appended to the tool's output;
``terminate`` raises :class:`AgentLoopTerminated`.

On ``terminate`` the caller sees :class:`AgentLoopTerminated`, raised by:

- ``await agent.run(...)``; the run's ``AgentSession`` keeps nothing of that run;
- the iteration of ``agent.run(..., stream=True)``, after the updates streamed so far (the last
  one is the stopped call), or the stream's ``get_final_response()``; the ``AgentSession`` keeps
  nothing of that run either. Asked again, ``get_final_response()`` returns the response so far,
  and the ``AgentSession`` then keeps it: its history ends with the stopped call, which has no
  result.

:class:`AgentLoopTerminated` is also the framework's ``MiddlewareFailure``, the signal its
function loop lets through to the caller: any other exception raised by function middleware
becomes a function error result and the run goes on. The framework cancels the other calls of
the same batch and starts no call after it; on a conversation kept by the service it first
sends one error result for each call left without one.
"""

from __future__ import annotations

import itertools
import json
from typing import Any, Awaitable, Callable, Optional

from agent_framework import (
    Content,
    FunctionInvocationContext,
    FunctionMiddleware,
    MiddlewareFailure,
    MiddlewareTermination,
    UserInputRequiredException,
)
from pydantic_core import to_jsonable_python

from .. import Engine, LoopTerminated
from . import Guard, refusal, refuses


class AgentLoopTerminated(LoopTerminated, MiddlewareFailure):
    """:class:`loopguard.LoopTerminated` raised out of an Agent Framework run on ``terminate``.

    It is a ``MiddlewareFailure``, which the framework's function loop lets through to the
    caller unchanged (other exceptions become tool error results)."""

    def __init__(self, verdict):
        LoopTerminated.__init__(self, verdict)


def _arguments(arguments: Any) -> Any:
    """The call's arguments as JSON values (a model's or a mapping's, as the framework gives)."""
    if arguments is None:
        return {}
    return to_jsonable_python(arguments, fallback=str)


def _item_text(item: Content) -> str:
    if item.type == "text":
        return item.text or ""
    return json.dumps(item.to_dict(), default=str, sort_keys=True)


def _text(result: Any) -> str:
    """What the model reads for a function result: the text of its items, in order (other items
    as their JSON), a string as is, anything else as the framework writes it (JSON)."""
    if isinstance(result, str):
        return result
    if result is None:
        return ""
    if isinstance(result, Content):
        return _item_text(result)
    if isinstance(result, list) and all(isinstance(c, Content) for c in result):
        return "\n".join(t for t in (_item_text(c) for c in result) if t)
    try:
        return json.dumps(result, default=str)
    except (TypeError, ValueError):
        return str(result)


def _with_note(result: Any, output: str, seen: str) -> Any:
    """``result`` with what :meth:`Guard.on_result` added to ``output`` (the warnings)."""
    if isinstance(result, list) and result and all(isinstance(c, Content) for c in result):
        note = seen[len(output):]
        items = list(result)
        last = items[-1]
        if last.type == "text":
            items[-1] = Content.from_text(
                (last.text or "") + note,
                annotations=last.annotations,
                additional_properties=last.additional_properties,
            )
        else:
            items.append(Content.from_text(note.lstrip("\n")))
        return items
    # A string, or a value the framework would write as one text item.
    return seen


def _is_approval_request(result: Any) -> bool:
    return isinstance(result, Content) and result.type == "function_approval_request"


class LoopGuard(FunctionMiddleware):
    """Agent Framework function middleware that puts every function tool call through a loopguard
    engine.

    Give it to ``Agent(middleware=[...])``, to a single ``agent.run(..., middleware=[...])``, or to
    a chat client that invokes functions. The loopguard session is ``session`` when given;
    otherwise the run's ``AgentSession`` (its ``session_id``), or ``"default"`` for a run without
    one. Pass a :class:`~loopguard.adapters.Guard` to share one session with other code.
    """

    def __init__(
        self,
        engine: Optional[Engine] = None,
        session: Optional[str] = None,
        guard: Optional[Guard] = None,
    ):
        if guard is not None:
            self.engine = guard.engine
        else:
            self.engine = engine if engine is not None else Engine()
        self.session = session
        self._guard = guard
        self._ids = itertools.count(1)

    def guard_for(self, context: FunctionInvocationContext) -> Guard:
        """The guard of one call: the one given, or one for the engine session of its run (the
        engine keeps the session's state; the guard only holds the call's verdict until its
        result)."""
        if self._guard is not None:
            return self._guard
        name = self.session
        if name is None:
            agent_session = getattr(context, "session", None)
            name = getattr(agent_session, "session_id", None) or "default"
        return Guard(self.engine, name, AgentLoopTerminated)

    async def process(
        self,
        context: FunctionInvocationContext,
        call_next: Callable[[], Awaitable[None]],
    ) -> None:
        guard = self.guard_for(context)
        call_id = context.metadata.get("call_id") or f"loopguard-{next(self._ids)}"
        v = guard.on_call(call_id, context.function.name, _arguments(context.arguments))
        if refuses(v):
            guard._pending.pop(call_id, None)
            # Not run: the framework turns this result into the call's function result.
            context.result = refusal(v)
            return
        try:
            await call_next()
        except (MiddlewareTermination, MiddlewareFailure, UserInputRequiredException):
            # The framework's control flow (a stop, an abort, a pause for input): no result.
            guard._pending.pop(call_id, None)
            raise
        except Exception as e:
            guard.on_result(call_id, f"{type(e).__name__}: {e}", error=True)
            raise
        except BaseException:
            # Cancelled (another call of the batch stopped the run): no result.
            guard._pending.pop(call_id, None)
            raise
        result = context.result
        if _is_approval_request(result):
            # Another middleware asked for approval: the call has not run.
            guard._pending.pop(call_id, None)
            return
        output = _text(result)
        seen = guard.on_result(call_id, output)
        if seen != output:
            context.result = _with_note(result, output, seen)


__all__ = ["AgentLoopTerminated", "LoopGuard"]
