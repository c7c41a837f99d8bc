"""Decoder checkpoints as users hold them: their files, what they hold, their layout, their identity.

Everything here reads file headers only and imports neither torch nor diffusers, so the driver (synth,
ingest, render) checks weights in milliseconds:

* files: a diffusers folder (``*.safetensors``), one ``.safetensors`` file, or a torch pickle
  (``.pt``/``.pth``: Wan 2.1's ``Wan2.1_VAE.pth``, HunyuanVideo's ``{"state_dict": ...}``); a pickle's
  tensor names and shapes come from its ``data.pkl`` read by a restricted unpickler that builds no
  tensor and imports nothing;
* layouts, told apart by the names: ``diffusers`` (what ``save_pretrained`` writes), ``ltx-original``
  (Lightricks' naming, LTX-2 and LTX-Video 0.9.x alike, as in their full checkpoints under ``vae.`` and in
  ComfyUI's VAE-only files without it), ``wan-original`` (Wan 2.1's own naming) and ``wan22-original``
  (Wan 2.2 TI2V's ``Wan2.2_VAE.pth``: residual up blocks, each a sequence of resnets and a resampler);
* :func:`original_name`: a diffusers tensor name in an original layout, the inverse of diffusers'
  converters (``diffusers.loaders.single_file_utils``) for the decoder's tensors; the workers convert
  with diffusers' own converters and the tests check both directions agree (diffusers' library has no
  converter for Wan 2.2's file: its names follow ``convert_vae_22`` in diffusers'
  ``scripts/convert_wan_to_diffusers.py``, checked against Wan2.2's own module names);
* :func:`content_identity`: sizes, safetensors headers and sampled bytes, hashed, so a render notices
  weights that changed since its job was made (a few dozen small reads per file, whatever its size).
"""

from __future__ import annotations

import hashlib
import json
import math
import pickle
import re
import zipfile
from collections import OrderedDict
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from farm.errors import FarmError

SAFETENSORS_SUFFIX = ".safetensors"
TORCH_SUFFIXES = (".pt", ".pth", ".bin", ".ckpt")
LAYOUTS = ("diffusers", "ltx-original", "wan-original", "wan22-original")
# A file's LTX-2 (or LTX-Video) video VAE sits under this prefix in the full checkpoints.
VAE_PREFIX = "vae."
FLOAT_DTYPES = ("F32", "F16", "BF16", "F64")
_MAX_HEADER = 256 * 2**20  # a safetensors header longer than this is not one


@dataclass(frozen=True)
class TensorInfo:
    shape: tuple[int, ...]
    dtype: str  # safetensors' dtype names (F32, BF16, ...)
    file: Path


@dataclass(frozen=True)
class Layout:
    name: str  # one of LAYOUTS
    prefix: str  # "" or "vae.": what precedes the VAE's names in the file


# ---- files -------------------------------------------------------------------------------------


def weight_files(path: Path) -> list[Path]:
    """The files holding the weights at `path`: a folder's .safetensors files (sorted), or the file."""
    if not path.is_dir():
        if not path.name.endswith((SAFETENSORS_SUFFIX, *TORCH_SUFFIXES)):
            raise FarmError(
                f"weights file {str(path)!r} is neither .safetensors nor a torch checkpoint "
                f"({', '.join(TORCH_SUFFIXES)}); give a diffusers folder, a .safetensors file or a .pt/.pth"
            )
        return [path]
    files = sorted(path.glob("*" + SAFETENSORS_SUFFIX))
    if not files:
        raise FarmError(
            f"weights folder {str(path)!r} holds no .safetensors file; expected a diffusers folder "
            "(config.json + diffusion_pytorch_model.safetensors) as written by save_pretrained"
        )
    return files


def is_torch_pickle(path: Path) -> bool:
    return path.name.endswith(TORCH_SUFFIXES)


def safetensors_header(path: Path) -> tuple[dict[str, Any], int]:
    """A .safetensors file's JSON header and its length in bytes (data starts at 8 + that length)."""
    try:
        with open(path, "rb") as f:
            n = int.from_bytes(f.read(8), "little")
            if not 0 < n <= min(_MAX_HEADER, path.stat().st_size - 8):
                raise ValueError(f"header length {n} does not fit the file")
            header = json.loads(f.read(n))
        if not isinstance(header, dict):
            raise ValueError("the header is not a JSON object")
    except (OSError, ValueError) as exc:
        raise FarmError(f"weights file {str(path)!r} is not a readable .safetensors file: {exc}") from None
    return header, n


