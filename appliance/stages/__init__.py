"""Built-in stages; importing this package registers them."""
from appliance.stages import chat, engine, geo  # noqa: F401
