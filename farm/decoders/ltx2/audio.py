"""LTX-2's sound: audio latents ``[C, T, M]`` → mel spectrogram (diffusers `AutoencoderKLLTX2Audio`) →
stereo waveform (`LTX2Vocoder`; LTX-2.3's `LTX2VocoderWithBWE`, a vocoder whose 16 kHz waveform a second
generator extends to 48 kHz), decoded whole per shot on a worker.

An audio decoder spec (JSON, kept in the job store beside the video decoder's):

    {"family": "ltx2-audio",
     "config": "ltx2-audio" | "ltx2.3-audio" | ... | {"audio_vae": {...}, "vocoder": {...}},
     "weights": {"path": "/models/LTX-2"} | {"path": "/models/ltx-2.safetensors"} | {"random_seed": 0},
     "dtype": "float32"}

A vocoder config with any of `LTX2VocoderWithBWE`'s own arguments (``bwe_*``, ``input_sampling_rate``, ...)
builds that class; any other builds `LTX2Vocoder`.

Weights: a diffusers pipeline folder (``audio_vae/`` and ``vocoder/`` subfolders, as
``pipeline.save_pretrained`` writes them; the folder of either also does), or an LTX-2 / LTX-2.3
single-file checkpoint (its ``audio_vae.`` and ``vocoder.`` tensors, renamed as diffusers' conversion
script, ``scripts/convert_ltx2_to_diffusers.py``, does for its version).

Timing (pure, from the config): the audio VAE turns T latent frames into ``4T - 3`` mel frames of
``mel_hop_length`` samples at ``sample_rate``; the vocoder multiplies time by the product of its
upsample factors (with bandwidth extension, then by ``output_sampling_rate / input_sampling_rate``) and
plays at ``output_sampling_rate``. LTX-2: 25 latent frames per second, 24 kHz stereo; LTX-2.3: 48 kHz.
"""

from __future__ import annotations

import functools
import json
import math
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np

from farm.decoders.base import CONFIG_REVISION, named_config_revision
from farm.decoders.ltx2.audio_vae_config import audio_vae_contradictions
from farm.decoders.ltx2.vocoder_config import vocoder_contradictions
from farm.decoders.sound_base import SoundSpec, parse_weights, samples_for_frames  # noqa: F401 (a name of this module too)
from farm.errors import FarmError

if TYPE_CHECKING:
    import torch

FAMILY = "ltx2-audio"
DTYPES = ("float32", "bfloat16", "float16")
# The audio VAE's time and mel compression (diffusers' LATENT_DOWNSAMPLE_FACTOR).
LATENT_DOWNSAMPLE = 4

