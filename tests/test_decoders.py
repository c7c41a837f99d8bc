"""Decoder adapters (LTX-Video, Wan, HunyuanVideo, Mochi) at tiny configs: farm's tile path against
independent in-process decodes with the diffusers classes, frame geometry, latent conventions and weights
loading. (CogVideoX's tiles decode in the batches of their place in the shot, which a plain decode of the
tile does not know: tests/test_conformance_cogvideox.py checks them against diffusers' whole decode.)"""

from __future__ import annotations

import numpy as np
import pytest
import torch

import farm
from farm.decoders import FAMILIES, decoder_class, load_decoder, spec_from_json
from farm.decoders.ltxv import LTXVideoDecoder
from farm.decoders.noise import position_noise
from farm.errors import FarmError
from farm.inputs.synthetic import resolve_decoder, smooth_latent, synth_spec
from farm.planning.tiling import ChunkSize, TileGrid, plan_shot
from farm.store.job import create_job, write_shot
from farm.worker.tasks import Placement, blend_batch, decode_tile
from tests.helpers import CAUSAL_LTX2_TINY, save_weights

pytestmark = pytest.mark.model  # real diffusers models, decoded in this process

# tiny config → (latent F, H, W) of the test shot: 3 latent frames, 3x4 latent pixels
TINY = {
    "ltxv-tiny": (3, 3, 4),
    "ltxv-0.9.1-tiny": (3, 3, 4),
    "ltxv-0.9.5-tiny": (3, 3, 4),
    "wan-tiny": (3, 3, 4),
    "wan2.2-tiny": (3, 3, 4),
    "hunyuanvideo-tiny": (3, 3, 4),
    "ltx2.3-tiny": (3, 3, 4),
    "mochi-tiny": (3, 3, 4),
    "hunyuanvideo15-tiny": (3, 3, 4),
    "cosmos-tiny": (3, 3, 4),
}
# What each tiny config must decode to: (spatial scale, temporal scale, whether a frame depends only on
# the latent frames up to its own). LTX-Video's decoder convolutions look both ways in time; HunyuanVideo's
# convolutions are causal but its GroupNorms take statistics over the whole tile, later frames included.
EXPECTED = {
    "ltxv-tiny": (32, 8, False),
    "ltxv-0.9.1-tiny": (32, 8, False),
    "ltxv-0.9.5-tiny": (32, 8, False),
    "wan-tiny": (8, 4, True),
    "wan2.2-tiny": (16, 4, True),
    "hunyuanvideo-tiny": (8, 4, False),
    "ltx2.3-tiny": (32, 8, False),
    "mochi-tiny": (8, 6, True),
    "hunyuanvideo15-tiny": (16, 4, True),
    "cosmos-tiny": (8, 8, True),
}
EXTRA = {
    "ltxv-0.9.1-tiny": {"decode_timestep": 0.05, "decode_noise_scale": 0.0},
    "ltxv-0.9.5-tiny": {"decode_timestep": 0.05, "decode_noise_scale": 0.0},
}


def raw_spec(name: str, **over) -> dict:
    family = resolve_decoder(name)[0]
    return {"family": family, "config": name, "weights": {"random_seed": 3}, **EXTRA.get(name, {}), **over}


def make_job(tmp_path, name: str, **over):
    spec = spec_from_json(raw_spec(name, **over))
    channels = decoder_class(spec).latent_channels_for(spec.config)
    path = tmp_path / "job.zarr"
    create_job(path, spec)
    latent = smooth_latent(np.random.default_rng(5), (channels, *TINY[name]))
    write_shot(path, "s", latent, fps=24.0)
    return path, spec, latent


def plain_decode(name: str, model, z: torch.Tensor) -> torch.Tensor:
    """diffusers' own decode of ``[C, f, h, w]`` → [3, F, H, W] in [0, 1], no farm code involved."""
    with torch.inference_mode():
        if name.startswith("ltxv") and model.config.timestep_conditioning:
            t = torch.tensor([EXTRA.get(name, {}).get("decode_timestep", 0.0)])
            out = model.decode(z[None], temb=t).sample[0]
        else:
            out = model.decode(z[None]).sample[0]
    return (out.float() + 1) / 2


