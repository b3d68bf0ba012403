"""Reading a client's request field by field.

``Fields`` wraps one JSON object of a request; each reader raises ``InvalidRequestError``
naming the bad field (``messages[2].role``), so the gateway can answer 400 with a message that
says what to fix. Both formats' parsers read with it.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, Literal, cast

from custom_components.llm_lanes.core.errors import InvalidRequestError
from custom_components.llm_lanes.core.model import ToolCall, ToolSpec
from custom_components.llm_lanes.core.protocols.common import json_object
from custom_components.llm_lanes.core.protocols.schemas import check_schema

type Role = Literal["system", "user", "assistant", "tool"]
ROLES: tuple[Role, ...] = ("system", "user", "assistant", "tool")


class Fields:
    """One JSON object of a client's request, read field by field.

    Every reader raises ``InvalidRequestError`` naming the field (``messages[2].role``).
    """

    __slots__ = ("_obj", "where")

    def __init__(self, value: Any, where: str = "") -> None:
        """Read ``value``, the object at ``where`` ("" for the request itself)."""
        if not isinstance(value, dict):
            raise InvalidRequestError(where or "request", "must be an object")
        self._obj: dict[str, Any] = value
        self.where = where

    def name(self, key: str) -> str:
        """Name one of the fields (``messages[0].content``)."""
        return f"{self.where}.{key}" if self.where else key

    @property
    def value(self) -> dict[str, Any]:
        """The object as it came."""
        return self._obj

    def get(self, key: str, default: Any = None) -> Any:
        """Return a field as it came."""
        return self._obj.get(key, default)

    def others(self, read: Iterable[str]) -> dict[str, Any]:
        """Return the fields not in ``read`` (what passes through)."""
        known = set(read)
        return {key: value for key, value in self._obj.items() if key not in known}

    def nested(self, key: str, *, required: bool = False) -> Fields:
        """Read an object field (absent or null reads as an empty one unless required)."""
        value = self._obj.get(key)
        return Fields({} if value is None and not required else value, self.name(key))

    def array(self, key: str) -> list[Any]:
        """Read a list field (absent or null reads as an empty one)."""
        value = self._obj.get(key)
        if value is None:
            return []
        if not isinstance(value, list):
            raise InvalidRequestError(self.name(key), "must be a list")
        return value

    def objects(self, key: str) -> list[Fields]:
        """Read a list of objects."""
        where = self.name(key)
        return [Fields(item, f"{where}[{i}]") for i, item in enumerate(self.array(key))]

    def string(self, key: str, *, default: str | None = None) -> str:
        """Read a string field (required unless it has a default)."""
        value = self._obj.get(key)
        if value is None and default is not None:
            return default
        if not isinstance(value, str):
            raise InvalidRequestError(self.name(key), "must be a string")
        return value

    def role(self) -> Role:
        """Read a message's role."""
        value = self.string("role")
        for known in ROLES:
            if value == known:
                return known
        raise InvalidRequestError(
            self.name("role"), f"must be one of {', '.join(ROLES)}"
        )

    def boolean(self, key: str, *, default: bool) -> bool:
        """Read a true/false field."""
        value = self._obj.get(key, default)
        if not isinstance(value, bool):
            raise InvalidRequestError(self.name(key), "must be true or false")
        return value

    def integer(self, key: str) -> int | None:
        """Read an optional whole number."""
        value = self._numeric(key, int, "must be a whole number")
        return None if value is None else int(value)

    def number(self, key: str) -> float | None:
        """Read an optional number."""
        value = self._numeric(key, int | float, "must be a number")
        return None if value is None else float(value)

    def _numeric(self, key: str, kind: Any, problem: str) -> float | None:
        value = self._obj.get(key)
        if value is None:
            return None
        # JSON's true and false are not numbers, though Python's bool is an int.
        if isinstance(value, bool) or not isinstance(value, kind):
            raise InvalidRequestError(self.name(key), problem)
        return cast("float", value)

    def stop(self, key: str) -> tuple[str, ...]:
        """Read stop sequences: one string or a list of them."""
        return () if self._obj.get(key) is None else self.texts(key)

    def texts(self, key: str) -> tuple[str, ...]:
        """Read one string or a list of strings (required)."""
        value = self._obj.get(key)
        if isinstance(value, str):
            return (value,)
        if isinstance(value, list) and all(isinstance(item, str) for item in value):
            return tuple(value)
        raise InvalidRequestError(
            self.name(key), "must be a string or a list of strings"
        )

    def absent(self, key: str, problem: str) -> None:
        """Refuse a field the server side does not support when it is set (null, "", [] pass)."""
        if self._obj.get(key) not in (None, "", [], False):
            raise InvalidRequestError(self.name(key), problem)

    def text(self, key: str) -> str:
        """Read a message's text: a string, null, or a list of text parts."""
        value = self._obj.get(key)
        if value is None or isinstance(value, str):
            return value or ""
        parts: list[str] = []
        for part in self.objects(key):
            if part.get("type") != "text":
                raise InvalidRequestError(
                    part.name("type"), "only text parts are supported"
                )
            parts.append(part.string("text"))
        return "".join(parts)

    def tools(self, key: str = "tools") -> tuple[ToolSpec, ...]:
        """Read function tools."""
        tools: list[ToolSpec] = []
        for tool in self.objects(key):
            if tool.get("type", "function") != "function":
                raise InvalidRequestError(
                    tool.name("type"), "only function tools are supported"
                )
            function = tool.nested("function", required=True)
            tools.append(
                ToolSpec(
                    name=function.string("name"),
                    description=function.string("description", default=""),
                    parameters=check_schema(
                        function.nested("parameters").value,
                        function.name("parameters"),
                    ),
                )
            )
        return tuple(tools)

    def tool_calls(self, key: str, *, first_index: int = 0) -> tuple[ToolCall, ...]:
        """Read a message's tool calls (arguments as an object or JSON text).

        A call without an id is numbered ``call_<n>``, counting from ``first_index``.
        """
        calls: list[ToolCall] = []
        for index, call in enumerate(self.objects(key)):
            function = call.nested("function", required=True)
            arguments = json_object(function.get("arguments", {}))
            if arguments is None:
                raise InvalidRequestError(
                    function.name("arguments"), "must be a JSON object"
                )
            calls.append(
                ToolCall(
                    id=call.string("id", default=f"call_{first_index + index}"),
                    name=function.string("name"),
                    arguments=arguments,
                )
            )
        return tuple(calls)
