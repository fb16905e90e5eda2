"""Parameter errors a scaler can only find when it meets the fleet (`bind`): a pool it names
that does not exist, a mode the pools do not support. They read like the registry's
constructor errors, one line naming the section, the scaler and the parameter."""

from lmsim.errors import ConfigError
from lmsim.scaling import Autoscaler


def bind_error(scaler: Autoscaler, message: str) -> ConfigError:
    return ConfigError(f"autoscaler.params: autoscaler {scaler.registry_name!r}: {message}")