def farm_tiles(job_path, spec, latent_shape, grid: TileGrid, batch_frames: int = 4):
    """farm's worker path in this process: decode_tile per tile, blend_batch per batch → uint8 frames."""
    geometry = decoder_class(spec).geometry_for(spec.config)
    plan = plan_shot("s", latent_shape, geometry, grid, batch_frames=batch_frames)
    pieces: dict[int, list] = {b.index: [] for b in plan.batches}
    for tile in plan.tiles:
        cuts = [(b.index, frames) for b, frames in plan.batch_pieces(tile)]
        out = decode_tile(str(job_path), spec.to_json(), tile, ChunkSize(), cuts)
        for b, _ in cuts:
            pieces[b].append((tile, out[b]))
    frames = []
    for batch in plan.batches:
        placements, tensors = [], []
        for tile, piece in sorted(pieces[batch.index], key=lambda tp: tp[0].index):
            f, h, w = tile.pixels
            placements.append(Placement(max(f.start - batch.start, 0), (h.start, h.stop), (w.start, w.stop)))
            tensors.append(piece)
        frames.append(blend_batch(batch, plan.pixel_shape[1:], placements, tensors).rgb)
    return plan, np.concatenate(frames)


def reference_tiles(name, model, latent: np.ndarray, plan) -> np.ndarray:
    """Each tile decoded by plain diffusers, weighted by its ramps, summed in tile order."""
    full = torch.zeros((3, *plan.pixel_shape), dtype=torch.float32)
    for tile in plan.tiles:
        pixels = plain_decode(name, model, torch.from_numpy(latent[(slice(None), *tile.decode_slices())]))
        t, k = EXPECTED[name][1], EXPECTED[name][0]  # context frames and the halo are decoded, then dropped
        top, bottom, left, right = (m * k for m in tile.halo)
        pixels = pixels[:, tile.context * t : pixels.shape[1] - tile.lookahead * t,
                        top : pixels.shape[2] - bottom, left : pixels.shape[3] - right]  # fmt: skip
        wf, wh, ww = (torch.tensor(s.weights, dtype=torch.float32) for s in tile.pixels)
        (f0, f1), (h0, h1), (w0, w1) = ((s.start, s.stop) for s in tile.pixels)
        full[:, f0:f1, h0:h1, w0:w1] += pixels * wf.view(-1, 1, 1) * wh.view(1, -1, 1) * ww.view(1, 1, -1)
    return torch.round(full.clamp(0, 1) * 255).to(torch.uint8).permute(1, 2, 3, 0).numpy()


def build_model(name: str, spec):
    model = decoder_class(spec).build(spec)
    if name.startswith("hunyuanvideo"):
        model.use_framewise_decoding = False  # what farm decodes: one pass per tile
    return model


@pytest.mark.parametrize("name", list(TINY))
def test_tiled_decode_equals_in_process_reference(tmp_path, name):
    job, spec, latent = make_job(tmp_path, name)
    plan, got = farm_tiles(job, spec, latent.shape, TileGrid(tiles=(2, 2, 2), overlap=(1, 1, 1)))
    assert len(plan.tiles) == 8 and got.shape == (*plan.pixel_shape, 3)
    expected = reference_tiles(name, build_model(name, spec), latent, plan)
    # Same decodes and ramps in another order of float operations: at most one level apart, rarely.
    diff = np.abs(got.astype(np.int16) - expected.astype(np.int16))
    assert diff.max() <= 1 and (diff > 0).mean() < 0.01


@pytest.mark.parametrize("name", list(TINY))
def test_single_tile_equals_plain_vae_decode(tmp_path, name):
    job, spec, latent = make_job(tmp_path, name)
    plan, got = farm_tiles(job, spec, latent.shape, TileGrid(), batch_frames=8)
    plain = plain_decode(name, build_model(name, spec), torch.from_numpy(latent))
    plain = plain.clamp(0, 1).mul(255).permute(1, 2, 3, 0).numpy()
    assert got.shape == plain.shape == (*plan.pixel_shape, 3)
    assert np.abs(got - plain).max() <= 1.0


