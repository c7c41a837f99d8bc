"""Cosmos 1.0's named VAE configs (diffusers' `AutoencoderKLCosmos` arguments).

The released tokenizer, nvidia/Cosmos-1.0-Tokenizer-CV8x8x8 (the VAE of the Cosmos-1.0-Diffusion
Text2World and Video2World models), is diffusers' default constructor: diffusers'
``scripts/convert_cosmos_to_diffusers.py`` (``VAE_CONFIGS["CV8x8x8-1.0"]``) builds it with 16 latent
channels, decoder blocks 256/512/512/512, 2 layers, Haar patches of 4, 8x spatial and 8x temporal
compression, and the tokenizer's ``mean_std.pt`` as ``latents_mean`` / ``latents_std``: 16 channels x 16
latent frames each, channel-major, which the class's defaults hold.
"""

from __future__ import annotations

# The same classes at a few channels, with the released structure (Haar patches of 4, one temporal and
# spatial upsampler, attention in the middle block only, 8x / 8x) and statistics per channel and latent
# frame as the release has them (4 channels x 16 frames), away from 0 and 1 so that un-normalising shows.
COSMOS_TINY = {
    "latent_channels": 4,
    "encoder_block_out_channels": [8, 16, 16, 16],
    "decode_block_out_channels": [16, 16, 16, 16],
    "num_layers": 1,
    "latents_mean": [round(0.05 * ((7 * i) % 11 - 5), 3) for i in range(64)],
    "latents_std": [round(0.6 + 0.1 * ((5 * i) % 9), 3) for i in range(64)],
}
