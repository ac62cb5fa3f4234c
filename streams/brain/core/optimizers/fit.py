"""Non-negative least squares for the few-parameter throughput models of GPU jobs.

Step-time terms (compute per sample, synchronisation) can only add time, so a fit with a
negative coefficient is physically wrong and extrapolates badly; with three parameters at
most, trying every subset of free coefficients is exact and cheap, and needs no numpy.
"""

from __future__ import annotations

from collections.abc import Sequence
from itertools import combinations

_SINGULAR = 1e-12


def _solve(matrix: list[list[float]], rhs: list[float]) -> list[float] | None:
    """Gaussian elimination with partial pivoting; None when (nearly) singular."""
    n = len(rhs)
    a = [[*row, b] for row, b in zip(matrix, rhs, strict=True)]
    scale = max((abs(v) for row in matrix for v in row), default=0.0) or 1.0
    for col in range(n):
        pivot = max(range(col, n), key=lambda r: abs(a[r][col]))
        if abs(a[pivot][col]) <= _SINGULAR * scale:
            return None
        a[col], a[pivot] = a[pivot], a[col]
        for row in range(col + 1, n):
            factor = a[row][col] / a[col][col]
            for k in range(col, n + 1):
                a[row][k] -= factor * a[col][k]
    x = [0.0] * n
    for row in range(n - 1, -1, -1):
        x[row] = (a[row][n] - sum(a[row][k] * x[k] for k in range(row + 1, n))) / a[row][row]
    return x


def nnls(features: Sequence[Sequence[float]], targets: Sequence[float]) -> list[float] | None:
    """Coefficients >= 0 minimising the squared error of `features @ coef ~ targets`.

    Ties (collinear features, e.g. a batch size that never changed) go to the fit with
    fewer free coefficients, so the answer is deterministic. None without data.
    """
    if not features or len(features) != len(targets):
        return None
    width = len(features[0])
    # every subset's normal equations take their entries from these: summed once, in the
    # order each subset summed them before, so the fits are the same to the last bit
    gram = [[sum(row[i] * row[j] for row in features) for j in range(width)] for i in range(width)]
    moments = [
        sum(row[i] * t for row, t in zip(features, targets, strict=True)) for i in range(width)
    ]
    scale = sum(t * t for t in targets) or 1.0
    best: tuple[float, int, list[float]] | None = None
    for size in range(1, width + 1):
        for free in combinations(range(width), size):
            normal = [[gram[i][j] for j in free] for i in free]
            rhs = [moments[i] for i in free]
            solved = _solve(normal, rhs)
            if solved is None or any(v < 0 for v in solved):
                continue
            coef = [0.0] * width
            for i, v in zip(free, solved, strict=True):
                coef[i] = v
            error = sum(
                (sum(c * x for c, x in zip(coef, row, strict=True)) - t) ** 2
                for row, t in zip(features, targets, strict=True)
            )
            key = (round(error / scale, 12), size)
            if best is None or key < (best[0], best[1]):
                best = (key[0], key[1], coef)
    return best[2] if best is not None else None
