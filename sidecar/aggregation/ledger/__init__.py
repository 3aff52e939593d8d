"""The run ledger (goodput): windows in, per run and role where the wall time and the energy went.

Split by job: ``facts`` reads a window into what the ledger needs (``window_facts``, the one
place the ledger reads a window); ``fold`` folds those facts into each run's typed record
(``RunLedger``) and makes the exporters' view; ``record`` is that record per role and run, with
its JSON and the state file's version rule; ``retell`` holds the rules that move time already
told to the cause a later window shows (compile, warmup, shutdown). Each run's verdicts are kept
by ``sidecar.aggregation.run_verdicts``; ``sidecar.core.ledger_state`` saves the state.
"""
