"""The LTX-2.5 diffusion decoder (`ltx2-diffusion`): its blocked neighbourhood attention against the
windowed definition and diffusers' FlexAttention, plans that never cut blocks smaller than its windows,
noise that is a function of each pixel's place, and renders that give the same bytes on 1 and 3
workers."""

from __future__ import annotations

import itertools
from dataclasses import replace

import numpy as np
import pytest
import torch

import farm
from farm.decoders import load_decoder
from farm.decoders.ltx2_diffusion import adapter as ltx2_diffusion
from farm.decoders.ltx2_diffusion.adapter import (
    LTX2DiffusionDecoder,
    decode_with_noise,
    spatial_reach,
    whole_frame_stages,
)
from farm.decoders.ltx2_diffusion.device import ltx2_diffusion_chunked as chunked
from farm.decoders.ltx2_diffusion.neighborhood_attention import (
    axis_blocks,
    block_shape,
    chunk_boxes,
    interior,
    neighborhood_attention,
)
from farm.errors import FarmError
from farm.inputs.synthetic import synth
from farm.planning import costmodel, planner
from farm.planning.tiling import ChunkSize, TileGrid, plan_shot
from farm.store.frames import read_frames
from farm.store.output import Output

pytestmark = pytest.mark.model
SPEC = {"family": "ltx2-diffusion", "config": "ltx2-diffusion-tiny", "weights": {"random_seed": 0}}


