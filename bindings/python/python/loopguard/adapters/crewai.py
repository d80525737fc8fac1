"""loopguard for CrewAI (``crewai``), as tool-call hooks scoped to a run.

>>> from loopguard.adapters.crewai import AgentLoopTerminated, LoopGuard
>>> with LoopGuard(session=run_id):  # doctest: +SKIP
...     result = crew.kickoff()

Inside the ``with`` block every tool call of the crews and agents kicked off there goes through
the engine (a CrewAI ``before_tool_call`` hook) and its result after (an ``after_tool_call``
hook), on both of CrewAI's tool paths (native function calling and ReAct text):

- a refused call is not run: the before hook blocks it, and the after hook, which CrewAI runs
  for a blocked call too, makes ``[loopguard: refused] …`` the tool result the model reads
  (CrewAI's hooks cannot mark a result failed: a blocked call carries no tool failure);
- a warning is appended to the tool result the model reads;
- ``terminate`` raises :class:`AgentLoopTerminated` out of ``crew.kickoff()`` /
  ``agent.kickoff()`` (and their async forms). The call that is stopped is not run.

The hooks are CrewAI's execution-scoped hooks (``crewai.hooks.dispatch.scoped_hooks``): they
live in a context variable, so they see only what runs in this thread or task and in the threads
CrewAI starts from it (it copies the context into them). Two crews kicked off in two ``with``
blocks, each in its own thread or task, do not mix.

:class:`AgentLoopTerminated` is a CrewAI ``HookAborted``, the exception a hook raises to stop a
run: CrewAI swallows any other exception a hook raises, and lets this one through its tool
loop and its agent's ``max_retry_limit`` retries.
"""

from __future__ import annotations

import contextvars
import itertools
import json
import threading
import uuid
from dataclasses import dataclass
from typing import Any, Optional

from crewai.hooks.dispatch import (
    HookAborted,
    InterceptionPoint,
    get_scoped_hooks,
    scoped_hooks,
)
from crewai.hooks.tool_hooks import ToolCallHookContext
from crewai.tools.tool_failure import ToolFailure

from .. import Engine, LoopTerminated
from . import Guard, refusal, refuses


class AgentLoopTerminated(LoopTerminated, HookAborted):
    """:class:`loopguard.LoopTerminated` raised out of a CrewAI run on ``terminate``.

    It is CrewAI's ``HookAborted``, which the framework lets through to the caller (it
    swallows other exceptions raised by hooks)."""

    def __init__(self, verdict):
        LoopTerminated.__init__(self, verdict)
        # HookAborted's attributes (its __init__ is not reached through RuntimeError's).
        self.reason = str(self)
        self.source = "loopguard"


def _text(value: Any) -> str:
    """A tool's raw return value as text: a string as is, anything else as JSON (or ``str``)."""
    if isinstance(value, str):
        return value
    if value is None:
        return ""
    if isinstance(value, ToolFailure):
        return value.as_agent_message()
    try:
        return json.dumps(value, default=str)
    except (TypeError, ValueError):
        return str(value)


@dataclass
class _Call:
    """What the before hook decided for one call, until its after hook."""

    guard: Guard
    call_id: str
    refused: Optional[str] = None
    stopped: Optional[AgentLoopTerminated] = None


