"""A declarative, config-driven serving appliance for vision-language and geospatial models."""
from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("appliance")
except PackageNotFoundError:  # a source tree that was never installed
    __version__ = "0.0.0"
