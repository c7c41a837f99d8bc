"""MiniMax-H3's named video VAE configs (diffusers' `AutoencoderKLMiniMaxH3` arguments)."""

from __future__ import annotations

# The released VAE is the class's defaults (diffusers 0.42.1, whose docstrings describe the released
# checkpoint: reflect padding, 16x spatial and 4x temporal compression, a 36-layer ViT decoder of 32 heads
# of 64, 17-frame clips with 3 latent frames dropped per clip). diffusers ships no conversion script for it;
# the released folder's config.json carries the latent statistics (the defaults are 0 and 1).
MINIMAX_H3: dict = {}

# The same class and code paths (16x16x4 patches, so diffusers' 256-px tiles and 17-frame clips are cut as
# for the real model) at a few channels: a 2-layer ViT of 2 heads of 16; latent statistics away from 0 / 1
# so that un-normalising latents shows.
MINIMAX_H3_TINY = {
    "latent_channels": 4,
    "block_out_channels": [8, 8, 8, 8, 8, 8],
    "layers_per_block": 1,
    "norm_num_groups": 4,
    "decoder_num_layers": 2,
    "decoder_num_attention_heads": 2,
    "decoder_attention_head_dim": 16,
    "decoder_num_register_tokens": 2,
    "decoder_ffn_mult": 2,
    "latents_mean": [0.1, -0.2, 0.05, 0.3],
    "latents_std": [0.8, 1.2, 0.9, 1.1],
}