# LTX-2's sound as released: diffusers' conversion script's configs for 2.0
# (`scripts/convert_ltx2_to_diffusers.py`: `get_ltx2_audio_vae_config`, `get_ltx2_vocoder_config`, "2.0"),
# which are also what Lightricks' own decoder builds from the released file's `config` metadata (ltx-core's
# `AudioDecoderConfigurator`: `audio_vae` → model.params.ddconfig, preprocessing.stft; `VocoderConfigurator`:
# the flat `vocoder` config, HiFi-GAN blocks "1", tanh and a bias at the end, 24 kHz). They equal diffusers'
# constructor defaults (0.42.1), which this name resolved to before; written out, they no longer follow them.
LTX2_AUDIO = {
    "audio_vae": {"base_channels": 128, "output_channels": 2, "ch_mult": [1, 2, 4], "num_res_blocks": 2,
                  "attn_resolutions": None, "in_channels": 2, "resolution": 256, "latent_channels": 8,
                  "norm_type": "pixel", "causality_axis": "height", "dropout": 0.0,
                  "mid_block_add_attention": False, "sample_rate": 16000, "mel_hop_length": 160,
                  "is_causal": True, "mel_bins": 64, "double_z": True},
    "vocoder": {"in_channels": 128, "hidden_channels": 1024, "out_channels": 2,
                "upsample_kernel_sizes": [16, 15, 8, 4, 4], "upsample_factors": [6, 5, 2, 2, 2],
                "resnet_kernel_sizes": [3, 7, 11], "resnet_dilations": [[1, 3, 5], [1, 3, 5], [1, 3, 5]],
                "act_fn": "leaky_relu", "leaky_relu_negative_slope": 0.1, "antialias": False,
                "final_act_fn": "tanh", "final_bias": True, "output_sampling_rate": 24000},
}  # fmt: skip
# LTX-2's structure at small widths: causal along the mel axis, pixel norm, no attention, 16 kHz mel frames
# (hop 160) and 24 kHz stereo from HiFi-GAN blocks with leaky ReLU, tanh and a final bias. The mel bins stay
# the released 64, as Lightricks' vocoder fixes its input at 2 x 64; the audio VAE's latent statistics span
# base_channels = latent_channels x mel_bins / 4 values in ltx-core, as in the real one.
LTX2_AUDIO_TINY = {
    "audio_vae": {**LTX2_AUDIO["audio_vae"], "base_channels": 32, "ch_mult": [1, 2], "num_res_blocks": 1,
                  "latent_channels": 2},
    "vocoder": {**LTX2_AUDIO["vocoder"], "hidden_channels": 32, "upsample_kernel_sizes": [16, 15, 16],
                "upsample_factors": [6, 5, 8], "resnet_kernel_sizes": [3], "resnet_dilations": [[1, 3, 5]]},
}  # fmt: skip
# LTX-2.3's sound: the audio VAE of LTX-2 and a vocoder with bandwidth extension, as diffusers' conversion
# script writes them (`scripts/convert_ltx2_to_diffusers.py`, `get_ltx2_audio_vae_config("2.3")`,
# `get_ltx2_vocoder_config("2.3")`) but for one argument: the script leaves the first stage's waveform
# unbounded (`final_act_fn: None`), while Lightricks' own decoder (ltx-core's `VocoderConfigurator`) clamps
# it to [-1, 1] before the extension (the file's `use_tanh_at_final: false` with the final activation on).
LTX2_3_AUDIO = {
    "audio_vae": LTX2_AUDIO["audio_vae"],
    "vocoder": {"in_channels": 128, "hidden_channels": 1536, "out_channels": 2,
                "upsample_kernel_sizes": [11, 4, 4, 4, 4, 4], "upsample_factors": [5, 2, 2, 2, 2, 2],
                "resnet_kernel_sizes": [3, 7, 11], "resnet_dilations": [[1, 3, 5], [1, 3, 5], [1, 3, 5]],
                "act_fn": "snakebeta", "leaky_relu_negative_slope": 0.1, "antialias": True,
                "antialias_ratio": 2, "antialias_kernel_size": 12, "final_act_fn": "clamp",
                "final_bias": False, "bwe_in_channels": 128, "bwe_hidden_channels": 512,
                "bwe_out_channels": 2, "bwe_upsample_kernel_sizes": [12, 11, 4, 4, 4],
                "bwe_upsample_factors": [6, 5, 2, 2, 2], "bwe_resnet_kernel_sizes": [3, 7, 11],
                "bwe_resnet_dilations": [[1, 3, 5], [1, 3, 5], [1, 3, 5]], "bwe_act_fn": "snakebeta",
                "bwe_leaky_relu_negative_slope": 0.1, "bwe_antialias": True, "bwe_antialias_ratio": 2,
                "bwe_antialias_kernel_size": 12, "bwe_final_act_fn": None, "bwe_final_bias": False,
                "filter_length": 512, "hop_length": 80, "window_length": 512, "num_mel_channels": 64,
                "input_sampling_rate": 16000, "output_sampling_rate": 48000},
}  # fmt: skip
# LTX-2.3's structure at small widths; the mel bins (64) and the rates (16 kHz, then 48 kHz) stay the
# released ones, as Lightricks' vocoder fixes its input at 2 x 64 mel bins. The audio VAE's latent
# statistics span base_channels = latent_channels x mel_bins / 4 values in ltx-core, as in the real one.
LTX2_3_AUDIO_TINY = {
    "audio_vae": {**LTX2_3_AUDIO["audio_vae"], "base_channels": 32, "ch_mult": [1, 2], "num_res_blocks": 1,
                  "latent_channels": 2},
    "vocoder": {**LTX2_3_AUDIO["vocoder"], "hidden_channels": 32, "upsample_kernel_sizes": [16, 11, 8],
                "upsample_factors": [8, 5, 4], "resnet_kernel_sizes": [3], "resnet_dilations": [[1, 3, 5]],
                "bwe_hidden_channels": 32, "bwe_upsample_kernel_sizes": [12, 11, 16],
                "bwe_upsample_factors": [6, 5, 8], "bwe_resnet_kernel_sizes": [3],
                "bwe_resnet_dilations": [[1, 3, 5]]},
}  # fmt: skip
NAMED_CONFIGS: dict[str, dict[str, dict[str, Any]]] = {
    "ltx2-audio": LTX2_AUDIO,
    "ltx2-audio-tiny": LTX2_AUDIO_TINY,
    "ltx2.3-audio": LTX2_3_AUDIO,
    "ltx2.3-audio-tiny": LTX2_3_AUDIO_TINY,
}


