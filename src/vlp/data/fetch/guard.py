"""What a URL list may make vlp connect to, and what of a URL may be written down.

A URL list is untrusted input: a row may name the cloud's metadata service (169.254.169.254), a service on the
cluster's private network, or this machine's loopback, directly or behind a public name or a redirect. The rule,
checked on every hop (the first URL and each redirect):

- the scheme is ``http`` or ``https``, and the URL has a host;
- every address the host resolves to is a public one: loopback, link-local (the metadata address among them),
  private, shared (100.64.0.0/10), multicast, reserved and unspecified addresses are refused, IPv4 inside IPv6
  (``::ffff:127.0.0.1``) by its IPv4 address, unless ``fetch.allow`` lists a range that holds it.

The check of a name's addresses runs inside the HTTP client's resolver (:class:`GuardedResolver`), so the
addresses checked are the addresses connected to: a name that resolves to a public address when checked and to
127.0.0.1 a moment later (DNS rebinding) cannot slip through. A literal address is checked before the request.

:func:`redact` is what reaches records and logs: the URL without its user and password, and the values of query
parameters that carry credentials (signed URLs) replaced by ``REDACTED``.
"""

from __future__ import annotations

import asyncio
import ipaddress
import socket
import urllib.parse
from collections.abc import Sequence
from typing import Any

IP = ipaddress.IPv4Address | ipaddress.IPv6Address
_SHARED = ipaddress.ip_network("100.64.0.0/10")
# Query parameters whose value is a credential: signed URLs of S3, GCS, Azure and common CDNs, tokens.
SECRET_PARAMS = frozenset({
    "x-amz-signature", "x-amz-credential", "x-amz-security-token", "x-goog-signature", "x-goog-credential",
    "signature", "sig", "token", "access_token", "auth", "key", "api_key", "apikey", "password", "secret", "policy",
    "key-pair-id", "se", "sp", "sv",
})  # fmt: skip


class RefusedAddress(OSError):
    """A host resolved to (or is) an address the rule refuses."""


def _refusal(ip: IP) -> str:
    """Why ``ip`` is refused, or ``""``."""
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    for kind in ("loopback", "link_local", "unspecified", "multicast", "reserved", "private"):
        if getattr(ip, f"is_{kind}"):
            return kind.replace("_", "-")
    if isinstance(ip, ipaddress.IPv4Address) and ip in _SHARED:
        return "shared (100.64.0.0/10)"
    return "" if ip.is_global else "not global"


class Policy:
    """The refusal rule with ``allow``'s ranges opened."""

    def __init__(self, allow: Sequence[str] = ()) -> None:
        try:
            self.allow = [ipaddress.ip_network(net, strict=False) for net in allow]
        except ValueError as exc:
            raise ValueError(f"fetch.allow: {exc}") from None

    def refusal(self, address: str) -> str:
        """``""`` when ``address`` may be connected to, else ``"<address> is <kind>"``."""
        ip = ipaddress.ip_address(address.split("%", 1)[0])
        if any(ip.version == net.version and ip in net for net in self.allow):
            return ""
        kind = _refusal(ip)
        return f"{address} is {kind}" if kind else ""

    def check_url(self, url: str) -> tuple[str, str]:
        """``(status, detail)`` of a URL refused before any connection (``("", "")`` if it may be requested):
        ``bad url`` (scheme, no host, a bad port) or ``refused address`` (a literal address the rule refuses)."""
        try:
            parts = urllib.parse.urlsplit(url)
            host, _port = parts.hostname, parts.port  # a port out of range raises here
        except ValueError as exc:
            return "bad url", str(exc)
        if parts.scheme not in ("http", "https"):
            return "bad url", f"scheme {parts.scheme or '(none)'!r} (http or https only)"
        if not host:
            return "bad url", "no host"
        try:
            literal = ipaddress.ip_address(host.split("%", 1)[0])
        except ValueError:
            return "", ""  # a name: checked by the resolver, on the addresses it connects to
        why = self.refusal(str(literal))
        return ("refused address", why) if why else ("", "")


class GuardedResolver:
    """aiohttp's resolver interface (``resolve``, ``close``) over the system's ``getaddrinfo``, refusing a name
    any of whose addresses :class:`Policy` refuses (one refused address refuses the name: which one a connection
    would use is not ours to choose)."""

    def __init__(self, policy: Policy) -> None:
        self.policy = policy

    async def resolve(self, host: str, port: int = 0, family: int = socket.AF_INET) -> list[dict[str, Any]]:
        loop = asyncio.get_running_loop()
        try:
            infos = await loop.getaddrinfo(host, port, type=socket.SOCK_STREAM, family=family)
        except socket.gaierror as exc:
            raise OSError(f"cannot resolve {host}: {exc.strerror}") from None
        found = []
        for fam, _type, proto, _name, sockaddr in infos:
            address = str(sockaddr[0])
            why = self.policy.refusal(address)
            if why:
                raise RefusedAddress(f"{host} resolves to {why}")
            found.append({"hostname": host, "host": address, "port": int(sockaddr[1]), "family": fam,
                          "proto": proto, "flags": socket.AI_NUMERICHOST | socket.AI_NUMERICSERV})  # fmt: skip
        if not found:
            raise OSError(f"cannot resolve {host}: no address")
        return found

    async def close(self) -> None:
        pass


def redact(url: str) -> str:
    """``url`` as records and logs show it: no user or password, credential query values ``REDACTED``."""
    try:
        parts = urllib.parse.urlsplit(url)
    except ValueError:
        return "(unparseable URL)"
    netloc = parts.netloc.rsplit("@", 1)[-1]
    query = parts.query
    if query:
        pairs = urllib.parse.parse_qsl(query, keep_blank_values=True)
        query = urllib.parse.urlencode(
            [(k, "REDACTED" if k.lower() in SECRET_PARAMS else v) for k, v in pairs], safe="/:"
        )
    return urllib.parse.urlunsplit((parts.scheme, netloc, parts.path, query, ""))
