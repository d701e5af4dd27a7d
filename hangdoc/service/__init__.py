"""``hangdoc server``: the standing coordinator that watches every job its agents see,
diagnoses a stall across the nodes that hold it, keeps each incident, links it to earlier
ones with the same fingerprint, and serves them on an HTTP API, a page and Prometheus
metrics (docs/service.md)."""