class AudioConfigs:
    """The named audio configs' revisions, in the form `farm.decoders.base`'s revision helpers read."""

    family: ClassVar[str] = FAMILY
    # Revision 1 of `ltx2-audio-tiny` took 16 mel bins and played 8 kHz: not LTX-2's structure, and a vocoder
    # Lightricks' decoder cannot build (it takes 2 x 64 mel bins). Every spec naming it carries its revision,
    # so a sound decoded with the old one is never resumed or called finished silently.
    config_revisions: ClassVar[dict[str, int]] = {"ltx2-audio-tiny": 2}
    config_revision_notes: ClassVar[dict[str, str]] = {
        "ltx2-audio-tiny": "now LTX-2's sound structure at small widths (64 mel bins, 24 kHz); revision 1 "
        "took 16 mel bins and played 8 kHz"
    }


# The constructor defaults (diffusers 0.42.1) the timing needs when a config leaves them out.
_VAE_DEFAULTS = {"latent_channels": 8, "mel_bins": 64, "sample_rate": 16000, "mel_hop_length": 160,
                 "output_channels": 2, "causality_axis": "height"}  # fmt: skip
_VOCODER_DEFAULTS = {"upsample_factors": [6, 5, 2, 2, 2], "output_sampling_rate": 24000, "out_channels": 2}
_BWE_VOCODER_DEFAULTS = {"upsample_factors": [5, 2, 2, 2, 2, 2], "input_sampling_rate": 16000,
                         "output_sampling_rate": 48000, "out_channels": 2}  # fmt: skip
# Arguments only `LTX2VocoderWithBWE` takes: a vocoder config with any of them has bandwidth extension.
_BWE_ONLY = ("input_sampling_rate", "filter_length", "hop_length", "window_length", "num_mel_channels")

# LTX-2's single-file checkpoint names (diffusers' LTX-2 conversion: audio VAE statistics, HiFi-GAN names).
_CHECKPOINT_AUDIO_VAE = {"per_channel_statistics.mean-of-means": "latents_mean",
                         "per_channel_statistics.std-of-means": "latents_std"}  # fmt: skip
_CHECKPOINT_VOCODER = {
    "ups": "upsamplers",
    "resblocks": "resnets",
    "conv_pre": "conv_in",
    "conv_post": "conv_out",
}
# LTX-2.3's vocoder with bandwidth extension (`vocoder.vocoder.*`, `vocoder.bwe_generator.*`,
# `vocoder.mel_stft.*` in the file): diffusers' LTX_2_3_VOCODER_RENAME_DICT, replaced anywhere in a name, then
# ".ups." → ".upsamplers." (`convert_ltx2_3_vocoder_upsamplers`; "ups" alone would also hit "upsample.").
_CHECKPOINT_BWE_VOCODER = {
    "resblocks": "resnets",
    "conv_pre": "conv_in",
    "conv_post": "conv_out",
    "act_post": "act_out",
    "downsample.lowpass": "downsample",
}


def is_bwe_vocoder(vocoder_config: dict[str, Any]) -> bool:
    """Whether a vocoder config is `LTX2VocoderWithBWE`'s (LTX-2.3) rather than `LTX2Vocoder`'s (LTX-2)."""
    return any(k.startswith("bwe_") or k in _BWE_ONLY for k in vocoder_config)


