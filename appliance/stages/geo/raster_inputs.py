"""`raster_inputs`: one run record in, one record per input scene out, all validated first.

A scene (`scene_sources.scene_spec`) is a GeoTIFF path or URL, a STAC item (`.json`, path or URL), or a list
of per-band GeoTIFFs in the model's band order: `input=[a.tif, b.tif]` is two scenes,
`input=[[b02.tif, b03.tif, ...]]` one scene from per-band files (an inner list of one file is that file:
`input=[[a.tif],[b.tif]]` is `input=[a.tif,b.tif]`, the shape the Helm Job renders for any model). Its stem names
the mask: the file's,
the first band file's, or the item file's. A multi-date model's (model.prithvi.num_frames T > 1) scene is
T dates or one stacked file (multidate.py): `input=[d1.tif, d2.tif, d3.tif]` is ONE scene of three dates,
`input=[[d1.tif, d2.tif, d3.tif], [e1.tif, e2.tif, e3.tif]]` two; its first date names the mask. Instead of
`input`, `search.url` (and the other `search.*` keys) takes the scenes a STAC API search finds
(search_scenes.py); each scene's first item (its id) names the mask. A search run skips the scenes whose
outputs are complete already (region_items.incomplete: checked, not assumed) and makes the others again,
so a rerun after a stop resumes; `overwrite=true` makes them all again.

Output rule (`plan_outputs`, pure):
  - no `output`: `<stem><suffix>` beside each input (suffix `.mask.tif` by default); a remote input
    needs an `output`, and so does an input inside the installed package (its bundled samples);
  - `output` ending in .tif/.tiff (and not an existing directory): that file; one input only;
  - any other `output`: a directory (created if missing) receiving `<stem><suffix>` per input.
Nothing is read or written before every input and output of the run passes its checks.
"""
import functools
import logging
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict, Iterator, List, Optional, Sequence, Tuple

from omegaconf import DictConfig, ListConfig, OmegaConf

from appliance.errors import InputError
from appliance.output_files import check_writable_dir
from appliance.pipeline import Record, Stage, register_stage
from appliance.stages.geo.aoi import parse_aoi
from appliance.stages.geo.geotiff import probe_geotiff
from appliance.stages.geo.multidate import given_dates, input_scenes, model_frames, multidate_spec
from appliance.stages.geo.raster_read import geo_contract
from appliance.stages.geo.region_items import incomplete
from appliance.stages.geo.scene_sources import SceneSpec, is_remote, is_stac_item, scene_spec, shown, stem
from appliance.stages.geo.search_plan import item_id, self_href
from appliance.stages.geo.search_scenes import check_one_source, found_scenes, scene_spec_of
from appliance.stages.geo.search_shares import share_positions, this_share
from appliance.stages.geo.stac_in import load_item

log = logging.getLogger(__name__)

TIFF_SUFFIXES = (".tif", ".tiff")
PACKAGE_DIR = Path(__file__).resolve().parents[2]  # the installed `appliance` package


def as_path_list(value: Any, depth: int = 2) -> List[Any]:
    """The entries of `input`: each a path / URL, or a list of them (per-band files; for a multi-date
    model, dates, each of which may be a list of per-band files: `depth` 3)."""
    if isinstance(value, (ListConfig, DictConfig)):
        value = OmegaConf.to_container(value)
    if value is None or value == "" or value == []:
        raise InputError("input: no scene given; pass input=scene.tif or input=[a.tif,b.tif]", param="input")
    items = value if isinstance(value, (list, tuple)) else [value]

    def paths(v, levels: int):
        if isinstance(v, (str, os.PathLike)) and str(v):
            return str(v)
        if levels > 1 and isinstance(v, (list, tuple)) and v:
            inner = [paths(p, levels - 1) for p in v]
            return None if None in inner else inner
        return None

    entries = [paths(v, depth) for v in items]
    if None in entries:
        raise InputError(f"input: expected a path, a list of paths, or lists of per-band paths, got {value!r}",
                         param="input")
    return entries


def first_file(value: Any) -> str:
    """What names an entry's mask: its first file (of its first date)."""
    return first_file(value[0]) if isinstance(value, list) else value


