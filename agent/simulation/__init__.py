"""`daop-agent simulate`: the real agent on a simulated device, driven along a scenario's timeline.

A scenario (TOML, docs/simulate.md; scenario.py) sets device conditions at given times,
starts and stops real load, registers monitors and states the events it
expects. The runner:

- writes a fixture /sys tree (thermal zone and trip points, cooling device,
  cpufreq, batteries and adapter, platform profile) and a /proc tree whose
  /proc/stat is synthesized from the *real* CPU time of the load processes it
  starts, plus any simulated steal time, so the device's load is exactly the
  scenario's and not that of whatever else shares the host;
- serves GPUs through an NVML stand-in (`SimulatedNvml`);
- runs the real agent (`agent.service.Agent`) in-process on that device,
  against a private Mosquitto or a given broker, and talks to it over MQTT
  as an app would (`daop_client.DaopClient`);
- keeps the device consistent: the agent's warm refresh runs the real
  onnxruntime probe on the real CPU (so that it costs what it costs on a
  device), and reports what the simulated device would read: the probe's
  quiet time per run slowed by the simulated clock (limit / maximum) and by
  the scenario's busy processes sharing the cores, like /proc/stat;
- prints the timeline and checks the expectations.

Parsing and validation are pure; everything else is I/O.
"""