def bwe_vocoder_name(name: str) -> str:
    """A tensor name of LTX-2.3's vocoder (after ``vocoder.``) in diffusers' `LTX2VocoderWithBWE`."""
    for old, new in _CHECKPOINT_BWE_VOCODER.items():
        name = name.replace(old, new)
    return name.replace(".ups.", ".upsamplers.")


@dataclass(frozen=True)
class AudioSpec(SoundSpec):
    """LTX-2's sound decoder spec: config ``{"audio_vae": {...}, "vocoder": {...}}``."""

    family: ClassVar[str] = FAMILY
    named_configs: ClassVar[dict[str, Any]] = NAMED_CONFIGS
    config_revisions: ClassVar[dict[str, int]] = AudioConfigs.config_revisions
    config_revision_notes: ClassVar[dict[str, str]] = AudioConfigs.config_revision_notes
    latent_dims: ClassVar[tuple[str, ...]] = ("audio_channel", "audio_frame", "mel")
    latent_layout: ClassVar[str] = "[C, T, M]"
    audio_vae_class: ClassVar[str] = "AutoencoderKLLTX2Audio"

    @classmethod
    def parse(cls, raw: dict[str, Any], where: str) -> AudioSpec:
        return parse_audio_spec(raw, where)

    def latent_shape(self, latent_frames: int) -> tuple[int, ...]:
        return self.latent_channels, latent_frames, self.latent_mel_bins

    def check_latent(self, shape: tuple[int, ...], where: str) -> None:
        check_audio_latent(shape, self, where)

    def check_weights(self) -> None:
        check_audio_weights(self)

    def build_decoder(self, device: str) -> AudioDecoder:
        return AudioDecoder(self, *build_models(self), device)

    @classmethod
    def spec_from_pipeline(cls, pipeline: Any, weights: str | None) -> dict[str, Any]:
        return audio_spec_from_pipeline(pipeline, weights)

    @property
    def channels(self) -> int:
        return int(self.vocoder["out_channels"])

    # ---- timing (pure) ------------------------------------------------------------------------

    @property
    def vae(self) -> dict[str, Any]:
        return {**_VAE_DEFAULTS, **self.config.get("audio_vae", {})}

    @property
    def bandwidth_extension(self) -> bool:
        return is_bwe_vocoder(self.config.get("vocoder", {}))

    @property
    def vocoder(self) -> dict[str, Any]:
        defaults = _BWE_VOCODER_DEFAULTS if self.bandwidth_extension else _VOCODER_DEFAULTS
        return {**defaults, **self.config.get("vocoder", {})}

    @property
    def latent_channels(self) -> int:
        return int(self.vae["latent_channels"])

    @property
    def latent_mel_bins(self) -> int:
        return int(self.vae["mel_bins"]) // LATENT_DOWNSAMPLE

    @property
    def sample_rate(self) -> int:
        """Samples per second of the waveform (the vocoder's output rate)."""
        return int(self.vocoder["output_sampling_rate"])

    @property
    def latents_per_second(self) -> float:
        vae = self.vae
        return vae["sample_rate"] / vae["mel_hop_length"] / LATENT_DOWNSAMPLE

    def decoded_samples(self, latent_frames: int) -> int:
        """Samples the vocoder makes from `latent_frames` audio latent frames."""
        mel = max(LATENT_DOWNSAMPLE * latent_frames - (LATENT_DOWNSAMPLE - 1), 1)
        vocoder = self.vocoder
        samples = mel * math.prod(int(f) for f in vocoder["upsample_factors"])
        if self.bandwidth_extension:  # the extension resamples by the rates' ratio
            samples = samples * int(vocoder["output_sampling_rate"]) // int(vocoder["input_sampling_rate"])
        return samples