@pytest.mark.parametrize("name", list(TINY))
def test_frame_counts_and_causal_first_frame(name):
    spatial, temporal, causal = EXPECTED[name]
    spec = spec_from_json(raw_spec(name))
    cls = decoder_class(spec)
    geometry = cls.geometry_for(spec.config)
    assert (geometry.spatial_scale, geometry.temporal_scale, geometry.causal) == (spatial, temporal, True)
    decoder = cls.load(spec, "cpu")
    z = torch.from_numpy(smooth_latent(np.random.default_rng(1), (decoder.latent_channels, 3, 2, 2)))
    whole = decoder.decode(z, origin=(0, 0, 0))
    for f in (1, 2, 3):
        out = decoder.decode(z[:, :f].contiguous(), origin=(0, 0, 0))
        # the first latent frame decodes to one pixel frame, every later one to `temporal` frames
        assert tuple(out.shape) == (3, 1 + temporal * (f - 1), 2 * spatial, 2 * spatial)
        assert out.shape[1] == geometry.pixel_frames(f)
        if causal:  # causal convolutions: a prefix of the latent decodes to a prefix of the video
            torch.testing.assert_close(out, whole[:, : out.shape[1]], atol=2e-4, rtol=0)


def test_every_named_config_has_a_geometry_and_channels():
    real = {"ltxv": (32, 8, 128), "ltxv-0.9.1": (32, 8, 128), "ltxv-0.9.5": (32, 8, 128),
            "wan": (8, 4, 16), "wan2.2": (16, 4, 48), "hunyuanvideo": (8, 4, 16), "cogvideox": (8, 4, 16),
            "cogvideox-5b": (8, 4, 16), "cogvideox1.5": (8, 4, 16), "mochi": (8, 6, 12),
            "hunyuanvideo15": (16, 4, 32), "cosmos": (8, 8, 16), "allegro": (8, 4, 4),
            "vidtok": (8, 4, 4)}  # fmt: skip
    for name, (spatial, temporal, channels) in real.items():
        spec = spec_from_json(raw_spec(name))
        cls = decoder_class(spec)
        g = cls.geometry_for(spec.config)
        assert (g.spatial_scale, g.temporal_scale, cls.latent_channels_for(spec.config)) == (
            spatial, temporal, channels,
        )  # fmt: skip
        assert cls.weight_bytes(spec) > 10**8  # real models: hundreds of MB of decoder weights
        # a decode call of ~10^6 pixel-frames (shaped: CogVideoX's estimate depends on the frame size)
        assert cls.peak_bytes(spec, (16, 250, 250)) > cls.weight_bytes(spec)
    names = [n for cls in FAMILIES.values() for n in cls.named_configs]
    assert len(names) == len(set(names))  # `--decoder NAME` finds one family


@pytest.mark.parametrize("name", ["ltxv-tiny", "wan-tiny", "hunyuanvideo-tiny", "mochi-tiny",
                                  "hunyuanvideo15-tiny", "cosmos-tiny"])
