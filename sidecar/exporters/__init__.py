"""Exporters: the fan-out's listeners that send each window out (Prometheus, W&B, the console),
the interface they share (``base``) and the live state they read between windows (``live``)."""