def parse_audio_spec(raw: Any, where: str = "audio decoder spec") -> AudioSpec:
    """Validate an audio decoder spec; errors name the field and what would be valid."""
    if isinstance(raw, AudioSpec):
        return raw
    if not isinstance(raw, dict):
        raise FarmError(f"{where}: expected a JSON object, got {type(raw).__name__}")
    if raw.get("family", FAMILY) != FAMILY:
        raise FarmError(f"{where}: unknown audio decoder family {raw.get('family')!r}; known: [{FAMILY!r}]")
    config = raw.get("config", FAMILY)
    if isinstance(config, str):
        if config not in NAMED_CONFIGS:
            raise FarmError(
                f"{where}: unknown audio config {config!r}; named configs: {sorted(NAMED_CONFIGS)} "
                '(or {"audio_vae": {...}, "vocoder": {...}}, the models\' constructor arguments)'
            )
        name, resolved = config, json.loads(json.dumps(NAMED_CONFIGS[config]))
    elif isinstance(config, dict) and set(config) <= {"audio_vae", "vocoder"}:
        name, resolved = None, {"audio_vae": dict(config.get("audio_vae", {})),
                                "vocoder": dict(config.get("vocoder", {}))}  # fmt: skip
    else:
        raise FarmError(f"{where}: 'config' must be a config name or {{\"audio_vae\": {{...}}, \"vocoder\": "
                        f"{{...}}}}, got {config!r}")  # fmt: skip
    weights = parse_weights(raw, where, "/local/pipeline/folder/or/ltx-2.safetensors",
                            "a diffusers pipeline folder (audio_vae/, vocoder/) or LTX-2's single "
                            ".safetensors checkpoint")  # fmt: skip
    dtype = raw.get("dtype", "float32")
    if dtype not in DTYPES:
        raise FarmError(f"{where}: dtype {dtype!r} is not supported; use one of {list(DTYPES)}")
    given = raw.get(CONFIG_REVISION)
    if name is None and given is not None:
        raise FarmError(f"{where}: 'config_revision' is for named configs only; remove it")
    revision = named_config_revision(AudioConfigs, name, given, where) if name is not None else {}
    return AudioSpec(name, resolved, weights, dtype, revision.get(CONFIG_REVISION))


def check_audio_latent(shape: tuple[int, ...], spec: AudioSpec, where: str) -> None:
    """Refuse an audio latent the spec's VAE cannot decode, saying what it takes."""
    want = f"[C, T, M] with C = {spec.latent_channels} and M = {spec.latent_mel_bins}"
    if (
        len(shape) != 3
        or shape[0] != spec.latent_channels
        or shape[2] != spec.latent_mel_bins
        or shape[1] < 1
    ):
        raise FarmError(f"{where}: audio latent has shape {list(shape)}; {spec.describe()} takes {want} "
                        "(the pipeline's unpacked audio latents, one sample of [B, C, T, M])")  # fmt: skip


# ---- weights and decoding (worker side: torch and diffusers imported here only) ---------------------


def _rename_top(name: str, renames: dict[str, str]) -> str:
    for old, new in renames.items():
        if name == old or name.startswith(old + "."):
            name = new + name[len(old) :]
    return name


def _checkpoint_tensors(path: Path, prefix: str, rename: Callable[[str], str]) -> dict[str, Any]:
    """The tensors under `prefix` in an LTX single-file checkpoint, renamed to diffusers' names."""
    from safetensors import safe_open

    out = {}
    with safe_open(str(path), framework="pt") as fh:
        for key in fh.keys():  # noqa: SIM118 (safe_open is not a Mapping)
            if not key.startswith(prefix):
                continue
            out[rename(key[len(prefix) :])] = fh.get_tensor(key)
    if not out:
        raise FarmError(
            f"{path}: holds no {prefix!r} tensors; an LTX-2 checkpoint with its audio VAE and "
            "vocoder (or a diffusers pipeline folder) is needed for sound"
        )
    return out


def _load_state(model: Any, state: dict[str, Any], where: str) -> None:
    wanted = set(model.state_dict())
    missing = sorted(
        k for k in wanted - set(state) if not k.startswith("encoder.")
    )  # decode needs no encoder
    unknown = sorted(set(state) - wanted)
    if missing or unknown:
        raise FarmError(f"{where}: the weights do not fit the config: missing {missing[:5]}, unexpected "
                        f"{unknown[:5]}; check the audio config")  # fmt: skip
    model.load_state_dict(state, strict=False)


