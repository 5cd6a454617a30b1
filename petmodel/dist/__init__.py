"""Dask and DDP: start or connect to a cluster (``cluster``; ``security`` for TLS), make a remote one ready
(``versions`` compared, our code shipped by ``shipping``; ``remote`` runs there before it has our code),
ask it about its workers (``workers``; bounded per-worker ``calls``), tune workers for training
(``tuning``), reserve workers across clients (``reservations``), launch and supervise one DDP run
(``launch`` on the client, ``ranks`` on the workers), and the registry of runs this process drives
(``registry``)."""