def windowed_reference(q, k, v, kernel):
    """Dense attention with each query's window as the mask, straight from the definition."""
    _, t, h, w, heads, d = q.shape
    starts = []
    for n, kk in zip((t, h, w), kernel, strict=True):
        kk = min(kk, n)
        s = (torch.arange(n) - kk // 2).clamp(0, n - kk)
        starts.append((s, kk))
    pos = torch.stack(torch.meshgrid(torch.arange(t), torch.arange(h), torch.arange(w), indexing="ij"), -1)
    pos = pos.reshape(-1, 3)
    allowed = torch.ones(len(pos), len(pos), dtype=torch.bool)
    for axis, (s, kk) in enumerate(starts):
        lo = s[pos[:, axis]][:, None]
        allowed &= (pos[None, :, axis] >= lo) & (pos[None, :, axis] < lo + kk)
    flat = [x.reshape(x.shape[0], -1, heads, d).transpose(1, 2) for x in (q, k, v)]
    out = torch.nn.functional.scaled_dot_product_attention(*flat, attn_mask=allowed)
    return out.transpose(1, 2).reshape(q.shape)


def test_windows_shift_inward_at_the_borders():
    axis = axis_blocks(5, 3, 2, "cpu")  # blocks [0, 1], [2, 3], [4 + a padded query]; halos of 4 keys
    assert (axis.count, axis.halo) == (3, 4)
    assert axis.halo_index.tolist() == [[0, 1, 2, 3], [1, 2, 3, 4], [1, 2, 3, 4]]
    seen = [[[i for i, m in enumerate(row) if m] for row in block] for block in axis.mask.tolist()]
    # query 0 sees keys 0-2 (shifted inward), 1: 0-2, 2: 1-3, 3: 2-4, 4: 2-4
    assert seen == [[[0, 1, 2], [0, 1, 2]], [[0, 1, 2], [1, 2, 3]], [[1, 2, 3], [1, 2, 3]]]


@pytest.mark.parametrize(
    ("grid", "kernel", "block", "chunk"),
    [((3, 5, 7), (3, 3, 3), None, 1 << 27), ((4, 6, 9), (3, 5, 5), (2, 4, 4), 1 << 27),
     ((5, 7, 6), (3, 7, 3), (2, 2, 4), 3000), ((2, 9, 11), (3, 3, 5), (1, 4, 8), 500),
     ((7, 3, 4), (5, 3, 3), (4, 2, 2), 1), ((9, 12, 14), (3, 5, 3), (2, 2, 2), 1 << 27),
     ((9, 12, 14), (5, 3, 3), (2, 4, 2), 2000)],
)  # fmt: skip
def test_blocked_attention_equals_the_windowed_definition(grid, kernel, block, chunk):
    gen = torch.Generator().manual_seed(sum(grid))
    q, k, v = (torch.randn(2, *grid, 2, 8, generator=gen, dtype=torch.float64) for _ in range(3))
    got = neighborhood_attention(q, k, v, kernel, block=block, chunk_elements=chunk)
    assert torch.allclose(got, windowed_reference(q, k, v, kernel), atol=1e-12)


def test_interior_blocks_share_one_mask():
    axis = axis_blocks(14, 3, 2, "cpu")  # 7 blocks: the first and last see their windows shifted
    assert interior(axis) == (1, 6)
    assert all(torch.equal(axis.mask[j], axis.mask[1]) for j in range(1, 6))
    assert not torch.equal(axis.mask[0], axis.mask[1]) and not torch.equal(axis.mask[6], axis.mask[1])
    boxes = chunk_boxes((axis, axis, axis), 10, 1 << 20)
    assert len(boxes) == 27 and [box[:3] for box in boxes if box[3]] == [((1, 6), (1, 6), (1, 6))]
    small = chunk_boxes((axis, axis, axis), 10, 10 * 7)  # a call gathers at most one row of 7 blocks
    for boxes_ in (boxes, small):  # every block in exactly one box
        seen = sorted((t, h, w) for (t0, t1), (h0, h1), (w0, w1), _ in boxes_ for t in range(t0, t1)
                      for h in range(h0, h1) for w in range(w0, w1))  # fmt: skip
        assert seen == sorted(itertools.product(range(7), repeat=3))


def test_blocks_hold_the_most_queries_with_the_smallest_halo():
    assert block_shape((121, 176, 304), (11, 11, 11), 512) == (8, 8, 8)  # 18^3 keys; (4, 8, 16): 14x18x26
    assert block_shape((18, 22, 38), (3, 7, 7), 512) == (4, 8, 16)
    assert block_shape((3, 4, 5), (3, 3, 3), 512) == (3, 4, 5)  # a grid smaller than a block: one block


def test_the_smallest_block_is_where_every_stages_window_fits():
    full, tiny = (LTX2DiffusionDecoder.geometry_for(c) for c in LTX2DiffusionDecoder.named_configs.values())
    # stage 1's 3x7x7 window in latent rows and columns; stage 5's 11 pixel frames need 1 + 8 * 2
    assert full.min_block == (3, 7, 7)
    assert tiny.min_block == (2, 3, 3)
    decoder = load_decoder(SPEC)
    decoder.decode(torch.zeros(8, 2, 3, 3), (0, 0, 0))  # the smallest block decodes
    with pytest.raises(FarmError, match="too small"):
        decoder.decode(torch.zeros(8, 2, 3, 2), (0, 0, 0))


def test_plans_never_cut_blocks_smaller_than_the_attention_window():
    # without the halo, which widens what a small tile decodes past the window (checked at the end)
    halo = LTX2DiffusionDecoder.geometry_for({})
    geometry = replace(halo, halo=0)
    shot = (128, 16, 22, 38)
    plan_shot("s", shot, geometry, TileGrid((1, 2, 2), (0, 2, 2)))  # 12 rows, 20 columns a tile
    with pytest.raises(FarmError, match="shot 's': a tile would decode 6 latent units of height, but this "
                                        "decoder needs at least 7 at a time"):  # fmt: skip
        plan_shot("s", shot, geometry, TileGrid((1, 4, 1), (0, 1, 0)))
    with pytest.raises(FarmError, match="a chunk would decode 4 latent units of width.*--chunk of at least"):
        plan_shot("s", shot, geometry, chunk=ChunkSize(width=5, overlap=(0, 0, 0)))
    model = costmodel.load("ltx2-h200")
    for candidate in planner.candidates(shot, geometry, model, None, None):
        tiles = plan_shot("s", shot, geometry, candidate.grid).tiles
        assert min(t.latent[1].size for t in tiles) >= 7 and min(t.latent[2].size for t in tiles) >= 7
    rows = {c.grid.tiles[1]: c.grid.overlap[1] for c in planner.candidates(shot, geometry, model, None, None)}
    assert rows[4] >= 2  # 22 rows in 4 tiles: only with overlap enough for 7 rows a tile
    for candidate in planner.candidates(shot, halo, model, None, None):  # with it: decoded blocks fit
        tiles = plan_shot("s", shot, halo, candidate.grid).tiles
        assert min(min(t.decoded_fhw[1:]) for t in tiles) >= 7


def diffusers_decode(model, z, noise, origin, steps):
    """diffusers' own `LTX2VideoDiffusionDecoder3d.forward`, given farm's noise for its generator's."""
    decoder = model.decoder
    context = decoder.forward_stage_4(decoder.forward_stages_1_to_3(z))
    shape = (z.shape[0], decoder.out_channels, context.shape[1], context.shape[2] * decoder.patch_size,
             context.shape[3] * decoder.patch_size)  # fmt: skip
    return decoder.denoise(context, noise(shape, origin), steps)


@pytest.mark.parametrize("steps", [1, 2])
def test_runs_of_frames_decode_as_the_whole_grid(monkeypatch, steps):
    """The decode a few frames at a time (each run's attention against its windows' key frames, its
    residual added once no later run reads the old values) equals diffusers' whole-grid forward."""
    decoder = load_decoder({**SPEC, "decode_steps": steps})
    model = LTX2DiffusionDecoder.build(decoder.spec)
    z = torch.randn(1, 8, 3, 3, 4, generator=torch.Generator().manual_seed(4))
    with torch.inference_mode():
        want = diffusers_decode(model, z, decoder.noise, (0, 0, 0), steps)
        monkeypatch.setattr(chunked, "MIN_CHUNK_FRAMES", 1)
        for tokens in (1, 200, 1000):  # runs of 1 frame (the windows' halos span 3 runs), 2-4 frames, 17
            got = decode_with_noise(model, z, decoder.noise, (0, 0, 0), steps, tokens=tokens)
            assert torch.allclose(got, want, atol=1e-5), tokens


def test_runs_add_their_residual_after_every_reader():
    assert chunked.key_frames(0, 4, 17, 3) == (0, 5)
    assert chunked.key_frames(4, 8, 17, 3) == (3, 9)
    assert chunked.key_frames(16, 17, 17, 11) == (6, 17)  # the last frames' windows shift inward
    assert chunked.runs(17, 8) == [(0, 8), (8, 16), (16, 17)]
    assert chunked.chunk_frames(121, 272, 480) == 16 and chunked.chunk_frames(121, 544, 960) == 8
    assert chunked.chunk_frames(5, 4, 4) == 5
    assert chunked.chunk_frames(121, 200, 304) == 32  # 34 would fit: runs start on the kernel's lattice


def test_decode_equals_diffusers_flex_attention_with_the_same_noise():
    decoder = load_decoder(SPEC)
    z = torch.randn(8, 3, 3, 4, generator=torch.Generator().manual_seed(1))
    got = decoder.decode(z, (0, 0, 0))
    assert got.shape == (3, 17, 96, 128)
    model = LTX2DiffusionDecoder.build(decoder.spec)  # diffusers' own FlexAttention processors
    with torch.inference_mode():
        want = (diffusers_decode(model, z[None], decoder.noise, (0, 0, 0), 1)[0] + 1) / 2
    assert torch.allclose(got, want, atol=1e-5)
    with pytest.raises(FarmError, match="needs the tile origin"):
        decoder.decode(z)


def test_a_tile_from_the_whole_frame_pass_is_the_whole_decode_once_its_halo_spans_the_rest():
    """Stages 1 and 2 run once over the whole frame; the rest of the decoder from their output is the
    decode, bit for bit, and a tile decoding the rest from its block equals the whole decode's pixels once
    its halo spans the reach counted from the layers after the pass (not before)."""
    decoder = load_decoder(SPEC)
    z = torch.randn(8, 3, 6, 8, generator=torch.Generator().manual_seed(1))
    whole = decoder.decode(z, (0, 0, 0))
    shared = decoder.whole_frame(z)
    assert shared.shape == (16 * 2 * 2, 3 + 2, 6, 8)  # stage 2's 16 channels at twice the rows and columns
    assert torch.equal(decoder.decode_shared(shared, (0, 0, 0)), whole)
    full = LTX2DiffusionDecoder._full_config(decoder.spec.config)
    reach = spatial_reach(full, whole_frame_stages(full))
    assert reach == 1
    errors = []
    for halo in (0, reach):  # the tile: rows [0, 3), columns [4, 8), decoded with `halo` on its inner sides
        rows, first = 3 + halo, 4 - halo
        tile = decoder.decode_shared(shared[:, :, :rows, first:], (0, 0, first))
        own = tile[:, :, : 3 * 32, halo * 32 :]
        errors.append(float((own - whole[:, :, : 3 * 32, 4 * 32 :]).abs().max()))
    assert errors[0] > 1e-2 and errors[1] < 1e-5, errors


def test_the_reach_is_counted_from_the_released_layers():
    """4 blocks of 7x7 windows at the latent's grid (3 rows each), 6 of 7x7 at twice it, 4 and 2 of 5x5 at
    twice and four times it, 8 of 11x11 at eight times it: 12 + 9 + 4 + 1 + 5 rows. The whole-frame pass
    runs stages 1 and 2; the released bf16 halo spans what is left."""
    full = LTX2DiffusionDecoder._full_config({})
    assert spatial_reach(full) == 31
    assert whole_frame_stages(full) == 2 and spatial_reach(full, 2) == 10
    halo = LTX2DiffusionDecoder.spatial_halo["ltx2-diffusion"]
    assert halo["bfloat16"] >= 10 and halo["float32"] >= 10


def test_noise_is_a_function_of_the_pixel_position(monkeypatch):
    decoder = load_decoder(SPEC)
    whole = decoder.noise((1, 3, 17, 96, 128), (0, 0, 0))
    monkeypatch.setattr(ltx2_diffusion, "NOISE_ELEMENTS", 3 * 96 * 128 * 2)  # drawn 2 frames at a time
    assert torch.equal(decoder.noise((1, 3, 17, 96, 128), (0, 0, 0)), whole)
    part = decoder.noise((1, 3, 9, 64, 64), (1, 1, 2))  # latent frame 1, row 1, column 2
    assert torch.equal(part, whole[:, :, 8:17, 32:96, 64:128])
    other = load_decoder({**SPEC, "decode_noise_seed": 5}).noise((1, 3, 9, 64, 64), (1, 1, 2))
    assert not torch.equal(part, other)


def test_steps_come_from_the_spec_or_the_config():
    assert load_decoder(SPEC).decode_steps() == 1
    two = load_decoder({**SPEC, "decode_steps": 2})
    assert two.decode_steps() == 2
    z = torch.randn(8, 2, 3, 3, generator=torch.Generator().manual_seed(2))
    assert not torch.equal(two.decode(z, (0, 0, 0)), load_decoder(SPEC).decode(z, (0, 0, 0)))
    with pytest.raises(FarmError, match="'decode_steps' must be 1 or more"):
        load_decoder({**SPEC, "decode_steps": 0})


@pytest.mark.slow
def test_a_tiled_render_gives_the_same_bytes_on_1_and_3_workers(tmp_path, scheduler3):
    job = tmp_path / "job.zarr"
    synth(job, decoder="ltx2-diffusion-tiny", shots=1, frames=9, height=128, width=160, seed=3)
    options = farm.PlanOptions(tiles=(1, 2, 2), overlap=(0, 2, 2), batch_frames=8)
    one = farm.render(job, tmp_path / "one", workers=1, options=options, log=lambda _: None)
    three = farm.render(job, tmp_path / "three", scheduler=scheduler3, options=options, log=lambda _: None)
    assert not one.failed and not three.failed and three.tiles_decoded == 4
    a, b = (read_frames(Output(tmp_path / out), "shot000") for out in ("one", "three"))
    assert a.shape == (9, 128, 160, 3) and np.array_equal(a, b)
    videos = [(tmp_path / out / "videos/shot000.mp4").read_bytes() for out in ("one", "three")]
    assert videos[0] == videos[1]


def test_decode_steps_go_into_a_new_jobs_spec(tmp_path):
    from farm.inputs.ingest import ingest
    from farm.store.job import open_job

    np.save(tmp_path / "sh010.npy", np.zeros((8, 2, 3, 3), np.float32))
    ingest(tmp_path / "job.zarr", [tmp_path / "sh010.npy"], decoder=SPEC, latents="denormalized",
           decode_steps=2)
    assert open_job(tmp_path / "job.zarr").spec.extra == {"decode_steps": 2}
    with pytest.raises(FarmError, match="fixes the steps"):
        ingest(tmp_path / "job.zarr", [tmp_path / "sh010.npy"], name="b", decode_steps=3)
    ltx2 = {"family": "ltx2", "config": "ltx2-tiny", "weights": {"random_seed": 0}, "latents": "denormalized"}
    with pytest.raises(FarmError, match="does not denoise"):
        ingest(tmp_path / "other.zarr", [tmp_path / "sh010.npy"], decoder=ltx2, latents="denormalized",
               decode_steps=2)


def test_a_24gib_plan_of_a_1080p_shot_keeps_the_fits_error_and_fragmentation_in_hand(
    tmp_path, capsys, monkeypatch
):
    """At its fitted peak a 1x1x2 plan of this shot ran out of a 24 GiB budget on an H200, and a 1x1x4 plan at
    the fit raised by its worst error ran out on an H100 (fragmentation under the cap): tiles are planned at
    the fit raised by both, which leaves those grids out."""
    from farm.cli import main

    job = tmp_path / "job.zarr"
    synth(job, decoder="ltx2-diffusion", shots=1, frames=121, height=1088, width=1920, dtype="bfloat16")
    spec = farm.open_job(job).spec
    pixels, weights = (121, 1088, 1216), LTX2DiffusionDecoder.weight_bytes(spec)
    raised = LTX2DiffusionDecoder.peak_bytes(spec, pixels) - weights
    with monkeypatch.context() as patched:
        patched.setattr(LTX2DiffusionDecoder, "memory_fit_error", {})
        fitted = LTX2DiffusionDecoder.peak_bytes(spec, pixels) - weights
    assert raised == pytest.approx(1.27 * fitted, rel=1e-6)
    capsys.readouterr()
    assert main(["plan", str(job), "--gpu-memory", "24GiB", "--workers", "1"]) == 0
    grid = next(line for line in capsys.readouterr().out.splitlines() if line.startswith("shot shot000"))
    assert not any(f"tiles {g} " in grid for g in ("1x1x1", "1x1x2", "1x1x4")), grid
