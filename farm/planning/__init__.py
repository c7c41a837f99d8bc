"""Pure planning: tiles and their blend ramps (`tiling`), what decodes and transfers cost (`costmodel`
and the recorded models in costmodels/), the auto planner (`planner`), a job's shot plans (`jobplan`),
the run policy as one value (`schedule`) and the state machine that runs it (`render_state`), memory
budgets (`budgets`), the user's planning options (`options`) and the `farm plan` table (`plan_table`).

May import: `farm.store` (the job it plans), `farm.decoders` (specs, geometry, memory models),
`farm.media` (rates, the render's settings), `farm.errors`, `farm.config`, numpy. Never Dask
distributed, torch, diffusers or the disk beyond reading a job's metadata: the fast test tier and
`farm plan` run it alone.
"""
