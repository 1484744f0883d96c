"""One small interface over local paths and ``s3://bucket/key`` URIs.

Everything in vlp that touches data goes through these functions, so every step works the
same on a laptop directory and on any S3-compatible object store (AWS S3, Ceph RGW, MinIO,
SeaweedFS). Connection settings come from :class:`StorageConfig` or, when unset there, from
the standard AWS environment variables (``AWS_ENDPOINT_URL``, ``AWS_ACCESS_KEY_ID``, ...).

Writes are atomic on both backends: a local write goes to a temporary file in the target
directory and is renamed into place; an S3 object (single PUT or multipart) becomes visible
only when it is complete. A reader therefore never sees half a file.
"""

from __future__ import annotations

import contextlib
import io
import os
import shutil
import tempfile
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple

import pyarrow as pa
import pyarrow.parquet as pq


@dataclass
class StorageConfig:
    """Object-store connection. Empty strings mean: use the AWS environment / defaults."""

    endpoint_url: str = ""  # e.g. http://127.0.0.1:9000; else AWS_ENDPOINT_URL[_S3] or AWS
    region: str = ""  # else AWS_REGION / AWS_DEFAULT_REGION, else us-east-1
    access_key_id: str = ""  # prefer the environment or an IAM role over putting keys in files
    secret_access_key: str = ""
    addressing_style: str = "path"  # "path" works on every S3-compatible server; "virtual" for AWS
    multipart_threshold_mb: int = 64  # files larger than this go through multipart upload
    multipart_chunk_mb: int = 16
    max_concurrency: int = 4
    max_attempts: int = 5  # tries per request (botocore "standard" retries: 5xx, throttling, connection errors)


class StorageError(OSError):
    """A storage operation failed; the message names the URI."""


_config = StorageConfig()
_clients: dict[tuple[Any, ...], Any] = {}
_lock = threading.Lock()


def configure(cfg: StorageConfig) -> None:
    """Set the process-wide storage settings (call once at step start-up)."""
    global _config
    with _lock:
        _config = cfg
        _clients.clear()


def is_s3(uri: str | os.PathLike[str]) -> bool:
    return str(uri).startswith("s3://")


def canonical(uri: str | os.PathLike[str]) -> str:
    """One spelling per place: a local path absolute and with its links resolved, an object URI as it is."""
    return str(uri).rstrip("/") if is_s3(uri) else os.path.realpath(uri)


def join(base: str | os.PathLike[str], *parts: str) -> str:
    """Join URI parts with ``/`` (``s3://b/a`` + ``x`` -> ``s3://b/a/x``; local paths likewise)."""
    out = str(base)
    for part in parts:
        part = str(part).strip("/")
        if not part:
            continue
        out = out.rstrip("/") + "/" + part if out else part
    return out


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

    cfg = _config
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
    cfg = _config
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

    mb = 1024 * 1024
    return TransferConfig(
        multipart_threshold=_config.multipart_threshold_mb * mb,
        multipart_chunksize=_config.multipart_chunk_mb * mb,
        max_concurrency=_config.max_concurrency,
    )


def _is_missing(exc: Exception) -> bool:
    response = getattr(exc, "response", None) or {}  # None on connection errors (reset, refused, timeout)
    code = str(response.get("Error", {}).get("Code", ""))
    return code in {"404", "NoSuchKey", "NotFound", "NoSuchBucket"}


# --------------------------------------------------------------------------- queries


def exists(uri: str | os.PathLike[str]) -> bool:
    """True when ``uri`` is an existing file/object, or a non-empty directory/prefix."""
    uri = str(uri)
    if not is_s3(uri):
        return os.path.exists(uri)
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
    return resp.get("KeyCount", 0) > 0


def list_files(uri: str | os.PathLike[str], suffix: str = "", recursive: bool = True) -> list[str]:
    """Sorted URIs of the files under directory/prefix ``uri`` (ending in ``suffix``)."""
    uri = str(uri)
    if not is_s3(uri):
        root = Path(uri)
        if not root.is_dir():
            return []
        paths = root.rglob("*") if recursive else root.iterdir()
        return sorted(str(p) for p in paths if p.is_file() and p.name.endswith(suffix) and not _is_tmp(p.name))
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


