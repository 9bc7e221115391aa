"""Local Azure Service Bus emulator: an AMQP 1.0 broker for the unmodified azure-servicebus SDK.

Run it with ``python -m local.servicebus --config FILE --host 127.0.0.1 --port PORT --data-dir DIR``.
See README.md in this folder for the design, the durability (fsync) policy and the limits.
"""
