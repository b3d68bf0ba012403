"""What the two clients share: a server of the API they speak, reached over the caller's session."""

from __future__ import annotations

from typing import ClassVar, Unpack

import aiohttp

from custom_components.llm_lanes.core.backends.base import Backend, server_unique_id
from custom_components.llm_lanes.core.backends.kinds import (
    ServerKind,
    ServerProfile,
    WireApi,
    server_profile,
)
from custom_components.llm_lanes.core.backends.transport import (
    ConnectionOptions,
    HttpClient,
)


class HttpBackend(Backend):
    """A client of one server that speaks ``api``, with the HTTP client every call goes through."""

    api: ClassVar[WireApi]
    """The API this client speaks; a server described as speaking another is refused."""
    api_name: ClassVar[str]
    """The API as the refusal names it."""
    default_kind: ClassVar[ServerKind]
    """The kind a server is taken for when none is given."""

    def __init__(
        self,
        session: aiohttp.ClientSession,
        base_url: str,
        *,
        kind: ServerKind | ServerProfile | None = None,
        **options: Unpack[ConnectionOptions],
    ) -> None:
        """Bind the caller's session to the server of ``kind`` (or of a description of one)."""
        profile = server_profile(self.default_kind if kind is None else kind)
        if profile.api is not self.api:
            raise ValueError(f"{profile.name} does not speak {self.api_name}")
        super().__init__(profile)
        self._http = HttpClient(session, base_url, **options)
        self.base_url = self._http.base_url

    @property
    def unique_id(self) -> str:
        """The identity its server info gives the server: its kind, host, port and path."""
        return server_unique_id(self.kind, self.base_url)
