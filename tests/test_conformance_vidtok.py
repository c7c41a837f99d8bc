"""VidTok against its reference: diffusers 0.42.1's `AutoencoderVidTok` (the continuous causal tokenizer),
loaded from a diffusers folder (``save_pretrained``, seeded random weights), decoded by its own
``vae.decode`` (tiling off: the whole latent in one pass, the first 3 frames dropped), float32 on a CPU.

farm ingests the latents with the tiny named config and those weights and renders them on a real cluster:
untiled, and split in two in time at the recorded context, the frames equal ``vae.decode``'s to the last
8-bit level. Specs VidTok cannot decode (non-causal configs, normalized latents) are refused by name.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from farm.decoders import FAMILIES, spec_from_json
from farm.errors import FarmError
from farm.inputs.synthetic import smooth_latent
from farm.planning.tiling import TileGrid, plan_shot
from tests.helpers import ingest_and_render, levels
from tests.test_conformance_wan_hunyuan import assert_same_levels, seeded

pytestmark = pytest.mark.model

NAME = "vidtok-tiny"
FRAMES = 80  # latent frames: 317 pixel frames, two temporal tiles longer than the context


def test_vidtok_folder_renders_as_its_decode(tmp_path, scheduler3):
    from diffusers import AutoencoderVidTok

    cls = FAMILIES["vidtok"]
    seeded(AutoencoderVidTok, cls.named_configs[NAME]).save_pretrained(tmp_path / "vae")
    reference = AutoencoderVidTok.from_pretrained(tmp_path / "vae").eval()
    latent = smooth_latent(np.random.default_rng(3), (4, FRAMES, 4, 6))
    with torch.inference_mode():
        want = levels(reference.decode(torch.from_numpy(latent)[None])[0])
    assert want.shape == (1 + 4 * (FRAMES - 1), 32, 48, 3) and want.std() > 10

    spec = spec_from_json({"family": "vidtok", "config": NAME, "weights": {"path": str(tmp_path / "vae")}})
    plan = plan_shot("x", (4, FRAMES, 4, 6), cls.geometry_for_spec(spec), TileGrid((2, 1, 1), (1, 0, 0)))
    later = max(plan.tiles, key=lambda t: t.latent[0].start)
    assert later.latent[0].start - later.context > 0  # the context, not the shot's start, bounds the tile
    grids = [((1, 1, 1), None), ((2, 1, 1), (1, 0, 0))]
    decoder = {"family": "vidtok", "config": NAME}
    untiled, temporal = ingest_and_render(tmp_path, latent, decoder, tmp_path / "vae", scheduler3, grids,
                                          latents="denormalized")  # fmt: skip
    assert_same_levels(untiled, want)
    assert_same_levels(temporal, want)


NON_CAUSAL = {**FAMILIES["vidtok"].named_configs[NAME], "is_causal": False}


@pytest.mark.parametrize(
    ("over", "message"),
    [({"config": NON_CAUSAL}, "causal VidTok configs only"),
     ({"latents": "normalized"}, "no normalisation to undo")],
)  # fmt: skip
def test_specs_vidtok_cannot_decode_are_refused(over, message):
    spec = spec_from_json({"family": "vidtok", "config": NAME, "weights": {"random_seed": 0}, **over})
    with pytest.raises(FarmError, match=message):
        FAMILIES["vidtok"].load(spec, "cpu")
