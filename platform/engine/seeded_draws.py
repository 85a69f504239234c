"""Seeded sampling keyed by (seed, position): each draw of a seeded request gets a generator of
its own, seeded from the request's seed and the position of the token it draws.

A generator kept per request and advanced at every draw ties the n-th draw to every draw
before it: a request resumed from its prefix (after a restart, or on another replica) starts
the stream again from its first draw. Keyed by position, the draw for a position is the same
however the request got there, whatever its row in the batch and whoever shares the step.
"""

from __future__ import annotations

import torch

_MASK64 = (1 << 64) - 1


def _splitmix64(x: int) -> int:
    """One SplitMix64 step: a bijective 64-bit mix (neighbouring inputs give unrelated outputs)."""
    x = (x + 0x9E3779B97F4A7C15) & _MASK64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _MASK64
    return x ^ (x >> 31)


def position_seed(seed: int, position: int) -> int:
    """The generator seed of the draw at `position` (0-based, prompt included) of a request
    seeded with `seed`: a 63-bit value (what `torch.Generator.manual_seed` takes)."""
    if seed < 0 or position < 0:
        raise ValueError(f"seed and position must be >= 0, got {seed}, {position}")
    return _splitmix64(_splitmix64(seed) ^ position) >> 1


def position_generator(seed: int, position: int, device: torch.device) -> torch.Generator:
    """A fresh generator for the draw at `position` of a request seeded with `seed`."""
    return torch.Generator(device=device).manual_seed(position_seed(seed, position))
