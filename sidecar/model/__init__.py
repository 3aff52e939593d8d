"""The types that cross stages: the window (``window``), GPU readings (``gpu``), names
(``names``). Sources, processing, aggregation and exporters import from here; nothing here
imports any of them."""
