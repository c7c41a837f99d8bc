"""The decoders' part that sees the whole frame, run once over the whole frame, and the rest per tile.

Wan's and HunyuanVideo's middle blocks see the whole frame (self-attention at latent resolution), which
no halo reaches; the LTX-2.5 diffusion decoder's first two stages reach 21 latent units, which its tiles
then need not span. Their ``conv_in`` and middle block run once over a shot's whole frame (`whole_frame`)
and each tile decodes the rest from its block of that output (`decode_shared`): on the whole frame the
two parts are the decoder (float32 noise). Renders share Wan's pass (`shares_whole_frame`):
`farm.run.whole_frame` groups a plan's tiles by the frames they decode, one pass per group. The rendered
seams: tests/test_fidelity.py (halo) and the streamed render below.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

import farm
from farm.decoders import decoder_class
from farm.decoders.hunyuanvideo import whole_frame as hunyuan_whole_frame
from farm.errors import FarmError
from farm.inputs.synthetic import synth_spec
from farm.media.settings import VideoSettings
from farm.planning.plan_table import describe_plans
from farm.planning.tiling import ChunkSize, TileGrid, plan_shot, whole_frame_groups
from farm.run.whole_frame import whole_frame_group_of
from farm.store.frames import read_frames
from farm.store.job import create_job, write_shot
from farm.store.output import Output
from farm.worker.tasks import FromWholeFrame, decode_block, shared_block


def load(name: str):
    spec = synth_spec(name, seed=0, dtype="float32")
    return decoder_class(spec).load(spec, "cpu")


def latent(decoder, fhw: tuple[int, int, int], seed: int = 1) -> torch.Tensor:
    return torch.randn(decoder.latent_channels, *fhw, generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("name", ["wan-tiny", "wan2.2-tiny", "hunyuanvideo-tiny"])
def test_the_whole_frame_pass_and_the_rest_are_the_decoder(name):
    decoder = load(name)
    assert decoder.shares_whole_frame(decoder.spec.config)
    z = latent(decoder, (5, 6, 10))
    shared = decoder.whole_frame(z)
    assert tuple(shared.shape[1:]) == (5, 6, 10) and shared.device.type == "cpu"
    assert torch.allclose(decoder.decode_shared(shared), decoder.decode(z), rtol=0, atol=1e-4)


def test_hunyuanvideo_attends_frame_by_frame_in_blocks_of_queries_as_under_its_causal_mask(monkeypatch):
    decoder = load("hunyuanvideo-tiny")
    z = latent(decoder, (4, 4, 6))
    monkeypatch.setattr(hunyuan_whole_frame, "QUERY_BLOCK_ELEMENTS", 100)  # several blocks per frame
    assert torch.allclose(decoder.decode_shared(decoder.whole_frame(z)), decoder.decode(z), rtol=0, atol=1e-4)


def test_a_tile_decodes_its_block_of_the_pass_in_chunks_as_from_its_latent():
    """`decode_block` hands a tile's block of the pass to the decoder as it would hand latent: one call,
    or one per temporal chunk with its context; on a tile of the whole frame both equal the latent's."""
    decoder = load("wan-tiny")
    z = latent(decoder, (6, 6, 8))
    plan = plan_shot("s", (decoder.latent_channels, *z.shape[1:]), decoder.geometry, TileGrid())
    (tile,) = plan.tiles
    block = shared_block(decoder.whole_frame(z), tile)
    chunk = ChunkSize(frames=3)
    from_pass = decode_block(FromWholeFrame(decoder), block, chunk)
    from_latent = decode_block(decoder, z, chunk)
    assert torch.allclose(from_pass, from_latent, rtol=0, atol=1e-4)


def test_diffusion_decoder_tiles_take_the_pass_only_when_they_decode_in_one_call():
    """The diffusion decoder's pass holds the frames diffusers pads a clip's end with: a plan that chunks
    its tiles decodes them from their latent (no pass), and `farm plan` says which."""
    spec = synth_spec("ltx2-diffusion-tiny")
    geometry = decoder_class(spec).geometry_for_spec(spec)
    shape = (8, 3, 24, 24)
    whole_tiles = plan_shot("s", shape, geometry, TileGrid((1, 2, 2)))
    chunked = plan_shot("s", shape, geometry, TileGrid((1, 2, 2)), chunk=ChunkSize(None, 8, 8))
    groups = whole_frame_group_of([whole_tiles, chunked], spec.to_json())
    assert sorted(groups) == [(0, k) for k in range(4)]
    shared = "part that sees the whole frame runs once over it"
    assert shared in describe_plans([whole_tiles], spec, 2)
    assert shared not in describe_plans([chunked], spec, 2)


def test_a_decoder_without_a_whole_frame_part_shares_none():
    decoder = load("ltx2-tiny")
    assert not decoder.shares_whole_frame(decoder.spec.config)
    with pytest.raises(FarmError, match="no whole-frame part"):
        decoder.whole_frame(latent(decoder, (2, 4, 4)))


def test_tiles_share_one_pass_per_frames_they_decode():
    geometry = decoder_class(synth_spec("wan-tiny")).geometry_for_spec(synth_spec("wan-tiny"))
    split = plan_shot("s", (4, 40, 24, 24), geometry, TileGrid((2, 2, 2), (1, 0, 0)))
    groups = whole_frame_groups(split)
    assert sorted(len(tiles) for tiles in groups.values()) == [4, 4]
    for (first, stop), tiles in groups.items():
        decoded = [split.tiles[k].decode_slices()[0] for k in tiles]
        assert {(f.start, f.stop) for f in decoded} == {(first, stop)}
    assert whole_frame_groups(plan_shot("s", (4, 40, 24, 24), geometry, TileGrid((2, 1, 1), (1, 0, 0)))) == {}


