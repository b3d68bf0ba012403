"""Draw the brand images Home Assistant shows for LLM Lanes (``custom_components/llm_lanes/brand/``).

The mark is a road of four lanes seen in perspective, one per lane of the scheduler: voice (blue,
with an arrow: it goes first), then interactive, automation and background in fading greys. The
logo is the mark and the name. File names and sizes follow Home Assistant's brands repository:
``icon.png`` 256x256 and ``icon@2x.png`` 512x512 (square, trimmed), ``logo.png`` 128 px high and
``logo@2x.png`` 256 px high (landscape, trimmed), each also as ``dark_…`` for dark themes;
transparent background.

    python scripts/lib/draw_brand.py [OUT_DIR]
"""

from __future__ import annotations

from pathlib import Path
import sys

import numpy as np
from PIL import Image, ImageDraw, ImageFont

OUT = Path(__file__).resolve().parents[2] / "custom_components/llm_lanes/brand"
FONT = Path("/usr/share/fonts/truetype/dejavu/DejaVuSans-Bold.ttf")
SUPERSAMPLE = 4
VOICE_BLUE = (3, 169, 244)  # Home Assistant's primary blue
# Per theme: the lanes after voice (fading with their priority), the arrow, the name.
THEMES = {
    "": {"lanes": (55, 71, 79), "arrow": (255, 255, 255), "text": (38, 50, 56)},
    "dark_": {
        "lanes": (207, 216, 220),
        "arrow": (255, 255, 255),
        "text": (236, 239, 241),
    },
}
LANE_ALPHAS = (255, 200, 140)


def perspective_coefficients(
    output: list[tuple[float, float]], source: list[tuple[float, float]]
) -> list[float]:
    """Solve the 8 coefficients PIL's PERSPECTIVE transform needs (output point → source point)."""
    rows, values = [], []
    for (x, y), (u, v) in zip(output, source, strict=True):
        rows.append([x, y, 1, 0, 0, 0, -u * x, -u * y])
        rows.append([0, 0, 0, x, y, 1, -v * x, -v * y])
        values += [u, v]
    return [float(c) for c in np.linalg.solve(np.array(rows), np.array(values))]


def flat_lanes(
    width: int, height: int, theme: dict[str, tuple[int, int, int]]
) -> Image.Image:
    """Four upright lanes, voice first with its arrow, before the perspective."""
    image = Image.new("RGBA", (width, height), (0, 0, 0, 0))
    draw = ImageDraw.Draw(image)
    gap = width // 22
    lane = (width - 3 * gap) / 4
    radius = int(lane * 0.28)
    colours = [(*VOICE_BLUE, 255)] + [(*theme["lanes"], alpha) for alpha in LANE_ALPHAS]
    for index, colour in enumerate(colours):
        left = index * (lane + gap)
        draw.rounded_rectangle(
            (left, 0, left + lane, height), radius=radius, fill=colour
        )
    # The arrow in the voice lane: a shaft and a head pointing up the road.
    centre, shaft = lane / 2, lane * 0.32
    head_top, head_base = height * 0.1, height * 0.4
    draw.polygon(
        [
            (centre, head_top),
            (centre + lane * 0.44, head_base),
            (centre - lane * 0.44, head_base),
        ],
        fill=(*theme["arrow"], 255),
    )
    draw.rectangle(
        (centre - shaft / 2, head_base - 1, centre + shaft / 2, height * 0.8),
        fill=(*theme["arrow"], 255),
    )
    return image


def mark(size: int, theme: dict[str, tuple[int, int, int]]) -> Image.Image:
    """Draw the road, size x size, trimmed (its bottom edge spans the square)."""
    big = size * SUPERSAMPLE
    flat = flat_lanes(big, big, theme)
    inset = big * 0.3  # how far the far end of the road narrows on each side
    coefficients = perspective_coefficients(
        [(inset, 0), (big - inset, 0), (big, big), (0, big)],
        [(0, 0), (big, 0), (big, big), (0, big)],
    )
    road = flat.transform(
        (big, big), Image.Transform.PERSPECTIVE, coefficients, Image.Resampling.BICUBIC
    )
    return road.resize((size, size), Image.Resampling.LANCZOS)


def logo(height: int, theme: dict[str, tuple[int, int, int]]) -> Image.Image:
    """Draw the mark and the name beside it, height px high, trimmed."""
    big = height * SUPERSAMPLE
    font = ImageFont.truetype(str(FONT), int(big * 0.52))
    name = "LLM Lanes"
    left, top, right, bottom = font.getbbox(name)
    gap = int(big * 0.18)
    image = Image.new("RGBA", (big + gap + right - left, big), (0, 0, 0, 0))
    image.paste(mark(big, theme), (0, 0))
    ImageDraw.Draw(image).text(
        (big + gap - left, (big - (bottom - top)) / 2 - top),
        name,
        font=font,
        fill=(*theme["text"], 255),
    )
    image = image.crop(image.getbbox())
    width = round(image.width * height / image.height)
    return image.resize((width, height), Image.Resampling.LANCZOS)


def main() -> int:
    """Write the eight images."""
    out = Path(sys.argv[1]) if len(sys.argv) > 1 else OUT
    out.mkdir(parents=True, exist_ok=True)
    for prefix, theme in THEMES.items():
        for suffix, scale in (("", 1), ("@2x", 2)):
            mark(256 * scale, theme).save(
                out / f"{prefix}icon{suffix}.png", optimize=True
            )
            logo(128 * scale, theme).save(
                out / f"{prefix}logo{suffix}.png", optimize=True
            )
    print(f"brand images in {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
