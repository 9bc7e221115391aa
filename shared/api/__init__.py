"""The HTTP API, framework-neutral (bytes and headers in, ``HttpResult`` out): ``orders``
(submit, read, history, workflows), ``operator`` (retry, cancel, terminate), ``search``, and what
they share (``http``: problem+json, body and id checks; ``auth``: who may act; ``tokens``:
continuation tokens; ``views``: an order as the API shows it). functions/http.py adapts them."""
