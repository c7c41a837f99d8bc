"""Checkpoints as users hold them: tiny models of every family written in each original layout (farm's
inverse of diffusers' key maps, checked against diffusers' converters) load and decode bit-identically
to the same weights as a diffusers folder, and to diffusers' own ``from_pretrained`` of that folder;
bad files, missing statistics and changed files are refused."""

from __future__ import annotations

import json
import resource
from pathlib import Path

import numpy as np
import pytest
import torch
import zarr

from farm.decoders import FAMILIES, decoder_class, spec_from_json
from farm.decoders import checkpoints as C
from farm.decoders import weights as W
from farm.decoders.diffusers_vae import assert_materialised
from farm.decoders.recording import recorded_decoder_tensors
from farm.errors import FarmError
from farm.inputs.synthetic import resolve_decoder, smooth_latent, synth
from tests.helpers import LTX2_TINY_FILE_CONFIG, LTXV_TINY_FILE_CONFIGS, farm

pytestmark = pytest.mark.model

ORIGINAL_LAYOUTS = {"ltx2": ("ltx-original",), "ltxv": ("ltx-original",), "wan": ("wan-original",)}
# (diffusers' library has no converter for Wan 2.2's own file; its names are checked in test_conformance_*)
# Tensors of a full LTX-2 checkpoint that are not the video decoder's (names as Lightricks ships them).
NOT_THE_DECODER = {
    "model.diffusion_model.transformer_blocks.0.attn1.to_q.weight": (16, 16),
    "audio_vae.decoder.conv_in.conv.weight": (8, 4, 3, 3),
    "audio_vae.per_channel_statistics.mean-of-means": (4,),
    "vocoder.conv_pre.weight": (8, 4, 7),
    "text_embedding_projection.aggregate_embed.weight": (8, 8),
}


def raw_spec(name: str, weights: dict, **over) -> dict:
    extra = {"decode_timestep": 0.05} if name == "ltxv-0.9.1-tiny" else {}
    return {"family": resolve_decoder(name)[0], "config": name, "weights": weights, **extra, **over}


def source_model(name: str, seed: int = 5):
    """A tiny model of `name` with seeded weights (LTX: non-trivial latent statistics)."""
    spec = spec_from_json(raw_spec(name, {"random_seed": seed}))
    cls = decoder_class(spec)
    model = cls.build(spec)
    if spec.family in ("ltx2", "ltxv"):
        c = cls.latent_channels_for(spec.config)
        model.latents_mean.copy_(torch.linspace(-0.5, 0.5, c))
        model.latents_std.copy_(torch.linspace(0.5, 2.0, c))
    return spec, cls, model


def original_state(spec, cls, model, layout: str) -> dict[str, torch.Tensor]:
    """The decoder's tensors of `model` under their names in `layout` (farm's inverse of diffusers')."""
    full = cls._full_config(spec.config)
    keep = cls.decoder_tensor_shapes(spec.config)
    return {decoder_class(spec).original_name(k, layout, full): v.detach().clone().contiguous()
            for k, v in model.state_dict().items() if k in keep}  # fmt: skip


def rand(shape, seed: int = 0) -> torch.Tensor:
    return torch.randn(shape, generator=torch.Generator().manual_seed(seed))


