"""The pictures a run draws, as pixel arrays: numpy and Pillow, no plotting library.

* :mod:`~lightning_ig.views.pictures.draw`: which pictures a run draws and what they need;
* :mod:`~lightning_ig.views.pictures.cards`: the verdict card, the shares over training, why this action;
* :mod:`~lightning_ig.views.pictures.saliency`: the saliency grid of held-out frames, the mean ``|attr|`` map;
* :mod:`~lightning_ig.views.pictures.raster`: the card's size, fonts, colour tables, palette PNGs.

Nothing is imported here, so a run that draws nothing loads no drawing code. A new picture is drawn from a run
summary, listed in :mod:`~lightning_ig.views.pictures.draw` and :data:`lightning_ig.views.tags.PICTURE_TAGS`.
"""

__all__: list[str] = []