def test_normalized_latents_follow_the_pipeline(tmp_path, name):
    """``"latents": "normalized"`` applies what the model's diffusers pipeline does before vae.decode."""
    spec = spec_from_json(raw_spec(name))
    source = decoder_class(spec).build(spec)
    c = decoder_class(spec).latent_channels_for(spec.config)
    if name.startswith("ltxv"):  # LTX keeps mean/std as buffers in the weights: make them non-trivial
        source.latents_mean.copy_(torch.linspace(-0.5, 0.5, c))
        source.latents_std.copy_(torch.linspace(0.5, 2.0, c))
    source.save_pretrained(tmp_path / "vae")
    decoder = load_decoder(raw_spec(name, weights={"path": str(tmp_path / "vae")}, latents="normalized"))
    z = torch.from_numpy(smooth_latent(np.random.default_rng(2), (c, 2, 2, 2)))
    cfg = source.config
    if name.startswith("ltxv"):  # LTXPipeline._denormalize_latents
        mean, std = source.latents_mean.view(-1, 1, 1, 1), source.latents_std.view(-1, 1, 1, 1)
        denorm = z * std / cfg.scaling_factor + mean
    elif name.startswith("mochi"):  # MochiPipeline
        mean = torch.tensor(cfg.latents_mean).view(-1, 1, 1, 1)
        denorm = z * torch.tensor(cfg.latents_std).view(-1, 1, 1, 1) / cfg.scaling_factor + mean
    elif name.startswith("wan"):  # WanPipeline
        mean = torch.tensor(cfg.latents_mean).view(-1, 1, 1, 1)
        denorm = z / (1.0 / torch.tensor(cfg.latents_std).view(-1, 1, 1, 1)) + mean
    elif name.startswith("cosmos"):  # CosmosTextToWorldPipeline, the release's sigma_data 0.5
        mean = torch.tensor(cfg.latents_mean).view(c, -1, 1, 1)[:, : z.shape[1]]
        std = torch.tensor(cfg.latents_std).view(c, -1, 1, 1)[:, : z.shape[1]]
        denorm = z * std / 0.5 + mean
    else:  # HunyuanVideoPipeline, HunyuanVideo15Pipeline
        denorm = z / cfg.scaling_factor
    torch.testing.assert_close(decoder.decode(z, origin=(0, 0, 0)), plain_decode(name, source, denorm))


@pytest.mark.parametrize("name", list(TINY))
@pytest.mark.parametrize("form", ["folder", "file"])
def test_weights_saved_then_loaded_equal_the_source(tmp_path, name, form):
    spec = spec_from_json(raw_spec(name, weights={"random_seed": 123}))
    cls = decoder_class(spec)
    source = cls.build(spec)
    path = save_weights(source, tmp_path, form)
    loaded = spec_from_json(raw_spec(name, weights={"path": str(path)}))
    assert not loaded.random_weights
    cls.check_weights(loaded)  # headers only
    decoder = cls.load(loaded, "cpu")
    for key, value in source.state_dict().items():
        if key.startswith(("decoder.", "post_quant_conv.", "latents_")):
            assert torch.equal(value, decoder.model.state_dict()[key]), key
    z = torch.from_numpy(smooth_latent(np.random.default_rng(3), (decoder.latent_channels, 2, 2, 2)))
    expected = plain_decode(name, source, z)
    decoded = decoder.decode(z, origin=(0, 0, 0))
    # the same bits as the source model's decode in farm's arithmetic (HunyuanVideo's is its tiles', not
    # diffusers' forward), and diffusers' own decode to float rounding
    from_source = cls.from_model(spec, source, "cpu").decode(z, origin=(0, 0, 0))
    torch.testing.assert_close(decoded, from_source, atol=0, rtol=0)
    torch.testing.assert_close(decoded, expected, atol=1e-5, rtol=0)


def test_weights_of_another_model_are_refused(tmp_path):
    from safetensors.torch import save_file

    wan = decoder_class(spec_from_json(raw_spec("wan-tiny"))).build(spec_from_json(raw_spec("wan-tiny")))
    wan.save_pretrained(tmp_path / "wan")
    state = {k: v.contiguous() for k, v in wan.state_dict().items() if not k.startswith("post_quant_conv.")}
    save_file(state, str(tmp_path / "no-post-quant.safetensors"))
    cases = [
        ("wan2.2-tiny", tmp_path / "wan", "were saved for a different decoder config"),
        ("hunyuanvideo-tiny", tmp_path / "wan" / "diffusion_pytorch_model.safetensors", "do not match"),
        ("wan-tiny", tmp_path / "no-post-quant.safetensors", r"2 decoder tensors missing: post_quant_conv\."),
    ]
    for name, path, message in cases:
        spec = spec_from_json(raw_spec(name, weights={"path": str(path)}))
        with pytest.raises(FarmError, match=message):
            decoder_class(spec).check_weights(spec)
        with pytest.raises(FarmError, match=message):
            decoder_class(spec).build(spec)


