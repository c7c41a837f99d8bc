"""An LTX single file's vocoder, as its ``config`` metadata says (``config`` → ``vocoder``, the form
Lightricks' ltx-core reads), against a farm audio spec's vocoder config (diffusers' `LTX2Vocoder` /
`LTX2VocoderWithBWE` arguments). Pure: no torch, no diffusers; the driver refuses a contradiction before
any cluster starts.

ltx-core's reading (`ltx_core/model/audio_vae/model_configurator.py`, 1.0.0): a flat config is LTX-2's
HiFi-GAN vocoder; one nesting ``vocoder`` and ``bwe`` is LTX-2.3's vocoder with bandwidth extension, its
first stage built with the final activation on (``use_tanh_at_final``: tanh, else a clamp to [-1, 1]) and
its extension generator without (``apply_final_activation: false``). Keys a file leaves out take
ltx-core's defaults (`_vocoder_from_config`).
"""

from __future__ import annotations

from typing import Any

# diffusers 0.42.1's constructor defaults (tests/test_conformance_ltx23.py checks them against the
# installed classes), which complete a spec's vocoder config as the worker builds it.
LTX2_VOCODER_DEFAULTS: dict[str, Any] = {
    "in_channels": 128, "hidden_channels": 1024, "out_channels": 2,
    "upsample_kernel_sizes": [16, 15, 8, 4, 4], "upsample_factors": [6, 5, 2, 2, 2],
    "resnet_kernel_sizes": [3, 7, 11], "resnet_dilations": [[1, 3, 5], [1, 3, 5], [1, 3, 5]],
    "act_fn": "leaky_relu", "leaky_relu_negative_slope": 0.1, "antialias": False, "antialias_ratio": 2,
    "antialias_kernel_size": 12, "final_act_fn": "tanh", "final_bias": True, "output_sampling_rate": 24000,
}  # fmt: skip
LTX2_VOCODER_WITH_BWE_DEFAULTS: dict[str, Any] = {
    "in_channels": 128, "hidden_channels": 1536, "out_channels": 2,
    "upsample_kernel_sizes": [11, 4, 4, 4, 4, 4], "upsample_factors": [5, 2, 2, 2, 2, 2],
    "resnet_kernel_sizes": [3, 7, 11], "resnet_dilations": [[1, 3, 5], [1, 3, 5], [1, 3, 5]],
    "act_fn": "snakebeta", "leaky_relu_negative_slope": 0.1, "antialias": True, "antialias_ratio": 2,
    "antialias_kernel_size": 12, "final_act_fn": None, "final_bias": False, "bwe_in_channels": 128,
    "bwe_hidden_channels": 512, "bwe_out_channels": 2, "bwe_upsample_kernel_sizes": [12, 11, 4, 4, 4],
    "bwe_upsample_factors": [6, 5, 2, 2, 2], "bwe_resnet_kernel_sizes": [3, 7, 11],
    "bwe_resnet_dilations": [[1, 3, 5], [1, 3, 5], [1, 3, 5]], "bwe_act_fn": "snakebeta",
    "bwe_leaky_relu_negative_slope": 0.1, "bwe_antialias": True, "bwe_antialias_ratio": 2,
    "bwe_antialias_kernel_size": 12, "bwe_final_act_fn": None, "bwe_final_bias": False,
    "filter_length": 512, "hop_length": 80, "window_length": 512, "num_mel_channels": 64,
    "input_sampling_rate": 16000, "output_sampling_rate": 48000,
}  # fmt: skip

# ltx-core's `_vocoder_from_config` defaults for a key a file leaves out.
_LTX_CORE_DEFAULTS: dict[str, Any] = {
    "resblock_kernel_sizes": [3, 7, 11], "upsample_rates": [6, 5, 2, 2, 2],
    "upsample_kernel_sizes": [16, 15, 8, 4, 4], "resblock_dilation_sizes": [[1, 3, 5]] * 3,
    "upsample_initial_channel": 1024, "resblock": "1", "output_sampling_rate": 24000,
    "activation": "snake", "use_tanh_at_final": True, "use_bias_at_final": True,
}  # fmt: skip
# ltx-core's generator keys → diffusers' `LTX2Vocoder` arguments.
_GENERATOR_KEYS = {
    "upsample_initial_channel": "hidden_channels",
    "upsample_rates": "upsample_factors",
    "upsample_kernel_sizes": "upsample_kernel_sizes",
    "resblock_kernel_sizes": "resnet_kernel_sizes",
    "resblock_dilation_sizes": "resnet_dilations",
    "use_bias_at_final": "final_bias",
}
# LTX-2.3's extension: ltx-core's `bwe` keys → `LTX2VocoderWithBWE` arguments (its STFT window is n_fft long).
_BWE_KEYS = {
    "input_sampling_rate": "input_sampling_rate",
    "output_sampling_rate": "output_sampling_rate",
    "hop_length": "hop_length",
    "n_fft": "filter_length",
    "num_mels": "num_mel_channels",
}


