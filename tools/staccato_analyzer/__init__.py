"""Workload analyzer for `staccato bench run` run directories (FaaSProfiler-compatible).

    PYTHONPATH=tools python3 -m staccato_analyzer analyze RUN_DIR
    PYTHONPATH=tools python3 -m staccato_analyzer compare RUN_DIR RUN_DIR... [--out DIR]

Needs numpy and matplotlib (Agg backend); not pandas, though the CSVs load into it.
"""

__all__ = ["analyze", "stats", "plots"]
