"""A dataclass instance from a plain mapping, checked the way the config schemas are: types converted as
OmegaConf converts them, unknown keys and wrong types refused with one line naming the key."""
from dataclasses import fields
from typing import Any, Mapping, Optional, Type

from omegaconf import OmegaConf
from omegaconf.errors import OmegaConfBaseException

from appliance.errors import ConfigError


def typed_dataclass(schema: Type, raw: Mapping[str, Any], where: str, what: str = "key",
                    owner: Optional[str] = None) -> Any:
    """`schema(**raw)` after OmegaConf's checks. ConfigError `<where>.<key>: unknown <what> (allowed: ...)`,
    `<where>.<key>: <the type error> (<owner>)`, or `<where>: <the dataclass's own ValueError>`."""
    try:
        return OmegaConf.to_object(OmegaConf.merge(OmegaConf.structured(schema), dict(raw)))
    except OmegaConfBaseException as e:
        key = getattr(e, "full_key", "") or getattr(e, "key", "") or ""
        message = str(e).splitlines()[0]
        if "not in" in message:
            allowed = ", ".join(f.name for f in fields(schema)) or "none"
            message = f"unknown {what} (allowed: {allowed})"
        elif owner:
            message = f"{message} ({owner})"
        raise ConfigError(f"{where}{'.' + str(key) if key else ''}: {message}") from None
    except ValueError as e:  # the dataclass's __post_init__
        raise ConfigError(f"{where}: {e}") from None
