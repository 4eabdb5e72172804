"""Built-in stages; importing this package registers them."""
from appliance.stages import engine, geo  # noqa: F401
