"""A local Azure Functions host for Python v2 function apps (no Core Tools needed).

``python -m local.host --app-dir DIR --settings FILE [--instances N] [--host 127.0.0.1]
[--port P] [--set Name=Value ...] [--keys FILE | --no-keys]`` runs any v2 app the way the Functions host and the Python
worker would:

- the app is the one ``FunctionApp`` in ``PYTHON_SCRIPT_FILE_NAME`` (default
  ``function_app.py``); functions come from ``app.get_functions()`` and their bindings from
  ``get_function_json()`` (:mod:`local.host.app`);
- ``local.settings.json`` ``Values`` become the instances' environment (variables already set
  in the environment win, as with Core Tools; ``--set`` wins over both); ``%Setting%`` is
  resolved in binding properties; ``host.json`` gives ``extensions.http.routePrefix`` and
  ``extensions.serviceBus`` options (:mod:`local.host.settings`);
- HTTP triggers on a threaded HTTP server with route templates and constraints
  (:mod:`local.host.http_server`, :mod:`local.host.routes`). Auth levels are enforced as in
  Azure, with the keys of ``--keys FILE`` (:mod:`local.host.keys`); ``--no-keys`` checks none,
  as ``func start``;
- Service Bus triggers with peek-lock receivers, maxConcurrentCalls, auto-complete / abandon,
  lock renewal and reconnection (:mod:`local.host.servicebus`); Service Bus output bindings;
  the function gets the message the host would hand the worker (:mod:`local.host.messages`);
- timer triggers on NCRONTAB schedules, one runner per function across all instances through
  a file lease (:mod:`local.host.timers`, :mod:`local.host.ncrontab`);
- ``--instances N`` separate processes on one port (:mod:`local.host.supervisor`).

Not supported (the function is reported in error and the others run): other trigger types,
input bindings, output bindings other than ``http`` / ``serviceBus``, Service Bus batches
(``cardinality: many``), per-function keys, ``functionTimeout`` and retry policies.
"""
