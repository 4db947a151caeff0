"""A run's records: its directory, what the server writes, reading them back, provenance, figures."""
