"""Latents in: job stores built from the files other tools save (`ingest`, `latent_files`), from a
diffusers pipeline's output (`pipelines`), or synthetic ones for demos, tests and benchmarks
(`synthetic`).

May import: `farm.store`, `farm.planning` (the tile geometry's limits), `farm.decoders`, `farm.media`,
`farm.errors`; torch and safetensors only inside the functions that read tensors.
"""
