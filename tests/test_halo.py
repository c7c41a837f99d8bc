"""The spatial halo and the temporal context each released config records, held by tests.

A tiny config's shallow depth says nothing about the released one's reach, so the released values are
tied to narrow models of the released depth (the released layers, a few channels each: the reach is the
layers', not the widths'), decoded in float32 on the CPU the way workers decode tiles (`decode_block`,
`drop_context`, the tile's ramps, summed in tile order) and compared with the untiled decode:

* the halo and context recorded for bfloat16 must bring the tiles to bfloat16's floor (≥ 50 dB over the
  band 16 pixels or 8 frames either side of each seam, no pixel more than 8 levels off);
* the float32 ones, and the receptive field the temporal context falls back to, to float32's (≥ 70 dB).

Cutting a recorded value (the mutation that once took `ltx2`'s context from 22 frames to 2 unnoticed)
fails here. Random weights make activations larger and seams wider than trained weights do.

CogVideoX's and Mochi's bf16 contexts (8 and 16) are measured on the released configs
(docs/fidelity.md); narrow models of their depth land at the floor's edge there (CogVideoX at 8: 57.5 dB
and a pixel 8.8 levels off; Mochi at 16 on a 4x4 latent: 49.2 dB), so only their float32 receptive fields
are held here.
"""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np
import pytest
import torch

from farm.decoders import decoder_class
from farm.decoders.base import DecoderSpec
from farm.decoders.cogvideox import CogVideoXDecoder
from farm.decoders.ltx2 import LTX2_3, LTX2_RELEASED, LTX2Decoder
from farm.decoders.mochi import MochiDecoder
from farm.planning.tiling import TileGrid, plan_shot
from farm.worker.tasks import decode_block, drop_context

BF16_FLOOR = (50.0, 8.0)  # dB over the seam band, worst pixel in levels
FP32_FLOOR = (70.0, 8.0)
NARROW = {  # the released depth, a few channels: family, config
    "ltx2": ("ltx2", {**LTX2_RELEASED, "latent_channels": 8, "decoder_block_out_channels": [8, 16, 32]}),
    "ltx2.3": ("ltx2", {**LTX2_3, "latent_channels": 8, "decoder_block_out_channels": [8, 16, 16, 32]}),
    # the released layers per block (3 and 3/3/4/6/3), narrow blocks
    "cogvideox": ("cogvideox", {"block_out_channels": [8, 16, 16, 32], "latent_channels": 4,
                                "norm_num_groups": 4}),
    "mochi": ("mochi", {"decoder_block_out_channels": [32] * 4, "encoder_block_out_channels": [32] * 4}),
}


def narrow_decoder(name: str):
    torch.manual_seed(0)
    family, config = NARROW[name]
    spec = DecoderSpec(family, None, config, {"random_seed": 0}, "float32")
    cls = decoder_class(spec)
    return cls.load(spec, "cpu")


def tiled_against_whole(decoder, latent: torch.Tensor, grid: TileGrid) -> tuple[float, float]:
    """Seam-band PSNR (uint8 levels) and worst pixel of the plan's tiles against the whole decode."""
    plan = plan_shot("s", latent.shape, decoder.geometry, grid)
    whole = decoder.decode(latent, origin=(0, 0, 0)).float()
    tiled = torch.zeros_like(whole)
    for tile in plan.tiles:
        block = latent[(slice(None), *tile.decode_slices())]
        pixels = drop_context(decode_block(decoder, block, plan.chunk, tile.decode_origin()).float(), tile,
                              decoder.geometry)  # fmt: skip
        wf, wh, ww = (torch.tensor(s.weights, dtype=torch.float32) for s in tile.pixels)
        (f0, f1), (h0, h1), (w0, w1) = ((s.start, s.stop) for s in tile.pixels)
        tiled[:, f0:f1, h0:h1, w0:w1] += pixels * wf.view(-1, 1, 1) * wh.view(1, -1, 1) * ww.view(1, 1, -1)
    band = np.zeros(whole.shape[1:], dtype=bool)
    for tile in plan.tiles:
        for axis, reach in ((0, 8), (1, 16), (2, 16)):
            for edge in (tile.pixels[axis].start, tile.pixels[axis].stop):
                if 0 < edge < whole.shape[axis + 1]:
                    index = [slice(None)] * 3
                    index[axis] = slice(max(0, edge - reach), edge + reach)
                    band[tuple(index)] = True
    diff = ((tiled.clamp(0, 1) - whole.clamp(0, 1)) * 255).numpy()[:, band]
    mse = float((diff**2).mean())
    return (math.inf if mse == 0 else 10 * math.log10(255.0**2 / mse)), float(np.abs(diff).max())