def write_checkpoint(spec, cls, model, form: str, folder: Path) -> Path:
    """`model`'s weights in one of the forms users hold; returns the path to give as --weights."""
    from safetensors.torch import save_file

    if form == "diffusers-file":
        path = folder / "vae.safetensors"
        save_file({k: v.contiguous() for k, v in model.state_dict().items()}, str(path))
    elif form in ("ltx-full", "ltx-vae-only"):  # LTX-2's full checkpoint / ComfyUI's VAE file
        state = original_state(spec, cls, model, "ltx-original")
        c = cls.latent_channels_for(spec.config)
        state |= {"per_channel_statistics.channel": torch.arange(c).float(),
                  "per_channel_statistics.mean-of-stds": torch.ones(c),
                  "encoder.conv_out.conv.weight": rand((2 * c, 32, 3, 3, 3))}  # fmt: skip
        if form == "ltx-vae-only":
            path = folder / "vae_comfy.safetensors"
            save_file(state, str(path))
        else:
            state = {"vae." + k: v for k, v in state.items()}
            state |= {k: rand(shape) for k, shape in NOT_THE_DECODER.items()}
            path = folder / "ltx-2-full.safetensors"
            # LTX-2's files carry the decoder's config as ltx-core reads it (farm checks it against the job's)
            vae = LTX2_TINY_FILE_CONFIG if spec.family == "ltx2" else LTXV_TINY_FILE_CONFIGS[spec.config_name]
            save_file(state, str(path), metadata={"config": json.dumps({"vae": vae})})
    elif form == "wan-pth":
        state = original_state(spec, cls, model, "wan-original")
        state |= {"encoder.conv1.weight": rand((8, 3, 3, 3, 3)), "conv1.weight": rand((8, 8, 1, 1, 1))}
        path = folder / "Wan2.1_VAE.pth"
        torch.save(state, path)
    elif form == "wan22-pth":
        path = folder / "Wan2.2_VAE.pth"
        torch.save(original_state(spec, cls, model, "wan22-original"), path)
    elif form == "hunyuan-pt":
        path = folder / "pytorch_model.pt"
        torch.save({"state_dict": {k: v.contiguous() for k, v in model.state_dict().items()}}, path)
    else:
        raise ValueError(form)
    return path


CASES = [
    ("ltx2-tiny", "ltx-full", "ltx-original"),
    ("ltx2-tiny", "ltx-vae-only", "ltx-original"),
    ("ltx2-tiny", "diffusers-file", "diffusers"),
    ("ltxv-tiny", "ltx-full", "ltx-original"),
    ("ltxv-0.9.1-tiny", "ltx-full", "ltx-original"),
    ("wan-tiny", "wan-pth", "wan-original"),
    ("wan2.2-tiny", "wan22-pth", "wan22-original"),
    ("hunyuanvideo-tiny", "hunyuan-pt", "diffusers"),
]


def decode(decoder, seed: int = 1) -> torch.Tensor:
    shape = (decoder.latent_channels, 2, 2, 3)
    z = torch.from_numpy(smooth_latent(np.random.default_rng(seed), shape))
    return decoder.decode(z, origin=(0, 0, 0))


@pytest.mark.parametrize(("name", "form", "layout"), CASES)
def test_checkpoint_layouts_decode_as_the_diffusers_folder(tmp_path, name, form, layout):
    spec, cls, model = source_model(name)
    model.save_pretrained(tmp_path / "folder")
    path = write_checkpoint(spec, cls, model, form, tmp_path)
    folder_spec = spec_from_json(raw_spec(name, {"path": str(tmp_path / "folder")}, latents="normalized"))
    file_spec = spec_from_json(raw_spec(name, {"path": str(path)}, latents="normalized"))
    recorded = cls.check_weights(file_spec)  # headers only: names, shapes, dtypes
    assert recorded.weights["layout"] == layout and len(recorded.weights["identity"]) == 32
    assert recorded.weights["files"] == [path.name]
    reference = cls.load(folder_spec, "cpu")
    loaded = cls.load(recorded, "cpu")
    theirs = reference.model.state_dict()
    for key, value in loaded.model.state_dict().items():
        assert torch.equal(value, theirs[key]), key
    assert torch.equal(decode(loaded), decode(reference))


@pytest.mark.parametrize("name", ["ltx2-tiny", "ltxv-tiny", "ltxv-0.9.1-tiny", "wan-tiny", "wan2.2-tiny",
                                  "hunyuanvideo-tiny"])  # fmt: skip
