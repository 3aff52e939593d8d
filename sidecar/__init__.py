"""dflash-sidecar: the host-side daemon. Its packages, lowest first: ``model`` (the types), the
stages ``sources`` -> ``processing`` -> ``aggregation`` -> ``exporters``, ``core`` (wires and runs
them) and ``cli`` (every command); docs/ARCHITECTURE.md has the map."""

__version__ = "0.2.0"
