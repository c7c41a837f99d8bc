"""Reflect padding by slices (`farm.decoders.reflect_pad`): the same padded tensors as ``F.pad``, so farm's
LTX-2 decoder gives diffusers' frames bit for bit, whole and in carried chunks; compiled decoders keep
``F.pad``."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from farm.decoders import load_decoder
from farm.decoders.reflect_pad import reflect_pad_hw, sliced_reflect_padding

pytestmark = pytest.mark.model

TINY_LTX2 = {"family": "ltx2", "config": "ltx2-tiny", "weights": {"random_seed": 0}, "dtype": "float32"}


@pytest.mark.parametrize(
    "shape,pad_h,pad_w",
    [((1, 3, 2, 5, 7), 1, 1), ((2, 4, 3, 6, 9), 2, 3), ((1, 1, 1, 4, 4), 0, 2), ((1, 2, 2, 5, 5), 3, 0),
     ((3, 8, 8), 1, 2)],
)  # fmt: skip
def test_slices_pad_as_f_pad(shape: tuple, pad_h: int, pad_w: int) -> None:
    x = torch.randn(shape)
    pads = (pad_w, pad_w, pad_h, pad_h) + ((0, 0) if x.dim() == 5 else ())
    assert torch.equal(reflect_pad_hw(x, pad_h, pad_w), F.pad(x, pads, mode="reflect"))


def test_padding_wider_than_the_input_is_refused() -> None:
    with pytest.raises(ValueError, match="needs more than that many rows and columns, got 2x5"):
        reflect_pad_hw(torch.zeros(1, 1, 1, 2, 5), 2, 1)


def test_only_spatial_reflect_padding_changes() -> None:
    model = torch.nn.Sequential(
        torch.nn.Conv3d(2, 2, 3, padding=(0, 1, 1), padding_mode="reflect"),
        torch.nn.Conv3d(2, 2, 3, padding=(1, 1, 1), padding_mode="reflect"),  # pads time: F.pad's
        torch.nn.Conv3d(2, 2, 3, padding=(0, 1, 1)),  # zeros
        torch.nn.Conv2d(2, 2, 3, padding=1, padding_mode="reflect"),
    )
    x = torch.randn(1, 2, 5, 6, 7)
    before = model[2](model[1](model[0](x)))
    assert sliced_reflect_padding(model) == 1
    assert "_conv_forward" in model[0].__dict__
    assert all("_conv_forward" not in m.__dict__ for m in model[1:])
    assert torch.equal(model[2](model[1](model[0](x))), before)
    assert sliced_reflect_padding(model, on=False) == 1
    assert "_conv_forward" not in model[0].__dict__


def test_farm_ltx2_decoder_gives_diffusers_frames_bit_for_bit() -> None:
    """farm's decoder pads by slices as loaded; with diffusers' own padding put back, the same frames,
    whole and in carried chunks."""
    decoder = load_decoder(TINY_LTX2, "cpu")
    assert any("_conv_forward" in m.__dict__ for m in decoder.model.modules())
    torch.manual_seed(0)
    z = torch.randn(decoder.latent_channels, 5, 4, 6)
    ours = decoder.decode(z)
    first, state = decoder.decode_carried(z[:, :2], None)
    second, _ = decoder.decode_carried(z[:, 2:], state)
    sliced_reflect_padding(decoder.model, on=False)
    assert not any("_conv_forward" in m.__dict__ for m in decoder.model.modules())
    assert torch.equal(ours, decoder.decode(z))
    first_ref, state_ref = decoder.decode_carried(z[:, :2], None)
    second_ref, _ = decoder.decode_carried(z[:, 2:], state_ref)
    assert torch.equal(first, first_ref) and torch.equal(second, second_ref)


def test_compiled_decoders_keep_f_pad() -> None:
    """torch.compile fuses F.pad's reflect padding into one kernel: a compiled decoder is traced with it."""
    decoder = load_decoder(TINY_LTX2, "cpu")
    decoder.enable_compile()  # lazy: nothing compiles until a decode
    assert not any("_conv_forward" in m.__dict__ for m in decoder.model.modules())
