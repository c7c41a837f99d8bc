"""HunyuanVideo's up blocks and head decoded per tile with the whole shot's GroupNorm statistics.

diffusers' ``nn.GroupNorm`` takes each group's mean and variance over everything it is given: on
``[1, C, frames, rows, columns]`` that is the group's channels and every frame, row and column. Decoded
whole (farm turns diffusers' framewise decoding off), a HunyuanVideo shot's GroupNorms see the whole shot,
time included, so a tile (spatial or temporal) decoding alone takes other statistics and differs from the
whole decode everywhere. Each GroupNorm's input depends on every earlier GroupNorm's statistics, so the
whole shot's statistics take one round across the tiles per GroupNorm, in order:

* the middle block (with its own GroupNorms and attention) runs once over the whole shot
  (`whole_frame.whole_frame_part`); each tile starts from its block of it (`start`);
* at GroupNorm k every tile sums its activation over its OWN region at that layer's resolution
  (`partial_sums`: sum, sum of squares and count per group, float64; the halo and context are left out,
  so the regions, `farm.planning.tiling.own_blocks`, partition the shot), `combine` adds the tiles' sums
  into the shot's mean and variance, and every tile normalises its whole block with them and runs to
  GroupNorm k + 1 (`advance`), carrying its activation (and the resnet's residual) from round to round:
  nothing is computed twice.

The sites are ``norm1`` and ``norm2`` of every up-block resnet and ``conv_norm_out`` (the released
config: 4 blocks x 3 resnets x 2 + 1 = 25 rounds). A tile's own pixels then equal the whole decode's as
far as its halo and context cover the up blocks' reach (causal in time: context before only).

Bit for bit: the untiled decode runs the same arithmetic (`decode_alone`: the rounds over one block that
owns everything), and every round's convolutions run on the shot's lattice (`farm.decoders.lattice_conv`,
placed by the block's `origin`), so that in bf16 too a tile's own pixels are the untiled decode's beyond
the halo's reach, not only to the dtype's noise.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from farm.decoders.lattice_conv import placed

if TYPE_CHECKING:
    import torch

# a tile's own latent frames, rows and columns [start, stop), local to its decoded block
OwnBlock = tuple[tuple[int, int], tuple[int, int], tuple[int, int]]


@dataclass(frozen=True)
class Site:
    """One GroupNorm of the up blocks and head: ``norm1``/``norm2`` of up block `block`'s resnet `resnet`,
    or the output norm (`block` -1)."""

    block: int
    resnet: int
    norm: int  # 1, 2; 0 for conv_norm_out


@dataclass
class Carried:
    """A tile between rounds: the input of GroupNorm `site` and the residual its resnet adds back; the
    tile's `own` latent block (tile-local) of its decoded block of `block_fhw` latent, whose first latent
    row and column in the shot are `origin`."""

    site: int
    x: torch.Tensor
    residual: torch.Tensor | None
    own: OwnBlock
    block_fhw: tuple[int, ...]
    origin: tuple[int, int] = (0, 0)


def sites(model: Any) -> list[Site]:
    """The GroupNorms after the middle block, in the order the decoder runs them."""
    found = []
    for b, block in enumerate(model.decoder.up_blocks):
        for r in range(len(block.resnets)):
            found += [Site(b, r, 1), Site(b, r, 2)]
    return [*found, Site(-1, -1, 0)]


def norm_at(model: Any, site: Site) -> Any:
    decoder = model.decoder
    if site.block < 0:
        return decoder.conv_norm_out
    resnet = decoder.up_blocks[site.block].resnets[site.resnet]
    return resnet.norm1 if site.norm == 1 else resnet.norm2


def start(shared: torch.Tensor, own: OwnBlock, origin: tuple[int, int] = (0, 0)) -> Carried:
    """A tile's block (halo and context included) of the middle block's output ``[1, C, f, h, w]``, its
    first latent row and column in the shot `origin`."""
    x = shared.contiguous()
    return Carried(0, x, x, own, tuple(x.shape[2:]), (int(origin[0]), int(origin[1])))


def everything(shared: torch.Tensor) -> OwnBlock:
    """The own block of a decode that owns all it decodes (the untiled decode, a tile decoded alone)."""
    f, h, w = shared.shape[2:]
    return (0, f), (0, h), (0, w)


def decode_alone(model: Any, shared: torch.Tensor, origin: tuple[int, int] = (0, 0)) -> torch.Tensor:
    """The rounds over one block that owns all of itself: the middle block's output ``[1, C, f, h, w]`` →
    pixels ``[1, 3, F, H, W]`` in [-1, 1], each GroupNorm over the whole block, as ``vae.decode`` takes
    them, in the arithmetic of the tiles that share a shot's statistics."""
    carried: Carried | torch.Tensor = start(shared, everything(shared), origin)
    while isinstance(carried, Carried):
        carried = advance(model, carried, combine([partial_sums(model, carried)]))
    return carried


