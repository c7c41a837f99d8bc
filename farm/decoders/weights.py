"""Decoder weights shared by every adapter: safetensors loading, config comparison, state-dict checks.

Weights come from a local diffusers folder (``config.json`` + ``*.safetensors``, as ``save_pretrained``
writes it) or from one ``.safetensors`` file; farm never downloads. Two entry points:

* :func:`load_weights` reads the tensors (on the worker that decodes) and :func:`apply_weights` loads
  them strictly for decoding: every tensor the decoder needs present, every shape equal;
* :func:`check_weights` refuses weights that do not fit a config before any cluster starts, reading only
  file headers and building the model on the meta device (no tensors, no GPU).

"Tensors the decoder needs" are those whose names start with one of ``required`` (``"decoder."`` by
default; adapters add e.g. ``"post_quant_conv."``). Encoder tensors may be missing: farm only decodes.
"""

from __future__ import annotations

import inspect
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from farm.errors import FarmError

DECODER_PREFIXES: tuple[str, ...] = ("decoder.",)


def constructor_defaults(model_cls: type) -> dict[str, Any]:
    """The keyword defaults of a diffusers model's constructor (its default config)."""
    return {
        name: p.default
        for name, p in inspect.signature(model_cls.__init__).parameters.items()  # type: ignore[misc]
        if p.default is not inspect.Parameter.empty
    }


def full_config(model_cls: type, config: dict[str, Any]) -> dict[str, Any]:
    """`config` completed with the constructor's defaults: what the model is built with."""
    return {**constructor_defaults(model_cls), **config}


def weight_files(path: Path) -> list[Path]:
    """The .safetensors files of a diffusers folder (sorted), or ``[path]`` for a single file."""
    if not path.is_dir():
        return [path]
    files = sorted(path.glob("*.safetensors"))
    if not files:
        raise FarmError(
            f"weights folder {str(path)!r} holds no .safetensors file; expected a diffusers folder "
            "(config.json + diffusion_pytorch_model.safetensors) as written by save_pretrained"
        )
    return files


def check_config_matches(folder_config: dict[str, Any], full_spec: dict[str, Any], where: str) -> None:
    """Refuse a folder whose ``config.json`` differs from the spec's (completed) config in any shared key."""

    def norm(v: Any) -> Any:
        return list(v) if isinstance(v, tuple | list) else v

    diffs = [
        f"{k}: weights have {folder_config[k]!r}, spec has {full_spec[k]!r}"
        for k in sorted(folder_config)
        if not k.startswith("_") and k in full_spec and norm(folder_config[k]) != norm(full_spec[k])
    ]
    if diffs:
        raise FarmError(
            f"weights at {where} were saved for a different decoder config than the job's spec: "
            + "; ".join(diffs[:5])
            + ("; …" if len(diffs) > 5 else "")
            + ". Put the weights' config in the job's decoder spec, or use the weights the job was made for"
        )


def _check_folder_config(path: Path, full_spec: dict[str, Any], where: str) -> None:
    cfg_file = path / "config.json"
    if path.is_dir() and cfg_file.exists():
        check_config_matches(json.loads(cfg_file.read_text()), full_spec, where=where)


def load_weights(path: Path, full_spec: dict[str, Any]) -> dict[str, Any]:
    """Tensors from one .safetensors file, or every .safetensors file of a diffusers folder."""
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    files = weight_files(path)
    _check_folder_config(path, full_spec, where=str(path / "config.json"))
    state: dict[str, Any] = {}
    for f in files:
        try:
            state.update(load_file(str(f)))
        except (SafetensorError, OSError, ValueError) as exc:
            raise FarmError(f"weights file {str(f)!r} is not a readable .safetensors file: {exc}") from None
    return state


def checkpoint_shapes(path: Path, full_spec: dict[str, Any]) -> dict[str, tuple[int, ...]]:
    """Tensor names and shapes of the weights at `path`, read from the file headers only."""
    from safetensors import SafetensorError, safe_open

    files = weight_files(path)
    _check_folder_config(path, full_spec, where=str(path))
    given: dict[str, tuple[int, ...]] = {}
    for f in files:
        try:
            with safe_open(str(f), framework="pt") as fh:
                for key in fh.keys():  # noqa: SIM118 (safe_open is not a mapping)
                    given[key] = tuple(fh.get_slice(key).get_shape())
        except (SafetensorError, OSError, ValueError) as exc:
            raise FarmError(f"weights file {str(f)!r} is not a readable .safetensors file: {exc}") from None
    return given


def weight_mismatches(
    expected: dict[str, tuple[int, ...]],
    given: dict[str, tuple[int, ...]],
    required: Sequence[str] = DECODER_PREFIXES,
) -> list[str]:
    """How a checkpoint's tensor shapes differ from the decoder's: empty when they fit."""
    missing = [k for k in expected if k.startswith(tuple(required)) and k not in given]
    unexpected = [k for k in given if k not in expected]
    wrong_shape = [
        f"{k} {given[k]} ≠ {expected[k]}" for k in given if k in expected and given[k] != expected[k]
    ]
    parts = []
    if missing:
        parts.append(f"{len(missing)} decoder tensors missing (e.g. {missing[0]})")
    if unexpected:
        parts.append(f"{len(unexpected)} tensors the model does not have (e.g. {unexpected[0]})")
    if wrong_shape:
        parts.append(f"{len(wrong_shape)} with other shapes (e.g. {wrong_shape[0]})")
    return parts


def raise_mismatch(parts: list[str], where: str) -> None:
    raise FarmError(
        f"weights at {where} do not match the decoder config: " + "; ".join(parts)
        + ". Check the spec's family and config against the checkpoint"
    )  # fmt: skip


def apply_weights(
    model: Any, state: dict[str, Any], where: str, required: Sequence[str] = DECODER_PREFIXES
) -> None:
    """Load a state dict strictly for the decoder: every required tensor present, every shape equal."""
    expected = {k: tuple(v.shape) for k, v in model.state_dict().items()}
    parts = weight_mismatches(expected, {k: tuple(v.shape) for k, v in state.items()}, required)
    if parts:
        raise_mismatch(parts, where)
    model.load_state_dict(state, strict=False)


def check_weights(spec: Any, model_cls: type, required: Sequence[str] = DECODER_PREFIXES) -> None:
    """Refuse weights that do not fit the spec's config, reading only file headers (no tensors, no GPU)."""
    if spec.random_weights:
        return
    import torch

    path = Path(spec.weights["path"])
    given = checkpoint_shapes(path, full_config(model_cls, spec.config))
    with torch.device("meta"):
        model = model_cls(**spec.config)
    parts = weight_mismatches({k: tuple(v.shape) for k, v in model.state_dict().items()}, given, required)
    if parts:
        raise_mismatch(parts, str(path))
