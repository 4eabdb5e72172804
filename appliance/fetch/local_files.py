"""Server files a client names (an image, a GeoTIFF, a pipeline input): the one rule for every route.

A name is taken inside the allowed directory (`server.allowed_local_media_dir`; a relative name is
relative to it, never to the server's working directory), and refused when no directory is allowed,
when it holds a NUL character, or when it resolves (symlinks and `..` followed) to a place outside.
"""
import os
from typing import Optional

from appliance.errors import InputError


def allowed_path(path, allowed_dir: Optional[str], field: str) -> str:
    """The resolved path of `path` inside `allowed_dir`; InputError naming `field` otherwise."""
    if not allowed_dir:
        raise InputError(f"{field}: local paths are disabled on this server; send the data in the request or "
                         "by URL, or start the server with server.allowed_local_media_dir=DIR to allow files "
                         "under DIR", param=field)
    if not isinstance(path, str) or not path:
        raise InputError(f"{field}: expected a file name, got {path!r}", param=field)
    if "\0" in path:
        raise InputError(f"{field}: path contains a NUL character; give a plain file name", param=field)
    root = os.path.realpath(allowed_dir)
    candidate = os.path.realpath(os.path.join(root, path))  # a relative path is relative to the root
    if os.path.commonpath([root, candidate]) != root:
        raise InputError(f"{field}: {path!r} is outside the allowed directory", param=field)
    return candidate