@pytest.mark.parametrize("name", list(TINY))
def test_random_weights_only_when_asked(name):
    family = resolve_decoder(name)[0]
    with pytest.raises(FarmError, match="never initialises a decoder with random weights"):
        spec_from_json({"family": family, "config": name})
    spec = synth_spec(name, seed=4)
    assert spec.random_weights and "RANDOM weights (seed 4)" in spec.describe()


def test_ltxv_decode_noise_is_positional_and_as_the_pipeline_mixes_it():
    spec = spec_from_json(raw_spec("ltxv-0.9.1-tiny", decode_noise_scale=0.25, decode_noise_seed=9))
    decoder = LTXVideoDecoder.load(spec, "cpu")
    z = torch.from_numpy(smooth_latent(np.random.default_rng(4), (8, 2, 2, 3)))
    with pytest.raises(FarmError, match="origin"):
        decoder.decode(z)
    a = decoder.decode(z, origin=(1, 2, 3))
    assert torch.equal(a, decoder.decode(z, origin=(1, 2, 3)))  # deterministic
    assert not torch.equal(a, decoder.decode(z, origin=(0, 0, 0)))  # noise follows the position
    # (1 - s) z + s noise(position), then the timestep-conditioned decode without noise
    from farm.decoders.ltxv.adapter import NOISE_SALT_LATENT
    from farm.decoders.noise import hash_seed

    coords = [torch.arange(8), 1 + torch.arange(2), 2 + torch.arange(2), 3 + torch.arange(3)]
    mixed = 0.75 * z + 0.25 * position_noise(hash_seed(9, NOISE_SALT_LATENT), coords).float()
    plain = LTXVideoDecoder.load(spec_from_json(raw_spec("ltxv-0.9.1-tiny")), "cpu")
    torch.testing.assert_close(a, plain.decode(mixed, origin=(1, 2, 3)))


def test_ltxv_injected_noise_is_the_same_for_a_tile_and_the_whole_shot():
    decoder = LTXVideoDecoder.load(spec_from_json(raw_spec("ltxv-0.9.1-tiny")), "cpu")
    assert decoder.injects_noise
    hook = decoder._noise_hook(torch.ones(4, 1, 1), seed=11)
    decoder._origin, decoder._latent_hw = (0, 0, 0), (4, 6)
    whole = hook(None, None, torch.zeros(1, 4, 2, 16, 24))  # a layer at 4x the latent resolution
    decoder._origin, decoder._latent_hw = (1, 1, 2), (2, 3)
    tile = hook(None, None, torch.zeros(1, 4, 2, 8, 12))
    torch.testing.assert_close(tile, whole[..., 4:12, 8:20], atol=0, rtol=0)
    assert whole.std() > 0.5


def test_ltxv_spec_fields_are_checked():
    with pytest.raises(FarmError, match="no timestep conditioning"):
        LTXVideoDecoder.check_spec(spec_from_json(raw_spec("ltxv-tiny", decode_timestep=0.05)))
    with pytest.raises(FarmError, match=r"\[0, 1\]"):
        LTXVideoDecoder.check_spec(spec_from_json(raw_spec("ltxv-0.9.1-tiny", decode_noise_scale=2)))
    with pytest.raises(FarmError, match="whole number"):
        LTXVideoDecoder.check_spec(spec_from_json(raw_spec("ltxv-0.9.1-tiny", decode_noise_seed=1.5)))


def test_compile_modes():
    from farm.decoders import COMPILE_MODES, compile_mode
    from farm.errors import FarmError

    assert compile_mode(False) is None and compile_mode(None) is None
    assert compile_mode(True) == "default"
    assert all(compile_mode(m) == m for m in COMPILE_MODES)
    with pytest.raises(FarmError, match="unknown torch.compile mode 'fast'"):
        compile_mode("fast")


