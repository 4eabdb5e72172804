"""`region`: after a run's masks are written into `output=DIR/`, what they add up to, rebuilt from what the
directory holds: `collection.json` (region_collection.py), `mosaic.tif` (region_mosaic.py) and
`summary.json` with its table on the terminal (region_summary.py).

Built from every complete mask in DIR (region_items.py), not only those this run made: a rerun that
skipped complete scenes, or runs that each mapped a share of a search into the same directory, give the
same region outputs as one run. A run whose `output` is one file writes none of them, and neither does a
run that maps one share of a search (`search.shares`, search_shares.py): `appliance assemble`
(region_assemble.py) builds them once every share is done.
"""
import logging
import os
import re
import time
from dataclasses import dataclass
from typing import Iterator, List, Optional

from appliance.pipeline import Record, Stage, register_stage
from appliance.progress import DEFAULT_INTERVAL, Progress, check_interval
from appliance.stages.geo.raster_inputs import TIFF_SUFFIXES
from appliance.stages.geo.region_collection import region_collection, write_collection
from appliance.stages.geo.region_items import RegionItem, region_items
from appliance.stages.geo.region_mosaic import MosaicRule, placed, write_mosaic
from appliance.stages.geo.region_publish import publish_region
from appliance.stages.geo.region_summary import region_summary, summary_table, write_summary
from appliance.stages.geo.search_shares import this_share

log = logging.getLogger(__name__)


@dataclass
class RegionOptions:
    collection: bool = True  # write DIR/collection.json, a STAC Collection linking every item
    mosaic: bool = True  # write DIR/mosaic.tif, every mask in one CRS
    mosaic_rule: MosaicRule = MosaicRule.latest  # where masks overlap: latest or max_class
    summary: bool = True  # write DIR/summary.json and print its table
    progress: bool = True  # scenes done of the run's, with an ETA, on stderr (a line every interval)
    progress_interval: float = DEFAULT_INTERVAL  # seconds between progress lines


@register_stage
class Region(Stage):
    name = "region"
    consumes = ("output_path",)
    online = False  # a server answers scene by scene
    runs_without_records = True  # a rerun that skipped every scene still rebuilds the region
    Options = RegionOptions

    def __init__(self, options, cfg):
        super().__init__(options, cfg)
        check_interval(options.progress_interval, f"{self.name}.progress_interval")

    def process(self, records: Iterator[Record]) -> Iterator[Record]:
        yield from self._counted(records)
        directory = self.directory()
        if directory is None:
            return
        share = this_share(self.cfg.get("search") or {})
        if share is not None:  # the other shares may still run: `appliance assemble` builds the region
            yield {"display": f"region: {share} done; once every share is, `appliance assemble` with the same "
                              "keys builds the collection, mosaic and summary"}
            return
        for line in region_outputs(self.cfg, directory, self.options):
            yield {"display": "region: " + line}

    def _counted(self, records: Iterator[Record]) -> Iterator[Record]:
        """The records, each written scene counted: progress over a run of several scenes into a directory,
        timed from the run's start (this generator's first step: before the first scene is read)."""
        start, progress, directory = time.monotonic(), None, self.directory()
        for record in records:
            count = record.get("scene_count") or 0  # raster_inputs' (a record of another source has none)
            if progress is None and count > 1 and directory is not None:
                progress = Progress(count, os.path.normpath(directory), "scene", enabled=self.options.progress,
                                    interval=self.options.progress_interval, bar=False, start=start)
            yield record
            if progress is not None and record.get("output_path"):
                progress.update()  # after the scene's `wrote` line, which the run prints as it gets the record

    def directory(self):
        """The run's output directory, or None when its output is one file (or unset)."""
        output = self.cfg.get("output")
        if not output or (str(output).lower().endswith(TIFF_SUFFIXES) and not os.path.isdir(str(output))):
            return None
        return str(output)



def region_outputs(cfg, directory: str, options: RegionOptions) -> Iterator[str]:
    """Write the region's outputs over `directory`'s complete masks, a line for each as it is written (none
    without a mask), then publish the region to `publish.url` where one is set: last, so that a refusal
    leaves every file shown. The items are read once, for both."""
    items = region_items(directory)
    if not items:
        log.warning("region: no complete mask in %s; no collection, mosaic or summary written", directory)
        return
    description = f"Masks by {cfg.model.name} (pipeline {cfg.pipeline.name})"
    yield from _build(directory, items, options, description)
    published = _publish(cfg.get("publish"), directory, items, description)
    if published:
        yield published


def _build(directory: str, items: List[RegionItem], options: RegionOptions, description: str) -> Iterator[str]:
    if options.collection:
        yield f"collection {write_collection(directory, items, _identifier(directory), description)}"
    on_map = placed(items) if options.mosaic else []
    if len(on_map) < len(items) and options.mosaic:
        log.warning("region: %d of %d masks have no CRS and are left out of the mosaic",
                    len(items) - len(on_map), len(items))
    mosaic = write_mosaic(directory, on_map, options.mosaic_rule) if on_map else None
    if mosaic:
        yield f"mosaic {mosaic} ({len(on_map)} masks, overlaps: {options.mosaic_rule.value})"
    if options.summary:
        # The region's totals come from the mosaic only when it holds every mask (overlaps counted once);
        # else they are the items' sum.
        summary = region_summary(items, mosaic if len(on_map) == len(items) else None)
        yield f"summary {write_summary(directory, summary)}\n{summary_table(summary)}"


def _publish(settings, directory: str, items: List[RegionItem], description: str) -> Optional[str]:
    """Send the region to `publish.url` (region_publish.py) when one is set: the line saying what was sent."""
    if settings is None or not settings.get("url"):
        return None
    collection = region_collection(items, _identifier(directory), description)
    return publish_region(settings, directory, collection.to_dict(include_self_link=False, transform_hrefs=False),
                          items)


def _identifier(directory: str) -> str:
    """The collection id: the directory's name, as a STAC id (no spaces or slashes)."""
    name = os.path.basename(os.path.normpath(os.path.abspath(directory)))
    return re.sub(r"[^0-9A-Za-z._-]", "_", name) or "region"
