"""dflash-sidecar: the host-side daemon (sources -> aggregation -> exporters)."""

__version__ = "0.2.0"
