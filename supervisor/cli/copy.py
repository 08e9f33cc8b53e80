"""``openshell-sandbox cp SRC DEST``: files in and out of the workload (docs/design.md "Files in and out").

``:PATH`` names the workload's side (relative to the workdir, like ``kubectl cp``). The copy is an exec of ``tar``
in the workload over the exec channel — the agent's own ``tar``, as the agent, under its Landlock rules, so it
reads and writes only what the agent may — with the archive streamed as the process's stdin or stdout; names are
argv elements and archive members, never shell text. ``cp`` works the same over the local socket and over
``--api https://…``.

Out of the workload, the archive is the agent's bytes (the agent can ptrace its ``tar`` or change what it reads):
``copy_extract`` writes it. Into the workload, ``copy_pack`` reads the source. Both with the same rules: regular
files and directories only, no set-id, bounded in bytes, members and time.

Exit: 0 when everything was copied; 1 when something was refused, a bound was reached or the workload's ``tar``
failed (each said on stderr); 124 when ``--timeout`` ended it; 125 when the sandbox could not be asked.
"""

from __future__ import annotations

import argparse
import errno
import os
import posixpath
import sys
from collections.abc import Callable, Iterator
from typing import Any, Final

import trio

from supervisor.cli.api_client import Api, ApiError, open_channel, request_json
from supervisor.cli.copy_archive import ArchiveError
from supervisor.cli.copy_extract import CopyLimit, Extractor, Limits, open_directory
from supervisor.cli.copy_pack import Packer
from supervisor.cli.human import clean
from supervisor.protocol.channel import (
    CLOSED,
    NEED_DATA,
    ChannelDecoder,
    ChannelProtocolError,
    Direction,
    Error,
    Exit,
    Stderr,
    Stdin,
    StdinEof,
    Stdout,
    encode_frame,
)
from supervisor.protocol.exit_codes import ExitCode
from supervisor.protocol.exit_result import ExitResult

__all__ = ["add_cp_parser", "run_cp"]

DEFAULT_TIMEOUT_S: Final = 600.0
MAX_STDERR: Final = 16 * 1024
_READ: Final = 256 * 1024


class CopyFailed(Exception):
    """The copy could not be done at all (said once, exit 125 or 1)."""

    def __init__(self, message: str, code: int = 1) -> None:
        super().__init__(message)
        self.code = code


def add_cp_parser(sub: Any, with_api: Callable[[argparse.ArgumentParser], argparse.ArgumentParser]) -> None:
    cp = with_api(sub.add_parser(
        "cp", help="copy files into or out of the workload (:PATH is the workload's side)",
        description="Copy SRC to DEST; one of them is :PATH, a path in the workload (relative to its workdir). "
        "Regular files and directories only: links and special files are refused and listed.",
    ))  # fmt: skip
    cp.add_argument("src", metavar="SRC")
    cp.add_argument("dest", metavar="DEST")
    cp.add_argument("--max-bytes", type=int, default=Limits().max_bytes, help="largest archive (default 1 GiB)")
    cp.add_argument("--max-files", type=int, default=Limits().max_members, help="most entries (default 100000)")
    cp.add_argument("--timeout", type=float, default=DEFAULT_TIMEOUT_S, help="give up after this many seconds")


async def run_cp(api: Api, args: argparse.Namespace) -> int:
    src, dest = str(args.src), str(args.dest)
    if src.startswith(":") == dest.startswith(":"):
        print("openshell-sandbox: cp: exactly one of SRC and DEST is :PATH (the workload's side)", file=sys.stderr)
        return ExitCode.USAGE
    limits = Limits(max_bytes=args.max_bytes, max_members=args.max_files)
    refused: list[str] = []
    try:
        with trio.fail_after(args.timeout):
            if src.startswith(":"):
                await _download(api, src[1:], dest, limits, refused, args.timeout)
            else:
                await _upload(api, src, dest[1:], limits, refused, args.timeout)
    except trio.TooSlowError:
        _say(refused)
        print(f"openshell-sandbox: cp: not done within {args.timeout:g} s (--timeout)", file=sys.stderr)
        return ExitCode.TIMEOUT
    except CopyFailed as exc:
        _say(refused)
        print(f"openshell-sandbox: cp: {exc}", file=sys.stderr)
        return exc.code
    _say(refused)
    return 1 if refused else 0


def _say(refused: list[str]) -> None:
    for line in refused:
        print(f"openshell-sandbox: cp: {line}", file=sys.stderr)


def _remote_path(path: str) -> tuple[str, str]:
    """The workload's directory and name of ``path``: a name is needed (not ``/``, ``.`` or ``..``)."""
    normal = posixpath.normpath(path) if path else ""
    parent, name = posixpath.split(normal)
    if name in ("", ".", "..") or "\x00" in normal:
        raise CopyFailed(f"name a file or directory in the workload, not {clean(path)!r}", ExitCode.USAGE)
    return parent or ".", name


async def _download(api: Api, remote: str, dest: str, limits: Limits, refused: list[str], remote_s: float) -> None:
    parent, name = _remote_path(remote)
    root, local = _destination(dest, name)
    extractor = Extractor(root, (name, local), limits)
    try:
        result = await _exec(api, ["tar", "-c", "-f", "-", "-C", parent, "--", name], remote_s, extractor.feed)
        extractor.finish()
    except (ArchiveError, CopyLimit) as exc:
        raise CopyFailed(f"stopped: {exc}") from None
    finally:
        extractor.abort()
        os.close(root)
        refused.extend(extractor.refused)
    _tar_result(result, refused)


