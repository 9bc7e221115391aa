"""A small v2 app for the local host's tests: a blueprint with HTTP, Service Bus and timer functions.

Functions record what they receive as JSON lines in the folder named by the setting
``SampleRecordDir``, so tests can check what the host handed them.
"""

import azure.functions as func
from sample_functions import bp

app = func.FunctionApp(http_auth_level=func.AuthLevel.FUNCTION)
app.register_functions(bp)
