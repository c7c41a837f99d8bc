"""Decoder weights shared by every adapter: check them on the driver, read the decoder's on a worker.

Weights come from a local diffusers folder (``config.json`` + ``*.safetensors``, as ``save_pretrained``
writes it), one ``.safetensors`` file in the diffusers layout or in an original one (LTX-2's full
checkpoint, ComfyUI's VAE-only files, LTX-Video 0.9.x), or a torch checkpoint (Wan 2.1's ``.pth``,
HunyuanVideo's ``.pt``); farm never downloads (`farm.decoders.checkpoints` tells them apart). Two entry
points:

* :func:`check_weights` refuses weights that do not fit a spec before any cluster starts, from file
  headers only and the decoder tensors' shapes recorded for each named config (its family's ``recorded.json``,
  written by ``tools/record_decoder_defaults.py``): no torch, no diffusers. A custom config (a JSON
  object, no record) has its shapes computed on the meta device, which imports both. It returns the spec
  with the weights' files, layout and content identity recorded, so a later render notices weights that
  changed;
* :func:`read_decoder_state` (on the worker that decodes) reads the decoder's tensors only, straight onto
  the device in the decode dtype, renamed to diffusers' names by diffusers' own converters.

"Tensors the decoder needs" are those whose names start with one of ``required`` (``"decoder."`` by
default; adapters add e.g. ``"post_quant_conv."``). Other tensors (encoder, transformer, audio VAE,
vocoder) are skipped. LTX's latent statistics (``latents_mean``/``latents_std``) are needed only to
un-normalise latents (``"latents": "normalized"``): weights without them are refused for that.
"""

from __future__ import annotations

import contextlib
import inspect
import json
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from farm.decoders import checkpoints as C
from farm.decoders.recording import recorded_decoder_tensors
from farm.errors import FarmError

if TYPE_CHECKING:
    from farm.decoders.base import DecoderSpec
    from farm.decoders.diffusers_vae import DiffusersVideoDecoder

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


weight_files = C.weight_files


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


def _check_folder_config(path: Path, full_spec: dict[str, Any]) -> None:
    cfg_file = path / "config.json"
    if path.is_dir() and cfg_file.exists():
        check_config_matches(json.loads(cfg_file.read_text()), full_spec, where=str(path))


# ---- expected tensors --------------------------------------------------------------------------


def expected_tensors(spec: DecoderSpec, cls: type[DiffusersVideoDecoder]) -> dict[str, tuple[int, ...]]:
    """The decoder's tensors (diffusers names → shapes) for the spec's config: recorded for a named
    config, else built on the meta device (imports torch and diffusers)."""
    recorded = recorded_tensors(spec, cls)
    return recorded if recorded is not None else cls.decoder_tensor_shapes(spec.config)


def recorded_tensors(
    spec: DecoderSpec, cls: type[DiffusersVideoDecoder]
) -> dict[str, tuple[int, ...]] | None:
    """The decoder's tensors (diffusers names → shapes) recorded for the spec's named config, or None."""
    return recorded_decoder_tensors(cls, spec.config_name) if spec.config_name else None


# ---- comparing ---------------------------------------------------------------------------------


def _examples(names: Sequence[str], n: int = 3) -> str:
    return ", ".join(names[:n]) + (f", … ({len(names)} in all)" if len(names) > n else "")


def weight_mismatches(
    expected: dict[str, tuple[int, ...]],
    infos: dict[str, C.TensorInfo],
    names: dict[str, str],
    prefix: str,
    required: Sequence[str] = DECODER_PREFIXES,
) -> list[str]:
    """How a checkpoint's tensors differ from the decoder's, each part naming the tensors (in the file's
    names); empty when they fit. `names` maps the decoder's (diffusers) names to the file's."""
    missing = sorted(names[k] for k in expected if k.startswith(tuple(required)) and names[k] not in infos)
    known = set(names.values())
    unexpected = sorted(k for k in infos if k.startswith(prefix + "decoder.") and k not in known)
    wrong_shape = [
        f"{names[k]} {list(infos[names[k]].shape)} ≠ {list(shape)}"
        for k, shape in expected.items()
        if names[k] in infos and infos[names[k]].shape != tuple(shape)
    ]
    not_float = [f"{names[k]} ({infos[names[k]].dtype})" for k in expected
                 if names[k] in infos and infos[names[k]].dtype not in C.FLOAT_DTYPES]  # fmt: skip
    parts = []
    if missing:
        parts.append(f"{len(missing)} decoder tensors missing: {_examples(missing)}")
    if unexpected:
        parts.append(f"{len(unexpected)} decoder tensors the model does not have: {_examples(unexpected)}")
    if wrong_shape:
        parts.append(f"{len(wrong_shape)} with other shapes: {_examples(wrong_shape)}")
    if not_float:
        parts.append(f"{len(not_float)} not floating point: {_examples(not_float)}")
    return parts


