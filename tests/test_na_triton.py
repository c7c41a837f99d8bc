"""The fused Triton neighbourhood attention (`farm.decoders.ltx2_diffusion.device.na_triton`) against
the windowed definition and the blocked SDPA path, run by Triton's interpreter on the CPU
(``TRITON_INTERPRET=1``: numpy executes the kernel's program, the same program a GPU compiles); and the
diffusion decoder through it."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from farm.decoders import load_decoder
from farm.decoders.ltx2_diffusion.adapter import LTX2DiffusionDecoder, decode_with_noise
from farm.decoders.ltx2_diffusion.device import ltx2_diffusion_chunked as chunked
from farm.decoders.ltx2_diffusion.device import na_triton
from farm.decoders.ltx2_diffusion.neighborhood_attention import neighborhood_attention
from tests.test_diffusion_decoder import SPEC, diffusers_decode, windowed_reference

pytestmark = [
    pytest.mark.model,
    pytest.mark.skipif(not na_triton.available(), reason="Triton is not installed (pip install triton)"),
]


ROOT = Path(__file__).resolve().parents[1]
# Triton chooses its interpreter as it is first imported (its own functions become interpreted or compiled
# ones then), and this process may have imported it already (torch's compiler does): the kernel's tests
# run in a process of their own that sets ``TRITON_INTERPRET=1`` from the start.
INTERPRETED = os.environ.get("TRITON_INTERPRET") == "1"
inner = pytest.mark.skipif(not INTERPRETED, reason="run by test_the_kernel_under_tritons_interpreter")


def test_the_kernel_under_tritons_interpreter():
    if INTERPRETED:
        pytest.skip("this is that process")
    done = subprocess.run([sys.executable, "-m", "pytest", __file__, "-x", "-q", "-p", "no:cacheprovider"],
                          env={**os.environ, "TRITON_INTERPRET": "1"}, cwd=ROOT, capture_output=True,
                          text=True, timeout=900)  # fmt: skip
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]
    assert " passed" in done.stdout and " failed" not in done.stdout


@inner
@pytest.mark.parametrize(
    ("grid", "kernel", "heads", "dim", "tile"),
    [((5, 6, 7), (3, 3, 3), 2, 8, None), ((4, 9, 10), (3, 5, 5), 1, 16, (2, 4, 4)),
     ((5, 4, 9), (5, 3, 7), 2, 24, (1, 4, 8)), ((3, 4, 3), (5, 5, 5), 1, 8, None)],
)  # fmt: skip
def test_fused_kernel_equals_the_windowed_definition(grid, kernel, heads, dim, tile):
    """Windows shifted inward at every border, tiles cut by the grid's edges, head dims under 16 (padded
    lanes), a window larger than the grid (clamped to it), two batch entries."""
    gen = torch.Generator().manual_seed(sum(grid))
    q, k, v = (torch.randn(2, *grid, heads, dim, generator=gen) for _ in range(3))
    got = na_triton.neighborhood_attention(q, k, v, kernel, block_q=32, block_k=16, tile=tile)
    want = windowed_reference(q, k, v, kernel)  # both at scale dim ** -0.5
    assert torch.allclose(got, want, atol=2e-6)


@inner
def test_queries_of_a_run_of_frames_see_the_whole_grids_windows():
    gen = torch.Generator().manual_seed(7)
    q, k, v = (torch.randn(1, 9, 5, 6, 2, 16, generator=gen) for _ in range(3))
    kernel = (5, 3, 3)
    want = neighborhood_attention(q, k, v, kernel, scale=0.5)
    for t0, t1 in ((0, 3), (3, 6), (6, 9), (8, 9)):
        k0, k1 = chunked.key_frames(t0, t1, 9, kernel[0])
        got = na_triton.neighborhood_attention(q[:, t0:t1], k[:, k0:k1], v[:, k0:k1], kernel, scale=0.5,
                                               q_frame_offset=t0 - k0, block_q=32, block_k=16)  # fmt: skip
        assert torch.allclose(got, want[:, t0:t1], atol=2e-6), (t0, t1)
    with pytest.raises(ValueError, match="outside the keys"):
        na_triton.neighborhood_attention(q[:, :4], k[:, :3], v[:, :3], kernel)


@inner
def test_a_spatial_tile_laid_on_the_shots_lattice_gets_the_shots_bits():
    """A tile cut from a grid at a row and column off the query tiles' lattice, told its place
    (`grid_origin`): its queries away from the cut get the whole grid's outputs bit for bit (their keys in
    the same runs), and every query still its own window's. Without it they differ in the last bits."""
    gen = torch.Generator().manual_seed(11)
    q, k, v = (torch.randn(1, 4, 13, 14, 2, 16, generator=gen) for _ in range(3))
    kernel, tile = (3, 3, 3), (2, 4, 4)
    whole = na_triton.neighborhood_attention(q, k, v, kernel, block_q=32, block_k=16, tile=tile)
    r, c = 3, 5  # neither a multiple of the tile's 4
    crop = [x[:, :, r:, c:] for x in (q, k, v)]
    got = na_triton.neighborhood_attention(*crop, kernel, block_q=32, block_k=16, tile=tile,
                                           grid_origin=(r, c))
    # from the lattice's first whole tile of queries on (a cut one's keys start at the cut)
    i, j = -r % tile[1], -c % tile[2]
    assert torch.equal(got[:, :, i:, j:], whole[:, :, r + i :, c + j :])
    assert torch.allclose(got, windowed_reference(*crop, kernel), atol=2e-6)
    unaligned = na_triton.neighborhood_attention(*crop, kernel, block_q=32, block_k=16, tile=tile)
    assert not torch.equal(unaligned[:, :, i:, j:], whole[:, :, r + i :, c + j :])


def test_query_tiles_hold_the_fewest_keys_per_query():
    assert na_triton.query_tile((121, 176, 304), (11, 11, 11), 128) == (4, 4, 8)
    assert na_triton.query_tile((3, 4, 3), (3, 3, 3), 32) in {(1, 4, 8), (2, 4, 4), (2, 2, 8)}


@inner
def test_the_decoder_through_the_fused_kernel_equals_diffusers():
    decoder = load_decoder(SPEC)
    model = LTX2DiffusionDecoder.build(decoder.spec)
    z = torch.randn(1, 8, 2, 3, 3, generator=torch.Generator().manual_seed(5))
    assert na_triton.usable_on("cpu")
    with torch.inference_mode():
        want = diffusers_decode(model, z, decoder.noise, (0, 0, 0), 1)
        got = decode_with_noise(model, z, decoder.noise, (0, 0, 0), 1, tokens=400)  # runs of 8 frames
    assert torch.allclose(got, want, atol=1e-5)