def size(uri: str | os.PathLike[str]) -> int:
    """Size in bytes of a file/object."""
    uri = str(uri)
    if not is_s3(uri):
        return os.path.getsize(uri)
    bucket, key = split_s3(uri)
    try:
        return int(client().head_object(Bucket=bucket, Key=key)["ContentLength"])
    except Exception as exc:
        if _is_missing(exc):
            raise FileNotFoundError(f"no such object: {uri}") from exc
        raise StorageError(f"cannot stat {uri}: {exc}") from exc


# --------------------------------------------------------------------------- bytes


def read_bytes(uri: str | os.PathLike[str]) -> bytes:
    uri = str(uri)
    if not is_s3(uri):
        try:
            return _counted(Path(uri).read_bytes())
        except FileNotFoundError as exc:
            raise FileNotFoundError(f"no such file: {uri}") from exc
    bucket, key = split_s3(uri)
    try:
        return _counted(client().get_object(Bucket=bucket, Key=key)["Body"].read())
    except Exception as exc:
        if _is_missing(exc):
            raise FileNotFoundError(f"no such object: {uri}") from exc
        raise StorageError(f"cannot read {uri}: {exc}") from exc


def read_text(uri: str | os.PathLike[str], encoding: str = "utf-8") -> str:
    return read_bytes(uri).decode(encoding)


@dataclass
class ReadStats:
    """Bytes and requests this process has read through :func:`read_bytes`, :func:`read_range`,
    :func:`read_tail` and :class:`RangedFile` (local files and objects alike): what a benchmark divides by."""

    bytes: int = 0
    requests: int = 0


_read_stats = ReadStats()


def read_stats() -> ReadStats:
    """A copy of this process's read counters."""
    return ReadStats(_read_stats.bytes, _read_stats.requests)


def reset_read_stats() -> None:
    _read_stats.bytes = _read_stats.requests = 0


def _counted(data: bytes) -> bytes:
    _read_stats.bytes += len(data)
    _read_stats.requests += 1
    return data


def read_range(uri: str | os.PathLike[str], start: int, length: int) -> bytes:
    """``length`` bytes of ``uri`` from byte ``start`` (fewer at the end of the file): one ranged GET on S3.

    A body cut off mid-transfer is fetched again (up to ``max_attempts`` tries, as the requests themselves are);
    then :class:`StorageError` names the object and the range.
    """
    uri = str(uri)
    if start < 0 or length < 0:
        raise ValueError(f"read_range({uri!r}, {start}, {length}): start and length must be >= 0")
    if length == 0:
        return b""
    if not is_s3(uri):
        try:
            with open(uri, "rb") as fh:
                fh.seek(start)
                return _counted(fh.read(length))
        except FileNotFoundError as exc:
            raise FileNotFoundError(f"no such file: {uri}") from exc
    return _counted(_get_range(uri, f"bytes={start}-{start + length - 1}")[0])


def read_tail(uri: str | os.PathLike[str], length: int) -> tuple[bytes, int]:
    """``(the last length bytes of uri (all of it when shorter), its size)``: one suffix-ranged GET on S3."""
    uri = str(uri)
    if length < 1:
        raise ValueError(f"read_tail({uri!r}, {length}): length must be >= 1")
    if not is_s3(uri):
        try:
            with open(uri, "rb") as fh:
                total = fh.seek(0, os.SEEK_END)
                fh.seek(max(0, total - length))
                return _counted(fh.read()), total
        except FileNotFoundError as exc:
            raise FileNotFoundError(f"no such file: {uri}") from exc
    data, total = _get_range(uri, f"bytes=-{length}")
    return _counted(data), total


def _get_range(uri: str, byte_range: str) -> tuple[bytes, int]:
    """``(body, object size)`` of one ranged GET, retried when the body is cut off mid-transfer."""
    bucket, key = split_s3(uri)
    attempts = max(1, _config.max_attempts)
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


def _is_cut_off(exc: Exception) -> bool:
    """A transfer that broke after the response started (botocore retries only errors before it)."""
    names = {type(e).__name__ for e in (exc, exc.__cause__, exc.__context__) if e is not None}
    return bool(names & {"IncompleteReadError", "ReadTimeoutError", "ResponseStreamingError", "ProtocolError",
                         "ConnectionClosedError", "IncompleteRead", "ConnectionResetError"})  # fmt: skip


