"""daop-client: talk to a daop-agent over MQTT (estimate, meets, monitors, groups, a fleet of devices).

Depends on aiomqtt alone; the agent's estimator is not imported.
"""

from daop_client.address import DEFAULT_BROKER, Address, default_broker, default_device_id, parse_broker_url
from daop_client.bodies import Context, Workload
from daop_client.client import DaopClient, DaopError, GroupAnswer, Monitor, MonitorEvent
from daop_client.fleet import DeviceStatus, Fleet, FleetEvent

__all__ = ["DEFAULT_BROKER", "Address", "Context", "DaopClient", "DaopError", "DeviceStatus", "Fleet", "FleetEvent",
           "GroupAnswer", "Monitor", "MonitorEvent", "Workload", "default_broker", "default_device_id",
           "parse_broker_url"]
__version__ = "0.1.0"