def test_load_decodes_as_diffusers_from_pretrained(tmp_path, name):
    """The decoder built on the meta device and given the folder's tensors equals diffusers'
    ``from_pretrained(folder).to(device, dtype)``, tensor for tensor and decode for decode; nothing of
    it is left on the meta device, and the encoder is not built."""
    spec, cls, model = source_model(name)
    model.save_pretrained(tmp_path / "folder")
    dtypes = ["float32", "bfloat16"] if name == "ltx2-tiny" else ["float32"]
    for dtype in dtypes:
        fspec = spec_from_json(
            raw_spec(name, {"path": str(tmp_path / "folder")}, latents="normalized", dtype=dtype)
        )
        pretrained = cls.model_class().from_pretrained(tmp_path / "folder").to("cpu", getattr(torch, dtype))
        for t in [*pretrained.parameters(), *pretrained.buffers()]:  # views of the mapped file, whose
            t.data = t.data.clone()  # alignment sends CPU kernels down other paths: aligned copies
        reference = cls.from_model(fspec, pretrained, "cpu")
        loaded = cls.load(fspec, "cpu")
        assert isinstance(loaded.model.encoder, torch.nn.Identity)
        assert not any(t.is_meta for t in [*loaded.model.parameters(), *loaded.model.buffers()])
        assert_materialised(loaded.model, "test")
        for key, value in loaded.model.state_dict().items():
            assert value.dtype == getattr(torch, dtype) and torch.equal(
                value, reference.model.state_dict()[key]
            )
        assert torch.equal(decode(loaded), decode(reference))


def test_a_meta_tensor_left_behind_is_refused():
    spec, cls, _ = source_model("ltx2-tiny")
    model = cls.meta_model(spec.config)
    with pytest.raises(
        FarmError, match=r"28 tensors were not loaded \(latents_mean, latents_std, decoder\.conv_in"
    ):
        assert_materialised(model, "x")
    model.load_state_dict({k: torch.zeros(s) for k, s in cls.decoder_tensor_shapes(spec.config).items()
                           if k != "decoder.conv_out.conv.bias"}, strict=False, assign=True)  # fmt: skip
    with pytest.raises(FarmError, match=r"1 tensors were not loaded \(decoder\.conv_out\.conv\.bias\)"):
        assert_materialised(model, "x")


def test_random_weights_keep_their_bytes():
    """Random-weights specs build the whole model as diffusers initialises it, seeded: the same bytes."""
    spec, cls, _ = source_model("wan-tiny")
    torch.manual_seed(int(spec.weights["random_seed"]))
    expected = cls.model_class()(**spec.config).state_dict()
    loaded = cls.load(spec, "cpu").model.state_dict()
    for key, value in loaded.items():
        assert torch.equal(value, expected[key]), key


@pytest.mark.parametrize(("family", "cls"), sorted(FAMILIES.items()))
def test_inverse_names_agree_with_diffusers_converters(family, cls):
    """For every named config (real ones included), diffusers' converter maps farm's original names of
    the decoder's tensors (as recorded for the config) back to diffusers' names, one to one."""
    for name, config in cls.named_configs.items():
        expected = recorded_decoder_tensors(cls, name)
        assert expected == cls.decoder_tensor_shapes(config), (
            f"{name}: rerun tools/record_decoder_defaults.py"
        )
        full = cls._full_config(config)
        for layout in ORIGINAL_LAYOUTS.get(family, ()):
            if layout == "wan-original" and full.get("is_residual"):
                continue  # Wan 2.2's own layout is not Wan 2.1's
            for prefix in ("", "vae.") if layout == "ltx-original" else ("",):
                infos = {prefix + cls.original_name(k, layout, full):
                         C.TensorInfo(tuple(s), "F32", Path("x")) for k, s in expected.items()}  # fmt: skip
                assert C.detect_layout(infos, cls, "x", FAMILIES.values()) == C.Layout(layout, prefix)
                names = W.converted_names(C.Layout(layout, prefix), cls, infos)
                assert {k: names[k] for k in expected} == {
                    k: prefix + cls.original_name(k, layout, full) for k in expected
                }, (name, layout, prefix)


