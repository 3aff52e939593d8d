"""Soak harness: load publishers, a garbage flood and the orchestrator that kills and restarts the
daemon under them. The CI form (``tests/test_soak_load.py``) and the long form (``bench/soak.py``)
run the same code with different durations."""
