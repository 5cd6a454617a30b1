"""The Streamlit app's non-UI layer; nothing here imports Streamlit.

- :mod:`~petmodel.app.backend`: :class:`AppBackend`, shared by every session: launching and
  cancelling runs, starting studies, the cluster summary; it is also
- :mod:`~petmodel.app.cluster_session`: the cluster's lifecycle (start, connect, warm up, disconnect), and
- :mod:`~petmodel.app.models`: the trained models, name generation and scoring.
- :mod:`~petmodel.app.pending`: launches that wait in the scheduler's queue for busy workers,
  each in a background thread the Train page polls.
- :mod:`~petmodel.app.warmup`: warming a new cluster up (switchable with ``$PETMODEL_WARMUP``).
- :mod:`~petmodel.app.loaders`: corpora and checkpoints, loaded once per file version.
- :mod:`~petmodel.app.links`: the Generate page's settings and its shareable URL.
- :mod:`~petmodel.app.forms`: the Train and Experiments forms' defaults and values → RunSpec or a study config.
- :mod:`~petmodel.app.tables`: rows for the pages' tables.
- :mod:`~petmodel.app.charts`: Altair charts the pages share.
"""