def _subfolder(root: Path, name: str) -> Path:
    for folder in (root / name, root.parent / name):
        if (folder / "config.json").is_file():
            return folder
    raise FarmError(f"{root}: no {name}/config.json in it or beside it; give a diffusers pipeline folder "
                    "(pipeline.save_pretrained) or LTX-2's .safetensors checkpoint")  # fmt: skip


def build_models(spec: AudioSpec) -> tuple[Any, Any]:
    """The audio VAE and vocoder of `spec`, weights loaded, in eval mode, float32 on the CPU."""
    import torch
    from diffusers import AutoencoderKLLTX2Audio
    from diffusers.pipelines.ltx2.vocoder import LTX2Vocoder, LTX2VocoderWithBWE

    vocoder_class = LTX2VocoderWithBWE if spec.bandwidth_extension else LTX2Vocoder
    path = Path(spec.weights["path"]) if "path" in spec.weights else None
    if path is not None and path.is_dir():
        vae = AutoencoderKLLTX2Audio.from_pretrained(_subfolder(path, "audio_vae"), local_files_only=True)
        vocoder = vocoder_class.from_pretrained(_subfolder(path, "vocoder"), local_files_only=True)
        return vae.eval(), vocoder.eval()
    if path is None:
        torch.manual_seed(int(spec.weights["random_seed"]))
    vae = AutoencoderKLLTX2Audio(**spec.config["audio_vae"])
    vocoder = vocoder_class(**spec.config["vocoder"])
    if path is not None:
        vae_names = functools.partial(_rename_top, renames=_CHECKPOINT_AUDIO_VAE)
        vocoder_names = (bwe_vocoder_name if spec.bandwidth_extension
                         else functools.partial(_rename_top, renames=_CHECKPOINT_VOCODER))  # fmt: skip
        _load_state(vae, _checkpoint_tensors(path, "audio_vae.", vae_names), f"{path} audio_vae.")
        _load_state(vocoder, _checkpoint_tensors(path, "vocoder.", vocoder_names), f"{path} vocoder.")
    return vae.eval(), vocoder.eval()  # type: ignore[attr-defined]


class AudioDecoder:
    """An audio VAE and vocoder on one device: `decode` turns one shot's audio latent into sound."""

    def __init__(self, spec: AudioSpec, vae: Any, vocoder: Any, device: str) -> None:
        import torch

        self.spec, self.device = spec, device
        self.dtype = getattr(torch, spec.dtype)
        self.vae = vae.to(device=device, dtype=self.dtype)
        self.vocoder = vocoder.to(device=device, dtype=self.dtype)
        self._lock = threading.Lock()

    @property
    def sample_rate(self) -> int:
        return int(self.vocoder.config.output_sampling_rate)

    def decode_tensor(self, latent: torch.Tensor) -> torch.Tensor:
        """``[B, C, T, M]`` → waveform ``[B, channels, samples]`` (float32), as LTX2Pipeline decodes."""
        import torch

        with self._lock, torch.inference_mode():
            mel = self.vae.decode(latent.to(self.device, self.dtype), return_dict=False)[0]
            return self.vocoder(mel).float()

    def decode(self, latent: np.ndarray) -> np.ndarray:
        """One shot's audio latent ``[C, T, M]`` → waveform ``[channels, samples]`` float32 (about -1…1)."""
        import torch

        return (
            self.decode_tensor(torch.from_numpy(np.ascontiguousarray(latent, np.float32))[None])[0]
            .cpu()
            .numpy()
        )


