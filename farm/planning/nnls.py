"""Non-negative least squares, for fitting cost figures that cannot be negative (`farm.planning.costmodel`,
`farm.planning.encode_cost`). Pure numpy."""

from __future__ import annotations

import numpy as np


def nnls(a: np.ndarray, b: np.ndarray, *, max_iter: int = 100) -> np.ndarray:
    """Non-negative least squares, ``min ||a x - b||, x >= 0`` (Lawson & Hanson's active set method)."""
    m, n = a.shape
    scale = np.linalg.norm(a, axis=0)
    scale[scale == 0] = 1.0
    a = a / scale
    tol = 1e-10 * max(1.0, float(np.abs(a).max()) * float(np.abs(b).max()))
    passive = np.zeros(n, dtype=bool)
    x = np.zeros(n)
    grad = a.T @ (b - a @ x)
    for _ in range(max_iter):
        if passive.all() or grad[~passive].max() <= tol:
            break
        passive[int(np.argmax(np.where(passive, -np.inf, grad)))] = True
        while True:
            z = np.zeros(n)
            z[passive] = np.linalg.lstsq(a[:, passive], b, rcond=None)[0]
            if (z[passive] > 0).all():
                break
            bad = passive & (z <= 0)
            alpha = float(np.min(x[bad] / (x[bad] - z[bad])))
            x = x + alpha * (z - x)
            passive &= x > tol
            x[~passive] = 0.0
        x = z
        grad = a.T @ (b - a @ x)
    return x / scale
