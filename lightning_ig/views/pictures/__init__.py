"""The pictures a run draws, as pixel arrays: numpy and Pillow, no plotting library.

* :mod:`~lightning_ig.views.pictures.draw`: which pictures a run draws and what they need
  (:func:`~lightning_ig.views.pictures.draw.picture_inputs`, :func:`~lightning_ig.views.pictures.draw.draw`);
  :mod:`~lightning_ig.views.pictures.words`: the words on them (the target, the baseline, the verdict, the trust
  line);
* :mod:`~lightning_ig.views.pictures.verdict_card`: the verdict card, the first card under ``ig/``;
  :mod:`~lightning_ig.views.pictures.bars`: the bar chart of the top features;
  :mod:`~lightning_ig.views.pictures.charts`: the heatmap and the stacked shares over training;
  :mod:`~lightning_ig.views.pictures.action_charts`: per action, and the greedy action against the runner-up;
* :mod:`~lightning_ig.views.pictures.saliency`: the saliency grid of held-out frames;
  :mod:`~lightning_ig.views.pictures.saliency_map`: the mean ``|attr|`` map;
  :mod:`~lightning_ig.views.pictures.frames`: what they share, and the PNG writer;
* :mod:`~lightning_ig.views.pictures.raster`: pixels, fonts, colour tables, palette PNGs.

Nothing is imported from the package itself, so a run that draws nothing loads no drawing code. A new picture
goes in a module here, drawn from a run summary, and is listed in :mod:`~lightning_ig.views.pictures.draw` and
:data:`lightning_ig.views.tags.PICTURE_TAGS`.
"""

__all__: list[str] = []
