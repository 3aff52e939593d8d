"""Processing: stages between decode and aggregation (the name-mapping stage goes here)."""
