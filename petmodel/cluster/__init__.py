"""Dask and DDP. Clusters: the project's client (``client``), the embedded one (``local``), connecting
to a running scheduler (``connect``; ``security`` for TLS). Making a remote one ready: ``versions``
compared, our code shipped by ``shipping``, with ``probes`` that run there before it has our code.
Asking it about its workers (``workers``; bounded per-worker ``calls``), tuning workers for training
(``tuning``), reserving workers across clients (``reservations`` here, ``reservation_state`` on the
scheduler). One DDP run: ``launch`` on the client (``launch_run``, ``RunHandle``), ``ranks`` on the workers;
the ``supervisor`` thread drives it through a ``rank_group`` (one formation of its ranks), typed
``failures`` and a pure ``failure_policy``, and a ``snapshot_collector``; ``registry`` lists the
runs this process drives."""
