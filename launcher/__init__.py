"""The one-host launcher and the `jetrl` command: `jetrl up` (a whole run as supervised child
processes), `jetrl demo`, `jetrl eval`, and the fault suite's scenario. It is the only package that
may import every service (it starts them); no service imports it."""
