"""The ``diffusers`` family: a diffusers video VAE farm has no family for (here `AutoencoderKLMagvit`, at a
tiny config, seeded weights saved as a diffusers folder), named by its class and read from the folder,
against diffusers' own decode (float32, CPU): the render of a real local cluster equals ``vae.decode``
to the last 8-bit level; its shots decode untiled unless the spec gives a halo, and `farm plan` says so;
a class that is not a diffusers video VAE is refused in one line.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from farm.decoders import decoder_class, spec_from_json
from farm.errors import FarmError
from farm.inputs.synthetic import smooth_latent
from farm.planning.tiling import TileGrid, plan_shot
from tests.helpers import ingest_and_render, levels

pytestmark = pytest.mark.model

CONFIG = {"latent_channels": 4, "block_out_channels": [8, 16, 16, 16], "layers_per_block": 1,
          "norm_num_groups": 4}  # fmt: skip
LATENT = (4, 3, 4, 6)


@pytest.fixture
def magvit(tmp_path):
    """A seeded tiny `AutoencoderKLMagvit` saved as a diffusers folder, and the model."""
    from diffusers import AutoencoderKLMagvit

    torch.manual_seed(7)
    model = AutoencoderKLMagvit(**CONFIG).eval()
    generator = torch.Generator().manual_seed(7)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.02 * torch.randn(p.shape, generator=generator))
    model.save_pretrained(tmp_path / "vae")
    return tmp_path / "vae", model


def spec(folder, **extra):
    return spec_from_json({"family": "diffusers", "class": "AutoencoderKLMagvit",
                           "weights": {"path": str(folder)}, **extra})  # fmt: skip


def test_render_equals_diffusers_decode(tmp_path, scheduler3, magvit):
    folder, model = magvit
    latent = smooth_latent(np.random.default_rng(2), LATENT)
    with torch.inference_mode():
        want = levels(model.decode(torch.from_numpy(latent)[None], return_dict=False)[0][0])
    assert want.shape == (9, 32, 48, 3) and want.std() > 5
    decoder = {"family": "diffusers", "class": "AutoencoderKLMagvit", "dtype": "float32"}
    (got,) = ingest_and_render(tmp_path, latent, decoder, folder, scheduler3, [((1, 1, 1), None)],
                               latents="denormalized")  # fmt: skip
    diff = np.abs(got.astype(np.int16) - want.astype(np.int16))
    assert diff.max() <= 1 and (diff > 0).mean() < 1e-3, (diff.max(), (diff > 0).mean())


def test_config_comes_from_the_folder_and_shapes_from_the_class(magvit):
    folder, _ = magvit
    s = spec(folder)
    assert s.config["block_out_channels"] == [8, 16, 16, 16] and s.extra["class"] == "AutoencoderKLMagvit"
    cls = decoder_class(s)
    g = cls.geometry_for_spec(s)
    assert (g.spatial_scale, g.temporal_scale, g.causal) == (8, 4, True) and g.whole_time and g.whole_space
    assert g.pixel_shape(LATENT[1:]) == (9, 32, 48)
    assert spec_from_json(s.to_json()).config == s.config  # the job records the config


def test_untiled_unless_the_spec_gives_a_halo(magvit):
    from farm.planning.plan_table import describe_plans

    folder, _ = magvit
    s = spec(folder)
    geometry = decoder_class(s).geometry_for_spec(s)
    for tiles in ((2, 1, 1), (1, 2, 2)):
        with pytest.raises(FarmError, match="decodes a shot whole along"):
            plan_shot("s", (4, 5, 8, 8), geometry, TileGrid(tiles, (1, 1, 1)))
    plan = plan_shot("s", (4, 5, 8, 8), geometry)
    assert "each shot decodes untiled" in describe_plans([plan], s, 1)
    halo = spec(folder, halo=2)
    geometry = decoder_class(halo).geometry_for_spec(halo)
    plan = plan_shot("s", (4, 5, 8, 8), geometry, TileGrid((1, 2, 2), (0, 1, 1)))
    assert {max(t.halo) for t in plan.tiles} == {2}
    assert "the spec's halo of 2" in describe_plans([plan], halo, 1)


@pytest.mark.parametrize("name, why", [
    ("AutoencoderKL", "its vae.decode of video latents"),  # an image VAE: 2-D convolutions
    ("AutoencoderKLAllegro", "Decoding without tiling"),  # decodes only through its own tiling
    ("UNet2DModel", "is not a diffusers video VAE class"),
    ("NoSuchClass", "is not a diffusers video VAE class"),
])  # fmt: skip
def test_a_class_that_is_not_a_video_vae_is_refused(name, why):
    s = spec_from_json({"family": "diffusers", "class": name, "config": CONFIG,
                        "weights": {"random_seed": 0}})  # fmt: skip
    with pytest.raises(FarmError, match=why) as refused:
        decoder_class(s).geometry_for(s.config)
    assert "\n" not in str(refused.value)


def test_normalized_latents_and_a_folder_without_config_are_refused(tmp_path, magvit):
    folder, _ = magvit
    with pytest.raises(FarmError, match='use "latents": "denormalized"'):
        decoder_class(spec(folder)).check_spec(spec(folder, latents="normalized"))
    (tmp_path / "bare").mkdir()
    with pytest.raises(FarmError, match="config.json"):
        spec(tmp_path / "bare")
    with pytest.raises(FarmError, match='needs "class"'):
        spec_from_json({"family": "diffusers", "weights": {"path": str(folder)}})