def test_decodes_run_on_one_thread_one_at_a_time():
    """Every decode of a process runs on the same thread (CUDA graphs are per thread), one at a time."""
    import threading
    import time
    from concurrent.futures import ThreadPoolExecutor

    from farm.worker.tasks import on_decode_thread

    seen, running, most = set(), [0], [0]
    lock = threading.Lock()

    def work(k: int) -> int:
        with lock:
            running[0] += 1
            most[0] = max(most[0], running[0])
        seen.add(threading.current_thread().name)
        time.sleep(0.01)
        with lock:
            running[0] -= 1
        if k == 3:
            raise ValueError("tile 3 failed")
        return on_decode_thread(lambda: k * 2)  # nested: runs inline, no deadlock

    with ThreadPoolExecutor(4) as pool:
        futures = [pool.submit(on_decode_thread, work, k) for k in range(8)]
    assert [f.result() for f in futures if f.exception() is None] == [0, 2, 4, 8, 10, 12, 14]
    with pytest.raises(ValueError, match="tile 3 failed"):
        futures[3].result()
    assert len(seen) == 1 and next(iter(seen)).startswith("farm-decode") and most[0] == 1


def test_every_named_config_records_its_temporal_context():
    """Temporal tiles decode the adapter's measured context / lookahead frames; a custom config gets the
    family's largest (its receptive field is unknown)."""
    for family, cls in FAMILIES.items():
        whole = set()  # configs never split in time (MiniMax-H3 blends its own clips): no context
        for name, config in cls.named_configs.items():
            g = cls.geometry_for(config)
            assert (g.context, g.lookahead) == cls.temporal_context_for(config)
            if g.whole_time:
                whole.add(name)
            elif family not in ("hunyuanvideo", "hunyuanvideo15"):  # no exact split: only the measured tiny
                # config is recorded
                assert name in cls.temporal_context, name
        if not cls.named_configs or whole == set(cls.named_configs):
            continue  # the diffusers family's configs come from the weights
        custom = {**cls.named_configs[next(iter(cls.named_configs))], "latent_channels": 999}
        largest = (
            max(c for c, _ in cls.temporal_context.values()),
            max(a for _, a in cls.temporal_context.values()),
        )
        assert cls.temporal_context_for(custom) == largest


def test_recorded_constructor_defaults_are_the_installed_classes():
    """Planning reads the diffusers classes' defaults from each family's recorded.json (no diffusers
    import); they must be the installed classes' (else: tools/record_decoder_defaults.py)."""
    from farm.decoders.diffusers_vae import live_constructor_defaults
    from farm.decoders.recording import recorded_constructor_defaults, recorded_decoder_parameters

    for family, cls in FAMILIES.items():
        if cls.model_class_name:  # the diffusers family names its class per spec: none recorded
            live = live_constructor_defaults(cls.model_class_name)
            assert recorded_constructor_defaults(cls) == live, family
        for name, config in cls.named_configs.items():
            assert recorded_decoder_parameters(cls, name) == cls.count_decoder_parameters(config), name


@pytest.mark.parametrize("size", [1, 2, 3])
def test_ltx2_carried_chunks_equal_the_whole_decode(size):
    """Chunk after chunk with the causal state carried: the whole decode's frames (float rounding
    only), no frame decoded twice; the model is left as it was."""
    spec = spec_from_json({**CAUSAL_LTX2_TINY, "weights": {"random_seed": 3}})
    decoder = decoder_class(spec).load(spec, "cpu")
    assert decoder.geometry.carries
    z = torch.from_numpy(smooth_latent(np.random.default_rng(4), (decoder.latent_channels, 7, 4, 6)))
    whole = decoder.decode(z)
    parts, state = [], None
    for start in range(0, 7, size):
        block = z[:, start : start + size]
        pixels, state = decoder.decode_carried(block, state)
        assert pixels.shape[1] == (
            decoder.geometry.pixel_frames(block.shape[1]) if start == 0 else 8 * block.shape[1]
        )
        parts.append(pixels)
    torch.testing.assert_close(torch.cat(parts, dim=1), whole, atol=1e-4, rtol=0)
    # the memory model's count of the state a chunk hands on is what the decoder hands on
    held = sum(t.numel() * t.element_size() for t in state)
    assert held == decoder_class(spec).carried_state_bytes(spec, (4, 6))
    # a chunk decoded without the carried state (its own first frame as padding) is clearly different
    alone, _ = decoder.decode_carried(z[:, size : 2 * size], None)
    assert (alone[:, -1] - whole[:, 8 * (2 * size - 1)]).abs().max() > 1e-3
    assert not any("forward" in vars(m) for m in decoder.model.modules())  # the class forwards again
    torch.testing.assert_close(decoder.decode(z), whole, atol=0, rtol=0)


