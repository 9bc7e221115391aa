"""The DBOS peer: the same three-step order with compensation, written with DBOS Transact.

It runs in its own venv (``.venv-peer``, see venv.py) as a subprocess; bench/peer.py measures it
beside our app with the same remotes simulator and load generator. Only venv.py is imported
from the app's venv: the other modules need dbos.
"""