def file_vae_config(path: Path, header: dict[str, Any]) -> dict[str, Any] | None:
    """The ``vae`` entry of a safetensors file's ``config`` metadata (`header`: its parsed JSON header),
    or None when the file carries none. A config that is not JSON is refused, naming the file."""
    metadata = header.get("__metadata__")
    if not isinstance(metadata, dict) or "config" not in metadata:
        return None
    try:
        config = json.loads(metadata["config"])
    except (TypeError, ValueError) as exc:
        raise FarmError(f"weights file {str(path)!r}: its 'config' metadata is not JSON ({exc})") from None
    vae = config.get("vae") if isinstance(config, dict) else None
    return vae if isinstance(vae, dict) else None


# Bytes per element of safetensors' dtypes and torch's storage types (by their names here).
ITEMSIZE = {"F64": 8, "F32": 4, "F16": 2, "BF16": 2, "I64": 8, "I32": 4, "I16": 2, "I8": 1, "U8": 1,
            "BOOL": 1, "F8_E4M3": 1, "F8_E5M2": 1, "Long": 8, "Int": 4, "Short": 2, "Char": 1, "Byte": 1,
            "Bool": 1}  # fmt: skip
# A storage may hold more than its tensors use (a view of a larger tensor), up to this much more.
STORAGE_SLACK_BYTES = 2**20


class _Storage:
    def __init__(self, dtype: str, key: str, numel: int) -> None:
        self.dtype, self.key, self.numel = dtype, key, numel
        self.used = 0  # elements its tensors reach (offset + span), the most of them
        self.expanded = 0  # elements of its largest tensor, materialised (stride 0 and overlaps expanded)


class _Tensor:
    def __init__(self, storage: _Storage, size: Iterable[int]) -> None:
        self.shape = tuple(int(s) for s in size)
        self.dtype = storage.dtype


def _rebuild_tensor(storage: _Storage, offset: int, size: Iterable[int], stride: Iterable[int] = (),
                    *_rest: Any) -> _Tensor:  # fmt: skip
    if not isinstance(storage, _Storage):
        raise pickle.UnpicklingError("a tensor without a storage")
    tensor = _Tensor(storage, size)
    strides = [int(s) for s in stride] or [1] * len(tensor.shape)
    reach = sum((n - 1) * s for n, s in zip(tensor.shape, strides, strict=False))
    span = 0 if 0 in tensor.shape else 1 + reach
    storage.used = max(storage.used, int(offset) + span)
    storage.expanded = max(storage.expanded, math.prod(tensor.shape))
    return tensor


def _rebuild_parameter(data: _Tensor, *_rest: Any) -> _Tensor:
    return data


_STORAGE_DTYPES = {"FloatStorage": "F32", "HalfStorage": "F16", "BFloat16Storage": "BF16",
                   "DoubleStorage": "F64"}  # fmt: skip


class _HeaderUnpickler(pickle.Unpickler):
    """Unpickles a torch checkpoint's structure: tensors become their shape and dtype, nothing else is
    built and nothing is imported (anything but tensors, dicts and plain values is refused)."""

    def find_class(self, module: str, name: str) -> Any:
        if (module, name) == ("collections", "OrderedDict"):
            return OrderedDict
        if (module, name) == ("torch._utils", "_rebuild_tensor_v2"):
            return _rebuild_tensor
        if (module, name) == ("torch._utils", "_rebuild_parameter"):
            return _rebuild_parameter
        if module == "torch" and name.endswith("Storage"):
            return _STORAGE_DTYPES.get(name, name.removesuffix("Storage"))
        raise pickle.UnpicklingError(f"{module}.{name} is not a tensor or a plain value")

    def persistent_load(self, pid: Any) -> _Storage:  # ('storage', storage type, key, location, numel)
        if not (isinstance(pid, tuple) and len(pid) >= 5 and isinstance(pid[4], int) and pid[4] >= 0):
            raise pickle.UnpicklingError(f"a storage reference {str(pid)[:80]} is not torch's")
        key = str(pid[2])
        if key not in self.storages:
            self.storages[key] = _Storage(str(pid[1]), key, pid[4])
        return self.storages[key]

    def __init__(self, file: Any) -> None:
        super().__init__(file)
        self.storages: dict[str, _Storage] = {}


