"""Data on disk: the job store (`job`: a render's input, latents and the decoder spec); the output
folder OUT: every path under it (`output`), its Zarr frames (`frames`), done markers (`markers`), the
table of output kinds (`output_kinds`: each kind's files, check and removal), a render's progress read
from it (`progress`); and its lock (`lock`). The frames are written through `beneath_zarr`'s store,
which never follows a link.

May import: `farm.media`, `farm.decoders` (the spec a job holds), `farm.errors`, `farm.config`, zarr
(inside functions) and numpy. No cluster, no torch.
"""
