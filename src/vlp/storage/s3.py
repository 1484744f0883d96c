"""``s3://bucket/key`` URIs on any S3-compatible object store (AWS S3, Ceph RGW, MinIO, SeaweedFS), through boto3.

Connection settings come from :class:`~vlp.storage.StorageConfig` or, when unset there, from the standard AWS
environment variables (``AWS_ENDPOINT_URL``, ``AWS_ACCESS_KEY_ID``, ...). An object (single PUT or multipart)
becomes visible only when it is complete, so a write is atomic; there are no appends and no directories.
"""

from __future__ import annotations

import io
import os
import threading
from typing import Any

from vlp.storage.base import Backend, StorageConfig, StorageError, current_config

_clients: dict[tuple[Any, ...], Any] = {}
_lock = threading.Lock()


def is_s3(uri: str | os.PathLike[str]) -> bool:
    """``uri`` is an ``s3://`` URI: for tests and tools that talk to the S3 server itself; vlp's modules ask
    :mod:`vlp.storage` for what they need (:func:`~vlp.storage.local_path`, ...) instead."""
    return str(uri).startswith("s3://")


def split_s3(uri: str) -> tuple[str, str]:
    """``s3://bucket/a/b`` -> ``("bucket", "a/b")``."""
    if not is_s3(uri):
        raise StorageError(f"not an s3:// URI: {uri!r}")
    bucket, _, key = uri[len("s3://") :].partition("/")
    if not bucket:
        raise StorageError(f"s3 URI without a bucket: {uri!r}")
    return bucket, key


def client() -> Any:
    """The boto3 S3 client for the current settings (cached per process and thread)."""
    import boto3
    from botocore.config import Config as BotoConfig

    cfg = current_config()
    key = (os.getpid(), threading.get_ident(), cfg.endpoint_url, cfg.region, cfg.access_key_id, cfg.addressing_style,
           cfg.max_attempts)  # fmt: skip
    with _lock:
        if key not in _clients:
            kwargs: dict[str, Any] = {}
            endpoint, region = _endpoint(cfg), _region(cfg)
            if endpoint:
                kwargs["endpoint_url"] = endpoint
            if cfg.access_key_id:
                kwargs["aws_access_key_id"] = cfg.access_key_id
                kwargs["aws_secret_access_key"] = cfg.secret_access_key
            boto_cfg = BotoConfig(
                s3={"addressing_style": cfg.addressing_style},
                retries={"max_attempts": max(1, cfg.max_attempts), "mode": "standard"},
                max_pool_connections=max(10, cfg.max_concurrency * 2),
            )
            _clients[key] = boto3.session.Session().client("s3", region_name=region, config=boto_cfg, **kwargs)
        return _clients[key]


def _endpoint(cfg: StorageConfig) -> str:
    return cfg.endpoint_url or os.environ.get("AWS_ENDPOINT_URL_S3") or os.environ.get("AWS_ENDPOINT_URL") or ""


def _region(cfg: StorageConfig) -> str:
    return cfg.region or os.environ.get("AWS_REGION") or os.environ.get("AWS_DEFAULT_REGION") or "us-east-1"


def object_store_options() -> dict[str, str]:
    """The connection :func:`client` makes, as the ``storage_options`` of a library that reads ``s3://`` itself
    through the Rust ``object_store`` crate (LanceDB): the same endpoint, region and addressing style, and the keys
    when :class:`StorageConfig` sets them (else that library reads the ``AWS_*`` environment, as boto3 does)."""
    cfg = current_config()
    options = {
        "aws_region": _region(cfg),
        "aws_virtual_hosted_style_request": "true" if cfg.addressing_style == "virtual" else "false",
    }
    endpoint = _endpoint(cfg)
    if endpoint:
        options["aws_endpoint"] = endpoint
        if endpoint.startswith("http://"):  # a plain-HTTP endpoint (a local MinIO, the tests' server)
            options["allow_http"] = "true"
    if cfg.access_key_id:
        options["aws_access_key_id"] = cfg.access_key_id
        options["aws_secret_access_key"] = cfg.secret_access_key
    return options


def _transfer_config() -> Any:
    from boto3.s3.transfer import TransferConfig

    cfg, mb = current_config(), 1024 * 1024
    return TransferConfig(
        multipart_threshold=cfg.multipart_threshold_mb * mb,
        multipart_chunksize=cfg.multipart_chunk_mb * mb,
        max_concurrency=cfg.max_concurrency,
    )


def _is_missing(exc: Exception) -> bool:
    response = getattr(exc, "response", None) or {}  # None on connection errors (reset, refused, timeout)
    code = str(response.get("Error", {}).get("Code", ""))
    return code in {"404", "NoSuchKey", "NotFound", "NoSuchBucket"}


def _is_cut_off(exc: Exception) -> bool:
    """A transfer that broke after the response started (botocore retries only errors before it)."""
    names = {type(e).__name__ for e in (exc, exc.__cause__, exc.__context__) if e is not None}
    return bool(names & {"IncompleteReadError", "ReadTimeoutError", "ResponseStreamingError", "ProtocolError",
                         "ConnectionClosedError", "IncompleteRead", "ConnectionResetError"})  # fmt: skip