def torch_pickle_tensors(path: Path) -> dict[str, tuple[tuple[int, ...], str]]:
    """Names → (shape, dtype) of a ``torch.save`` file's state dict (``{"state_dict": {...}}`` or the
    dict itself), from its pickle alone: no tensor data is read."""
    try:
        with zipfile.ZipFile(path) as z:
            pkl = next(n for n in z.namelist() if n.endswith("/data.pkl") or n == "data.pkl")
            unpickler = _HeaderUnpickler(z.open(pkl))
            obj = unpickler.load()
            check_storages(path, z, pkl.removesuffix("data.pkl"), unpickler.storages)
    except (OSError, zipfile.BadZipFile, StopIteration, pickle.UnpicklingError, EOFError, ValueError,
            TypeError, AttributeError, IndexError, KeyError, RecursionError) as exc:  # fmt: skip
        # the last five: a crafted pickle calling what it names with the wrong arguments
        raise FarmError(
            f"weights file {str(path)!r} is not a torch checkpoint farm can read "
            f"({type(exc).__name__}: {str(exc)[:200] or 'no detail'}); expected a torch.save zip file of a "
            "state dict (tensors only)"
        ) from None
    if isinstance(obj, dict) and isinstance(obj.get("state_dict"), dict):
        obj = obj["state_dict"]
    if not isinstance(obj, dict):
        raise FarmError(f"weights file {str(path)!r} holds a {type(obj).__name__}, not a state dict")
    return {str(k): (v.shape, v.dtype) for k, v in obj.items() if isinstance(v, _Tensor)}


def check_torch_storages(path: Path) -> None:
    """`check_storages` for any ``torch.save`` zip (a latent file too: a tensor, a list or a dict of them),
    before ``torch.load`` allocates them; a file whose pickle this reader cannot follow is left to the
    loader, which refuses it in its own words."""
    try:
        with zipfile.ZipFile(path) as z:
            pkl = next(n for n in z.namelist() if n.endswith("/data.pkl") or n == "data.pkl")
            unpickler = _HeaderUnpickler(z.open(pkl))
            unpickler.load()
            storages = unpickler.storages
            check_storages(path, z, pkl.removesuffix("data.pkl"), storages)
    except (OSError, zipfile.BadZipFile, StopIteration, pickle.UnpicklingError, EOFError, ValueError,
            TypeError, AttributeError, IndexError, KeyError, RecursionError):  # fmt: skip
        return


def check_storages(path: Path, z: zipfile.ZipFile, root: str, storages: dict[str, _Storage]) -> None:
    """Every storage of a torch checkpoint is whole and no larger than its tensors use: its member
    ``<root>data/<key>`` holds its bytes (the archive not cut short), and it holds no more than its
    tensors reach (beyond `STORAGE_SLACK_BYTES`: a small file may not unpack into a large storage)."""
    size = path.stat().st_size
    for key, storage in storages.items():
        name = f"{root}data/{key}"
        try:
            info = z.getinfo(name)
        except KeyError:
            raise FarmError(f"weights file {str(path)!r}: storage {key} has no member {name!r}") from None
        need = storage.numel * ITEMSIZE.get(storage.dtype, 1)
        used = storage.used * ITEMSIZE.get(storage.dtype, 1)
        expanded = storage.expanded * ITEMSIZE.get(storage.dtype, 1)
        if expanded - need > STORAGE_SLACK_BYTES:  # a stride-0 or overlapping view: counted as torch.load
            raise FarmError(  # and every reader of it would materialise it, not as stored
                f"{str(path)!r}: storage {key} holds {need} bytes but a tensor of it expands to {expanded} "
                "bytes (a stride-0 or overlapping view, e.g. expand()); refused unread. Save the tensor "
                "itself (contiguous() or clone() before torch.save)"
            )
        if need - used > STORAGE_SLACK_BYTES:
            raise FarmError(
                f"weights file {str(path)!r}: storage {key} declares {need} bytes for tensors of {used} "
                "bytes; refused unread (a small file may not unpack into a large storage). Save the tensors "
                "themselves (clone() before torch.save)"
            )
        end = info.header_offset + 30 + len(info.filename.encode()) + len(info.extra) + info.compress_size
        if info.file_size < need or end > size:
            missing = max(need - info.file_size, end - size)
            raise FarmError(
                f"weights file {str(path)!r} is cut short: {missing} bytes missing (storage {key} needs "
                f"{need} bytes, member {name!r} declares {info.file_size} and the archive is {size} bytes)"
            )


