"""Exporters: the fan-out's listeners that send each window out (Prometheus, W&B, the console),
the interface they share (``base``: with ``ScrapeView``, what they read between windows, which the
daemon's core provides)."""
