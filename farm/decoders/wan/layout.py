"""Wan's original checkpoint layouts: Wan 2.1's ``Wan2.1_VAE.pth`` (``wan-original``) and Wan 2.2 TI2V's
``Wan2.2_VAE.pth`` (``wan22-original``: residual up blocks, each a sequence of resnets and a resampler):
detection, the original names of diffusers' tensors (the inverse of diffusers'
``convert_wan_vae_to_diffusers`` for the decoder's; Wan 2.2's follow ``convert_vae_22`` in diffusers'
``scripts/convert_wan_to_diffusers.py``, which diffusers' library lacks), and which configs each layout can
name. Names only."""

from __future__ import annotations

import re
from typing import Any

from farm.errors import FarmError

WAN_ORIGINAL, WAN22_ORIGINAL = "wan-original", "wan22-original"

_WAN_RESNET_PARTS = {"norm1.gamma": "residual.0.gamma", "conv1.": "residual.2.",
                     "norm2.gamma": "residual.3.gamma", "conv2.": "residual.6.",
                     "conv_shortcut.": "shortcut."}  # fmt: skip


_WAN_UP_BLOCK = re.compile(r"decoder\.up_blocks\.(\d+)\.(resnets\.(\d+)|upsamplers\.0)\.(.*)")
_WAN_MID = re.compile(r"decoder\.mid_block\.(resnets\.(\d+)|attentions\.0)\.(.*)")
WAN_ORIGINAL_RESNETS = 3  # per up block: the converter's fixed numbering (num_res_blocks 2)


def _wan_original(name: str) -> str:
    fixed = {"decoder.conv_in.": "decoder.conv1.", "decoder.norm_out.": "decoder.head.0.",
             "decoder.conv_out.": "decoder.head.2.", "post_quant_conv.": "conv2.",
             "quant_conv.": "conv1."}  # fmt: skip
    for new, old in fixed.items():
        if name.startswith(new):
            return old + name[len(new) :]
    if m := _WAN_MID.fullmatch(name):
        if m.group(2) is None:
            return f"decoder.middle.1.{m.group(3)}"
        return f"decoder.middle.{2 * int(m.group(2))}.{_wan_resnet_part(m.group(3))}"
    if m := _WAN_UP_BLOCK.fullmatch(name):
        block = int(m.group(1)) * (WAN_ORIGINAL_RESNETS + 1)
        if m.group(3) is None:
            return f"decoder.upsamples.{block + WAN_ORIGINAL_RESNETS}.{m.group(4)}"
        return f"decoder.upsamples.{block + int(m.group(3))}.{_wan_resnet_part(m.group(4))}"
    return name


_WAN22_UP = re.compile(r"decoder\.upsamples\.\d+\.upsamples\.\d+\..*")
_WAN22_UP_BLOCK = re.compile(r"decoder\.up_blocks\.(\d+)\.(resnets\.(\d+)|upsampler)\.(.*)")


def _wan22_original(name: str, num_res_blocks: int) -> str:
    """Wan 2.2's naming: up block ``i`` is ``decoder.upsamples.i``, its resnets ``.upsamples.j`` and its
    resampler the one after them (``num_res_blocks + 1`` resnets a block); the rest is Wan 2.1's."""
    if m := _WAN22_UP_BLOCK.fullmatch(name):
        if m.group(3) is None:
            return f"decoder.upsamples.{m.group(1)}.upsamples.{num_res_blocks + 1}.{m.group(4)}"
        return f"decoder.upsamples.{m.group(1)}.upsamples.{m.group(3)}.{_wan_resnet_part(m.group(4))}"
    return _wan_original(name)


def _wan_resnet_part(rest: str) -> str:
    for new, old in _WAN_RESNET_PARTS.items():
        if rest.startswith(new):
            return old + rest[len(new) :]
    return rest


def check_layout_fits(layout: str, full_config: dict[str, Any], where: str) -> None:
    """Refuse an original layout whose fixed numbering cannot name this config's tensors."""
    if layout == WAN22_ORIGINAL and not full_config.get("is_residual"):
        raise FarmError(
            f"weights at {where} are in Wan 2.2 TI2V's original layout (residual up blocks); this config "
            "has none: use a Wan 2.2 config (wan2.2, wan2.2-tiny)"
        )
    if layout == WAN_ORIGINAL and (
        full_config.get("num_res_blocks") != 2 or full_config.get("is_residual")
    ):
        raise FarmError(
            f"weights at {where} are in Wan 2.1's original layout, which numbers 2 resnets per encoder "
            "block (3 per decoder block) and no residual up blocks; this config has num_res_blocks="
            f"{full_config.get('num_res_blocks')}: use a Wan 2.1 config (wan, wan-tiny) or a diffusers folder"
        )


def wan_layout(names: list[str]) -> str | None:
    """Which Wan original layout a checkpoint's VAE names (a file's prefix removed) are in, or None."""
    if any(n.startswith("decoder.mid_block.") for n in names):
        return None
    if not any(n.startswith("decoder.middle.") for n in names):
        return None
    return WAN22_ORIGINAL if any(_WAN22_UP.fullmatch(n) for n in names) else WAN_ORIGINAL


def wan_original_name(name: str, layout: str, full_config: dict[str, Any]) -> str:
    """The name diffusers' tensor `name` has in a Wan original layout."""
    if layout == WAN22_ORIGINAL:
        return _wan22_original(name, int(full_config["num_res_blocks"]))
    return _wan_original(name)