def test_only_causal_noiseless_ltx2_carries_state():
    for name in ("ltxv-tiny", "wan-tiny", "hunyuanvideo-tiny"):
        spec = spec_from_json(raw_spec(name))
        assert not decoder_class(spec).geometry_for(spec.config).carries
    cls = decoder_class(spec_from_json(raw_spec("ltx2-tiny")))
    assert cls.geometry_for(CAUSAL_LTX2_TINY["config"]).carries and cls.geometry_for({}).carries
    assert not cls.geometry_for(cls.named_configs["ltx2-tiny"]).carries  # the released LTX-2 looks ahead
    assert not cls.geometry_for(cls.named_configs["ltx2"]).carries
    assert not cls.geometry_for({"decoder_inject_noise": [False, True, False, False]}).carries


def test_carried_chunks_budget_two_decoder_states():
    """A tile decoded in carried chunks needs its largest chunk's call, the buffer the chunks land in,
    and two decoder states (the one a chunk starts from and the one it hands on) per spatial chunk."""
    from farm.planning.budgets import tile_peak_bytes
    from farm.planning.tiling import carried_frames, plan_chunks

    spec = spec_from_json(raw_spec("ltx2-tiny"))
    cls = decoder_class(spec)
    geometry = cls.geometry_for(spec.config)
    (tile,) = plan_shot("s", (8, 9, 4, 6), geometry).tiles
    cases = ((ChunkSize(frames=3, carry=True), 1), (ChunkSize(frames=3, width=4, carry=True), 2))
    for chunk, pieces in cases:
        calls = plan_chunks(tile.decoded_fhw, geometry, chunk)
        call = max(cls.peak_bytes(spec, geometry.pixel_shape(c.decoded_fhw)) for c in calls)
        spatial = [(c.latent[1].size, c.latent[2].size) for c in calls if c.grid_pos[0] == 0]
        assert len(spatial) == pieces and len(calls) == len(carried_frames(9, 3)) * pieces
        states = 2 * sum(cls.carried_state_bytes(spec, hw) for hw in spatial)
        assert states >= 2 * cls.carried_state_bytes(spec, (4, 6)) > 0
        assert tile_peak_bytes(cls, spec, tile, chunk) == call + 12 * tile.pixel_volume + states


def test_shots_smaller_than_one_decode_call_are_refused_when_the_job_is_made(tmp_path):
    """A diffusion decoder needs a whole attention window per call: synth and ingest refuse smaller shots
    with the minimum, instead of writing a job that can never render."""
    from farm.inputs.ingest import ingest

    with pytest.raises(FarmError, match=r"--height 64 is smaller .* use at least 96"):
        farm.synth(tmp_path / "small.zarr", decoder="ltx2-diffusion-tiny", frames=17, height=64, width=96)
    assert not (tmp_path / "small.zarr").exists()
    farm.synth(tmp_path / "least.zarr", decoder="ltx2-diffusion-tiny", frames=9, height=96, width=96)
    spec = decoder_class(spec_from_json(raw_spec("ltx2-diffusion-tiny")))
    c = spec.latent_channels_for(spec.named_configs["ltx2-diffusion-tiny"])
    np.save(tmp_path / "thin.npy", np.zeros((1, c, 2, 2, 3), np.float32))
    with pytest.raises(FarmError, match="too small: the decoder needs at least 2 latent frame.* 3 latent"):
        ingest(tmp_path / "job.zarr", [tmp_path / "thin.npy"], decoder={**raw_spec("ltx2-diffusion-tiny")})
    assert not (tmp_path / "job.zarr").exists()
