"""Hotseat audit service: durable JetStream consumer, exactly-once store, query API."""