def raise_mismatch(parts: list[str], where: str) -> None:
    raise FarmError(
        f"weights at {where} do not match the decoder config: " + "; ".join(parts)
        + ". Check the spec's family and config against the checkpoint"
    )  # fmt: skip


def missing_statistics(
    spec: DecoderSpec, statistics: Sequence[str], infos: dict[str, C.TensorInfo], names: dict[str, str]
) -> list[str]:
    """The latent statistics the spec needs (to un-normalise latents) that the weights lack."""
    if spec.latents != "normalized":
        return []
    return [names[k] for k in statistics if names.get(k) not in infos]


def refuse_missing_statistics(missing: list[str], spec: DecoderSpec, where: str) -> None:
    if missing:
        raise FarmError(
            f"weights at {where} hold no latent statistics ({', '.join(missing)} missing), which "
            f'"latents": "normalized" needs to un-normalise latents ({spec.family}); give weights that '
            "carry them (LTX checkpoints keep them as per_channel_statistics), or store denormalized latents"
        )


# ---- the check (driver) ------------------------------------------------------------------------


def inspect_weights(
    spec: DecoderSpec, cls: type[DiffusersVideoDecoder]
) -> tuple[list[Path], C.Layout, dict[str, C.TensorInfo], dict[str, C.Derived]]:
    """The weights' files, layout and tensors (headers only), as the family's decoder takes them, and the
    tensors derived from others (the family's `file_tensors`: e.g. a Lightricks-layout diffusion decoder's
    fused and gated projections)."""
    from farm.decoders import FAMILIES  # the registry names the other families' layouts in a refusal

    path = Path(spec.weights["path"])
    files = C.weight_files(path)
    full = cls._full_config(spec.config)
    _check_folder_config(path, full)
    infos = C.read_tensor_infos(files)
    layout = C.detect_layout(infos, cls, str(path), FAMILIES.values())
    cls.check_layout_fits(layout.name, full, str(path))
    cls.check_file_config(spec, files)
    infos, derived = cls.file_tensors(infos, layout, files, full, str(path))
    return files, layout, infos, derived


def check_weights(spec: DecoderSpec, cls: type[DiffusersVideoDecoder]) -> DecoderSpec:
    """Refuse weights that do not fit the spec's config, or that changed since the spec recorded them;
    return the spec with the weights' layout and content identity recorded. Reads file headers and a
    few sampled blocks only; imports neither torch nor diffusers for a named config."""
    if spec.random_weights:
        return spec
    path = str(spec.weights["path"])
    files, layout, infos, _ = inspect_weights(spec, cls)  # first: a file cut short says so
    identity = C.content_identity(files)
    recorded = spec.weights.get("identity")
    if recorded is not None and recorded != identity:
        raise FarmError(
            f"weights at {path} changed since the job was made (content identity {recorded}, now "
            f"{identity}): restore the weights the job was made with, or make the job again"
        )
    full = cls._full_config(spec.config)
    expected = expected_tensors(spec, cls)
    names = {k: layout.prefix + cls.original_name(k, layout.name, full) for k in expected}
    for k in cls.statistics_tensors:
        names.setdefault(k, layout.prefix + cls.original_name(k, layout.name, full))
    parts = weight_mismatches(expected, infos, names, layout.prefix, cls.required_weights)
    if parts:
        raise_mismatch(parts, path)
    refuse_missing_statistics(missing_statistics(spec, cls.statistics_tensors, infos, names), spec, path)
    record = {"files": [f.name for f in files], "layout": layout.name, "identity": identity}
    return replace(spec, weights={**spec.weights, **record})


# ---- pinned for a render ------------------------------------------------------------------------


def file_stamp(path: Path) -> list[int]:
    """What changes when a file is written, replaced or renamed over: size, mtime, ctime, inode, device."""
    st = path.stat()
    return [st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino, st.st_dev]


