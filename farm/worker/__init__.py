"""What runs inside Dask workers: the task functions (`tasks`: decode a tile, blend, write, encode, mark
a batch, finish a shot), the task that writes each output kind (`writers`), tensors between workers
(`transport`, installed by `transport_plugin`; CUDA IPC in `ipc`), per-thread CUDA streams
(`cuda_streams`), a worker's warm-up preload (`warmup`) and how a decode worker imports diffusers
(`diffusers_imports`).

May import: `farm.store`, `farm.media`, `farm.planning` (tiles), `farm.decoders`, `farm.errors`,
`farm.config`, `farm.keys` (task key names); torch and diffusers. The driver imports `tasks`,
`writers`, `ipc`, `cuda_streams` and `transport_plugin` too (Dask pickles task functions by reference,
so the graph holds the functions themselves): those import torch only inside the functions that run
on a worker. `transport` imports it at module level; only workers load it.
"""
