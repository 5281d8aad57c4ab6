"""jetrl shared contracts: names, messages, codec, bus helpers, config, telemetry.

This package is the only code every service imports. Nothing service-specific lives here.
"""

__version__ = "0.3.4"
