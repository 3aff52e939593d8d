"""Exporters: the fan-out's listeners that send each window out (Prometheus, W&B, the console),
the interface they share (``base``) and the scrape state they read between windows (``scrape_state``)."""
