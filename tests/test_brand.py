"""The brand images Home Assistant serves from ``custom_components/llm_lanes/brand/``."""

from __future__ import annotations

from http import HTTPStatus
from io import BytesIO
from pathlib import Path

from homeassistant.components.brands.const import ALLOWED_IMAGES
from homeassistant.core import HomeAssistant
from homeassistant.setup import async_setup_component
from PIL import Image
import pytest
from pytest_homeassistant_custom_component.typing import ClientSessionGenerator

BRAND = Path(__file__).parents[1] / "custom_components/llm_lanes/brand"


# Sizes as Home Assistant's brands repository wants them (its README's image specification:
# https://github.com/home-assistant/brands/blob/035379c803d3aff102792b322b06d6902d58ebe0/README.md):
# square icons of 256 (hDPI 512) pixels, logos whose shortest side is 128 to 256 (hDPI 256 to 512)
# pixels (ours: landscape, 128 and 256 pixels high).
SIZES = {
    "icon.png": (256, 256),
    "icon@2x.png": (512, 512),
    "logo.png": (None, 128),
    "logo@2x.png": (None, 256),
}
IMAGES = {
    f"{theme}{image}": size for theme in ("", "dark_") for image, size in SIZES.items()
}


def test_brand_folder_holds_every_image_home_assistant_serves() -> None:
    """Every image name Home Assistant serves from a custom integration's brand/, and no other.

    HACS' brands check looks for ``brand/icon.png`` among them.
    """
    assert {path.name for path in BRAND.iterdir()} == set(IMAGES) == ALLOWED_IMAGES


@pytest.mark.parametrize(("name", "size"), IMAGES.items())
async def test_brand_image_served(
    hass: HomeAssistant,
    hass_client: ClientSessionGenerator,
    name: str,
    size: tuple[int | None, int],
) -> None:
    """Each image is our own file (not the CDN's placeholder), a transparent PNG of its size."""
    width, height = size
    assert await async_setup_component(hass, "brands", {})
    client = await hass_client()

    response = await client.get(f"/api/brands/integration/llm_lanes/{name}")

    assert response.status == HTTPStatus.OK
    assert response.content_type == "image/png"
    body = await response.read()
    assert body == (BRAND / name).read_bytes()
    picture = Image.open(BytesIO(body))
    assert picture.format == "PNG"
    assert picture.mode == "RGBA"
    assert picture.height == height
    # Logos are landscape; icons square.
    assert picture.width == width if width else picture.width > 2 * height
    # Transparent background, trimmed: the corner is clear, the mark reaches top and bottom.
    assert picture.getpixel((0, 0))[3] == 0
    _, top, _, bottom = picture.getbbox()
    assert (top, bottom) == (0, picture.height)
