"""The types that cross stages: decoded messages (``messages``), the window (``window``), GPU
readings and views (``gpu``), the pipeline insight and verdict (``insight``), names (``names``),
``HOST:PORT`` (``address``), how a component declares its settings (``settings``), the retry
delays (``backoff``). Sources,
processing, aggregation and exporters import from here; nothing here imports any of them."""
