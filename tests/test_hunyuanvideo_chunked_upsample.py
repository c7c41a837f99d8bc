"""HunyuanVideo's causal upsamplers in channel blocks (`chunked_upsample`) compute what diffusers' computes,
bit for bit, and every HunyuanVideo model farm loads uses them.

One interpolation past 2^32 output elements handed NaN on to the convolution on an H100, which only a GPU
of that size shows; here the limit per call is lowered so that several blocks run on a CPU.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from farm.decoders import FAMILIES
from farm.decoders.hunyuanvideo import chunked_upsample
from farm.inputs.synthetic import synth_spec

pytestmark = pytest.mark.model


def count_interpolations(monkeypatch) -> list[int]:
    """The output elements of each ``F.interpolate`` call from now on."""
    sizes: list[int] = []
    interpolate = F.interpolate

    def counted(*args, **kwargs):
        out = interpolate(*args, **kwargs)
        sizes.append(out.numel())
        return out

    monkeypatch.setattr(F, "interpolate", counted)
    return sizes


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_an_upsampler_in_channel_blocks_equals_diffusers_forward(monkeypatch, dtype):
    model = FAMILIES["hunyuanvideo"].build(synth_spec("hunyuanvideo-tiny", seed=1)).to(dtype)
    upsampler = next(u for b in model.decoder.up_blocks for u in (b.upsamplers or ()))
    channels = upsampler.conv.conv.in_channels
    x = torch.randn(1, channels, 3, 5, 7, generator=torch.Generator().manual_seed(2)).to(dtype)
    with torch.inference_mode():
        want = upsampler(x)
        sizes = count_interpolations(monkeypatch)
        per_channel = (1 + 2 * upsampler.upsample_factor[0]) * 5 * 7 * upsampler.upsample_factor[1] ** 2
        got = chunked_upsample.upsample_causal(upsampler, x, limit=3 * per_channel)
    blocks = -(-channels // 3)
    assert len(sizes) == 2 * blocks and max(sizes) <= 3 * per_channel
    assert torch.equal(got, want)


def test_loaded_hunyuanvideo_upsamples_in_blocks_and_decodes_as_diffusers(monkeypatch):
    cls = FAMILIES["hunyuanvideo"]
    spec = synth_spec("hunyuanvideo-tiny", seed=2)
    reference = cls.build(spec)
    reference.use_framewise_decoding = False  # the untiled decode, as farm decodes a tile
    decoder = cls.load(spec, "cpu")
    upsamplers = [u for b in decoder.model.decoder.up_blocks for u in (b.upsamplers or ())]
    assert upsamplers and all(u.forward.__func__ is chunked_upsample.upsample_causal for u in upsamplers)

    latent = torch.randn(1, 4, 3, 4, 6, generator=torch.Generator().manual_seed(8))
    monkeypatch.setattr(chunked_upsample.upsample_causal, "__defaults__", (16384,))  # several blocks a call
    with torch.inference_mode():
        want = reference.decode(latent, return_dict=False)[0]
        sizes = count_interpolations(monkeypatch)
        got = decoder.model.decode(latent, return_dict=False)[0]
    assert len(sizes) > 2 * len(upsamplers) and max(sizes) <= 16384
    torch.testing.assert_close(got, want, rtol=0, atol=1e-5)
