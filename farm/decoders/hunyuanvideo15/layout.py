"""HunyuanVideo 1.5's original checkpoint layout (``hunyuanvideo15-original``): the release's
``vae/diffusion_pytorch_model.safetensors`` in tencent/HunyuanVideo-1.5, named as its own code names the
modules (``decoder.mid.block_1``, ``decoder.mid.attn_1.q``, ``decoder.up.N.block.M``,
``decoder.up.N.upsample``). Detection and the original name of each diffusers decoder tensor: the inverse
of ``convert_hunyuan_video_15_vae_checkpoint_to_diffusers`` in diffusers'
``scripts/convert_hunyuan_video1_5_to_diffusers.py`` (diffusers' library has no converter). Names only."""

from __future__ import annotations

import re

HUNYUANVIDEO15_ORIGINAL = "hunyuanvideo15-original"

_MID_RESNET = re.compile(r"decoder\.mid_block\.resnets\.(\d+)\.(.*)")
_MID_ATTENTION = re.compile(r"decoder\.mid_block\.attentions\.0\.(norm|to_q|to_k|to_v|proj_out)\.(.*)")
_UP_RESNET = re.compile(r"decoder\.up_blocks\.(\d+)\.resnets\.(\d+)\.(.*)")
_UP_SAMPLER = re.compile(r"decoder\.up_blocks\.(\d+)\.upsamplers\.0\.(.*)")
_ATTENTION_PARTS = {"norm": "norm", "to_q": "q", "to_k": "k", "to_v": "v", "proj_out": "proj_out"}


def hunyuanvideo15_layout(names: list[str]) -> str | None:
    """The original layout when a checkpoint's VAE names (a file's prefix removed) are in it, else None."""
    if any(n.startswith(("decoder.up_blocks.", "decoder.mid_block.")) for n in names):
        return None
    if any(n.startswith("decoder.mid.attn_1.") for n in names) and any(
        n.startswith("decoder.up.") for n in names
    ):
        return HUNYUANVIDEO15_ORIGINAL
    return None


def hunyuanvideo15_original_name(name: str) -> str:
    """The name diffusers' decoder tensor `name` has in the original layout (conv_in, norm_out and conv_out
    keep theirs)."""
    if m := _MID_RESNET.fullmatch(name):
        return f"decoder.mid.block_{int(m.group(1)) + 1}.{m.group(2)}"
    if m := _MID_ATTENTION.fullmatch(name):
        return f"decoder.mid.attn_1.{_ATTENTION_PARTS[m.group(1)]}.{m.group(2)}"
    if m := _UP_RESNET.fullmatch(name):
        return f"decoder.up.{m.group(1)}.block.{m.group(2)}.{m.group(3)}"
    if m := _UP_SAMPLER.fullmatch(name):
        return f"decoder.up.{m.group(1)}.upsample.{m.group(2)}"
    return name
