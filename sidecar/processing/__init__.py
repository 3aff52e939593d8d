"""Processing: the name-mapping stage between decode and aggregation (``mapping``, with its units,
presets and rules), and the ``/explain`` report of what it made of every series (``explain``)."""