class S3Backend(Backend):
    """``s3://`` through boto3: ranged GETs, multipart uploads, server-side copies."""

    def exists(self, uri: str) -> bool:
        bucket, key = split_s3(uri)
        s3 = client()
        if key:
            try:
                s3.head_object(Bucket=bucket, Key=key)
                return True
            except Exception as exc:
                if not _is_missing(exc):
                    raise StorageError(f"cannot stat {uri}: {exc}") from exc
        prefix = key.rstrip("/") + "/" if key else ""
        try:
            resp = s3.list_objects_v2(Bucket=bucket, Prefix=prefix, MaxKeys=1)
        except Exception as exc:  # e.g. NoSuchBucket, bad credentials, unreachable endpoint
            raise StorageError(f"cannot list {uri}: {exc}") from exc
        return bool(resp.get("KeyCount", 0) > 0)

    def list_files(self, uri: str, suffix: str, recursive: bool) -> list[str]:
        bucket, key = split_s3(uri)
        prefix = key.rstrip("/") + "/" if key else ""
        out = []
        paginator = client().get_paginator("list_objects_v2")
        kwargs = {"Bucket": bucket, "Prefix": prefix} | ({} if recursive else {"Delimiter": "/"})
        try:
            for page in paginator.paginate(**kwargs):
                for obj in page.get("Contents", []):
                    if obj["Key"].endswith(suffix) and not obj["Key"].endswith("/"):
                        out.append(f"s3://{bucket}/{obj['Key']}")
        except Exception as exc:
            raise StorageError(f"cannot list {uri}: {exc}") from exc
        return sorted(out)

    def size(self, uri: str) -> int:
        bucket, key = split_s3(uri)
        try:
            return int(client().head_object(Bucket=bucket, Key=key)["ContentLength"])
        except Exception as exc:
            if _is_missing(exc):
                raise FileNotFoundError(f"no such object: {uri}") from exc
            raise StorageError(f"cannot stat {uri}: {exc}") from exc

    def read_bytes(self, uri: str) -> bytes:
        bucket, key = split_s3(uri)
        try:
            return bytes(client().get_object(Bucket=bucket, Key=key)["Body"].read())
        except Exception as exc:
            if _is_missing(exc):
                raise FileNotFoundError(f"no such object: {uri}") from exc
            raise StorageError(f"cannot read {uri}: {exc}") from exc

    def write_bytes(self, uri: str, data: bytes) -> None:
        if len(data) > current_config().multipart_threshold_mb * 1024 * 1024:
            self._upload_fileobj(io.BytesIO(data), uri)
            return
        bucket, key = split_s3(uri)
        try:
            client().put_object(Bucket=bucket, Key=key, Body=data)
        except Exception as exc:
            raise StorageError(f"cannot write {uri}: {exc}") from exc

    def delete(self, uri: str) -> None:
        bucket, key = split_s3(uri)
        try:
            client().delete_object(Bucket=bucket, Key=key)
        except Exception as exc:
            raise StorageError(f"cannot delete {uri}: {exc}") from exc

    def read_range(self, uri: str, start: int, length: int) -> bytes:
        return self._get_range(uri, f"bytes={start}-{start + length - 1}")[0]

    def read_tail(self, uri: str, length: int) -> tuple[bytes, int]:
        return self._get_range(uri, f"bytes=-{length}")

    def _get_range(self, uri: str, byte_range: str) -> tuple[bytes, int]:
        """``(body, object size)`` of one ranged GET, retried when the body is cut off mid-transfer."""
        bucket, key = split_s3(uri)
        attempts = max(1, current_config().max_attempts)
        for attempt in range(1, attempts + 1):
            try:
                resp = client().get_object(Bucket=bucket, Key=key, Range=byte_range)
                body = resp["Body"].read()
            except Exception as exc:
                if _is_missing(exc):
                    raise FileNotFoundError(f"no such object: {uri}") from exc
                if attempt < attempts and _is_cut_off(exc):
                    continue
                raise StorageError(f"cannot read {uri} ({byte_range}): {exc}") from exc
            expected = int(resp.get("ContentLength", len(body)))
            if len(body) != expected:  # a short body without an error: count it as cut off
                if attempt < attempts:
                    continue
                raise StorageError(f"cannot read {uri} ({byte_range}): got {len(body)} of {expected} bytes")
            content_range = str(resp.get("ContentRange", ""))  # "bytes 0-9/1234"; absent when the range covers all
            total = int(content_range.rpartition("/")[2]) if "/" in content_range else len(body)
            return body, total
        raise AssertionError("unreachable")  # pragma: no cover

    def download(self, uri: str, local_path: str) -> None:
        bucket, key = split_s3(uri)
        try:
            client().download_file(bucket, key, local_path, Config=_transfer_config())
        except Exception as exc:
            if _is_missing(exc):
                raise FileNotFoundError(f"no such object: {uri}") from exc
            raise StorageError(f"cannot download {uri}: {exc}") from exc

    def upload(self, local_path: str, uri: str) -> None:
        with open(local_path, "rb") as fh:
            self._upload_fileobj(fh, uri)

    def _upload_fileobj(self, fh: Any, uri: str) -> None:
        bucket, key = split_s3(uri)
        try:
            client().upload_fileobj(fh, bucket, key, Config=_transfer_config())
        except Exception as exc:
            raise StorageError(f"cannot upload to {uri}: {exc}") from exc

    def copy_within(self, src: str, dst: str) -> None:
        (src_bucket, src_key), (bucket, key) = split_s3(src), split_s3(dst)
        try:
            client().copy({"Bucket": src_bucket, "Key": src_key}, bucket, key, Config=_transfer_config())
        except Exception as exc:
            if _is_missing(exc):
                raise FileNotFoundError(f"no such object: {src}") from exc
            raise StorageError(f"cannot copy {src} to {dst}: {exc}") from exc

    def library_options(self) -> dict[str, str] | None:
        return object_store_options()

    def configure(self, cfg: StorageConfig) -> None:
        with _lock:
            _clients.clear()
