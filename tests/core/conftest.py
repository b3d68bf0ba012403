"""Fixtures shared by the engine's tests."""

from __future__ import annotations

from collections.abc import AsyncIterator

import aiohttp
import pytest


@pytest.fixture
async def session() -> AsyncIterator[aiohttp.ClientSession]:
    """Open a client session the test owns (Home Assistant's shared session in the integration)."""
    async with aiohttp.ClientSession() as client:
        yield client