def _destination(dest: str, name: str) -> tuple[int, str]:
    """The directory to write in and the top entry's local name: into ``dest`` when it is a directory (never
    through a symbolic link), else ``dest`` itself in its parent."""
    try:
        return open_directory(dest), name
    except FileNotFoundError:
        pass
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise CopyFailed(f"{clean(dest)} is a symbolic link: name the directory itself") from None
        if exc.errno != errno.ENOTDIR:
            raise CopyFailed(f"{clean(dest)}: {exc.strerror}") from None
    parent, local = os.path.split(os.path.normpath(dest))
    try:
        return open_directory(parent or "."), local
    except OSError as exc:
        raise CopyFailed(f"{clean(parent or '.')}: {exc.strerror}") from None


async def _upload(api: Api, src: str, remote: str, limits: Limits, refused: list[str], remote_s: float) -> None:
    parent, name = _source(src)
    is_dir = await _exec(api, ["test", "-d", remote], remote_s, _no_output)
    if is_dir.exited and is_dir.code == 0:
        directory, top = remote, name
    else:
        directory, top = _remote_path(remote)
    packer = Packer(limits)
    parent_fd = open_directory(parent)
    try:
        argv = ["tar", "-x", "-f", "-", "-C", directory, "--no-same-owner", "--no-same-permissions"]
        result = await _exec(api, argv, remote_s, _no_output, packer.stream(parent_fd, name, top))
    except CopyLimit as exc:
        raise CopyFailed(f"stopped: {exc}") from None
    finally:
        os.close(parent_fd)
        refused.extend(packer.refused)
    _tar_result(result, refused)


def _source(src: str) -> tuple[str, str]:
    """The local source's directory and name (the name is not followed: a link there is refused)."""
    source = os.path.normpath(os.path.abspath(src))
    parent, name = os.path.split(source)
    if not name:
        raise CopyFailed("name a file or directory to copy, not /", ExitCode.USAGE)
    if not os.path.lexists(source):
        raise CopyFailed(f"{clean(src)}: no such file or directory")
    return parent, name


def _no_output(data: bytes) -> None:
    pass


def _tar_result(result: ExitResult, refused: list[str]) -> None:
    if not (result.exited and result.code == 0):
        refused.append(f"the workload's tar failed ({_rendered(result)})")


def _rendered(result: ExitResult) -> str:
    return f"exit {result.code}" if result.exited else f"signal {result.signal or '?'}"


async def _exec(
    api: Api,
    argv: list[str],
    remote_s: float,
    on_stdout: Callable[[bytes], None],
    stdin: Iterator[bytes] | None = None,
) -> ExitResult:
    """One exec in the workload: ``stdin`` sent as it is produced, stdout handed over, stderr shown (escaped)."""
    body = {"argv": argv, "stdin": "pipe" if stdin is not None else "null", "timeout_s": remote_s}
    try:
        stream, reply = await open_channel(api, "/v1/exec", body)
    except ApiError as exc:
        raise CopyFailed(f"{exc.body.get('kind', 'error')}: {exc}", ExitCode.SELF_FAILED) from None
    stderr = bytearray()
    try:
        try:
            async with stream, trio.open_nursery() as nursery:
                nursery.start_soon(_send_stdin, stream, stdin)
                result = await _read(stream, on_stdout, stderr)
                nursery.cancel_scope.cancel()
        except BaseExceptionGroup as group:  # one failure at a time: the reader's or the sender's, as itself
            if len(group.exceptions) == 1:
                raise group.exceptions[0] from None
            raise
    except BaseException:
        handle = reply.get("handle")
        if isinstance(handle, str):  # the workload's side ends with us, not at its own timeout
            with trio.CancelScope(shield=True), trio.move_on_after(5):
                try:
                    await request_json(api, "POST", "/v1/terminate", {"handle": handle, "grace_s": 0})
                except (ApiError, OSError):
                    pass
        raise
    finally:
        for line in bytes(stderr).decode("utf-8", "replace").splitlines():
            print(f"openshell-sandbox: cp: workload: {clean(line)}", file=sys.stderr)
    return result


async def _send_stdin(stream: trio.abc.HalfCloseableStream, chunks: Iterator[bytes] | None) -> None:
    try:
        for chunk in chunks or ():
            await stream.send_all(encode_frame(Stdin(chunk)))
        await stream.send_all(encode_frame(StdinEof()))
    except (trio.BrokenResourceError, trio.ClosedResourceError):
        pass  # the process ended early: its exit says why


async def _read(stream: trio.abc.ReceiveStream, on_stdout: Callable[[bytes], None], stderr: bytearray) -> ExitResult:
    decoder = ChannelDecoder(Direction.TO_CLIENT)
    while True:
        try:
            event = decoder.next_frame()
        except ChannelProtocolError as exc:
            raise CopyFailed(f"bad frame from the sandbox: {exc}", ExitCode.SELF_FAILED) from None
        if event is NEED_DATA:
            try:
                decoder.receive_data(await stream.receive_some(_READ))
            except (trio.BrokenResourceError, trio.ClosedResourceError) as exc:
                raise CopyFailed(f"the exec stream broke: {exc}", ExitCode.SELF_FAILED) from None
            continue
        if event is CLOSED:
            raise CopyFailed("the exec stream closed before the process exit was reported", ExitCode.SELF_FAILED)
        match event:
            case Stdout(data):
                on_stdout(data)
            case Stderr(data):
                stderr.extend(data[: max(0, MAX_STDERR - len(stderr))])
            case Exit(result):
                return result
            case Error(error):
                launch = f" (stage {error.stage})" if error.stage else ""
                raise CopyFailed(f"the workload's tar could not run: {error.reason or error.kind}{launch}")
