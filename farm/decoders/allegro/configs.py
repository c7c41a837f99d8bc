"""Allegro's named VAE configs (diffusers' `AutoencoderKLAllegro` arguments).

The released VAE (rhymes-ai/Allegro's ``vae/``, which diffusers' docs load with ``from_pretrained``) is
taken as the class's defaults: decoder blocks 128/256/512/512, 2 layers, 4 latent channels, time doubled
in the second and third up blocks (4x), space in the first three (8x), ``scaling_factor`` 0.13, and
``sample_size`` 320 (diffusers' decode tiles of 24 x 320 x 320 pixels).
"""

from __future__ import annotations

# The released structure (four up blocks, two of them doubling time, a mid block with spatial attention,
# temporal convolutions whose GroupNorms see the whole clip) at a few channels. ``sample_size`` 128 sets
# diffusers' decode tile to 24 x 128 x 128 pixels, 6 x 16 x 16 latents (its 120 / 80 pixel overlaps, fixed
# in the class, need a tile wider than 120 pixels).
ALLEGRO_TINY = {
    "block_out_channels": [8, 16, 16, 16],
    "latent_channels": 4,
    "layers_per_block": 1,
    "norm_num_groups": 4,
    "sample_size": 128,
}
