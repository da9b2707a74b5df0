"""Alerts: rules over stored captions, and durable delivery of what they fire to webhooks and MQTT."""