_object_size = size  # RangedFile's `size` argument shadows the function


class RangedFile(io.RawIOBase):
    """A read-only, seekable file over ``uri`` whose reads are ranged reads (:func:`read_range`), for readers
    that seek (pyarrow's Parquet reader): only the bytes asked for are fetched. ``size`` saves a HEAD request."""

    def __init__(self, uri: str | os.PathLike[str], size: int | None = None) -> None:
        super().__init__()
        self.uri = str(uri)
        self._size = _object_size(self.uri) if size is None else int(size)
        self._pos = 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self._pos

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self._pos, io.SEEK_END: self._size}[whence]
        if base + offset < 0:
            raise ValueError(f"negative seek position in {self.uri}")
        self._pos = base + offset
        return self._pos

    def readinto(self, buffer: Any) -> int:
        view = memoryview(buffer).cast("B")
        n = max(0, min(len(view), self._size - self._pos))
        if n:
            data = read_range(self.uri, self._pos, n)
            view[: len(data)] = data
            n = len(data)
            self._pos += n
        return n


def write_bytes(uri: str | os.PathLike[str], data: bytes) -> None:
    """Write ``data`` to ``uri`` atomically (parent directories are created)."""
    uri = str(uri)
    if is_s3(uri):
        if len(data) > _config.multipart_threshold_mb * 1024 * 1024:
            _upload_fileobj(io.BytesIO(data), uri)
            return
        bucket, key = split_s3(uri)
        try:
            client().put_object(Bucket=bucket, Key=key, Body=data)
        except Exception as exc:
            raise StorageError(f"cannot write {uri}: {exc}") from exc
        return
    with _atomic_local(uri) as tmp:
        Path(tmp).write_bytes(data)


def write_text(uri: str | os.PathLike[str], text: str, encoding: str = "utf-8") -> None:
    write_bytes(uri, text.encode(encoding))


def delete(uri: str | os.PathLike[str]) -> None:
    """Delete a file/object if it exists."""
    uri = str(uri)
    if not is_s3(uri):
        with contextlib.suppress(FileNotFoundError):
            os.remove(uri)
        return
    bucket, key = split_s3(uri)
    try:
        client().delete_object(Bucket=bucket, Key=key)
    except Exception as exc:
        raise StorageError(f"cannot delete {uri}: {exc}") from exc


# --------------------------------------------------------------------------- files


def upload(local_path: str | os.PathLike[str], uri: str | os.PathLike[str]) -> None:
    """Copy a local file to ``uri`` atomically (S3: transfer manager, multipart when large)."""
    local_path, uri = str(local_path), str(uri)
    if not is_s3(uri):
        if os.path.abspath(local_path) == os.path.abspath(uri):
            return
        with _atomic_local(uri) as tmp:
            shutil.copyfile(local_path, tmp)
        return
    with open(local_path, "rb") as fh:
        _upload_fileobj(fh, uri)


def _upload_fileobj(fh: Any, uri: str) -> None:
    bucket, key = split_s3(uri)
    try:
        client().upload_fileobj(fh, bucket, key, Config=_transfer_config())
    except Exception as exc:
        raise StorageError(f"cannot upload to {uri}: {exc}") from exc


def copy(src: str | os.PathLike[str], dst: str | os.PathLike[str]) -> None:
    """Copy one file/object to another place, atomically at the destination (S3 to S3: a server-side copy,
    multipart when large; across the two kinds: a download or an upload)."""
    src, dst = str(src), str(dst)
    if is_s3(src) and is_s3(dst):
        (src_bucket, src_key), (bucket, key) = split_s3(src), split_s3(dst)
        try:
            client().copy({"Bucket": src_bucket, "Key": src_key}, bucket, key, Config=_transfer_config())
        except Exception as exc:
            if _is_missing(exc):
                raise FileNotFoundError(f"no such object: {src}") from exc
            raise StorageError(f"cannot copy {src} to {dst}: {exc}") from exc
    elif is_s3(src):
        download(src, dst)
    else:
        upload(src, dst)


