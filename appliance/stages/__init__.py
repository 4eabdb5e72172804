"""Built-in stages; importing this package registers them."""
from appliance.stages import chat, engine_stage, geo  # noqa: F401 - imported to register their stages