def _generator(cfg: dict[str, Any], final_activation: bool, where: str) -> dict[str, tuple[str, Any]]:
    """One ltx-core generator's config as diffusers' arguments, each with the metadata field it came from."""
    full = {**_LTX_CORE_DEFAULTS, **cfg}
    out = {arg: (f"{where}.{key}", full[key]) for key, arg in _GENERATOR_KEYS.items()}
    out["in_channels"] = (f"{where} (ltx-core's generators take 2 x 64 mel bins)", 128)
    amp = full["resblock"] == "AMP1"  # BigVGAN v2 blocks: snake activations, anti-aliased
    out["act_fn"] = (f"{where}.resblock/activation", full["activation"] if amp else "leaky_relu")
    if not final_activation:
        out["final_act_fn"] = (f"{where}.apply_final_activation", None)
    else:
        out["final_act_fn"] = (f"{where}.use_tanh_at_final", "tanh" if full["use_tanh_at_final"] else "clamp")
    return out


def metadata_vocoder(file_config: dict[str, Any]) -> tuple[bool, dict[str, tuple[str, Any]]] | None:
    """From a file's ``config`` metadata: whether its vocoder has bandwidth extension, and the diffusers
    arguments it implies, each with its metadata field; None when the metadata has no vocoder."""
    cfg = file_config.get("vocoder")
    if not isinstance(cfg, dict):
        return None
    if "bwe" not in cfg:
        flat = _generator(cfg, True, "config.vocoder")
        flat["output_sampling_rate"] = ("config.vocoder.output_sampling_rate", flat_rate(cfg))
        return False, flat
    bwe = cfg["bwe"]
    out = _generator(cfg.get("vocoder", {}), True, "config.vocoder.vocoder")
    extension = _generator(bwe, bool(bwe.get("apply_final_activation", True)), "config.vocoder.bwe")
    out.update({f"bwe_{arg}": value for arg, value in extension.items()})
    out.update({arg: (f"config.vocoder.bwe.{key}", bwe[key]) for key, arg in _BWE_KEYS.items() if key in bwe})
    if "n_fft" in bwe:
        out["window_length"] = ("config.vocoder.bwe.n_fft", bwe["n_fft"])
    return True, out


def flat_rate(cfg: dict[str, Any]) -> int:
    return int(cfg.get("output_sampling_rate", _LTX_CORE_DEFAULTS["output_sampling_rate"]))


def vocoder_contradictions(
    file_config: dict[str, Any], vocoder_config: dict[str, Any], bwe: bool
) -> list[str]:
    """Where a spec's vocoder config (`bwe`: built as `LTX2VocoderWithBWE`) differs from what the file's
    metadata says its vocoder is: one line per argument naming the metadata field, empty when they agree."""
    read = metadata_vocoder(file_config)
    if read is None:
        return []
    file_bwe, implied = read
    if file_bwe != bwe:
        return [f"config.vocoder: the file's vocoder is {'with' if file_bwe else 'without'} bandwidth "
                f"extension, the audio config's is {'with' if bwe else 'without'}"]  # fmt: skip
    full = {**(LTX2_VOCODER_WITH_BWE_DEFAULTS if bwe else LTX2_VOCODER_DEFAULTS), **vocoder_config}

    def norm(value: Any) -> Any:
        return [norm(v) for v in value] if isinstance(value, list | tuple) else value

    return [
        f"{field} in the file means {arg}={value!r}, the audio config has {full[arg]!r}"
        for arg, (field, value) in implied.items()
        if arg in full and norm(full[arg]) != norm(value)
    ]
