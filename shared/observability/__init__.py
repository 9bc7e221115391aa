"""Observability: OpenTelemetry traces (``telemetry``) and metrics (``metrics``), structured JSON
logs (``logs``), and the console's own figures per process (``figures``, flushed by ``periodic``)."""
