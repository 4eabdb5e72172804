"""A search's scenes split over `search.shares` processes, with no coordinator: each process runs the same
search, plans the same scenes, and keeps its share of them.

`this_share`: which share this process maps: `search.share`, else `$JOB_COMPLETION_INDEX` (the index a
Kubernetes Indexed Job gives each of its pods); None when `search.shares` is 1. `share_positions`: the
scenes sorted by their key (the first item's id: unique, and the same on every process whatever order the
API answers in), then dealt round-robin: share i takes the i-th, (i + n)-th, ... of them, so n shares of
m scenes hold m // n or m // n + 1 each, and every scene is in exactly one.
"""
import os
from dataclasses import dataclass
from typing import Any, List, Optional, Sequence

from appliance.errors import InputError

SHARE_ENV = "JOB_COMPLETION_INDEX"


@dataclass(frozen=True)
class Share:
    index: int  # 0 to count - 1
    count: int

    def __str__(self) -> str:
        return f"share {self.index} of {self.count} (0 to {self.count - 1})"


def this_share(search: Any) -> Optional[Share]:
    """This process's share of the search, or None when one process maps it all; InputError when
    `search.shares` splits it and neither `search.share` nor $JOB_COMPLETION_INDEX says which share."""
    count = int(search.get("shares") or 1)
    if count == 1:
        return None
    index = search.get("share")
    if index is None:
        given = os.environ.get(SHARE_ENV)
        if given is None:
            raise InputError(f"search.share: search.shares={count} splits the search over {count} processes: give "
                             f"this one's share as search.share=N (0 to {count - 1}), or run it in an Indexed Job, "
                             f"which sets {SHARE_ENV}", param="search.share")
        try:
            index = int(given)
        except ValueError:
            raise InputError(f"{SHARE_ENV}: {given!r} is not a share number (0 to {count - 1})",
                             param="search.share") from None
        if not 0 <= index < count:
            raise InputError(f"{SHARE_ENV}: {index}; allowed: 0 to {count - 1} (search.shares is {count}: the "
                             "Job's completions and search.shares must be the same)", param="search.share")
    return Share(int(index), count)


def share_positions(keys: Sequence[str], share: Share) -> List[int]:
    """The positions of `keys` in `share` (in their given order), by the rule in the module docstring."""
    ranked = sorted(range(len(keys)), key=lambda position: keys[position])
    return sorted(ranked[share.index::share.count])
