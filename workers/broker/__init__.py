"""The broker side of delivery: kombu transport, consumer inboxes, redelivery, serialization."""