def plan_outputs(inputs: Sequence[str], output: Optional[str], suffix: str = ".mask.tif") -> List[Tuple[str, str]]:
    """(input, output) pairs by the rule in the module docstring; InputError on conflicts."""
    def named(src: str, directory: str) -> str:
        return os.path.join(directory, stem(src) + suffix)

    if output is None or str(output) == "":
        for src in inputs:
            if is_remote(src):
                raise InputError(f"output: {shown(src)} is remote, so its mask cannot go beside it; give "
                                 "output=DIR or output=mask.tif", param="output")
            if _inside(src, PACKAGE_DIR):
                raise InputError(f"output: not given, and the mask of {src} would go beside it, inside the "
                                 f"appliance package; pass output=PATH (a .tif file or a directory)", param="output")
        pairs = [(src, named(src, os.path.dirname(src))) for src in inputs]
    else:
        output = str(output)
        is_file = output.lower().endswith(TIFF_SUFFIXES) and not os.path.isdir(output)
        if is_file and len(inputs) > 1:
            raise InputError(
                f"output: {len(inputs)} inputs need an output directory, got the file name {output}", param="output"
            )
        pairs = [(inputs[0], output)] if is_file else [(src, named(src, output)) for src in inputs]
    seen: Dict[str, Any] = {}
    for src, dst in pairs:
        key = os.path.normpath(os.path.abspath(dst))
        if key in seen:
            raise InputError(
                f"output: {seen[key]} and {src} would both write {dst}; give them distinct names or run them apart",
                param="output"
            )
        seen[key] = src
    return pairs


def _inside(path: str, directory: Path) -> bool:
    return Path(os.path.realpath(path)).is_relative_to(directory)


def check_output(src: str, dst: str, overwrite: bool, inputs: Sequence[str]) -> None:
    """InputError when `dst` would clobber an input or an existing file, or cannot be written."""
    dst_abs = os.path.realpath(dst)
    for other in inputs:
        if os.path.realpath(other) == dst_abs:
            raise InputError(f"output: {dst} is an input scene; choose another output path", param="output")
    if os.path.isdir(dst):
        raise InputError(f"output: {dst} is a directory; expected a file path for the mask of {src}", param="output")
    if os.path.exists(dst) and not overwrite:
        raise InputError(f"output: {dst} exists; pass overwrite=true to replace it", param="output")


@dataclass
class RasterInputsOptions:
    suffix: str = ".mask.tif"  # output name beside each input (or in the output directory)