def own_at_layer(
    own: OwnBlock, block_fhw: tuple[int, ...], layer_fhw: tuple[int, ...]
) -> tuple[slice, slice, slice]:
    """The tile's own region (tile-local latent `own` of a decoded block of `block_fhw` latent) at a layer
    of `layer_fhw`: rows and columns scale by the layer's spatial factor; a causal upsampler gives the
    block's first latent frame one frame and each later one `s`, so latent frame i > 0 is frames
    ``s·i - s + 1 .. s·i``. The own regions of a plan's tiles partition the shot at every layer."""
    (f0, f1), (r0, r1), (c0, c1) = own
    frames, rows, cols = block_fhw
    f, h, w = layer_fhw
    s = (f - 1) // (frames - 1) if frames > 1 else 1
    sh, sw = h // rows, w // cols
    first = 0 if f0 == 0 else s * f0 - s + 1
    return slice(first, s * (f1 - 1) + 1), slice(sh * r0, sh * r1), slice(sw * c0, sw * c1)


def partial_sums(model: Any, carried: Carried) -> torch.Tensor:
    """Sum, sum of squares and count per group ``[G, 3]`` (float64, on the CPU) of the tile's own region
    of GroupNorm `carried.site`'s input."""
    import torch

    norm = norm_at(model, sites(model)[carried.site])
    x = carried.x
    frames, rows, cols = own_at_layer(carried.own, carried.block_fhw, tuple(x.shape[2:]))
    g = norm.num_groups
    sums = torch.zeros(g, 3, dtype=torch.float64, device=x.device)
    for t in range(frames.start, frames.stop):  # a frame at a time: the float64 copy stays small
        part = x[0, :, t, rows, cols].reshape(g, -1).double()
        sums[:, 0] += part.sum(1)
        sums[:, 1] += (part * part).sum(1)
        sums[:, 2] += part.shape[1]
    return sums.cpu()


def combine(partials: list[torch.Tensor]) -> torch.Tensor:
    """The tiles' `partial_sums` → the whole shot's mean and (biased) variance per group ``[G, 2]``."""
    import torch

    total = torch.stack(partials).sum(0)
    mean = total[:, 0] / total[:, 2]
    var = (total[:, 1] / total[:, 2] - mean * mean).clamp(min=0.0)
    return torch.stack([mean, var], 1)


def normalized(norm: Any, x: torch.Tensor, stats: torch.Tensor) -> torch.Tensor:
    """``norm(x)`` with the given per-group mean and variance instead of `x`'s own."""
    import torch

    b, c = x.shape[:2]
    g = norm.num_groups
    group = (1, g, 1, 1, 1)  # against a frame of [b, C, h, w] seen as [b, G, C/G, h, w]
    mean = stats[:, 0].to(device=x.device, dtype=torch.float32).view(group)
    scale = torch.rsqrt(stats[:, 1] + norm.eps).to(device=x.device, dtype=torch.float32).view(group)
    affine = [p.float().view(1, c, 1, 1) for p in (norm.weight, norm.bias)] if norm.affine else None
    out = torch.empty_like(x)
    for t in range(x.shape[2]):  # a frame at a time: the float32 copy stays small (elementwise: same bits)
        frame = x[:, :, t]
        y = (frame.float().reshape(b, g, c // g, *frame.shape[2:]) - mean).mul_(scale).reshape(frame.shape)
        if affine is not None:
            y = y.mul_(affine[0]).add_(affine[1])
        out[:, :, t] = y
    return out


def advance(model: Any, carried: Carried, stats: torch.Tensor) -> Carried | torch.Tensor:
    """Normalise GroupNorm `carried.site`'s input with the shot's `stats` and run to the next GroupNorm;
    after the last, the tile's pixels ``[1, 3, F, H, W]`` in [-1, 1] (as `whole_frame.rest_of_decoder`)."""
    with placed(carried.origin, (carried.block_fhw[1], carried.block_fhw[2])):
        return _advance(model, carried, stats)


def _advance(model: Any, carried: Carried, stats: torch.Tensor) -> Carried | torch.Tensor:
    decoder = model.decoder
    order = sites(model)
    site = order[carried.site]
    x = normalized(norm_at(model, site), carried.x, stats)
    if site.block < 0:
        return decoder.conv_out(decoder.conv_act(x))
    block = decoder.up_blocks[site.block]
    resnet = block.resnets[site.resnet]
    if site.norm == 1:
        return replace(carried, site=carried.site + 1, x=resnet.conv1(resnet.nonlinearity(x)))
    x = resnet.conv2(resnet.dropout(resnet.nonlinearity(x)))
    residual = carried.residual
    assert residual is not None
    if resnet.conv_shortcut is not None:
        residual = resnet.conv_shortcut(residual)
    x = x + residual
    if site.resnet == len(block.resnets) - 1 and block.upsamplers is not None:
        for upsampler in block.upsamplers:
            x = upsampler(x)
    x = x.contiguous()
    following = order[carried.site + 1]
    return replace(carried, site=carried.site + 1, x=x, residual=x if following.block >= 0 else None)
