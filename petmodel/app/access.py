"""Who a request comes from, and what it may do: the owner, an administrator, or a visitor.

The app is safe to start with no setup (Jupyter-style): a browser on the machine the server runs
on is the **owner** and gets the whole app without typing anything, because whoever can open a
loopback connection can already run code on that machine. Everyone else is a **visitor** (the
read-only pages) until they give ``$PETMODEL_ADMIN_PASSWORD`` (**admin**); with no password set
there is no way in for them at all.

A reverse proxy on the same host makes every visitor's connection come from loopback, so a
loopback request carrying any proxy header (:data:`PROXY_HEADERS`) counts as remote. A peer that
cannot be told (``None``, or text that is not an address) is remote too: the decision fails closed.

Loopback alone is not enough (issue 41): a web page the owner visits can rebind its own host name to
127.0.0.1 (DNS rebinding), and the owner's browser then talks to this app over loopback, same-origin
for the browser, so Streamlit's origin checks pass. As Jupyter does, the owner must also have opened
the app under a local name: the ``Host`` header (and ``Origin``, where the request carries one) must
be ``localhost``, a loopback address, or a name in ``$PETMODEL_ALLOWED_HOSTS``. On a shared machine
(another user, a JupyterHub node) loopback is not one person: ``PETMODEL_LOOPBACK_IS_OWNER=0`` makes
no request the owner, so control needs the admin password. Each refusal of a loopback request comes
with one sentence (:func:`owner_refusal`) that the visitor page shows.

Pure and Streamlit-free: ``pages/_ui.py`` reads the request (``st.context``) and asks here.
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from enum import StrEnum

from petmodel.errors import UsageError
from petmodel.settings import env_flag, env_names

# Headers a forwarding proxy or load balancer adds (any one of them, whatever its value, means "not the owner"):
# the de-facto standard ones, RFC 7239's, and those of common CDNs, ingress controllers and cloud balancers.
PROXY_HEADERS = frozenset({
    "x-forwarded-for", "forwarded", "x-real-ip", "x-forwarded-host", "x-forwarded-proto", "x-forwarded-port",
    "x-forwarded-server", "x-forwarded", "forwarded-for", "x-original-forwarded-for", "x-client-ip",
    "x-cluster-client-ip", "true-client-ip", "cf-connecting-ip", "fastly-client-ip", "akamai-client-ip",
    "x-envoy-external-address", "x-appengine-user-ip", "x-originating-ip", "x-remote-ip", "x-remote-addr",
    "x-proxyuser-ip", "via"})
# The headers uvicorn (Streamlit's server) reads the client's address from when the TCP peer is 127.0.0.1.
ADDRESS_HEADERS = ("x-forwarded-for",)
IPV6_CLIENT_PREFIX = 64  # one IPv6 client usually holds a whole /64: count its tries as one
ALLOWED_HOSTS_ENV = "PETMODEL_ALLOWED_HOSTS"  # comma-separated names, besides the local ones, the owner may use
LOOPBACK_OWNER_ENV = "PETMODEL_LOOPBACK_IS_OWNER"  # 0: loopback is no one in particular (a shared machine)
BEHIND_PROXY_ENV = "PETMODEL_BEHIND_PROXY"  # 1: a reverse proxy on this machine sets X-Forwarded-For for every client
THIS_MACHINE = "this machine"  # the client key of every loopback address (127.0.0.0/8, ::1): one machine, one client
LOCAL_NAMES = frozenset({"localhost"})  # besides loopback addresses (127.0.0.0/8, ::1)
# A Host header's value: a name or a [bracketed IPv6 address], then an optional port; nothing else (no user@).
_HOST_VALUE = re.compile(r"^(\[[0-9A-Za-z:.%]+\]|[0-9A-Za-z._-]+)(:\d{0,5})?$")


class Role(StrEnum):
    """What a session may do: ``OWNER`` and ``ADMIN`` everything, ``VISITOR`` read and generate."""

    OWNER = "owner"
    ADMIN = "admin"
    VISITOR = "visitor"

    @property
    def controls(self) -> bool:
        """May start or stop work, change the cluster (start, scale, connect a scheduler, log in to a Dask
        Gateway and create or shut down its clusters), upload data or name a server file."""
        return self is not Role.VISITOR


def _address(peer: str | None) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    """``peer`` as an address (an IPv4-mapped IPv6 address as its IPv4 one); None if it is none."""
    if not peer:
        return None
    try:
        address = ipaddress.ip_address(peer.strip().strip("[]").split("%", 1)[0])
    except ValueError:
        return None
    mapped = getattr(address, "ipv4_mapped", None)
    return mapped or address


def proxied(headers: Mapping[str, str] | Iterable[str]) -> bool:
    """True when the request passed a forwarding proxy (one of :data:`PROXY_HEADERS`, any case)."""
    return any(str(name).lower() in PROXY_HEADERS for name in headers)


@dataclass(frozen=True)
class OwnerPolicy:
    """Which loopback requests are the owner: extra host names, and whether loopback counts at all; and
    whether a proxy was declared, so that its ``X-Forwarded-For`` may tell clients apart.

    ``problem``: a bad setting's sentence; the policy then trusts no loopback request (fail closed),
    and the sentence tells the user what to fix.
    """

    allowed_hosts: frozenset[str] = frozenset()
    loopback_is_owner: bool = True
    behind_proxy: bool = False
    problem: str | None = None

    @classmethod
    def from_env(cls) -> OwnerPolicy:
        """The policy of ``$PETMODEL_ALLOWED_HOSTS``, ``$PETMODEL_LOOPBACK_IS_OWNER`` and ``$PETMODEL_BEHIND_PROXY``,
        read per request (cheap), so a test or a restart with other settings needs no cache to be cleared.

        An allowed name it cannot read (a wildcard, a URL path, ``user@host``) is a problem, not a name
        quietly dropped: the owner would otherwise wonder why the name they listed is refused.
        """
        items = env_names(ALLOWED_HOSTS_ENV)
        allowed = frozenset(filter(None, (host_name(item) for item in items)))
        try:
            behind_proxy = env_flag(BEHIND_PROXY_ENV, False)
        except UsageError as err:  # an unreadable switch: count proxy headers as one client, and say so
            return cls(allowed, loopback_is_owner=False, problem=str(err))
        bad = [item for item in items if host_name(item) is None]
        if bad:
            return cls(allowed, loopback_is_owner=False, behind_proxy=behind_proxy,
                       problem=f"{ALLOWED_HOSTS_ENV} holds {bad[0]!r}, which is not a host name (no wildcards, paths "
                               "or user names), so no browser is the owner: list plain names separated by commas "
                               "and restart the app.")
        try:
            trusted = env_flag(LOOPBACK_OWNER_ENV, True)
        except UsageError as err:
            return cls(allowed, loopback_is_owner=False, behind_proxy=behind_proxy, problem=str(err))
        return cls(allowed, loopback_is_owner=trusted, behind_proxy=behind_proxy)


def host_name(value: str | None) -> str | None:
    """The name in a ``Host`` header or a setting ("Evil.Example:8501" → "evil.example", "[::1]:80" → "::1").

    A URL's host counts too (an Origin, or a setting someone wrote as ``http://name:port``). None for
    anything else (no value, ``user@name``, a path): such a request is not the owner's.
    """
    text = (value or "").strip()
    if "://" in text:
        text = text.split("://", 1)[1].split("/", 1)[0]
    if _address(text) is not None and ":" in text and not text.startswith("["):
        return text.lower()  # a bare IPv6 address, as a setting may give it
    match = _HOST_VALUE.match(text)
    if not match:
        return None
    name = match.group(1).strip("[]").lower()
    return name[:-1] if name.endswith(".") and len(name) > 1 else name


def is_local_name(name: str | None, allowed: Iterable[str] = ()) -> bool:
    """True for ``localhost``, a loopback address, or an allowed name: the names a rebinding page cannot use.

    A rebinding page's own name (e.g. ``evil.example``) resolves to 127.0.0.1 only through its DNS;
    the page cannot make the browser send ``Host: localhost``, which the browser itself resolves.
    """
    if not name:
        return False
    if name in LOCAL_NAMES or name in allowed:
        return True
    address = _address(name)
    return address is not None and address.is_loopback


def _header(headers: Mapping[str, str] | Iterable[str], name: str) -> str | None:
    """The value of header ``name`` (any case), or None when absent or when only names were given."""
    if not isinstance(headers, Mapping):
        return None
    return next((str(value) for key, value in headers.items() if str(key).lower() == name), None)


def _allow_sentence(name: str, policy: OwnerPolicy) -> str:
    """How to allow ``name``: set the variable, or add to it when it already holds names."""
    if policy.allowed_hosts:
        return f"add {name} to {ALLOWED_HOSTS_ENV} (names separated by commas) and restart the app"
    return f"set {ALLOWED_HOSTS_ENV}={name} and restart the app"


def _direct_loopback(peer: str | None, headers: Mapping[str, str] | Iterable[str]) -> bool:
    """True for a loopback peer (127.0.0.0/8, ::1) that no proxy forwarded: a candidate for the owner."""
    address = _address(peer)
    return address is not None and address.is_loopback and not proxied(headers)


def owner_refusal(peer: str | None, headers: Mapping[str, str] | Iterable[str],
                  policy: OwnerPolicy = OwnerPolicy()) -> str | None:
    """Why a direct loopback request is not the owner, in one sentence; None when it is, or when the request
    is remote or proxied (the pages say their own sentence for those).

    The name in a sentence is the request's own, normalised by :func:`host_name` (letters, digits and
    ``.-_:%`` only); the page still shows it as plain text.
    """
    if not _direct_loopback(peer, headers):
        return None
    if policy.problem:
        return policy.problem
    if not policy.loopback_is_owner:
        return (f"{LOOPBACK_OWNER_ENV} is off (a shared machine), so a browser on this machine is not the owner "
                "either: control needs the admin password (PETMODEL_ADMIN_PASSWORD).")
    host = _header(headers, "host")
    name = host_name(host)
    if not is_local_name(name, policy.allowed_hosts):
        if name is None:
            return "This request named no host the app can read, so it cannot be the owner's."
        return (f"This app was opened as {name}, which is not a local name, so this browser gets the visitor's "
                f"pages: if you opened it so on purpose, {_allow_sentence(name, policy)}.")
    return _origin_refusal(_header(headers, "origin"), policy)


def _origin_refusal(origin: str | None, policy: OwnerPolicy) -> str | None:
    """Why a request's ``Origin`` (the page that opened the connection) keeps it from being the owner's.

    No Origin is fine (a browser sends one with the app's WebSocket; other clients need not). An
    opaque one (``null``: a sandboxed frame, a file) names no page this app can trust: fail closed.
    """
    if origin is None:
        return None
    name = host_name(origin) if "://" in origin else None
    if name is None:
        return ("This request came from a page with no address of its own (Origin: null), so it gets the "
                "visitor's pages.")
    if is_local_name(name, policy.allowed_hosts):
        return None
    return (f"This request came from a page at {name}, which is not a local name, so it gets the visitor's pages: "
            f"if that page is yours, {_allow_sentence(name, policy)}.")


def is_owner(peer: str | None, headers: Mapping[str, str] | Iterable[str],
             policy: OwnerPolicy = OwnerPolicy()) -> bool:
    """True for a direct loopback connection that no proxy forwarded, opened under a local name (``Host``,
    and ``Origin`` where sent), while ``policy`` trusts loopback at all."""
    return _direct_loopback(peer, headers) and owner_refusal(peer, headers, policy) is None


def request_role(peer: str | None, headers: Mapping[str, str] | Iterable[str], *, password_set: bool,
                 unlocked: bool, policy: OwnerPolicy = OwnerPolicy()) -> Role:
    """The role of a request from ``peer`` (its TCP peer address) with ``headers``, under ``policy``
    (the defaults: no extra host names, loopback trusted; the app passes :meth:`OwnerPolicy.from_env`).

    ``unlocked``: this session gave the admin password; it counts only while one is set, so a
    session unlocked before the password was removed does not stay an admin.
    """
    if is_owner(peer, headers, policy):
        return Role.OWNER
    return Role.ADMIN if password_set and unlocked else Role.VISITOR


def client_key(peer: str | None, headers: Mapping[str, str] | Iterable[str] = (),
               policy: OwnerPolicy = OwnerPolicy()) -> str:
    """The key wrong passwords are counted under: one per machine, as far as the request lets us tell.

    A reload starts a new session but keeps the address, so counting by address (not session) stops
    a guesser from resetting the count, and one guesser never slows another client. Every loopback
    address (127.0.0.0/8, ::1) is :data:`THIS_MACHINE`: a local guesser cannot get a fresh count per
    127.x.y.z. An IPv6 address counts by its /64, which one client usually holds whole.

    ``X-Forwarded-For`` picks the key only behind a declared proxy (``policy.behind_proxy``). Streamlit's
    server (uvicorn) takes the client's address from that header whenever the TCP peer is 127.0.0.1, so
    without a declared proxy a peer that the header names may be a local guesser naming a new address
    each time: it counts as this machine. A remote client naming its own address in the header lands
    there too, and can then slow only this machine's users, whom the owner rule already lets in.
    """
    address = _address(peer)
    if address is None:
        return "unknown"
    if address.is_loopback:
        return THIS_MACHINE
    if proxied(headers) and not policy.behind_proxy and _named_by_headers(address, headers):
        return THIS_MACHINE
    if address.version == 6:
        return str(ipaddress.ip_network(f"{address}/{IPV6_CLIENT_PREFIX}", strict=False))
    return str(address)


def _named_by_headers(address: ipaddress.IPv4Address | ipaddress.IPv6Address,
                      headers: Mapping[str, str] | Iterable[str]) -> bool:
    """True when ``address`` is one that the request's own address headers name (so it may be forged);
    True also when only header names were given (nothing to compare: assume the worst)."""
    if not isinstance(headers, Mapping):
        return True
    named = (_address(part) for name in ADDRESS_HEADERS for part in (_header(headers, name) or "").split(","))
    return any(item == address for item in named)


def may_act_on_server(peer: str | None, headers: Mapping[str, str] | Iterable[str],
                      policy: OwnerPolicy = OwnerPolicy()) -> bool:
    """Whether a session may send Streamlit the messages that act on the whole server (clear every cache,
    read the app's git state, install files): the owner only. Everyone else's are dropped
    (:func:`petmodel.compat.guard_server_wide_messages`)."""
    return is_owner(peer, headers, policy)
