"""Runs and talks: the asyncio service, the MQTT API, persistence, systemd and the CLI."""
