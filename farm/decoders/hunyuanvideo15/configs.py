"""HunyuanVideo 1.5's named VAE configs (diffusers' `AutoencoderKLHunyuanVideo15` arguments).

The released VAE (tencent/HunyuanVideo-1.5 ``vae/``) is diffusers' default constructor: diffusers'
``scripts/convert_hunyuan_video1_5_to_diffusers.py`` builds ``AutoencoderKLHunyuanVideo15()`` and loads
the converted weights strictly (128/256/512/1024/1024 channels, 2 layers a block, 32 latent channels,
16x spatial and 4x temporal compression, scaling factor 1.03682).
"""

from __future__ import annotations

# The same classes at a few channels, with the released compression (16x, 4x: five levels, the last
# without upsampling). The decoder's first width (16) is a multiple of the latent channels (its input
# shortcut repeats them), and each upsampler's output channels divide its input's times its factor.
HUNYUANVIDEO15_TINY = {
    "latent_channels": 4,
    "block_out_channels": [8, 8, 16, 16, 16],
    "layers_per_block": 1,
}
