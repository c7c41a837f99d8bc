"""Convolutions on the shot's lattice (`farm.decoders.lattice_conv`): the same result as one call, and a
tile's outputs with the untiled decode's bits.

A convolution's algorithm, and so its rounding, follows from its input's shape; placed on the shot's
lattice, every call has one shape and every output the same place in its block, whatever block of the
shot is decoded. HunyuanVideo's tiles run their rounds so, and its untiled decode runs the same rounds
over one block: a tile's pixels out of its cut's reach are the untiled decode's, bit for bit.
"""

from __future__ import annotations

import pytest
import torch

from farm.decoders import decoder_class
from farm.decoders.hunyuanvideo import groupnorm_rounds
from farm.decoders.lattice_conv import Place, install, lattice_conv3d, placed, uninstall
from farm.inputs.synthetic import synth_spec
from farm.planning.tiling import TileGrid, own_blocks, plan_shot

NAME = "hunyuanvideo-tiny"


@pytest.mark.parametrize("padding, mode", [((1, 1, 1), "zeros"), ((0, 1, 1), "replicate"),
                                           ((0, 2, 2), "reflect"), ((1, 0, 0), "zeros")])  # fmt: skip
@pytest.mark.parametrize("origin, block", [((0, 0), 4), ((3, 5), 4), ((7, 2), 3)])
def test_a_placed_convolution_computes_the_convolution(padding, mode, origin, block):
    """Whatever the block's place and the lattice's size, the blocks put together are the convolution
    of the whole input (zeros, replicated or reflected borders; a 3x3 or a 5x5 kernel)."""
    kernel = 5 if padding[1] == 2 else 3
    conv = torch.nn.Conv3d(6, 5, (3, kernel, kernel), padding=padding, padding_mode=mode)
    x = torch.randn(1, 6, 4, 2 * 9, 2 * 11, generator=torch.Generator().manual_seed(0))
    install(conv)
    with torch.no_grad():
        plain = conv(x)
        with placed(origin, (9, 11), block):  # the layer at twice the latent block's rows and columns
            on_lattice = conv(x)
    assert on_lattice.shape == plain.shape
    torch.testing.assert_close(on_lattice, plain, rtol=1e-5, atol=1e-5)


def test_a_layer_whose_size_is_not_a_multiple_of_the_block_runs_unplaced():
    conv = torch.nn.Conv3d(2, 2, 3, padding=0)
    x = torch.randn(1, 2, 3, 13, 13)
    with torch.no_grad():
        assert lattice_conv3d(conv, x, conv.weight, conv.bias, Place((0, 0), (4, 4), 4)) is None


def test_a_crop_on_the_lattice_has_the_whole_convolutions_bits():
    """A crop of the input at an offset off the lattice, told its place, gives exactly the whole's outputs
    everywhere its inputs are whole; `uninstall` puts the class's convolution back."""
    conv = torch.nn.Conv3d(16, 16, 3, padding=(1, 1, 1))
    x = torch.randn(1, 16, 5, 40, 48, generator=torch.Generator().manual_seed(1))
    assert install(conv) == 1 and install(conv) == 0
    r, c = 11, 6  # the crop's first latent row and column (one latent unit: 2 rows and columns here)
    with torch.no_grad():
        with placed((0, 0), (20, 24), 4):
            whole = conv(x)
        with placed((r, c), (7, 9), 4):
            crop = conv(x[..., 2 * r : 2 * (r + 7), 2 * c : 2 * (c + 9)])
    inner = (..., slice(1, -1), slice(1, -1))  # the crop's border rows and columns pad with zeros
    assert torch.equal(crop[inner], whole[..., 2 * r : 2 * (r + 7), 2 * c : 2 * (c + 9)][inner])
    assert uninstall(conv) == 1 and "_conv_forward" not in conv.__dict__


def tiles_in_rounds(decoder, latent, plan):
    """The plan's tiles through the decoder's own round API: each tile's own pixels."""
    cls = type(decoder)
    shared = decoder.whole_frame(latent)
    carried, sums = [], []
    for tile, own in zip(plan.tiles, own_blocks(plan), strict=True):
        block = shared[(slice(None), *tile.decode_slices())]
        state, tile_sums = decoder.statistics_start(block, own, tile.decode_origin())
        carried.append(state)
        sums.append(tile_sums)
    for _ in range(cls.statistics_round_count(decoder.spec.config)):
        stats = groupnorm_rounds.combine(sums)
        carried, sums = map(list, zip(*(decoder.statistics_round(c, stats) for c in carried), strict=True))
    owned = []
    for tile, pixels in zip(plan.tiles, carried, strict=True):
        (f0, f1), (h0, h1), (w0, w1) = ((s.start, s.stop) for s in tile.pixels)
        _, r, c = (8 * o for o in tile.decode_origin())
        where = (slice(f0, f1), slice(h0, h1), slice(w0, w1))
        owned.append((where, pixels[:, :, h0 - r : h1 - r, w0 - c : w1 - c]))
    return owned


def test_tiles_in_rounds_have_the_untiled_decodes_bits():
    """hunyuanvideo-tiny, float32, a 2x2 split of a 3x32x32 latent with halo 12 (beyond the up blocks'
    reach; three tiles start off the lattice), through the decoder's own round API: every tile's pixels
    are the untiled decode's, bit for bit. Off the lattice (convolutions as picked per shape) they are
    not."""
    from dataclasses import replace

    spec = synth_spec(NAME, seed=0, dtype="float32")
    cls = decoder_class(spec)
    decoder = cls.load(spec, "cpu")
    latent = torch.randn(4, 3, 32, 32, generator=torch.Generator().manual_seed(3))
    geometry = replace(cls.geometry_for_spec(spec), halo=12)
    plan = plan_shot("s", (4, 3, 32, 32), geometry, TileGrid((1, 2, 2), (0, 0, 0)))
    assert {t.decode_origin()[1] % 8 for t in plan.tiles} == {0, 4}
    whole = decoder.decode(latent, origin=(0, 0, 0))
    for where, pixels in tiles_in_rounds(decoder, latent, plan):
        assert torch.equal(pixels, whole[(slice(None), *where)]), where
    uninstall(decoder.model)
    whole = decoder.decode(latent, origin=(0, 0, 0))
    assert any(not torch.equal(pixels, whole[(slice(None), *where)])
               for where, pixels in tiles_in_rounds(decoder, latent, plan))  # fmt: skip
