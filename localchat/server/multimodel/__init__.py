"""One server for several models: engines loaded on first use and evicted least-recently-used,
each served by the single-model app, behind a router that picks one by the request's `model`."""
