"""A memory budget as users write it: bytes, a size string, or a share of the unplanned step's peak.

    resolve_budget(8_000_000_000, peak)   # bytes
    resolve_budget("8GB", peak)           # pydantic's ByteSize: kB/MB/GB are powers of 1000, KiB/MiB/GiB of 1024
    resolve_budget(0.6, peak)             # 60% of ``peak``, the unplanned step's measured peak bytes
"""

from __future__ import annotations

import math

from pydantic import ByteSize, TypeAdapter, ValidationError

from env.data.errors import BudgetError

MemoryBudget = int | str | float

_SIZES = TypeAdapter(ByteSize)
FORMS = "bytes (an int), a size string ('8GB', '900MiB') or a fraction 0 < f <= 1 of the unplanned step's peak"


def is_fraction(budget: MemoryBudget) -> bool:
    """Whether the budget is a share of the unplanned peak (a float), so it needs that peak to resolve."""
    return isinstance(budget, float)


def resolve_budget(budget: MemoryBudget, unplanned_peak_bytes: int | None = None) -> int:
    """The budget in bytes; a fraction is taken of ``unplanned_peak_bytes``. A one-line ``BudgetError`` otherwise."""
    if isinstance(budget, bool):
        raise BudgetError(f"memory_budget={budget!r} is a bool; give {FORMS}")
    if isinstance(budget, float):
        if not (math.isfinite(budget) and 0 < budget <= 1):
            raise BudgetError(f"memory_budget={budget!r} as a float is a fraction of the unplanned peak and must lie "
                              f"in (0, 1]; for bytes give an int, or a size string such as '8GB'")
        if unplanned_peak_bytes is None:
            raise BudgetError("memory_budget as a fraction needs the unplanned step's peak; measure it first")
        return int(budget * unplanned_peak_bytes)
    if isinstance(budget, int):
        if budget <= 0:
            raise BudgetError(f"memory_budget={budget} bytes must be positive; give {FORMS}")
        return budget
    if isinstance(budget, str):
        try:
            size = int(_SIZES.validate_python(budget.strip()))
        except ValidationError:
            raise BudgetError(f"memory_budget={budget!r} is not a size; write it as '8GB', '7.5GiB' or '900MiB' "
                              "(or give bytes, or a fraction of the unplanned peak)") from None
        if size <= 0:
            raise BudgetError(f"memory_budget={budget!r} must be more than 0 bytes")
        return size
    raise BudgetError(f"memory_budget of type {type(budget).__name__}; give {FORMS}")