def check_safetensors_data(path: Path, header: dict[str, Any], header_bytes: int) -> None:
    """Every tensor's declared bytes lie inside the file and match its shape and dtype."""
    data = path.stat().st_size - 8 - header_bytes
    end = 0
    for name, entry in header.items():
        if name == "__metadata__" or not isinstance(entry, dict):
            continue
        offsets: list[int] = entry.get("data_offsets") or []
        shape: list[int] = entry.get("shape") or []
        valid = (isinstance(offsets, list) and len(offsets) == 2 and all(isinstance(o, int) for o in offsets)
                 and 0 <= offsets[0] <= offsets[1] and isinstance(shape, list)
                 and all(isinstance(s, int) and s >= 0 for s in shape))  # fmt: skip
        if not valid:
            raise FarmError(
                f"weights file {str(path)!r}: header entry {name!r} has no valid data_offsets or shape"
            )
        itemsize = ITEMSIZE.get(str(entry.get("dtype")))
        count = 1
        for s in shape:
            count *= s
        if itemsize is not None and offsets[1] - offsets[0] != count * itemsize:
            raise FarmError(
                f"weights file {str(path)!r}: tensor {name!r} of shape {tuple(shape)} ({entry.get('dtype')}) "
                f"declares {offsets[1] - offsets[0]} bytes, not {count * itemsize}"
            )
        end = max(end, offsets[1])
    if end > data:
        raise FarmError(
            f"weights file {str(path)!r} is cut short: {end - data} bytes missing (its tensors need {end} "
            f"bytes of data after the header, the file holds {max(data, 0)})"
        )


def read_tensor_infos(files: list[Path]) -> dict[str, TensorInfo]:
    """Every tensor's shape, dtype and file, from the headers of `files`."""
    infos: dict[str, TensorInfo] = {}
    for f in files:
        if is_torch_pickle(f):
            for name, (shape, dtype) in torch_pickle_tensors(f).items():
                infos[name] = TensorInfo(shape, dtype, f)
            continue
        header, header_bytes = safetensors_header(f)
        check_safetensors_data(f, header, header_bytes)
        for name, entry in header.items():
            if name == "__metadata__":
                continue
            if not isinstance(entry, dict) or "shape" not in entry:
                raise FarmError(f"weights file {str(f)!r}: header entry {name!r} is not a tensor")
            infos[name] = TensorInfo(tuple(int(s) for s in entry["shape"]), str(entry.get("dtype")), f)
    return infos


# ---- identity ----------------------------------------------------------------------------------

_SAMPLES = 32
_SAMPLE_BYTES = 4096


