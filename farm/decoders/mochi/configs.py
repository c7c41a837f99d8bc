"""Mochi's named VAE configs (diffusers' `AutoencoderKLMochi` arguments).

The released VAE (Mochi 1 preview) is the class's defaults: diffusers'
``scripts/convert_mochi_to_diffusers.py`` builds it as ``AutoencoderKLMochi(latent_channels=12,
out_channels=3)`` (decoder widths 128/256/512/768, 3/3/4/6/3 resnets, time expanded 3x then 2x, space
2x three times, per-channel ``latents_mean`` / ``latents_std``, scaling factor 1.0).
"""

from __future__ import annotations

# The released structure at 32 channels a block (its GroupNorms have 32 groups), one resnet a block; 12
# latent channels, the released statistics, as MochiPipeline reshapes them to 12 channels.
MOCHI_TINY = {
    "encoder_block_out_channels": [32, 32, 32, 32],
    "decoder_block_out_channels": [32, 32, 32, 32],
    "layers_per_block": [1, 1, 1, 1, 1],
}