def download(uri: str | os.PathLike[str], local_path: str | os.PathLike[str]) -> str:
    """Copy ``uri`` to ``local_path`` atomically; returns ``local_path``."""
    uri, local_path = str(uri), str(local_path)
    with _atomic_local(local_path) as tmp:
        if is_s3(uri):
            bucket, key = split_s3(uri)
            try:
                client().download_file(bucket, key, tmp, Config=_transfer_config())
            except Exception as exc:
                if _is_missing(exc):
                    raise FileNotFoundError(f"no such object: {uri}") from exc
                raise StorageError(f"cannot download {uri}: {exc}") from exc
        else:
            try:
                shutil.copyfile(uri, tmp)
            except FileNotFoundError as exc:
                raise FileNotFoundError(f"no such file: {uri}") from exc
    return local_path


def is_below(directory: str | os.PathLike[str], path: str | os.PathLike[str]) -> bool:
    """True when local ``path`` lies strictly inside ``directory`` once ``..`` and symbolic links are resolved."""
    base, target = os.path.realpath(directory), os.path.realpath(path)
    return target != base and os.path.commonpath([base, target]) == base


class LinkError(ValueError):
    """A store or model directory holds a symbolic link: what vlp wrote there is never one, so a link is something
    put in afterwards that could lead reads anywhere on the machine."""


def refuse_links(root: str | os.PathLike[str], what: str) -> None:
    """Refuse a local ``root`` (a frames store, an index, a model directory, a checkpoint) that holds a symbolic link
    anywhere below it, to a file or a directory, whether it points inside or out: vlp's steps never write one, so a
    link is a file replaced after the fact, and reading through it would read whatever it names. ``root`` itself may
    be a link (it is the caller's own argument). A root that does not exist passes (the caller says what is missing).
    On S3 there are no links: a key is read as itself, and readers take only the key names their writer makes.

    Raises:
        LinkError: naming ``what``, the link (relative to ``root``) and where it points.
    """
    root = str(root)
    if is_s3(root):
        return
    pending = [root]
    while pending:
        folder = pending.pop()
        try:
            entries = list(os.scandir(folder))
        except (FileNotFoundError, NotADirectoryError):
            continue
        for entry in entries:
            if entry.is_symlink():
                where = os.path.relpath(entry.path, root)
                raise LinkError(
                    f"the {what} {root} holds a symbolic link, {where} -> {os.readlink(entry.path)}: vlp never "
                    f"writes one there, so it is refused (replace it with the file itself)"
                )
            if entry.is_dir(follow_symlinks=False):
                pending.append(entry.path)


def local_path_under(directory: str | os.PathLike[str], relative: str) -> str:
    """``directory/relative`` for a key-derived relative path, refusing one that climbs out (``..``, absolute).

    An S3 key may contain ``..`` segments; as a file name under a temporary directory it would escape it.
    """
    target = os.path.join(os.path.realpath(directory), relative)
    if os.path.isabs(relative) or not is_below(directory, target):
        raise StorageError(f"refusing the key-derived path {relative!r}: it leaves {directory}")
    return os.path.realpath(target)


@contextlib.contextmanager
def local_copy(uri: str | os.PathLike[str], suffix: str = "") -> Iterator[str]:
    """A local path holding ``uri``'s bytes for the duration of the block.

    Local files are used in place (no copy); S3 objects are downloaded to a temporary file
    that is removed afterwards. Use this for libraries that need a real file (decord, PyAV).
    """
    uri = str(uri)
    if not is_s3(uri):
        yield uri
        return
    fd, tmp = tempfile.mkstemp(suffix=suffix or Path(uri).suffix, prefix="vlp-")
    os.close(fd)
    try:
        download(uri, tmp)
        yield tmp
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.remove(tmp)


# --------------------------------------------------------------------------- parquet


