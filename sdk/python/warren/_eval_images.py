"""warren eval's tasks with layers taken from images (``--layer-image``)."""

from __future__ import annotations

import dataclasses
import time
from typing import IO, TYPE_CHECKING, Dict, List, Optional, Sequence, Tuple

from . import errors

if TYPE_CHECKING:
    from .client import Client
    from .eval import Task


def layers_from_images(client: Client, tasks: Sequence[Task], images: Dict[str, str],
                       log: Optional[IO[str]] = None) -> List[Task]:
    """The tasks with each layer ref that is a key of `images` replaced by
    the stack of layers of the image named by its value (bottom first), e.g.
    {"workspace/more-itertools@10.1.0": "127.0.0.1:5000/ws/more-itertools:10.1.0"}.
    An image the node does not have is pulled first (a registry ref). The
    image's layers sit where the replaced layer sat: what is above it stays
    above. NotFound/registry errors as images.get/pull raise them."""
    stacks: Dict[str, Tuple[str, ...]] = {}
    for layer, ref in images.items():
        try:
            img = client.images.get(ref)
        except errors.NotFound:
            t0 = time.monotonic()
            img = client.images.pull(ref, timeout=1800)
            if log is not None:
                log.write(f"pulled image {img.name} ({len(img.layers)} layers) in {time.monotonic() - t0:.1f} s\n")
        stacks[layer] = tuple(x.layer_name for x in img.stack)
    out = []
    for t in tasks:
        layers: List[str] = []
        for ref in t.layers:
            layers.extend(stacks.get(ref, (ref,)))
        out.append(dataclasses.replace(t, layers=tuple(layers)))
    return out