def write_sparse_safetensors(path: Path, tensors: dict[str, torch.Tensor], big: dict[str, tuple[int, ...]]):
    """A .safetensors file of `tensors` and, after them, `big` float32 tensors left as holes (no disk)."""
    header: dict = {}
    offset = 0
    blobs = []
    for name, t in tensors.items():
        data = t.contiguous().numpy().tobytes()
        header[name] = {"dtype": "F32", "shape": list(t.shape), "data_offsets": [offset, offset + len(data)]}
        blobs.append(data)
        offset += len(data)
    for name, shape in big.items():
        n = 4 * int(np.prod(shape))
        header[name] = {"dtype": "F32", "shape": list(shape), "data_offsets": [offset, offset + n]}
        offset += n
    raw = json.dumps(header).encode()
    raw += b" " * (-len(raw) % 8)
    with open(path, "wb") as f:
        f.write(len(raw).to_bytes(8, "little") + raw + b"".join(blobs))
        f.truncate(8 + len(raw) + offset)


def test_the_full_checkpoint_is_read_lazily(tmp_path):
    """Only the video decoder's tensors are read: a 1 GiB transformer tensor beside it costs no memory."""
    spec, cls, model = source_model("ltx2-tiny")
    state = {"vae." + k: v for k, v in original_state(spec, cls, model, "ltx-original").items()}
    path = tmp_path / "ltx-2-full.safetensors"
    write_sparse_safetensors(path, state, {"model.diffusion_model.proj_out.weight": (2**14, 2**14)})
    file_spec = cls.check_weights(spec_from_json(raw_spec("ltx2-tiny", {"path": str(path)})))
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    decoder = cls.load(file_spec, "cpu")
    grown_kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before
    assert grown_kib < 200 * 1024, f"peak memory grew {grown_kib} KiB while loading"
    assert torch.equal(decoder.model.decoder.conv_in.conv.weight, model.decoder.conv_in.conv.weight)


def test_missing_statistics_are_refused_where_needed(tmp_path):
    from safetensors.torch import save_file

    spec, cls, model = source_model("ltx2-tiny")
    state = {k: v for k, v in original_state(spec, cls, model, "ltx-original").items()
             if not k.startswith("per_channel_statistics")}  # fmt: skip
    save_file(state, str(tmp_path / "vae.safetensors"))
    normalized = spec_from_json(
        raw_spec("ltx2-tiny", {"path": str(tmp_path / "vae.safetensors")}, latents="normalized")
    )
    for attempt in (lambda: cls.check_weights(normalized), lambda: cls.load(normalized, "cpu")):
        with pytest.raises(FarmError, match=r"no latent statistics \(per_channel_statistics\.mean-of-means"):
            attempt()
    plain = spec_from_json(raw_spec("ltx2-tiny", {"path": str(tmp_path / "vae.safetensors")}))
    decoder = cls.load(cls.check_weights(plain), "cpu")  # denormalized latents: not needed, never zeros
    assert torch.isnan(decoder.model.latents_mean).all()
    assert torch.equal(decode(decoder), decode(cls.from_model(plain, model, "cpu")))


def test_synth_refuses_a_bad_file_in_one_line_naming_the_tensors(tmp_path):
    spec, cls, model = source_model("wan-tiny")
    state = original_state(spec, cls, model, "wan-original")
    del state["decoder.upsamples.5.residual.2.weight"]
    state["decoder.upsamples.16.residual.2.weight"] = torch.zeros(1)
    torch.save(state, tmp_path / "bad.pth")
    result = farm("synth", str(tmp_path / "job.zarr"), "--decoder", "wan-tiny", "--frames", "5",
                  "--height", "32", "--width", "32", "--weights", str(tmp_path / "bad.pth"))  # fmt: skip
    lines = [line for line in result.stderr.splitlines() if line.startswith("farm: error:")]
    assert result.returncode == 2 and len(lines) == 1 and "Traceback" not in result.stderr, result.stderr
    assert "1 decoder tensors missing: decoder.upsamples.5.residual.2.weight" in lines[0]
    assert "decoder tensors the model does not have: decoder.upsamples.16.residual.2.weight" in lines[0]
    assert not (tmp_path / "job.zarr").exists()