@register_stage
class RasterInputs(Stage):
    """Expand the run record into one record per scene: `input_path`, `output_path`, `scene_index`, and
    `scene_count` (the scenes this run maps: the region stage's progress counts them)."""

    name = "raster_inputs"
    consumes = ("input", "output", "overwrite")
    produces = ("input_path", "output_path", "scene_index", "scene_count")
    online = False  # the server gets one scene per request, spooled or named in the body

    Options = RasterInputsOptions

    def __init__(self, options, cfg):
        super().__init__(options, cfg)
        geo = geo_contract(cfg, self.name, required=False)
        self.model_bands = list(geo.bands) if geo is not None else []
        self.stac_bands = list(geo.stac_bands) if geo is not None and geo.get("stac_bands") else None
        self.frames = model_frames(cfg)
        self.load_item = functools.partial(load_item, timeout_s=cfg.server.limits.fetch_timeout_s)
        self.search = cfg.get("search") if cfg is not None else None

    def process(self, records: Iterator[Record]) -> Iterator[Record]:
        for record in records:
            yield from self._scenes(record, network=True)

    def preflight(self, records: List[Record]) -> Optional[List[Record]]:
        # Without the network: a search is not run, a STAC item named by URL is not read, a remote file's
        # header not probed; a run that names any of them has its scenes checked as the run reads them.
        if self._searching():
            for record in records:
                check_one_source(record.get("input"))
            this_share(self.search)  # a share run that cannot say which share stops before the model loads
            return None
        scenes = [scene for record in records for scene in self._scenes(record, network=False)]
        remote = any(s["input_path"] is None or any(map(is_remote, s["input_path"].files)) for s in scenes)
        return None if remote else scenes

    def _searching(self) -> bool:
        return self.search is not None and bool(self.search.get("url"))

    def _scenes(self, record: Record, network: bool) -> Iterator[Record]:
        """The record's scenes, once every input and output has passed its checks (`input_path` None:
        a STAC item by URL, left unread without the `network`)."""
        aoi = parse_aoi(record.get("aoi"), record.get("aoi_crs"))
        date = given_dates(record.get("date"), self.frames, "date")
        if self._searching():
            pairs, specs = self._searched(record, aoi)
        else:
            pairs, specs = self._given(record, network)
        overwrite = bool(record.get("overwrite", False))
        if self._searching() and not overwrite:
            pairs, specs = _unfinished(pairs, specs)
            overwrite = True  # what is left is unfinished: its outputs, if any, are made again
        local = [f for spec in specs if spec is not None for f in spec.files if not is_remote(f)]
        for spec in specs:
            for position, file in enumerate(spec.files if spec is not None else ()):
                if network or not is_remote(file):
                    probe_geotiff(file, spec.label(position))
        for src, dst in pairs:
            check_output(src, dst, overwrite, local)
        for directory in sorted({os.path.dirname(dst) for _, dst in pairs}):
            check_writable_dir(directory)
        for index, (spec, (_, dst)) in enumerate(zip(specs, pairs)):
            yield {**record, "input_path": spec, "output_path": dst, "scene_index": index,
                   "scene_count": len(pairs), "aoi": aoi,
                   "date": date}

    def _given(self, record, network: bool):
        """`input=`'s scenes: (input, output) pairs (planned before any network) and their SceneSpecs
        (None for a STAC item by URL, without the `network`)."""
        if self.frames > 1:
            values = input_scenes(as_path_list(record.get("input"), depth=3), self.frames)
        else:
            values = as_path_list(record.get("input"))
        names = [first_file(value) for value in values]  # what names a mask
        pairs = plan_outputs(names, record.get("output"), self.options.suffix)
        return pairs, [self._spec(value) if network or not _item_url(value) else None for value in values]

    def _searched(self, record, aoi):
        """`search.*`'s scenes, or this process's share of them (search_shares.py)."""
        planned = self.planned_search(record, aoi)
        share = this_share(self.search)
        if share is not None:
            positions = share_positions([key for key, _, _ in planned], share)
            log.warning("search: %s: %d of the %d scenes", share, len(positions), len(planned))
            planned = [planned[position] for position in positions]
        return [pair for _, pair, _ in planned], [spec for _, _, spec in planned]

    def planned_search(self, record, aoi) -> List[Tuple[str, Tuple[str, str], SceneSpec]]:
        """Every scene of `search.*` (search_scenes.py) as (its first item's id, (input, output), its
        SceneSpec): the masks are named by each scene's first item."""
        check_one_source(record.get("input"))
        found = found_scenes(self.search, aoi, self.stac_bands, self.frames)
        for skipped in found.skipped:
            log.warning("search: skipped %s: %s", skipped.item_id, skipped.reason)
        names = [self_href(scene[0]) for scene in found.scenes]
        pairs = plan_outputs(names, record.get("output"), self.options.suffix)
        bands = self.stac_bands or ()  # found_scenes refuses a model that names none
        return [(item_id(scene[0]), pair, scene_spec_of(scene, bands, self.model_bands))
                for scene, pair in zip(found.scenes, pairs)]

    def _spec(self, value):
        if self.frames > 1:
            return multidate_spec(value, self.frames, self.stac_bands, self.model_bands, self.load_item)
        if isinstance(value, list) and len(value) == 1:
            value = value[0]  # `[[a.tif],[b.tif]]`: an inner list of one is that file, as for multi-date models
        return scene_spec(value, self.stac_bands, self.model_bands, self.load_item)


def _unfinished(pairs, specs):
    """A search's scenes whose outputs are not complete (region_items.incomplete): a rerun skips the rest."""
    kept = [(pair, spec) for pair, spec in zip(pairs, specs) if incomplete(pair[1]) is not None]
    if len(kept) < len(pairs):
        log.warning("search: skipped %d complete of %d scenes (their masks and STAC items are there; "
                    "overwrite=true makes them again)", len(pairs) - len(kept), len(pairs))
    return [pair for pair, _ in kept], [spec for _, spec in kept]


def _item_url(value: Any) -> bool:
    """An entry that names a STAC item by URL (reading it takes the network)."""
    if isinstance(value, list):
        return any(_item_url(v) for v in value)
    return is_remote(value) and is_stac_item(value)
