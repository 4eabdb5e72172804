"""FetchPolicy: normalised allowed hosts, checked values, and the server config it is built from."""
import pytest
from omegaconf import OmegaConf

from appliance.config.schema import ServerConfig
from appliance.errors import ConfigError
from appliance.fetch import FetchPolicy


def test_allowed_domains_are_matched_exactly_ignoring_case_dots_and_brackets():
    policy = FetchPolicy(allowed_domains=["Bucket.Internal.", "[::1]", "127.0.0.1"], max_bytes=10, total_timeout_s=30)
    assert policy.allowed_domains == ("bucket.internal", "::1", "127.0.0.1")
    assert all(policy.allows(h) for h in ("bucket.internal", "BUCKET.internal.", "::1", "127.0.0.1"))
    assert not any(policy.allows(h) for h in ("a.bucket.internal", "internal", "127.0.0.2", "localhost"))


@pytest.mark.parametrize("kwargs,fragment", [
    ({"allowed_domains": "bucket.internal"}, "expected a list of host names, got the string 'bucket.internal'"),
    ({"allowed_domains": ["https://bucket.internal/"]}, "is not a bare host"),
    ({"allowed_domains": ["bucket.internal:9000"]}, "is not a bare host"),
    ({"allowed_domains": ["*.internal"]}, "no scheme, port, path or wildcard"),
    ({"allowed_domains": [""]}, "is not a host name"),
    ({"allowed_domains": [5]}, "is not a host name"),
    ({"total_timeout_s": 0}, "total_timeout_s (server.limits.fetch_timeout_s): must be a number of seconds > 0, got 0"),
    ({"read_timeout_s": -1}, "read_timeout_s: must be a number of seconds > 0"),
    ({"connect_timeout_s": "5"}, "connect_timeout_s: must be a number"),
    ({"max_bytes": 0}, "max_bytes (server.limits.max_media_bytes): must be an integer >= 1"),
    ({"max_redirects": -1}, "max_redirects: must be an integer >= 0"),
])
def test_bad_values_are_config_errors(kwargs, fragment):
    with pytest.raises(ConfigError) as e:
        FetchPolicy(**{"max_bytes": 100, "total_timeout_s": 30, **kwargs})
    assert fragment in str(e.value)


def test_the_limits_are_required_and_fields_are_keywords():
    with pytest.raises(TypeError, match="max_bytes"):
        FetchPolicy(total_timeout_s=30)
    with pytest.raises(TypeError, match="total_timeout_s"):
        FetchPolicy(max_bytes=100)
    with pytest.raises(TypeError):
        FetchPolicy(("a",), 5)


LIMITS = ServerConfig().limits


@pytest.mark.parametrize("server,expected", [
    (OmegaConf.structured(ServerConfig),
     FetchPolicy(max_bytes=LIMITS.max_media_bytes, total_timeout_s=LIMITS.fetch_timeout_s)),
    (OmegaConf.create({"allowed_media_domains": ["Bucket.Internal"],
                       "limits": {"max_media_bytes": 1000, "fetch_timeout_s": 7.5}}),
     FetchPolicy(allowed_domains=("bucket.internal",), max_bytes=1000, total_timeout_s=7.5)),
    (ServerConfig(), FetchPolicy(max_bytes=LIMITS.max_media_bytes, total_timeout_s=LIMITS.fetch_timeout_s)),
])
def test_from_server_config(server, expected):
    assert FetchPolicy.from_server_config(server) == expected


@pytest.mark.parametrize("limits,fragment", [
    ({"max_media_bytes": 9}, r"total_timeout_s \(server\.limits\.fetch_timeout_s\): .* got None"),
    ({"fetch_timeout_s": 5}, r"max_bytes \(server\.limits\.max_media_bytes\): .* got None"),
])
def test_a_limit_the_config_lacks_is_named_not_guessed(limits, fragment):
    """The limits have one home, the schema: a node without them is an error, not a second default."""
    with pytest.raises(ConfigError, match=fragment):
        FetchPolicy.from_server_config({"limits": limits})


def test_from_server_config_names_the_config_key():
    with pytest.raises(ConfigError, match=r"server\.allowed_media_domains"):
        FetchPolicy.from_server_config({"allowed_media_domains": "bucket.internal", "limits": {}})
