"""Dask and DDP: start or connect to a cluster (``cluster``), ask it about its workers (``workers``),
tune workers for training (``tuning``), launch and supervise one DDP run (``launch`` on the client,
``ranks`` on the workers), and the registry of runs this process drives (``registry``)."""