def latent_for(decoder, fhw: tuple[int, int, int]) -> torch.Tensor:
    rng = np.random.default_rng(1)
    return torch.from_numpy(rng.standard_normal((decoder.latent_channels, *fhw)).astype(np.float32))


@pytest.mark.parametrize(("name", "dtype", "floor"), [
    ("ltx2", "bfloat16", BF16_FLOOR), ("ltx2", "float32", FP32_FLOOR), ("ltx2.3", "bfloat16", BF16_FLOOR),
])  # fmt: skip
def test_the_recorded_halo_reaches_the_floor_at_the_released_depth(name, dtype, floor):
    decoder = narrow_decoder(name)
    halo = LTX2Decoder.spatial_halo[name][dtype]
    decoder.geometry = replace(decoder.geometry, halo=halo)
    # two tiles side by side, each far wider than the halo: the halo, not the frame's edge, bounds them
    latent = latent_for(decoder, (2, 4, 4 * halo + 8))
    band_db, worst = tiled_against_whole(decoder, latent, TileGrid((1, 1, 2)))
    assert band_db >= floor[0] and worst <= floor[1], (name, dtype, halo, band_db, worst)


@pytest.mark.parametrize(("name", "context", "floor"), [
    ("ltx2", LTX2Decoder.measured_context["ltx2"]["bfloat16"], BF16_FLOOR),
    ("ltx2", LTX2Decoder.temporal_context["ltx2"], FP32_FLOOR),
    ("ltx2.3", LTX2Decoder.measured_context["ltx2.3"]["bfloat16"], BF16_FLOOR),
    ("ltx2.3", LTX2Decoder.temporal_context["ltx2.3"], FP32_FLOOR),
    # their convolutions' counted reach, which float32 decodes (bf16's measured 8 and 16: docs/fidelity.md)
    ("cogvideox", CogVideoXDecoder.temporal_context["cogvideox"], FP32_FLOOR),
    ("mochi", MochiDecoder.temporal_context["mochi"], FP32_FLOOR),
])  # fmt: skip
def test_the_recorded_context_reaches_the_floor_at_the_released_depth(name, context, floor):
    decoder = narrow_decoder(name)
    before, after = context
    decoder.geometry = replace(decoder.geometry, context=before, lookahead=after, halo=0)
    frames = 2 * max(before, after) + 8  # neither tile's context reaches the shot's far end
    band_db, worst = tiled_against_whole(decoder, latent_for(decoder, (frames, 2, 2)), TileGrid((2, 1, 1)))
    assert band_db >= floor[0] and worst <= floor[1], (name, context, band_db, worst)


def test_a_cut_halo_falls_short_of_the_floor():
    """The test above can fail: a halo of 2 at the released depth is far from the floor."""
    decoder = narrow_decoder("ltx2")
    decoder.geometry = replace(decoder.geometry, halo=2)
    band_db, _ = tiled_against_whole(decoder, latent_for(decoder, (2, 4, 40)), TileGrid((1, 1, 2)))
    assert band_db < BF16_FLOOR[0]


@pytest.mark.parametrize("context", [None, "measured", "receptive-field"])
def test_the_receptive_field_stays_available_as_the_specs_context(tmp_path, context):
    """A bf16 LTX-2 job decodes the measured 8 frames of temporal context a side, unless its decoder spec
    asks for the whole receptive field (22), which the job records and every plan of it then uses."""
    from farm import PlanOptions
    from farm.decoders import spec_from_json
    from farm.planning.jobplan import plan_job
    from farm.store.job import create_job, open_job, write_shot

    raw = {"family": "ltx2", "config": "ltx2", "weights": {"random_seed": 0}, "dtype": "bfloat16"}
    spec = spec_from_json({**raw, **({"context": context} if context else {})})
    job = tmp_path / "job.zarr"
    create_job(job, spec)
    write_shot(job, "s", np.zeros((128, 61, 2, 2), np.float32), fps=24.0)
    recorded = open_job(job).spec
    assert recorded.to_json().get("context") == ("receptive-field" if context == "receptive-field" else None)
    plan = plan_job(open_job(job), PlanOptions(tiles=(2, 1, 1), batch_frames=8), 1)[0]
    reach = {max(t.context, t.lookahead) for t in plan.tiles}
    assert reach == ({22} if context == "receptive-field" else {8})


def test_a_context_other_than_measured_or_the_receptive_field_is_refused():
    from farm.decoders import spec_from_json
    from farm.errors import FarmError

    raw = {"family": "ltx2", "config": "ltx2-tiny", "weights": {"random_seed": 0}, "context": "all"}
    with pytest.raises(FarmError, match=r"'context' 'all' is invalid; use 'measured' .* 'receptive-field'"):
        spec_from_json(raw)
