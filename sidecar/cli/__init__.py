"""Every ``dflash-sidecar`` command: the argument parsing and dispatch (``main``), the console
script's entry (``entry``, importable without the daemon's dependencies), the commands (``check``,
``report``, ``explain``, ``top``, ``demo``), the exit statuses and the generators of the docs'
tables (``options_doc``, ``family_docs``). Nothing here is imported by the daemon's core or its
stages; importing this package alone loads nothing."""