def test_weights_are_checked_from_headers_without_torch(tmp_path):
    """The check of a named config imports neither torch nor diffusers (a fresh interpreter)."""
    import subprocess
    import sys

    spec, cls, model = source_model("wan-tiny")
    torch.save(original_state(spec, cls, model, "wan-original"), tmp_path / "Wan2.1_VAE.pth")
    model.save_pretrained(tmp_path / "folder")
    code = (
        "import sys, json\n"
        "from farm.decoders import decoder_class, spec_from_json\n"
        "for path in sys.argv[1:]:\n"
        "    s = spec_from_json({'family': 'wan', 'config': 'wan-tiny', 'weights': {'path': path}})\n"
        "    print(json.dumps(decoder_class(s).check_weights(s).weights))\n"
        "print(sorted(m for m in ('torch', 'diffusers', 'safetensors') if m in sys.modules))\n"
    )
    paths = [str(tmp_path / "Wan2.1_VAE.pth"), str(tmp_path / "folder")]
    out = subprocess.run([sys.executable, "-c", code, *paths], capture_output=True, text=True,
                         check=True).stdout.splitlines()  # fmt: skip
    assert json.loads(out[0])["layout"] == "wan-original" and json.loads(out[1])["layout"] == "diffusers"
    assert out[-1] == "[]"


def test_render_through_a_cluster_and_refuse_changed_weights(tmp_path, scheduler3):
    """An LTX-2 full checkpoint renders through a real cluster the frames the diffusers folder renders;
    once the file changes, the job's render is refused before any cluster work."""
    from safetensors.torch import save_file

    from farm.run.render import render

    spec, cls, model = source_model("ltx2-tiny")
    model.save_pretrained(tmp_path / "folder")
    path = write_checkpoint(spec, cls, model, "ltx-full", tmp_path)
    frames = {}
    for label, weights in (("folder", tmp_path / "folder"), ("file", path)):
        job = tmp_path / f"{label}.zarr"
        synth(job, decoder="ltx2-tiny", frames=17, height=64, width=96, seed=2, weights=str(weights))
        render(job, tmp_path / f"out-{label}", scheduler=scheduler3)
        group = zarr.open_group(store=str(tmp_path / f"out-{label}" / "frames.zarr"), mode="r")
        frames[label] = {
            k: np.asarray(a[...]) for k, a in group.members(max_depth=None) if isinstance(a, zarr.Array)
        }
    assert frames["file"].keys() == frames["folder"].keys() and frames["file"]
    for key, value in frames["file"].items():
        assert np.array_equal(value, frames["folder"][key]), key
    from safetensors.torch import load_file

    changed = load_file(str(path))
    changed["vae.decoder.conv_in.conv.weight"] = changed["vae.decoder.conv_in.conv.weight"] * 1.01
    save_file(changed, str(path))
    result = farm("render", str(tmp_path / "file.zarr"), "--out", str(tmp_path / "out-changed"))
    assert result.returncode == 2 and "changed since the job was made" in result.stderr, result.stderr
    assert not (tmp_path / "out-changed").exists()


def test_a_layout_only_another_family_reads_is_refused_naming_that_family():
    wan, hunyuan = FAMILIES["wan"], FAMILIES["hunyuanvideo"]
    config = wan.named_configs["wan-tiny"]
    full = wan._full_config(config)
    infos = {wan.original_name(k, "wan-original", full): C.TensorInfo(shape, "F32", Path("Wan2.1_VAE.pth"))
             for k, shape in wan.decoder_tensor_shapes(config).items()}  # fmt: skip
    assert C.detect_layout(infos, wan, "x", FAMILIES.values()) == C.Layout("wan-original", "")
    with pytest.raises(FarmError, match="in the wan-original layout, which wan read, not the hunyuanvideo "
                                        "decoder: check the spec's family"):  # fmt: skip
        C.detect_layout(infos, hunyuan, "x", FAMILIES.values())
