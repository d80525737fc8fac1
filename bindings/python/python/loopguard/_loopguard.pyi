"""Type stubs of the native module (see the package docstring)."""

from __future__ import annotations

import os
from typing import Any, Optional, Sequence, Union

from . import Action

JSONLike = Union[dict, list, tuple, str, int, float, bool, None]

class PolicyError(Exception):
    """A policy that cannot be used; the message is the report ``loopctl validate`` prints."""

class SnapshotError(Exception):
    """A snapshot that cannot be restored."""

class Policy:
    @staticmethod
    def default() -> Policy: ...
    @staticmethod
    def load(path: Union[str, os.PathLike[str]]) -> Policy: ...
    @staticmethod
    def parse(text: str, path: Union[str, os.PathLike[str]] = "policy.yaml") -> Policy: ...
    @property
    def name(self) -> str: ...

class Verdict:
    @property
    def action(self) -> Action: ...
    @property
    def message(self) -> str: ...
    @property
    def detector(self) -> Optional[str]: ...
    @property
    def rule(self) -> Optional[str]: ...
    @property
    def count(self) -> int: ...
    @property
    def calls(self) -> list[str]: ...
    @property
    def loop_start(self) -> Optional[str]: ...
    @property
    def notes(self) -> list[str]: ...
    @property
    def is_allow(self) -> bool: ...

class Engine:
    def __init__(
        self,
        policy: Optional[Policy] = None,
        backend: Optional[str] = None,
        model: Optional[str] = None,
    ) -> None: ...
    def call(
        self,
        session: str,
        call_id: str,
        tool: str,
        arguments: Union[str, JSONLike],
        time_ms: Optional[int] = None,
    ) -> Verdict: ...
    def result(
        self,
        session: str,
        call_id: str,
        output: str,
        error: bool = False,
        exit_code: Optional[int] = None,
        time_ms: Optional[int] = None,
    ) -> Verdict: ...
    def text(
        self,
        session: str,
        text: str,
        chunk: bool = False,
        end_of_turn: bool = True,
        reasoning: bool = False,
        narration: bool = False,
        time_ms: Optional[int] = None,
    ) -> Verdict: ...
    def user(
        self, session: str, text: str, automated: bool = False, time_ms: Optional[int] = None
    ) -> Verdict: ...
    def reset(self, session: str, time_ms: Optional[int] = None) -> Verdict: ...
    def observe_messages(
        self, session: str, messages: list[dict[str, Any]], time_ms: Optional[int] = None
    ) -> list[Verdict]: ...
    def set_session_settings(
        self,
        session: str,
        enabled: Optional[bool] = None,
        max_repeats: Optional[int] = None,
        ttl_seconds: Optional[int] = None,
        mode: Optional[str] = None,
    ) -> None: ...
    def session_settings(self, session: str) -> dict[str, Any]: ...
    def set_session_target(
        self, session: str, backend: Optional[str] = None, model: Optional[str] = None
    ) -> None: ...
    def session_target(self, session: str) -> dict[str, str]: ...
    def join_group(self, session: str, group: str, worker: str) -> None: ...
    def leave_group(self, session: str) -> None: ...
    def clear_group(self, group: str) -> None: ...
    def snapshot_session(self, session: str) -> Optional[str]: ...
    def restore_session(self, session: str, snapshot: str) -> None: ...
    def snapshot(self) -> str: ...
    def restore(self, snapshot: str) -> int: ...
    def session_ids(self) -> list[str]: ...
    def remove_session(self, session: str, time_ms: Optional[int] = None) -> bool: ...

def simulate(
    messages: Union[str, Sequence[Any]],
    policy: Optional[Policy] = None,
    backend: Optional[str] = None,
    model: Optional[str] = None,
) -> list[dict[str, Any]]: ...