def pinned_weights(spec: DecoderSpec) -> DecoderSpec:
    """The spec with its weight files as a render found them: each file's stamp (`file_stamp`) and their
    content identity (`farm.decoders.checkpoints.content_identity`; the job's own, which the render's
    check compares the files with). Workers load only those files (`check_pinned`)."""
    if spec.random_weights:
        return spec
    files = C.weight_files(Path(spec.weights["path"]))
    stamps = {f.name: file_stamp(f) for f in files}  # before the identity: a file replaced between the two
    identity = spec.weights.get("identity") or C.content_identity(files)  # then fails the identity check
    return replace(spec, weights={**spec.weights, "identity": identity, "stamps": stamps})


def check_pinned(spec: DecoderSpec) -> None:
    """Refuse weights other than those the render pinned (`pinned_weights`): a file whose stamp changed is
    compared by content identity, and refused unless it is the same; a spec never pinned passes. Costs a
    `stat` per file while the stamps hold."""
    pinned = spec.weights.get("stamps")
    if spec.random_weights or not isinstance(pinned, dict):
        return
    path = Path(spec.weights["path"])
    try:
        files = C.weight_files(path)
        changed = [f for f in files if pinned.get(f.name) != file_stamp(f)]
    except (OSError, FarmError) as exc:
        raise FarmError(f"weights at {str(path)!r} cannot be read any more on this worker ({exc}); nothing "
                        "was decoded with them: restore them and render again") from None  # fmt: skip
    names = sorted(f.name for f in files)
    if names != sorted(pinned):
        raise FarmError(f"weights at {str(path)!r} are other files than this render checked "
                        f"({sorted(pinned)}, now {names}); nothing was decoded with them")  # fmt: skip
    if changed and C.content_identity(files) != spec.weights.get("identity"):
        raise FarmError(
            f"weights file {str(changed[0])!r} changed since this render checked it (content identity "
            f"{spec.weights.get('identity')}, now {C.content_identity(files)}); nothing was decoded with it: "
            "restore the weights and render again"
        )


# ---- reading (worker) --------------------------------------------------------------------------


class _Named:
    """A tensor stand-in for diffusers' converters: its name in the file, and its shape."""

    def __init__(self, name: str | None, shape: tuple[int, ...]) -> None:
        self.name = name
        self.shape = shape


def converted_names(
    layout: C.Layout, cls: type[DiffusersVideoDecoder], infos: dict[str, C.TensorInfo]
) -> dict[str, str]:
    """Diffusers names → the file's names, by diffusers' own converter for the layout (the family's
    `convert_names`), fed names and shapes only (no tensor is read); empty where diffusers has none."""
    mine = {n: _Named(n, i.shape) for n, i in infos.items() if n.startswith(layout.prefix)}
    if layout.name == "diffusers":
        return {n[len(layout.prefix) :]: n for n in mine}
    out = cls.convert_names(layout, mine, _Named(None, (0, 0)))
    return {k: v.name for k, v in out.items() if isinstance(v, _Named) and v.name is not None}


def read_derived(fh: Any, how: C.Derived) -> Any:
    """A tensor a file holds as part of another (`C.Derived`): its third of a fused projection, its rows
    scaled by a static gate in float32 (as ltx-core folds them)."""
    tensor = fh.get_tensor(how.base)
    if how.part is not None:
        tensor = tensor.chunk(3, dim=0)[how.part].contiguous()
    if how.gate is not None:
        gate = fh.get_tensor(how.gate).float()
        folded = gate[:, None] * tensor.float() if tensor.ndim == 2 else gate * tensor.float()
        tensor = folded.to(tensor.dtype)
    return tensor


@dataclass(frozen=True)
class DecoderRead:
    """What `read_decoder_state` reads: per file, the file's names of the decoder's tensors → their diffusers
    names, and the tensors a file holds only as parts of others (`C.Derived`)."""

    wanted: dict[Path, dict[str, str]]
    derived: dict[str, C.Derived]


def plan_decoder_read(
    spec: DecoderSpec, cls: type[DiffusersVideoDecoder], expected: dict[str, tuple[int, ...]]
) -> DecoderRead:
    """Which tensors of the spec's weights the decoder's `expected` tensors are, from the files' headers
    (an original layout's names by diffusers' converter, which may import diffusers); raises FarmError
    where they do not fit."""
    path = str(spec.weights["path"])
    _, layout, infos, derived = inspect_weights(spec, cls)
    found = converted_names(layout, cls, infos)
    full = cls._full_config(spec.config)
    names = {k: found.get(k) or layout.prefix + cls.original_name(k, layout.name, full)
             for k in [*expected, *cls.statistics_tensors]}  # fmt: skip
    parts = weight_mismatches(expected, infos, names, layout.prefix, cls.required_weights)
    if parts:
        raise_mismatch(parts, path)
    refuse_missing_statistics(missing_statistics(spec, cls.statistics_tensors, infos, names), spec, path)
    wanted: dict[Path, dict[str, str]] = {}
    for k, name in names.items():
        if name in infos:
            wanted.setdefault(infos[name].file, {})[name] = k
    return DecoderRead(wanted, derived)


