"""Watching renders: the scheduler plugin that serves the farm page, its JSON and Prometheus metrics
(`monitor`), and each finished shot's thumbnail (`thumbnails`).

May import: `farm.keys`, `farm.render_ids`, `farm.media` (PNG encoding), `farm.errors`, Dask
distributed (it runs on the scheduler). No torch.
"""
