"""VidTok's named configs (diffusers' `AutoencoderVidTok` arguments).

``vidtok`` is the class's defaults: the continuous (KL) causal tokenizer with 4x temporal and 8x8
spatial compression and 4 latent channels (base 128 channels, multipliers 1/2/4/4, 2 resnets a level),
the structure VidTok names ``vidtok_kl_causal_488_4chn``.
"""

from __future__ import annotations

# The same structure (causal convolutions, LayerNorms, a mid block attending over each frame, two temporal
# and three spatial upsamplers) at 8 base channels and one resnet a level.
VIDTOK_TINY = {"ch": 8, "num_res_blocks": 1}
