"""`appliance assemble`: a region's collection, mosaic and summary (region.py) once the shares of a search
(search_shares.py) have each mapped theirs into `output=DIR/`.

It runs the shares' search again and plans its scenes as they did (all of them: `search.share` and
$JOB_COMPLETION_INDEX are not read), then checks that each scene's outputs are complete
(region_items.incomplete: checked, not assumed). Any that is not is named, with why, and nothing is
written: the shares whose scenes are missing run again (a rerun maps only what is missing). Loads no model.
"""
from typing import Any, Iterator, List, Type

from appliance.errors import ConfigError, InputError
from appliance.pipeline import Stage
from appliance.stages.geo.aoi import parse_aoi
from appliance.stages.geo.raster_inputs import RasterInputs
from appliance.stages.geo.region import Region, region_outputs
from appliance.stages.geo.region_items import incomplete

SHOWN_MISSING = 20  # scenes named in the error; the count says how many more


def assemble(cfg: Any, stages: List[Stage]) -> Iterator[str]:
    """The region's lines (region.region_outputs: what was built over `cfg.output`, then what was published
    where `publish.url` is set), for the pipeline's built `stages`, as each step ends; InputError naming the
    scenes whose outputs are missing or incomplete."""
    inputs = _stage(stages, RasterInputs)
    region = _stage(stages, Region)
    search = cfg.get("search")
    if search is None or not search.get("url"):
        raise InputError("search.url: assemble builds the region of a search's shares: give the search they "
                         "ran (the same search.* keys)", param="search.url")
    directory = region.directory()
    if directory is None:
        raise InputError("output: assemble needs the directory the shares wrote into (output=DIR/)",
                         param="output")
    record = {"output": directory, "aoi": cfg.get("aoi"), "aoi_crs": cfg.get("aoi_crs")}
    planned = inputs.planned_search(record, parse_aoi(record["aoi"], record["aoi_crs"]))
    missing = [(key, why) for key, (_, mask), _ in planned if (why := incomplete(mask)) is not None]
    if missing:
        named = "; ".join(f"{key} ({why})" for key, why in missing[:SHOWN_MISSING])
        more = f"; and {len(missing) - SHOWN_MISSING} more" if len(missing) > SHOWN_MISSING else ""
        raise InputError(f"output: {len(missing)} of the search's {len(planned)} scenes are not complete in "
                         f"{directory}: {named}{more}; run their shares again (a rerun maps only what is "
                         "missing), then assemble", param="output")
    yield f"{len(planned)} scenes of the search complete"
    yield from region_outputs(cfg, directory, region.options)


def _stage(stages: List[Stage], cls: Type[Stage]) -> Any:
    found = next((stage for stage in stages if isinstance(stage, cls)), None)
    if found is None:
        raise ConfigError(f"pipeline: assemble needs the {cls.name} stage, and this pipeline has none "
                          f"(its stages: {', '.join(stage.name for stage in stages)})")
    return found
