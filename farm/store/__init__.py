"""Data on disk: the job store (`job`: a render's input, latents and the decoder spec), the output
folder OUT (`output`: every path under it, frames arrays, done markers) and its lock (`lock`).

May import: `farm.media`, `farm.decoders` (the spec a job holds), `farm.errors`, `farm.config`, zarr
(inside functions) and numpy. No cluster, no torch.
"""
