"""sessionlake: session analytics with the session state in Delta Lake tables.

The flow, one module per stage: :mod:`sources` (format adapters) → :mod:`validation`
→ :mod:`sessionize` (sessions and lateness) → :mod:`changelog` → :mod:`state` (the MERGE)
→ :mod:`batch` (one micro-batch, exactly once) → :mod:`stream` (the streaming job).
"""

__version__ = "0.1.0"
