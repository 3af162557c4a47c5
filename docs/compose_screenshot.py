"""Stack a Scalars screenshot over the picture cards of an Images screenshot: the README's TensorBoard pictures.

TensorBoard draws image cards narrower than the pictures, so the cards are taken
from a screenshot at twice the pixel density (CHROMIUM set to a wrapper that adds
``--force-device-scale-factor=2``) and scaled to the page's width. Usage::

    python docs/compose_screenshot.py SCALARS.png IMAGES_2X.png LEFT,TOP,RIGHT,BOTTOM OUTPUT.png

The box is the cards' region in IMAGES_2X.png (for two cards at 1600x1200 css pixels:
720,370,2200,880 for the charts of CartPole, 720,370,2200,1040 for MinAtar's saliency pictures).
"""

from __future__ import annotations

import sys

from PIL import Image

WIDTH, SCALARS_HEIGHT = 1600, 770  # the Scalars page's charts end above 770 css pixels with 5 charts


def compose(scalars: str, images: str, box: tuple[int, int, int, int], output: str) -> None:
    top = Image.open(scalars).convert("RGB").crop((0, 0, WIDTH, SCALARS_HEIGHT))
    cards = Image.open(images).convert("RGB").crop(box)
    cards = cards.resize((WIDTH, round(cards.height * WIDTH / cards.width)), Image.LANCZOS)
    canvas = Image.new("RGB", (WIDTH, top.height + cards.height), "white")
    canvas.paste(top, (0, 0))
    canvas.paste(cards, (0, top.height))
    canvas.save(output, optimize=True)


if __name__ == "__main__":
    scalars_path, images_path, region, output_path = sys.argv[1:5]
    compose(scalars_path, images_path, tuple(int(v) for v in region.split(",")), output_path)  # type: ignore[arg-type]
    print(output_path)