def read_planned(plan: DecoderRead, device: str, dtype: Any) -> dict[str, Any]:
    """The tensors `plan` names, read straight onto `device` in `dtype` (diffusers names); every other
    tensor of the files is left unread. Imports nothing beyond torch and safetensors."""
    import torch
    from safetensors import SafetensorError, safe_open

    # on a CPU the tensors must not stay views of the mapped file: kernels take other paths (other
    # roundings) on data not aligned as torch's allocator aligns it
    copy = torch.device(device).type == "cpu"
    state: dict[str, Any] = {}
    for f, by_name in plan.wanted.items():
        if C.is_torch_pickle(f):  # mmap: only the tensors taken are read
            loaded = torch.load(str(f), map_location="cpu", weights_only=True, mmap=True)
            loaded = loaded.get("state_dict", loaded)
            for name, k in by_name.items():
                state[k] = loaded[name].to(device=device, dtype=dtype, copy=copy)
            continue
        try:
            with safe_open(str(f), framework="pt", device=str(device)) as fh:
                for name, k in by_name.items():
                    how = plan.derived.get(name)
                    tensor = read_derived(fh, how) if how is not None else fh.get_tensor(name)
                    state[k] = tensor.to(dtype=dtype, copy=copy)
        except (SafetensorError, OSError, ValueError) as exc:
            raise FarmError(f"weights file {str(f)!r} is not a readable .safetensors file: {exc}") from None
    return state


def read_decoder_state(
    spec: DecoderSpec, cls: type[DiffusersVideoDecoder], expected: dict[str, tuple[int, ...]], device: str,
    dtype: Any,
) -> dict[str, Any]:
    """The decoder's tensors (diffusers names) from the spec's weights, read straight onto `device` in
    `dtype`; every other tensor of the files is left unread. Raises FarmError where they do not fit."""
    return read_planned(plan_decoder_read(spec, cls, expected), device, dtype)


class ReadAhead:
    """A read of the decoder's tensors (`read_planned`) running on a thread of its own: taken once
    (`take`), its tensors dropped when they are not taken; `seconds` is the read's, once it finished."""

    def __init__(self, read: Callable[[], dict[str, Any]]) -> None:
        self.seconds: float | None = None
        self._state: dict[str, Any] | None = None
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, args=(read,), name="farm-weights-read", daemon=True)
        self._thread.start()

    def _run(self, read: Callable[[], dict[str, Any]]) -> None:
        started = time.perf_counter()
        try:
            self._state = read()
        except BaseException as exc:  # raised again by `take`, in the thread that builds the decoder
            self._error = exc
        finally:
            self.seconds = time.perf_counter() - started

    def take(self) -> dict[str, Any]:
        """The tensors read (waiting for the read to finish), or the read's error raised."""
        self._thread.join()
        if self._error is not None:
            raise self._error
        state, self._state = self._state, None
        assert state is not None
        return state

    def finish(self) -> None:
        """Wait for the read, and drop what it read unless it was taken."""
        self._thread.join()
        self._state = None


@contextlib.contextmanager
def reading_ahead(
    spec: DecoderSpec, cls: type[DiffusersVideoDecoder], expected: dict[str, tuple[int, ...]] | None,
    device: str, dtype: Any,
) -> Iterator[ReadAhead | None]:  # fmt: skip
    """The decoder's tensors `expected` being read onto `device` on a thread (`ReadAhead`) for the block,
    or None when nothing is `expected` yet (the model must be built first to know its tensors). Which
    tensors, and whether they fit, is settled first, on the calling thread (`plan_decoder_read`: a
    mismatch raises here); the thread imports nothing, so no import of it runs beside the block's. The
    read has finished when the block ends, its tensors dropped unless the block took them."""
    if expected is None:
        yield None
        return
    # here, not on the thread: an import of diffusers' converters (or of safetensors) beside the block's
    # imports could deadlock on their module locks
    import safetensors  # noqa: F401

    plan = plan_decoder_read(spec, cls, expected)
    ahead = ReadAhead(lambda: read_planned(plan, device, dtype))
    try:
        yield ahead
    finally:
        ahead.finish()
