"""MLflow's built-in authentication (``mlflow server --app-name basic-auth``), from vlp's side.

- :func:`ensure_user`: the admin makes sure a user exists with a given password (created, or its password set):
  the chart's post-install hook runs it for the step pods' user (``python -m vlp.tracking_auth ensure-user``,
  every credential from the environment, never from arguments).
- :func:`write_config`: the server's ``basic_auth.ini`` (default permission, auth database) from the environment,
  so a database URI with a password comes from a Secret and never sits in a ConfigMap (the chart's init
  container: ``python -m vlp.tracking_auth write-config PATH``).
- :func:`redact`: a tracking URI fit to print (``http://user:secret@host`` -> ``http://user:***@host``).

Clients authenticate with ``MLFLOW_TRACKING_USERNAME`` / ``MLFLOW_TRACKING_PASSWORD`` (MLflow reads them), which
the compiled pipelines set on every step pod from a Secret (``pipelines/config``: ``tracking_secret``).
"""

from __future__ import annotations

import base64
import json
import os
import sys
import time
import urllib.error
import urllib.request
from typing import Any
from urllib.parse import urlsplit, urlunsplit

ENV = {  # what ensure-user reads
    "uri": "MLFLOW_TRACKING_URI",
    "admin_username": "MLFLOW_AUTH_ADMIN_USERNAME",
    "admin_password": "MLFLOW_AUTH_ADMIN_PASSWORD",
    "username": "VLP_TRACKING_USERNAME",
    "password": "VLP_TRACKING_PASSWORD",
}


CONFIG_ENV = {"permission": "MLFLOW_AUTH_DEFAULT_PERMISSION", "database": "MLFLOW_AUTH_DATABASE_URI"}
PERMISSIONS = ("READ", "USE", "EDIT", "MANAGE", "NO_PERMISSIONS")


class AuthError(RuntimeError):
    """The tracking server refused or failed an account call."""


def redact(uri: str) -> str:
    """``uri`` with any password in its user-info replaced by ``***`` (other URIs unchanged)."""
    parts = urlsplit(uri)
    if not parts.password:
        return uri
    host = parts.hostname or ""
    netloc = f"{parts.username}:***@{host}" + (f":{parts.port}" if parts.port else "")
    return urlunsplit(parts._replace(netloc=netloc))


def _call(uri: str, method: str, path: str, auth: tuple[str, str], body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
    token = base64.b64encode(f"{auth[0]}:{auth[1]}".encode()).decode()
    request = urllib.request.Request(
        uri.rstrip("/") + path,
        data=json.dumps(body).encode(),
        method=method,
        headers={"Authorization": f"Basic {token}", "Content-Type": "application/json"},
    )
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return response.status, json.loads(response.read() or b"{}")
    except urllib.error.HTTPError as exc:
        text = exc.read().decode(errors="replace")
        try:
            return exc.code, json.loads(text)
        except json.JSONDecodeError:
            return exc.code, {"message": text[:300]}


def ensure_user(uri: str, admin: tuple[str, str], username: str, password: str) -> str:
    """Make ``username`` exist with ``password`` on the server at ``uri``, as ``admin``; returns ``"created"`` or
    ``"updated"``. Raises :class:`AuthError` with the server's answer otherwise (e.g. 401: wrong admin)."""
    if not (username and password):
        raise AuthError("ensure_user needs a username and a password")
    status, answer = _call(uri, "POST", "/api/2.0/mlflow/users/create", admin, {"username": username,
                                                                                 "password": password})  # fmt: skip
    if status == 200:
        return "created"
    if status == 400 and answer.get("error_code") == "RESOURCE_ALREADY_EXISTS":
        status, answer = _call(uri, "PATCH", "/api/2.0/mlflow/users/update-password", admin,
                               {"username": username, "password": password})  # fmt: skip
        if status == 200:
            return "updated"
    raise AuthError(f"MLflow at {redact(uri)} answered {status} for user {username!r}: {answer.get('message', answer)}")


def write_config(path: str, permission: str, database_uri: str) -> None:
    """Write MLflow's ``basic_auth.ini`` to ``path`` (configparser syntax: ``%`` in a password is doubled)."""
    import configparser

    if permission not in PERMISSIONS:
        raise AuthError(f"default permission {permission!r} is not one of {', '.join(PERMISSIONS)}")
    if not database_uri:
        raise AuthError("the auth database URI is empty")
    config = configparser.ConfigParser()
    config["mlflow"] = {"default_permission": permission, "database_uri": database_uri.replace("%", "%%")}
    with open(path, "w", encoding="utf-8") as fh:
        config.write(fh)


def wait_healthy(uri: str, timeout_s: float = 300.0) -> None:
    """Wait until ``<uri>/health`` answers 200 (it needs no login)."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            with urllib.request.urlopen(uri.rstrip("/") + "/health", timeout=10) as response:
                if response.status == 200:
                    return
        except (urllib.error.URLError, OSError):
            pass
        if time.monotonic() > deadline:
            raise AuthError(f"MLflow at {redact(uri)} was not healthy within {timeout_s:g} s")
        time.sleep(2)


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) == 2 and args[0] == "write-config":
        try:
            write_config(args[1], os.environ.get(CONFIG_ENV["permission"], "READ"),
                         os.environ.get(CONFIG_ENV["database"], ""))  # fmt: skip
        except AuthError as exc:
            print(f"vlp.tracking_auth: error: {exc} ({', '.join(CONFIG_ENV.values())})", file=sys.stderr)
            return 2
        print(f"wrote {args[1]}")
        return 0
    if args != ["ensure-user"]:
        print("usage: python -m vlp.tracking_auth ensure-user | write-config PATH   (settings from the "
              "environment: " + ", ".join([*ENV.values(), *CONFIG_ENV.values()]) + ")", file=sys.stderr)  # fmt: skip
        return 2
    missing = [name for name in ENV.values() if not os.environ.get(name)]
    if missing:
        print(f"vlp.tracking_auth: error: {', '.join(missing)} not set", file=sys.stderr)
        return 2
    get = {key: os.environ[name] for key, name in ENV.items()}
    wait_healthy(get["uri"])
    try:
        done = ensure_user(get["uri"], (get["admin_username"], get["admin_password"]), get["username"], get["password"])
    except AuthError as exc:
        print(f"vlp.tracking_auth: error: {exc}", file=sys.stderr)
        return 1
    print(f"MLflow user {get['username']!r} {done} at {redact(get['uri'])}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