class LoopGuard:
    """CrewAI tool-call hooks that put every tool call through a loopguard engine.

    Use it as a context manager around a run: ``with LoopGuard(session=run_id):
    crew.kickoff()``. The loopguard session is ``session`` when given; otherwise each ``with``
    block is a new session. Pass a :class:`~loopguard.adapters.Guard` to share one session with
    other code, and ``engine=`` to share an engine (and its policy).

    :meth:`before_tool_call` and :meth:`after_tool_call` are CrewAI hooks and can also be
    registered by hand (``register_before_tool_call_hook`` / ``register_after_tool_call_hook``):
    registered globally they see every crew of the process, in the session ``session`` (or
    ``"default"``).
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
        self._default: Optional[Guard] = None
        # The guard of the `with` block the current thread or task is in.
        self._active: contextvars.ContextVar[Optional[Guard]] = contextvars.ContextVar(
            "loopguard_crewai_guard", default=None
        )
        self._scopes: contextvars.ContextVar[tuple] = contextvars.ContextVar(
            "loopguard_crewai_scopes", default=()
        )
        self._ids = itertools.count(1)
        self._calls: dict[int, tuple[dict, _Call]] = {}
        self._lock = threading.Lock()

    def _new_guard(self) -> Guard:
        if self._guard is not None:
            return self._guard
        session = self.session if self.session is not None else f"crewai-{uuid.uuid4().hex}"
        return Guard(self.engine, session, AgentLoopTerminated)

    def current(self) -> Guard:
        """The guard (engine session) of the current ``with`` block, or of hooks registered
        globally outside one."""
        guard = self._active.get()
        if guard is not None:
            return guard
        with self._lock:
            if self._default is None:
                self._default = self._guard or Guard(
                    self.engine, self.session or "default", AgentLoopTerminated
                )
            return self._default

    def __enter__(self) -> "LoopGuard":
        guard_token = self._active.set(self._new_guard())
        # CrewAI's scope replaces any outer one: it starts with the outer scope's hooks.
        scope = scoped_hooks({p: get_scoped_hooks(p) for p in InterceptionPoint})
        hooks = scope.__enter__()
        hooks[InterceptionPoint.PRE_TOOL_CALL].append(self.before_tool_call)
        hooks[InterceptionPoint.POST_TOOL_CALL].append(self.after_tool_call)
        self._scopes.set(self._scopes.get() + ((scope, guard_token),))
        return self

    def __exit__(self, *exc) -> None:
        scopes = self._scopes.get()
        scope, guard_token = scopes[-1]
        self._scopes.set(scopes[:-1])
        scope.__exit__(*exc)
        self._active.reset(guard_token)

    def before_tool_call(self, context: ToolCallHookContext) -> Optional[bool]:
        """CrewAI ``before_tool_call`` hook: observes the call; ``False`` blocks a refused or
        stopped call."""
        guard = self.current()
        call = _Call(guard, f"loopguard-{next(self._ids)}")
        arguments = context.tool_input if context.tool_input is not None else {}
        try:
            v = guard.on_call(call.call_id, context.tool_name, _jsonable(arguments))
        except AgentLoopTerminated as stopped:
            # Raised here, it would only block the call (CrewAI blocks a call whose before hook
            # raises HookAborted): the after hook, which CrewAI runs for a blocked call too,
            # raises it.
            call.stopped = stopped
            v = None
        if v is not None and refuses(v):
            guard._pending.pop(call.call_id, None)
            call.refused = refusal(v)
        self._remember(context, call)
        if call.stopped is not None or call.refused is not None:
            return False
        return None

    def after_tool_call(self, context: ToolCallHookContext) -> Optional[str]:
        """CrewAI ``after_tool_call`` hook: observes the result and returns what the model reads
        (the refusal, or the output with the warnings); raises :class:`AgentLoopTerminated`."""
        call = self._forget(context)
        if call is None:
            # Not seen before it ran (another hook blocked it first).
            return None
        if call.stopped is not None:
            raise call.stopped
        if call.refused is not None:
            return call.refused
        raw = context.raw_tool_result
        output = _text(raw if raw is not None else context.tool_result)
        seen = call.guard.on_result(call.call_id, output, error=isinstance(raw, ToolFailure))
        note = seen[len(output):]
        if not note:
            return None
        return (context.tool_result or "") + note

    def _remember(self, context: ToolCallHookContext, call: _Call) -> None:
        # The before and after contexts of one call are two objects sharing one `tool_input`
        # dict; it is kept here so that its id names no other dict until the call's after hook.
        with self._lock:
            self._calls[id(context.tool_input)] = (context.tool_input, call)

    def _forget(self, context: ToolCallHookContext) -> Optional[_Call]:
        with self._lock:
            entry = self._calls.get(id(context.tool_input))
            if entry is None or entry[0] is not context.tool_input:
                return None
            del self._calls[id(context.tool_input)]
            return entry[1]


def _jsonable(arguments: Any) -> Any:
    """The call's arguments as JSON values."""
    return json.loads(json.dumps(arguments, default=str))


__all__ = ["AgentLoopTerminated", "LoopGuard"]
