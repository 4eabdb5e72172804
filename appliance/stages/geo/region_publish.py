"""`publish.url=URL`: a region's collection and items sent to a STAC API with the Transactions extension,
so the results appear where a search found the inputs.

The collection is created (POST /collections) or, when the API has it already (409), replaced (PUT); each
item likewise under it. A rerun publishes the same ids again and so updates them: publishing is
idempotent, as the run's outputs are. The API gets no files, only their addresses: asset hrefs are made
absolute from `publish.asset_base` (where the output directory is served: https://, s3://) or, unset,
from the directory's own absolute path (for a catalog on the same machine). Relative links (the item's
collection and parent, written for the directory) are left out: the API writes its own.
"""
import os
from typing import Any, Dict, List, Sequence
from urllib.parse import quote

from appliance.errors import InputError
from appliance.stages.geo.region_items import RegionItem
from appliance.stages.geo.scene_sources import shown
from appliance.stages.geo.stac_search import api_retries, reason

CONFLICT = 409  # the Transactions extension's answer to a POST of an id the API holds


def published_item(item: dict, collection_id: str, asset_base: str) -> dict:
    """`item` as the API should hold it: in the collection, its assets' hrefs absolute, no relative links."""
    assets = {key: dict(asset, href=_absolute(asset["href"], asset_base)) for key, asset in item["assets"].items()}
    links = [link for link in item.get("links", []) if _is_absolute(link.get("href", ""))]
    return dict(item, collection=collection_id, assets=assets, links=links)


def published_collection(collection: dict) -> dict:
    """The collection without its relative item links (the API lists its items itself)."""
    return dict(collection, links=[link for link in collection.get("links", []) if _is_absolute(link.get("href", ""))])


def publish_region(publish: Any, directory: str, collection: dict, items: Sequence[RegionItem]) -> str:
    """Send `collection` and `items` to `publish.url`; returns the line the run prints. InputError naming
    publish.url when the API refuses (its answer's first line) or cannot be reached; the files stay."""
    from pystac_client.exceptions import APIError
    from pystac_client.stac_api_io import StacApiIO
    from requests import RequestException

    url = str(publish.get("url")).rstrip("/")
    base = str(publish.get("asset_base") or os.path.abspath(directory))
    stac_io = StacApiIO(timeout=float(publish.get("api_timeout_s")), max_retries=api_retries())
    collection_id = collection["id"]
    try:
        made = [_put(stac_io, f"{url}/collections", collection_id, published_collection(collection))]
        items_url = f"{url}/collections/{quote(collection_id, safe='')}/items"
        made += [_put(stac_io, items_url, r.id, published_item(r.item, collection_id, base)) for r in items]
    except (APIError, RequestException, OSError) as e:
        raise InputError(f"publish.url: the STAC API at {shown(url)} did not take the region ({reason(e)}); "
                         f"the outputs in {directory} are complete", param="publish.url") from None
    return f"published collection {collection_id} and {len(items)} items to {shown(url)} " \
           f"({_counted(made)})"


def _put(stac_io, collection_url: str, object_id: str, body: Dict[str, Any]) -> str:
    """Create `body` at `collection_url`, or replace it where the API has its id already."""
    from pystac_client.exceptions import APIError

    try:
        stac_io.request(collection_url, method="POST", parameters=body)
        return "created"
    except APIError as e:
        if getattr(e, "status_code", None) != CONFLICT:
            raise
    stac_io.request(f"{collection_url}/{quote(object_id, safe='')}", method="PUT", parameters=body)
    return "updated"


def _counted(outcomes: List[str]) -> str:
    return ", ".join(f"{outcomes.count(kind)} {kind}" for kind in ("created", "updated") if kind in outcomes)


def _is_absolute(href: str) -> bool:
    return "://" in href or href.startswith("/")


def _absolute(href: str, base: str) -> str:
    if _is_absolute(href):
        return href
    return f"{base.rstrip('/')}/{href}" if "://" in base else os.path.join(base, href)
