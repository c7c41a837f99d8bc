"""LTX-2.5's split video VAE file (``ltx-2.5-video-vae-bf16.safetensors``): its diffusion decoder in
Lightricks' own layout, as ltx-core 1.2.0 reads it (fused Q/K/V projections, static gates folded into
their projections, the timestep MLP under the reference's names, preview heads, the encoder and the latent
statistics beside it, a ``config`` JSON in the metadata), written here for the tiny config, decodes as the
same weights in diffusers' layout; a file saved for another config is refused before anything loads."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import save_file

from farm.decoders import checkpoints as C
from farm.decoders import decoder_class, load_decoder, spec_from_json
from farm.decoders.ltx2_diffusion import LTX2DiffusionDecoder
from farm.decoders.ltx2_diffusion.layout import LTX_DIFFUSION_GATES
from farm.errors import FarmError

pytestmark = pytest.mark.model
TINY = {"family": "ltx2-diffusion", "config": "ltx2-diffusion-tiny"}
GATED = (".attn.proj.", ".mlp.w_down.", ".context_proj.")


def tiny_model():
    spec = spec_from_json({**TINY, "weights": {"random_seed": 3}})
    cls = decoder_class(spec)
    model = cls.build(spec)
    model.latents_mean.copy_(torch.linspace(-0.5, 0.5, model.latents_mean.numel()))
    model.latents_std.copy_(torch.linspace(0.5, 2.0, model.latents_std.numel()))
    return spec, cls, model


def lightricks_file(path, spec, cls, model, *, prefix: str = "", config: dict | None = None) -> None:
    """`model`'s decoder as Lightricks ships it: ltx-core's module names, each attention's Q/K/V fused
    into one ``qkv`` tensor, the diffusion blocks' projections stored divided by a static gate (powers
    of two, so folding them back is exact), the timestep MLP as ``t_embedder.mlp.{0,2}``; with an encoder
    tensor, a preview head and the latent statistics beside it."""
    full = cls._full_config(spec.config)
    state = {LTX2DiffusionDecoder.original_name(k, "ltx-original", full): v.detach().clone()
             for k, v in model.state_dict().items()}  # fmt: skip
    out: dict[str, torch.Tensor] = {}
    for name, value in state.items():
        if ".attn.qkv.to_q." in name:
            leaf = name.rsplit(".", 1)[1]
            parts = [state[name.replace(".to_q.", f".to_{p}.")] for p in "qkv"]
            out[name.replace("qkv.to_q." + leaf, "qkv." + leaf)] = torch.cat(parts)
        elif ".attn.qkv.to_" in name:
            continue
        elif name.startswith("decoder.diff_blocks.") and any(g in name for g in GATED):
            out[name] = value
        else:
            for module, reference in (("linear_1.", "mlp.0."), ("linear_2.", "mlp.2.")):
                name = name.replace("t_embedder.timestep_embedder." + module, "t_embedder." + reference)
            out[name] = value
    for block in range(len(model.decoder.diff_blocks)):
        for projection, suffix in LTX_DIFFUSION_GATES.items():
            stem = f"decoder.diff_blocks.{block}"
            weight = out[f"{stem}{projection}weight"]
            gate = 2.0 ** torch.randint(
                -2, 3, (weight.shape[0],), generator=torch.Generator().manual_seed(block)
            )
            out[f"{stem}{suffix}"] = gate
            for leaf in ("weight", "bias"):
                if f"{stem}{projection}{leaf}" in out:
                    value = out[f"{stem}{projection}{leaf}"]
                    out[f"{stem}{projection}{leaf}"] = value / (gate[:, None] if value.ndim == 2 else gate)
    out |= {"decoder.coarse_head.weight": torch.ones(3, 8), "encoder.conv_in.weight": torch.ones(4, 3),
            "per_channel_statistics.mean-of-stds": torch.ones(8)}  # fmt: skip
    metadata = {"config": json.dumps({"vae": config})} if config is not None else None
    save_file({prefix + k: v.contiguous() for k, v in out.items()}, str(path), metadata=metadata)


def released_config(full: dict) -> dict:
    """The metadata ``config`` → ``vae`` of a CausalDiffusionVAE file, for the tiny config."""
    return {"_class_name": "CausalDiffusionVAE", "model_output_type": full["decoder_model_output_type"],
            "decoder": {"stage_channels": full["decoder_stage_channels"],
                        "stage_depths": full["decoder_stage_depths"],
                        "stage_kernels": [*full["decoder_stage_kernels"], full["decoder_stage5_kernel"]],
                        "stage5_kernel": full["decoder_stage5_kernel"], "head_dim": full["decoder_head_dim"],
                        "patch_size": full["patch_size"],
                        "timestep_scale_multiplier": full["decoder_timestep_scale_multiplier"]}}  # fmt: skip


@pytest.mark.parametrize("prefix", ["", "vae."])
def test_lightricks_split_file_decodes_as_the_same_weights(tmp_path, prefix):
    spec, cls, model = tiny_model()
    path = tmp_path / "ltx-2.5-video-vae-bf16.safetensors"
    lightricks_file(
        path, spec, cls, model, prefix=prefix, config=released_config(cls._full_config(spec.config))
    )
    infos = C.read_tensor_infos([path])
    assert C.detect_layout(infos, LTX2DiffusionDecoder, "x") == C.Layout("ltx-original", prefix)
    raw = {**TINY, "weights": {"path": str(path)}, "latents": "normalized"}
    assert cls.check_weights(spec_from_json(raw)).weights["layout"] == "ltx-original"  # headers only
    from_file = load_decoder(raw)
    for name, value in model.state_dict().items():  # gates folded back exactly, Q/K/V split
        assert torch.equal(from_file.model.state_dict()[name], value), name
    z = torch.randn(8, 2, 3, 3, generator=torch.Generator().manual_seed(1))
    same = load_decoder({**TINY, "weights": {"random_seed": 3}, "latents": "normalized"})
    same.model.load_state_dict(model.state_dict())
    assert torch.equal(from_file.decode(z, (0, 0, 0)), same.decode(z, (0, 0, 0)))


def test_a_file_saved_for_another_config_is_refused(tmp_path):
    spec, cls, model = tiny_model()
    config = released_config(cls._full_config(spec.config))
    config["decoder"]["timestep_scale_multiplier"] = 1.0
    path = tmp_path / "vae.safetensors"
    lightricks_file(path, spec, cls, model, config=config)
    with pytest.raises(FarmError, match=r"another diffusion decoder config: timestep_scale_multiplier 1\.0"):
        load_decoder({**TINY, "weights": {"path": str(path)}})


def test_diffusers_layout_is_still_read_as_it_is(tmp_path):
    spec, cls, model = tiny_model()
    path = tmp_path / "diffusers.safetensors"
    save_file({k: v.contiguous() for k, v in model.state_dict().items()}, str(path))
    assert C.detect_layout(C.read_tensor_infos([path]), LTX2DiffusionDecoder, "x").name == "diffusers"
    raw = {**TINY, "weights": {"path": str(path)}}
    assert cls.check_weights(spec_from_json(raw)).weights["layout"] == "diffusers"
    assert torch.equal(load_decoder(raw).model.decoder.conv_in.weight, model.decoder.conv_in.weight)
