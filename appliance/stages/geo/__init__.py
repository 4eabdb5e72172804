"""Geospatial stages: GeoTIFF scenes in, segmentation masks out, tile by tile in bounded memory.

raster_inputs -> raster_read -> tile -> normalize -> engine -> stitch -> raster_write
(see docs/geo.md). Importing this package registers the stages.
"""
from appliance.stages.geo import normalize, raster_inputs, raster_read, region, stitch, tile, write  # noqa: F401 - registers them
