"""The daemon's core: the lifecycle (``daemon``), the ingest thread (``ingest``), the pipeline that
wires the stages (``pipeline``), the run ledger's window stage and state file (``ledger_state``),
the configuration (``config``) and the admin side (``admin``, ``selfstats``, ``systemd``)."""
