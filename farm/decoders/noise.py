"""Noise that is a function of position: the same value at a latent position whichever tile asks for it.

Some decoders draw noise while decoding (LTX-Video's timestep-conditioned decode mixes noise into the
latents; its 0.9.1 decoder injects noise after convolutions). Drawn from a generator, every tile would
see different noise where tiles overlap, and the blend would no longer equal a decode of the whole shot.
Here each value is a hash of (seed, coordinates), turned into a standard normal sample (Box-Muller), so
a tile starting at latent row 7 sees exactly the noise the whole shot has at rows 7, 8, …
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch

_MASK = 0xFFFFFFFF
_MUL = 0x45D9F3B  # < 2**27: products of 32-bit values stay inside int64
_SALT_U1 = 0x9E3779B9
_SALT_U2 = 0x85EBCA6B


def _mix(x: torch.Tensor) -> torch.Tensor:
    """A 32-bit integer hash (good avalanche), on int64 tensors holding values in [0, 2**32)."""
    x = (((x >> 16) ^ x) * _MUL) & _MASK
    x = (((x >> 16) ^ x) * _MUL) & _MASK
    return (x >> 16) ^ x


def hash_seed(*parts: int) -> int:
    """Combine integers into one 32-bit seed (pure Python, same hash as the tensors use)."""
    key = 0
    for p in parts:
        x = (key ^ (p & _MASK)) & _MASK
        x = (((x >> 16) ^ x) * _MUL) & _MASK
        x = (((x >> 16) ^ x) * _MUL) & _MASK
        key = (x >> 16) ^ x
    return key


def position_noise(seed: int, coords: Sequence[Any], device: torch.device | str = "cpu") -> torch.Tensor:
    """Standard normal noise on the grid ``coords`` (one 1-D integer tensor per axis), float64.

    ``position_noise(s, [a[i:j], b])`` equals ``position_noise(s, [a, b])[i:j]``: values depend only on
    the seed and the coordinates.
    """
    import torch

    n = len(coords)
    key = torch.tensor(seed & _MASK, dtype=torch.int64, device=device)
    for axis, c in enumerate(coords):
        shape = [1] * n
        shape[axis] = -1
        c = torch.as_tensor(c, dtype=torch.int64, device=device).view(shape) & _MASK
        key = _mix(key ^ c)
    u1 = (_mix(key ^ _SALT_U1).double() + 1.0) / 2.0**32  # (0, 1]: log is finite
    u2 = _mix(key ^ _SALT_U2).double() / 2.0**32
    return torch.sqrt(-2.0 * torch.log(u1)) * torch.cos(2.0 * math.pi * u2)
