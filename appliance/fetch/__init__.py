"""Fetch a user's http(s) URL (an image, a GeoTIFF) from a server that faces the public.

The rule (docs/fetch.md): http and https only; the host is resolved once and refused if any address
is loopback, private, link-local, multicast, reserved, unspecified or a cloud metadata address
(IPv4-mapped IPv6 forms included), unless the host is listed in `FetchPolicy.allowed_domains`
(`server.allowed_media_domains`); the connection goes to the vetted address; redirects are followed
by hand and re-checked; connect, read, total-time and byte limits apply. Every failure is an
InputError naming the field and the host.
"""
from appliance.fetch.addresses import refusal
from appliance.fetch.client import Fetcher, fetch_bytes, fetch_to_file
from appliance.fetch.policy import FetchPolicy

__all__ = ["FetchPolicy", "Fetcher", "fetch_bytes", "fetch_to_file", "refusal"]