def content_identity(files: list[Path]) -> str:
    """A short hash of the weights' names, sizes, headers and 33 sampled 4 KiB blocks of each file.

    Any change of tensor names, shapes, dtypes or file sizes changes it, and so do different weights of
    the same architecture (a retrained or re-quantised checkpoint differs in every sampled block); an
    edit confined to bytes between the samples would go unnoticed. Costs ~35 reads per file: well under
    a millisecond for a 2 GiB file in the page cache, a few out of it.
    """
    digest = hashlib.sha256()
    for f in files:
        size = f.stat().st_size
        digest.update(f"{f.name}\0{size}\0".encode())
        with open(f, "rb") as fh:
            head = 8 + safetensors_header(f)[1] if f.name.endswith(SAFETENSORS_SUFFIX) else 65536
            digest.update(fh.read(head))
            for i in range(_SAMPLES + 1):
                fh.seek(max(0, min(head + (size - head) * i // _SAMPLES, size - _SAMPLE_BYTES)))
                digest.update(fh.read(_SAMPLE_BYTES))
    return digest.hexdigest()[:32]


# ---- layouts -----------------------------------------------------------------------------------


def detect_layout(names: Iterable[str], family: str, where: str) -> Layout:
    """The layout of a checkpoint holding `names`, for a decoder of `family`."""
    names = list(names)
    prefix = VAE_PREFIX if any(n.startswith(VAE_PREFIX + "decoder.") for n in names) else ""
    inner = [n[len(prefix) :] for n in names if n.startswith(prefix)]
    if not any(n.startswith("decoder.") for n in inner):
        raise FarmError(
            f"weights at {where} hold no decoder tensors (no name starts with 'decoder.' or "
            f"'vae.decoder.'; e.g. {names[0] if names else 'no tensors at all'!r}); give a VAE checkpoint"
        )
    if family == "ltx2-diffusion":  # Lightricks' names (ltx-core) or diffusers'
        lightricks = any(mark in n for n in inner for mark in LTX_DIFFUSION_MARKS)
        return Layout("ltx-original" if lightricks else "diffusers", prefix)
    ltx = any(
        n.startswith("decoder.up_blocks.0.res_blocks.") or "per_channel_statistics." in n for n in inner
    )
    wan = any(n.startswith("decoder.middle.") for n in inner)
    if any(n.startswith("decoder.mid_block.") for n in inner) or not (ltx or wan):
        return Layout("diffusers", prefix)  # (a partial file is compared as one: its mismatches are named)
    if ltx and family in ("ltx2", "ltxv"):
        return Layout("ltx-original", prefix)
    if wan and family == "wan":  # Wan 2.2's up blocks hold their resnets and resampler as `upsamples`
        residual = any(_WAN22_UP.fullmatch(n) for n in inner)
        return Layout("wan22-original" if residual else "wan-original", prefix)
    raise FarmError(
        f"weights at {where} are in {'an LTX' if ltx else 'a Wan'} original layout, not one a {family} "
        "decoder reads: check the spec's family (LTX original files: ltx2, ltxv; Wan 2.1 / 2.2 files: wan)"
    )


def ltx_variant(family: str, full_config: dict[str, Any]) -> str:
    """Which of Lightricks' decoder namings a config has: LTX-2 ("ltx2"), LTX-Video 0.9.0 ("0.9.0": up
    blocks with their own conv_in) or 0.9.1 and later ("0.9.1": residual upsamplers)."""
    if family == "ltx2":
        return "ltx2"
    return "0.9.1" if any(full_config.get("upsample_residual") or ()) else "0.9.0"


def _ltx_block_table(variant: str, n_blocks: int) -> list[tuple[str, str]]:
    """(diffusers prefix, original prefix) of the decoder's blocks, longest diffusers prefix first."""
    if variant == "0.9.0":  # diffusers' VAE_KEYS_RENAME_DICT, inverted
        forward = ["mid_block", "up_blocks.0", "up_blocks.1.upsamplers.0", "up_blocks.1",
                   "up_blocks.2.conv_in", "up_blocks.2.upsamplers.0", "up_blocks.2", "up_blocks.3.conv_in",
                   "up_blocks.3.upsamplers.0", "up_blocks.3"]  # fmt: skip
    else:  # LTX-2 and LTX-Video 0.9.1/0.9.5: each up block's upsampler, then its resnets
        forward = ["mid_block"] + [
            p for i in range(n_blocks) for p in (f"up_blocks.{i}.upsamplers.0", f"up_blocks.{i}")
        ]
    table = [(f"decoder.{d}.", f"decoder.up_blocks.{i}.") for i, d in enumerate(forward)]
    return sorted(table, key=lambda t: -len(t[0]))


_LTX_STATISTICS = {
    "latents_mean": "per_channel_statistics.mean-of-means",
    "latents_std": "per_channel_statistics.std-of-means",
}
_WAN_RESNET_PARTS = {"norm1.gamma": "residual.0.gamma", "conv1.": "residual.2.",
                     "norm2.gamma": "residual.3.gamma", "conv2.": "residual.6.",
                     "conv_shortcut.": "shortcut."}  # fmt: skip


def original_name(name: str, layout: str, family: str, full_config: dict[str, Any]) -> str:
    """The name diffusers' tensor `name` has in `layout` (without a file's prefix)."""
    if layout == "diffusers":
        return name
    if layout == "ltx-original" and family == "ltx2-diffusion":
        return _ltx_diffusion_original(name)
    if layout == "ltx-original":
        return _ltx_original(name, ltx_variant(family, full_config), full_config)
    if layout == "wan-original":
        return _wan_original(name)
    if layout == "wan22-original":
        return _wan22_original(name, int(full_config["num_res_blocks"]))
    raise ValueError(layout)


def _ltx_original(name: str, variant: str, full: dict[str, Any]) -> str:
    if name in _LTX_STATISTICS:
        return _LTX_STATISTICS[name]
    for diffusers_prefix, original in _ltx_block_table(variant, len(full["decoder_block_out_channels"])):
        if name.startswith(diffusers_prefix):
            name = original + name[len(diffusers_prefix) :]
            break
    name = name.replace(".resnets.", ".res_blocks.")
    if variant != "ltx2":  # LTX-Video's converter also renames these
        name = name.replace("conv_shortcut.conv.", "conv_shortcut.").replace(".norm3.", ".norm3.norm.")
        for top in ("time_embedder.", "scale_shift_table"):
            if name.startswith("decoder." + top):
                name = "decoder.last_" + name[len("decoder.") :]
    return name


# ---- LTX-2.5's diffusion decoder in Lightricks' layout -------------------------------------------
#
# As ltx-core 1.2.0 reads it (`ltx_core/model/video_vae/model_configurator.py`,
# `_build_diffusion_vae_decoder_sd_ops`): the names of its `DiffusionVideoDecoder` modules, with, in the
# released files, one fused ``attn.qkv`` projection (split into ``to_q``/``to_k``/``to_v``), static gates
# beside three projections (``gate_msa``, ``gate_mlp``, ``gate_ctx``: folded into the projection's rows),
# the timestep MLP under the reference's ``t_embedder.mlp.{0,2}`` and preview heads (``coarse_*``) that
# the decoder does not run.

_LTX_DIFFUSION_RENAMES = (
    (".attn.to_q.", ".attn.qkv.to_q."),
    (".attn.to_k.", ".attn.qkv.to_k."),
    (".attn.to_v.", ".attn.qkv.to_v."),
    (".attn.to_out.0.", ".attn.proj."),
    (".attn.norm_q.", ".attn.q_norm."),
    (".attn.norm_k.", ".attn.k_norm."),
)
_LTX_DIFFUSION_TIMESTEP = (
    ("decoder.t_embedder.mlp.0.", "decoder.t_embedder.timestep_embedder.linear_1."),
    ("decoder.t_embedder.mlp.2.", "decoder.t_embedder.timestep_embedder.linear_2."),
)
# Lightricks' layout: a projection (its weight and bias) and the gate tensor that scales its output rows
LTX_DIFFUSION_GATES = {
    ".attn.proj.": ".gate_msa",
    ".mlp.w_down.": ".gate_mlp",
    ".context_proj.": ".gate_ctx",
}
# names only Lightricks' layout has (diffusers' modules share the rest: det_stages, diff_blocks, ...)
LTX_DIFFUSION_MARKS = (".attn.qkv.", ".attn.proj.", "per_channel_statistics.", "t_embedder.mlp.")


def _ltx_diffusion_original(name: str) -> str:
    if name in _LTX_STATISTICS:
        return _LTX_STATISTICS[name]
    for diffusers_part, original in _LTX_DIFFUSION_RENAMES:
        name = name.replace(diffusers_part, original)
    return name


@dataclass(frozen=True)
class Derived:
    """A tensor the decoder takes that a file holds only as part of another: rows ``part`` of three of
    `base` (a fused Q/K/V projection), scaled row by row by `gate` where a static gate sits beside it."""

    base: str
    part: int | None = None
    gate: str | None = None


def ltx_diffusion_tensors(
    infos: dict[str, TensorInfo], prefix: str
) -> tuple[dict[str, TensorInfo], dict[str, Derived]]:
    """A Lightricks-layout diffusion decoder file's tensors as the decoder's modules take them: fused
    projections split (virtual names ``…attn.qkv.to_q.weight``), the timestep MLP renamed, gates and
    preview heads consumed; and how each virtual or gated tensor is read (:class:`Derived`)."""
    gate_suffixes = tuple(LTX_DIFFUSION_GATES.values())
    gates = {n for n in infos if n.startswith(prefix + "decoder.") and n.endswith(gate_suffixes)}
    out: dict[str, TensorInfo] = {}
    derived: dict[str, Derived] = {}
    for name, info in infos.items():
        if name in gates or name.startswith(prefix + "decoder.coarse_"):
            continue
        leaf = name.rsplit(".", 1)[-1]
        if name.endswith((".attn.qkv.weight", ".attn.qkv.bias")) and info.shape and info.shape[0] % 3 == 0:
            for part, which in enumerate("qkv"):
                virtual = f"{name[: -len(leaf)]}to_{which}.{leaf}"
                out[virtual] = TensorInfo((info.shape[0] // 3, *info.shape[1:]), info.dtype, info.file)
                derived[virtual] = Derived(name, part)
            continue
        renamed = name
        for reference, module in _LTX_DIFFUSION_TIMESTEP:
            if name.startswith(prefix + reference):
                renamed = prefix + module + name[len(prefix + reference) :]
                derived[renamed] = Derived(name)
        out[renamed] = info
    for name in out:
        for projection, suffix in LTX_DIFFUSION_GATES.items():
            leaf = name.rsplit(".", 1)[-1]
            if name.endswith(projection + leaf) and leaf in ("weight", "bias"):
                gate = name[: -len(projection + leaf)] + suffix
                if gate in gates:
                    base = derived[name].base if name in derived else name
                    derived[name] = Derived(base, derived[name].part if name in derived else None, gate)
    return out, derived


def ltx_diffusion_metadata_mismatches(files: list[Path], full_config: dict[str, Any]) -> list[str]:
    """How the ``config`` JSON a Lightricks file carries in its metadata (``vae`` → ``decoder``, as
    ltx-core's `_build_diffusion_video_decoder` reads it) differs from the decoder config; empty where
    the files carry none."""
    found: list[str] = []
    for f in files:
        if not f.name.endswith(SAFETENSORS_SUFFIX):
            continue
        meta = safetensors_header(f)[0].get("__metadata__") or {}
        try:
            vae = json.loads(meta["config"])["vae"]
        except (KeyError, TypeError, ValueError):
            continue
        if not isinstance(vae, dict):
            continue
        decoder = vae.get("decoder", vae) if isinstance(vae.get("decoder", vae), dict) else vae
        pairs = {"stage_channels": "decoder_stage_channels", "stage_depths": "decoder_stage_depths",
                 "stage5_kernel": "decoder_stage5_kernel", "head_dim": "decoder_head_dim",
                 "patch_size": "patch_size", "t_emb_dim": "decoder_t_emb_dim",
                 "timestep_scale_multiplier": "decoder_timestep_scale_multiplier",
                 "default_num_inference_steps": "decoder_num_inference_steps"}  # fmt: skip
        theirs = {key: decoder[key] for key in pairs if key in decoder}
        if "stage_kernels" in decoder:  # one a stage; the last is stage 5's, read from stage5_kernel
            theirs["stage_kernels"] = decoder["stage_kernels"][: len(full_config["decoder_stage_kernels"])]
            pairs["stage_kernels"] = "decoder_stage_kernels"
        if "model_output_type" in vae:
            theirs["model_output_type"] = vae["model_output_type"]
            pairs["model_output_type"] = "decoder_model_output_type"
        for key, value in theirs.items():
            ours = full_config.get(pairs[key])
            if json.loads(json.dumps(value)) != json.loads(json.dumps(ours)):
                found.append(f"{key} {value!r} in {f.name}'s config ≠ {pairs[key]} {ours!r}")
    return found


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


def check_layout_fits(layout: str, family: str, full_config: dict[str, Any], where: str) -> None:
    """Refuse an original layout whose fixed numbering cannot name this config's tensors."""
    if layout == "wan22-original" and not full_config.get("is_residual"):
        raise FarmError(
            f"weights at {where} are in Wan 2.2 TI2V's original layout (residual up blocks); this config "
            "has none: use a Wan 2.2 config (wan2.2, wan2.2-tiny)"
        )
    if layout == "wan-original" and (
        full_config.get("num_res_blocks") != 2 or full_config.get("is_residual")
    ):
        raise FarmError(
            f"weights at {where} are in Wan 2.1's original layout, which numbers 2 resnets per encoder "
            "block (3 per decoder block) and no residual up blocks; this config has num_res_blocks="
            f"{full_config.get('num_res_blocks')}: use a Wan 2.1 config (wan, wan-tiny) or a diffusers folder"
        )
