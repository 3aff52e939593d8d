"""dflash-sidecar: the host-side daemon (sources -> aggregation -> exporters)."""

__version__ = "0.1.0"