def test_farm_plan_says_the_tiles_share_the_whole_frame_pass():
    notes = {}
    for name in ("wan-tiny", "hunyuanvideo-tiny", "ltx2-tiny"):
        spec = synth_spec(name)
        cls = decoder_class(spec)
        overlap = 0 if cls.statistics_exact(spec.config) else cls.spatial_overlap_for(spec.config)
        grid = TileGrid((1, 2, 2), (0, overlap, overlap))
        channels = cls.latent_channels_for(spec.config)
        plan = plan_shot("s", (channels, 3, 24, 24), cls.geometry_for_spec(spec), grid)
        notes[name] = describe_plans([plan], spec, 2)
    shared = "part that sees the whole frame runs once over it"
    assert "halo 10, no blend (each tile equals" in notes["wan-tiny"] and shared in notes["wan-tiny"]
    assert "halo 8, no blend, exact by shared statistics" in notes["hunyuanvideo-tiny"]
    assert "statistics are shared by its tiles in 17 rounds" in notes["hunyuanvideo-tiny"]
    assert shared in notes["hunyuanvideo-tiny"] and shared not in notes["ltx2-tiny"]


@pytest.mark.slow
def test_farm_plan_says_released_wan_in_bf16_needs_no_blend(tmp_path):
    """Released Wan 2.1 in bf16 with the whole-frame pass reaches bf16's floor at halo 8 (50.3 dB over the
    seams at 81x720x1280 on an H200, worst pixel 4 levels; docs/fidelity.md "Halo"), so its explicit
    spatial tiles decode that halo without a blend. Wan 2.2, not measured with the pass, keeps blending."""
    from tests.helpers import farm as farm_command

    out = {}
    for name in ("wan", "wan2.2"):
        job = str(tmp_path / f"{name}.zarr")
        made = farm_command("synth", job, "--decoder", name, "--frames", "5", "--height", "256",
                            "--width", "384")  # fmt: skip
        assert made.returncode == 0, made.stderr
        planned = farm_command("plan", job, "--workers", "4", "--tiles", "1,2,2")
        assert planned.returncode == 0, planned.stderr
        out[name] = planned.stdout
    assert "tiles 1x2x2 overlap 0,0,0;" in out["wan"]
    assert "spatial seams: halo 8, no blend (each tile equals the untiled decode" in out["wan"]
    assert "part that sees the whole frame runs once over it" in out["wan"]
    assert "tiles 1x2x2 overlap 0,4,4;" in out["wan2.2"]
    assert "spatial seams: halo 8 and a blend over overlap 4" in out["wan2.2"]


def test_streamed_chunks_of_tiles_decode_from_the_whole_frame_pass(tmp_path, scheduler3):
    """A 2x2 split whose tiles decode in temporal chunks, one task per chunk (streamed), through a real
    cluster: every chunk decodes from its tile's block of the shot's whole-frame pass, so wan-tiny's tiles
    equal the untiled render (its halo alone, without the pass, is 44.6 dB off over the seams)."""
    spec = synth_spec("wan-tiny", seed=0)
    job = tmp_path / "job.zarr"
    create_job(job, spec)
    channels = decoder_class(spec).latent_channels_for(spec.config)
    z = np.random.default_rng(1).standard_normal((channels, 4, 24, 24))
    write_shot(job, "s", z.astype(np.float32), fps=24.0)

    def render(out: str, options: farm.PlanOptions) -> np.ndarray:
        stats = farm.render(job, tmp_path / out, scheduler=scheduler3, options=options,
                            video=VideoSettings(enabled=False), log=lambda _: None)  # fmt: skip
        assert not stats.failed
        return read_frames(Output(tmp_path / out), "s").astype(np.float64)

    whole = render("whole", farm.PlanOptions(tiles=(1, 1, 1), batch_frames=64))
    tiled = render("tiled", farm.PlanOptions(tiles=(1, 2, 2), batch_frames=4, chunk=ChunkSize(frames=2)))
    assert np.abs(tiled - whole).max() <= 1.0


def test_tiles_that_take_the_whole_frame_pass_have_no_latent_read_ahead(tmp_path, cluster3):
    """A decode worker's first latent is read while a render sets up (`read_first_latents`), but a tile
    that decodes from the shot's whole-frame pass never reads its latent: none is read for it. An
    untiled plan of the same shot (no pass) still has its read."""
    from farm.run.graph import read_first_latents, split_workers

    spec = synth_spec("wan-tiny", seed=0)
    job = tmp_path / "job.zarr"
    create_job(job, spec)
    channels = decoder_class(spec).latent_channels_for(spec.config)
    write_shot(job, "s", np.zeros((channels, 3, 24, 24), np.float32), fps=24.0)
    geometry = decoder_class(spec).geometry_for_spec(spec)
    workers, _ = split_workers(cluster3)

    def reads(tiles: tuple[int, int, int]) -> dict:
        plan = plan_shot("s", (channels, 3, 24, 24), geometry, TileGrid(tiles, (0, 0, 0)))
        return read_first_latents(cluster3, [plan], workers, 0, job_path=str(job), spec_json=spec.to_json(),
                                  render_id=f"ahead-{tiles}")  # fmt: skip

    assert whole_frame_groups(plan_shot("s", (channels, 3, 24, 24), geometry, TileGrid((1, 2, 2), (0, 0, 0))))
    assert reads((1, 2, 2)) == {}
    untiled = reads((1, 1, 1))
    assert len(untiled) == 1 and next(iter(untiled.values())).result() is not None
