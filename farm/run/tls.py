"""Dask's TLS settings checked before anything starts: a cluster, a client or a submission that Dask
would make require encryption without the certificates for it fails in words, naming each missing
setting or file, instead of in the comm layer."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from farm.errors import FarmError


def tls_problems(
    roles: tuple[str, ...] = ("scheduler", "worker", "client"), *, required: bool = False
) -> list[str]:
    """What Dask's TLS settings lack when they require encryption, or when `required` (a ``tls://``
    address) (nothing otherwise): the CA file and each role's certificate, and every file they name must
    exist."""
    import dask

    if not required and not dask.config.get("distributed.comm.require-encryption", default=False):
        return []
    def setting(name: str) -> Any:  # through dask.config.get: "ca-file" and "ca_file" alike
        return dask.config.get(f"distributed.comm.tls.{name}", default=None)

    found = []
    needed = {"ca-file": setting("ca-file")}
    for role in roles:
        needed[f"{role}.cert"] = setting(f"{role}.cert")
        if setting(f"{role}.key"):
            needed[f"{role}.key"] = setting(f"{role}.key")
    for name, path in needed.items():
        if not path:
            found.append(f"distributed.comm.tls.{name} is not set")
        elif not Path(path).is_file():
            found.append(f"distributed.comm.tls.{name} names {path}, which is not a file")
    return found


def check_tls_to(address: str) -> None:
    """A FarmError, before connecting, when `address` is a ``tls://`` scheduler and this client has no
    usable TLS settings (Dask would otherwise fail after its connect timeout, in a long traceback)."""
    if not address.startswith("tls://"):
        return
    problems = tls_problems(("client",), required=True)
    if problems:
        raise FarmError(
            f"the scheduler at {address} speaks TLS, but this client cannot: " + "; ".join(problems)
            + ". Give this machine the farm's Dask TLS settings (docs/clusters.md, 'TLS on a multi-node "
            "farm')"
        )


def check_tls(roles: tuple[str, ...] = ("scheduler", "worker", "client")) -> None:
    """A FarmError before anything starts when Dask requires TLS without the certificates for it."""
    problems = tls_problems(roles)
    if problems:
        raise FarmError(
            "the Dask configuration requires TLS (distributed.comm.require-encryption) but "
            + "; ".join(problems) + "; set them (docs/clusters.md, 'TLS on a multi-node farm') or turn "
            "TLS off"
        )