def read_parquet(uri: str | os.PathLike[str], columns: list[str] | None = None) -> pa.Table:
    """A Parquet file as a table (its ``columns`` only: on S3 just their column chunks are fetched, after the
    footer, so the other columns' bytes are never read). A missing column raises ``pyarrow.ArrowInvalid``."""
    uri = str(uri)
    if not is_s3(uri):
        if not os.path.exists(uri):
            raise FileNotFoundError(f"no such file: {uri}")
        if columns is None:  # read through read_bytes: counted in read_stats(), as on S3
            return pq.read_table(pa.BufferReader(_arrow_owned(read_bytes(uri))))
        return pq.read_table(uri, columns=columns)
    if columns is None:
        return pq.read_table(pa.BufferReader(_arrow_owned(read_bytes(uri))))
    footer = parquet_footer(uri)
    names = footer.metadata.schema.to_arrow_schema().names
    missing = [c for c in columns if c not in names]
    if missing:
        raise pa.ArrowInvalid(f"{uri}: no column(s) {missing}; it has {names}")
    table = read_row_groups(uri, list(range(footer.metadata.num_row_groups)), columns, footer)
    return table.replace_schema_metadata(footer.metadata.schema.to_arrow_schema().metadata)


def _arrow_owned(data: bytes) -> pa.Buffer:
    """``data`` copied into memory that Arrow allocated (no Python object behind it).

    ``pq.read_table`` decodes on Arrow's thread pools, and a task there may drop its reference to the input buffer
    after the read has returned. Were that buffer a Python ``bytes`` (``pa.BufferReader(bytes)``, ``io.BytesIO``), the
    pool thread would take the GIL to release it; when that happens while the interpreter is finalizing (a command
    that fails right after a read and exits), Python ends the thread inside Arrow's C++ destructor and the process
    aborts ("terminate called without an active exception", exit 134) after printing its error. Memory Arrow owns is
    released without the GIL.
    """
    buffer = pa.allocate_buffer(len(data))
    memoryview(buffer).cast("B")[:] = data
    return buffer


def read_parquet_metadata(uri: str | os.PathLike[str]) -> dict[bytes, bytes]:
    """The key-value metadata of a Parquet file's schema, read from its footer alone (:func:`parquet_footer`)."""
    return dict(parquet_footer(uri).metadata.schema.to_arrow_schema().metadata or {})


class ParquetFooter(NamedTuple):
    """A Parquet file's parsed footer and the file's size (what :func:`read_row_groups` needs to seek in it)."""

    metadata: pq.FileMetaData
    size: int


FOOTER_GUESS = 64 * 1024  # bytes read from the end at first: most footers fit, so one request does


def parquet_footer(uri: str | os.PathLike[str], tail: int = FOOTER_GUESS) -> ParquetFooter:
    """A Parquet file's footer (schema, row groups, key-value metadata) without reading its data: one read of the
    file's last ``tail`` bytes (64 KiB), and a second only when the footer is larger. A caller that knows the
    footer's size (``metadata.serialized_size + 8``, e.g. from an index) passes it as ``tail`` and reads exactly it.

    Raises:
        StorageError: ``uri`` is not a Parquet file (no ``PAR1`` at its end, or a footer that does not parse).
    """
    uri = str(uri)
    data, total = read_tail(uri, max(12, tail))
    if total < 12 or data[-4:] != b"PAR1":
        raise StorageError(f"{uri} is not a Parquet file (it does not end with PAR1)")
    footer_len = int.from_bytes(data[-8:-4], "little")
    if footer_len + 8 > total - 4:
        raise StorageError(f"{uri}: its footer claims {footer_len} bytes of a {total}-byte file")
    if footer_len + 8 > len(data):
        data = read_range(uri, total - footer_len - 8, footer_len + 8)
    footer = data[len(data) - footer_len - 8 :]
    try:  # pyarrow parses a footer from any buffer that starts and ends like a Parquet file
        return ParquetFooter(pq.read_metadata(io.BytesIO(b"PAR1" + footer)), total)
    except (pa.ArrowException, OSError) as exc:
        raise StorageError(f"{uri}: cannot parse its Parquet footer: {exc}") from exc