def check_audio_weights(spec: AudioSpec) -> None:
    """Refuse weights that cannot load (cheap: files and tensor names only)."""
    if "path" not in spec.weights:
        return
    path = Path(spec.weights["path"])
    if path.is_dir():
        _subfolder(path, "audio_vae")
        _subfolder(path, "vocoder")
        return
    from safetensors import safe_open

    try:
        with safe_open(str(path), framework="np") as fh:
            keys = list(fh.keys())
            metadata = fh.metadata() or {}
    except Exception as exc:  # safetensors raises its own types for files that are not safetensors
        raise FarmError(f"{path}: cannot read it as safetensors ({type(exc).__name__}: {exc})") from None
    for prefix in ("audio_vae.", "vocoder."):
        if not any(k.startswith(prefix) for k in keys):
            raise FarmError(
                f"{path}: holds no {prefix!r} tensors; an LTX-2 checkpoint with its audio VAE and "
                "vocoder (or a diffusers pipeline folder) is needed for sound"
            )
    # LTX-2.3's vocoder nests its generators (vocoder.vocoder.*, vocoder.bwe_generator.*); LTX-2's does not
    file_bwe = any(k.startswith("vocoder.bwe_generator.") for k in keys)
    if file_bwe != spec.bandwidth_extension:
        has, wants = ("LTX-2.3's", "LTX-2's") if file_bwe else ("LTX-2's", "LTX-2.3's")
        raise FarmError(
            f"{path}: holds {has} vocoder ({'with' if file_bwe else 'without'} bandwidth extension), but "
            f"{spec.describe()} is {wants}; use the audio config of the checkpoint's model "
            f"({'ltx2.3-audio' if file_bwe else 'ltx2-audio'})"
        )
    _refuse_contradicted_config(path, metadata.get("config"), spec)


def _refuse_contradicted_config(path: Path, text: str | None, spec: AudioSpec) -> None:
    """Refuse an audio config whose audio VAE or vocoder is not the one the file's `config` metadata
    describes."""
    try:
        file_config = json.loads(text) if text else {}
    except ValueError:
        return  # not LTX's metadata: the tensors alone are checked
    if not isinstance(file_config, dict):
        return
    found = audio_vae_contradictions(file_config, spec.config.get("audio_vae", {}))
    found += vocoder_contradictions(file_config, spec.config.get("vocoder", {}), spec.bandwidth_extension)
    if found:
        raise FarmError(
            f"{path}: its config metadata contradicts {spec.describe()}: " + "; ".join(found[:4])
            + ("; …" if len(found) > 4 else "") + ". Use the audio config of the checkpoint's model, or give "
            "the audio VAE's and vocoder's arguments as the file says them"
        )  # fmt: skip


def audio_spec_from_pipeline(pipeline: Any, weights: str | None = None) -> dict[str, Any]:
    """An audio decoder spec (JSON) for an LTX-2 pipeline's own audio VAE and vocoder: their configs and
    the pipeline folder they were loaded from (``<folder>/audio_vae``, ``<folder>/vocoder``), or `weights`."""
    vae, vocoder = getattr(pipeline, "audio_vae", None), getattr(pipeline, "vocoder", None)
    if vae is None or vocoder is None:
        raise FarmError("give audio_decoder= (the pipeline has no audio_vae and vocoder to take it from)")
    if type(vocoder).__name__ not in ("LTX2Vocoder", "LTX2VocoderWithBWE"):  # LTX-2; LTX-2.3 (48 kHz)
        raise FarmError(f"farm decodes sound with LTX2Vocoder or LTX2VocoderWithBWE; the pipeline's vocoder "
                        f"is {type(vocoder).__name__}")  # fmt: skip
    config = {name: {k: v for k, v in dict(part.config).items() if not k.startswith("_")}
              for name, part in (("audio_vae", vae), ("vocoder", vocoder))}  # fmt: skip
    source = weights
    if source is None:
        folders = {Path(str(part.config.get("_name_or_path") or "")).parent
                   for part in (vae, vocoder)}  # fmt: skip
        root = folders.pop() if len(folders) == 1 else None
        if (
            root is not None
            and (root / "audio_vae" / "config.json").is_file()
            and (root / "vocoder" / "config.json").is_file()
        ):
            source = str(root)
    if source is None:
        raise FarmError(
            "the pipeline's audio VAE and vocoder were not loaded from one local pipeline folder: pass "
            "audio_weights= (a folder with audio_vae/ and vocoder/, or LTX-2's .safetensors checkpoint) "
            "or audio_decoder= (a spec)"
        )
    torch_dtype = str(getattr(vae, "dtype", "float32")).removeprefix("torch.")
    dtype = torch_dtype if torch_dtype in ("float32", "bfloat16", "float16") else "float32"
    return {"family": FAMILY, "config": config, "weights": {"path": source}, "dtype": dtype}
