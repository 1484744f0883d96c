"""What a URL list may make vlp connect to, and what of a URL may be written down.

A URL list is untrusted input: a row may name the cloud's metadata service (169.254.169.254), a service on the
cluster's private network, or this machine's loopback, directly or behind a public name or a redirect. The rule,
checked on every hop (the first URL and each redirect):

- the scheme is ``http`` or ``https``, and the URL has a host;
- every address the host resolves to is a public one: loopback, link-local (the metadata address among them),
  private, shared (100.64.0.0/10), multicast, reserved and unspecified addresses are refused, IPv4 inside IPv6
  (``::ffff:127.0.0.1``) by its IPv4 address, unless ``fetch.allow`` lists a range that holds it.

A host is read once, as the HTTP client reads it (:func:`client_host`): the URL library (yarl) maps a name to its
ASCII form by IDNA/UTS 46, which folds fullwidth and other Unicode digits and dots (``１２７．０．０．１``,
``127。0。0。1``, ``①②⑦.0.0.1``) into an IP literal; the rule decides "literal or name" on that form, never on the
text of the list. A literal is checked before the request. A name's addresses are checked inside the HTTP
client's resolver (:class:`GuardedResolver`), so the addresses checked are the addresses connected to: a name that
resolves to a public address when checked and to 127.0.0.1 a moment later (DNS rebinding) cannot slip through.
Behind both, every socket the client opens checks the address it connects to (:class:`GuardedSocket`, the
connector's socket factory), literal or resolved: a host that some other parse difference turns into a refused
address is refused at the ``connect`` call, before a byte is sent. ``localhost`` and names under ``.localhost``
are refused as loopback without a lookup (RFC 6761), and a URL holding a control character (a NUL among them) is a
bad URL, never requested.

:func:`redact` is what reaches records and logs: the URL without its user and password, and the values of query
parameters that carry credentials (signed URLs) replaced by ``REDACTED``; a URL inside a query value is redacted
the same way.
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

    def allows(self, ip: IP) -> bool:
        """Whether ``fetch.allow`` opens ``ip``."""
        return any(ip.version == net.version and ip in net for net in self.allow)

    def refusal(self, address: str) -> str:
        """``""`` when ``address`` may be connected to, else ``"<address> is <kind>"``."""
        ip = ipaddress.ip_address(address.split("%", 1)[0])
        if self.allows(ip):
            return ""
        kind = _refusal(ip)
        return f"{address} is {kind}" if kind else ""

    def check_url(self, url: str) -> tuple[str, str]:
        """``(status, detail)`` of a URL refused before any connection (``("", "")`` if it may be requested):
        ``bad url`` (scheme, no host, a bad port, a control character) or ``refused address`` (a host that is, as
        the client reads it, a literal address the rule refuses, or ``localhost``)."""
        bad = next((c for c in url if ord(c) < 0x20 or 0x7F <= ord(c) < 0xA0), None)
        if bad is not None:
            return "bad url", f"it holds the control character U+{ord(bad):04X}"
        try:
            parts = urllib.parse.urlsplit(url)
            _port = parts.port  # a port out of range raises here
        except ValueError as exc:
            return "bad url", str(exc)
        if parts.scheme not in ("http", "https"):
            return "bad url", f"scheme {parts.scheme or '(none)'!r} (http or https only)"
        try:
            host = client_host(url)
        except ValueError as exc:
            return "bad url", f"the host cannot be read: {exc}"
        if not host:
            return "bad url", "no host"
        name = host.rstrip(".").lower()
        if name == "localhost" or name.endswith(".localhost"):
            if not self.allows(ipaddress.ip_address("127.0.0.1")):
                return "refused address", f"{host} is loopback (a localhost name)"
            return "", ""
        try:
            literal = ipaddress.ip_address(host.split("%", 1)[0])
        except ValueError:
            return "", ""  # a name: checked by the resolver and at the connection, on the addresses connected to
        why = self.refusal(str(literal))
        return ("refused address", why) if why else ("", "")


def client_host(url: str) -> str:
    """The host of ``url`` exactly as the HTTP client connects to it: yarl's reading, the ASCII (IDNA/UTS 46) form
    of a name, an IPv6 literal without its brackets; ``""`` for none.

    Raises:
        ValueError: yarl cannot read the URL or encode its host.
    """
    import yarl  # aiohttp's URL library: what the client itself parses the URL with

    try:
        return yarl.URL(url).raw_host or ""
    except (ValueError, UnicodeError, TypeError) as exc:
        raise ValueError(f"{type(exc).__name__}: {exc}") from None


class GuardedSocket(socket.socket):
    """A socket that refuses to ``connect`` to an address :class:`Policy` refuses (the last guard: whatever a URL's
    spelling, this is the address the connection would reach)."""

    policy: Policy

    def connect(self, address: Any) -> None:
        self._check(address)
        super().connect(address)

    def connect_ex(self, address: Any) -> int:
        self._check(address)
        return super().connect_ex(address)

    def _check(self, address: Any) -> None:
        if self.family in (socket.AF_INET, socket.AF_INET6):
            why = self.policy.refusal(str(address[0]))
            if why:
                raise RefusedAddress(f"connection to {why}")


def socket_factory(policy: Policy) -> Any:
    """aiohttp's ``socket_factory``: a :class:`GuardedSocket` for each address the connector tries."""

    def make(addr_info: Any) -> socket.socket:
        family, kind, proto = addr_info[0], addr_info[1], addr_info[2]
        sock = GuardedSocket(family=family, type=kind, proto=proto)
        sock.policy = policy
        return sock

    return make


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


def redact(url: str, depth: int = 0) -> str:
    """``url`` as records and logs show it: no user or password, credential query values ``REDACTED``."""
    try:
        parts = urllib.parse.urlsplit(url)
    except ValueError:
        return "(unparseable URL)"
    netloc = parts.netloc.rsplit("@", 1)[-1]
    query = parts.query
    if query:
        pairs = urllib.parse.parse_qsl(query, keep_blank_values=True)
        query = urllib.parse.urlencode([(k, _redact_value(k, v, depth)) for k, v in pairs], safe="/:")
    return urllib.parse.urlunsplit((parts.scheme, netloc, parts.path, query, ""))


def _redact_value(key: str, value: str, depth: int) -> str:
    """A query value as records show it: ``REDACTED`` for a credential, a URL redacted in turn, else itself."""
    if key.lower() in SECRET_PARAMS:
        return "REDACTED"
    if "://" in value:
        return redact(value, depth + 1) if depth < 4 else "REDACTED"
    return value