def read_row_groups(
    uri: str | os.PathLike[str],
    row_groups: list[int],
    columns: list[str] | None = None,
    footer: ParquetFooter | None = None,
) -> pa.Table:
    """Rows of ``row_groups`` of Parquet file ``uri``. With its ``footer`` given (:func:`parquet_footer`), only the
    column chunks asked for are read - one ranged read per run of adjacent chunks - and nothing else.

    The chunks are fetched first (:func:`read_range`) and pyarrow decodes them from memory: no request per page and
    no I/O thread pool calling back into Python for every read.
    """
    uri = str(uri)
    footer = footer if footer is not None else parquet_footer(uri)
    meta = footer.metadata
    try:
        wanted = _column_indices(meta, columns)
        spans = sorted(_chunk_span(meta.row_group(g).column(c)) for g in row_groups for c in wanted)
        segments: list[tuple[int, bytes]] = []
        for start, end in _coalesce(spans):
            segments.append((start, read_range(uri, start, end - start)))
        # on this thread: the file object is Python's, which a task left on Arrow's pools could outlive the read
        # holding (see _arrow_owned); a clip's row group is small, and loaders read clips in worker processes
        with pq.ParquetFile(_Segments(uri, footer.size, segments), metadata=meta, pre_buffer=False) as pf:
            return pf.read_row_groups(row_groups, columns=columns, use_threads=False)
    except (FileNotFoundError, StorageError):
        raise
    except (pa.ArrowException, OSError, IndexError, KeyError) as exc:
        raise StorageError(f"cannot read row groups {row_groups[:5]} of {uri}: {exc}") from exc


def _column_indices(meta: pq.FileMetaData, columns: list[str] | None) -> list[int]:
    """Leaf column indices of ``columns`` (all when None) in a file of flat columns."""
    names = [meta.schema.column(i).path for i in range(meta.num_columns)]
    if columns is None:
        return list(range(meta.num_columns))
    missing = [c for c in columns if c not in names]
    if missing:
        raise KeyError(f"no column(s) {missing}; the file has {names}")
    return [names.index(c) for c in columns]


def _chunk_span(chunk: Any) -> tuple[int, int]:
    """``[start, end)`` bytes of a column chunk: its dictionary page (if any) and its data pages."""
    start = chunk.data_page_offset
    if chunk.has_dictionary_page and chunk.dictionary_page_offset is not None:
        start = min(start, chunk.dictionary_page_offset)
    return start, start + chunk.total_compressed_size


def _coalesce(spans: list[tuple[int, int]], gap: int = 4096) -> list[tuple[int, int]]:
    """Sorted byte spans merged where they touch or lie less than ``gap`` bytes apart (one request each run)."""
    merged: list[list[int]] = []
    for start, end in spans:
        if merged and start - merged[-1][1] <= gap:
            merged[-1][1] = max(merged[-1][1], end)
        else:
            merged.append([start, end])
    return [(a, b) for a, b in merged]


class _Segments(RangedFile):
    """A :class:`RangedFile` of which ``segments`` (``(offset, bytes)``) were fetched already: reads inside a segment
    come from memory; anything else is a ranged read (pyarrow should need none)."""

    def __init__(self, uri: str, size: int, segments: list[tuple[int, bytes]]) -> None:
        super().__init__(uri, size=size)
        self._segments = segments

    def readinto(self, buffer: Any) -> int:
        view = memoryview(buffer).cast("B")
        n = max(0, min(len(view), self._size - self._pos))
        for start, data in self._segments:
            if start <= self._pos and self._pos + n <= start + len(data):
                view[:n] = data[self._pos - start : self._pos - start + n]
                self._pos += n
                return n
        return super().readinto(buffer)


def write_parquet(uri: str | os.PathLike[str], table: pa.Table, **kwargs: Any) -> None:
    """Write ``table`` as Parquet to ``uri`` atomically (deterministic bytes for equal tables)."""
    buf = io.BytesIO()
    kwargs.setdefault("compression", "zstd")
    pq.write_table(table, buf, **kwargs)
    write_bytes(uri, buf.getvalue())


# --------------------------------------------------------------------------- internals

_TMP_MARK = ".vlp-tmp-"


def _is_tmp(name: str) -> bool:
    return _TMP_MARK in name


@contextlib.contextmanager
def _atomic_local(path: str) -> Iterator[str]:
    """Yield a temporary path next to ``path``; rename it over ``path`` on success."""
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}{_TMP_MARK}")
    os.close(fd)
    try:
        yield tmp
        os.chmod(tmp, 0o644)
        os.replace(tmp, target)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.remove(tmp)
        raise
