"""``equeue-console``: a web console for a broker or a cluster (docs/console.md).

A separate process (design30 2.1): a poller thread asks the brokers through
the client's ``Admin`` every ``--interval`` (poller.py) and publishes an
immutable ``Snapshot`` (snapshot.py); ``History`` (history.py) keeps ring
buffers of rates and lags for the plots; web.py serves the JSON API, live
updates (server-sent events) and the pages; actions.py performs the admin
actions with the caller's own token; browser.py reads messages.
"""
