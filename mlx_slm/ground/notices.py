"""The one printer of notes: a line on stderr, flushed, so that results alone go to stdout.

Every notice the package prints itself goes through `notice`: the CLI's notes, warnings and
summaries (`cli.base.notice` is this function), and the library's own lines that have no caller to
hand them to (the cache fetching, waiting or converting; a quantized checkpoint dequantized at
load; a layer type mlx-lm runs for us). Code that can be handed a `say` callback takes one and
falls back to this. It sits on the ground floor so that every floor can reach it.
"""

from __future__ import annotations

import sys


def notice(msg: str) -> None:
    """One line on stderr (looked up at each call, so redirected or captured stderr gets it)."""
    print(msg, file=sys.stderr, flush=True)
