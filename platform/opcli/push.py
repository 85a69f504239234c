"""`loraplex adapters push`: send a PEFT folder to the tenant API and wait for validation.

Small weights go in one multipart/form-data POST; weights of `presign_from` bytes or more go
straight to object storage through the API's presigned multipart upload (one PUT per part,
each ETag collected, then `complete`), with a progress bar on stderr.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

import httpx
from rich.console import Console
from rich.progress import (
    BarColumn,
    DownloadColumn,
    Progress,
    TextColumn,
    TimeRemainingColumn,
    TransferSpeedColumn,
)

from .client import ApiClient, CliError, adapter_path

CONFIG_FILE = "adapter_config.json"
WEIGHTS_FILE = "adapter_model.safetensors"
PRESIGN_FROM = 8 << 20
CHUNK = 1 << 20
PART_TIMEOUT_S = 300.0


@dataclass(frozen=True)
class AdapterFolder:
    """The two files of a PEFT adapter folder."""

    config: Path
    weights: Path

    @property
    def size(self) -> int:
        """Bytes of the weights file."""
        return self.weights.stat().st_size


def adapter_folder(folder: Path) -> AdapterFolder:
    """Check `folder` holds adapter_config.json and adapter_model.safetensors."""
    if not folder.is_dir():
        raise CliError(f"{folder} is not a folder")
    config, weights = folder / CONFIG_FILE, folder / WEIGHTS_FILE
    missing = [p.name for p in (config, weights) if not p.is_file()]
    if missing:
        raise CliError(f"{folder} has no {' or '.join(missing)} (a PEFT adapter folder has both)")
    return AdapterFolder(config, weights)


def _read_chunks(fh: BinaryIO, length: int, advance: Callable[[int], None]) -> Iterator[bytes]:
    left = length
    while left > 0:
        data = fh.read(min(CHUNK, left))
        if not data:
            raise CliError("the weights file shrank while it was being uploaded")
        left -= len(data)
        advance(len(data))
        yield data


class PartProgress:
    """Upload progress on stderr: a live rich bar on a terminal, else one plain line per
    finished part (logs and CI keep a readable record)."""

    def __init__(self, console: Console, label: str, total: int, parts: int) -> None:
        self.console, self.label, self.total, self.parts = console, label, total, parts
        self.done = 0
        self.bar: Progress | None = None
        if console.is_terminal:
            self.bar = Progress(
                TextColumn("[bold]{task.description}"),
                BarColumn(),
                DownloadColumn(),
                TransferSpeedColumn(),
                TimeRemainingColumn(),
                console=console,
            )
            noun = "part" if parts == 1 else "parts"
            self.task = self.bar.add_task(f"{label} ({parts} {noun})", total=total)
            self.bar.start()

    def advance(self, n: int) -> None:
        """Count `n` more bytes sent."""
        self.done += n
        if self.bar is not None:
            self.bar.advance(self.task, n)

    def part_done(self, number: int) -> None:
        """Report a finished part (plain mode)."""
        if self.bar is None:
            pct = 100.0 * self.done / self.total if self.total else 100.0
            mib, total_mib = self.done / (1 << 20), self.total / (1 << 20)
            self.console.print(
                f"{self.label}: part {number}/{self.parts} uploaded, "
                f"{mib:.1f}/{total_mib:.1f} MiB ({pct:.0f}%)",
                highlight=False,
            )

    def close(self) -> None:
        """Stop the live bar."""
        if self.bar is not None:
            self.bar.stop()


def upload_parts(
    plan: dict[str, Any], weights: Path, console: Console, label: str
) -> list[dict[str, Any]]:
    """PUT each presigned part of `weights` (its exact byte range); the parts' ETags."""
    part_size = int(plan["part_size"])
    total = weights.stat().st_size
    parts: list[dict[str, Any]] = []
    progress = PartProgress(console, label, total, len(plan["parts"]))
    try:
        with weights.open("rb") as fh, httpx.Client(timeout=PART_TIMEOUT_S) as s3:
            for part in plan["parts"]:
                number = int(part["part_number"])
                start = (number - 1) * part_size
                length = min(part_size, total - start)
                fh.seek(start)
                body = _read_chunks(fh, length, progress.advance)
                try:
                    resp = s3.put(
                        part["url"], content=body, headers={"Content-Length": str(length)}
                    )
                except httpx.TransportError as exc:
                    raise CliError(f"uploading part {number} failed: {exc}") from None
                if resp.status_code >= 400:
                    raise CliError(
                        f"object storage refused part {number}: HTTP {resp.status_code} "
                        f"{resp.text.strip()[:200]}"
                    )
                parts.append({"part_number": number, "etag": resp.headers["ETag"]})
                progress.part_done(number)
    finally:
        progress.close()
    return parts


def push_presigned(
    api: ApiClient, folder: AdapterFolder, name: str, base_model: str, console: Console
) -> dict[str, Any]:
    """Start a presigned upload, PUT the parts with progress, complete it; the 202 answer."""
    try:
        config = json.loads(folder.config.read_text())
    except ValueError as exc:
        raise CliError(f"{folder.config} is not valid JSON: {exc}") from None
    body = {"base_model": base_model, "adapter_config": config, "size": folder.size}
    path = adapter_path(name)
    plan = api.json("POST", f"{path}/uploads", json=body)
    parts = upload_parts(plan, folder.weights, console, f"{name} v{plan['version']}")
    return api.json(
        "POST",
        f"{path}/uploads/{plan['upload_id']}/complete",
        json={"parts": parts},
    )


def push_direct(
    api: ApiClient, folder: AdapterFolder, name: str, base_model: str
) -> dict[str, Any]:
    """One multipart/form-data POST with both files; the 202 answer."""
    with folder.config.open("rb") as config, folder.weights.open("rb") as weights:
        files = {
            "adapter_config": (CONFIG_FILE, config, "application/json"),
            "adapter_model": (WEIGHTS_FILE, weights, "application/octet-stream"),
        }
        data = {"name": name, "base_model": base_model}
        return api.json("POST", "/v1/adapters", data=data, files=files)


def wait_for_validation(
    api: ApiClient, name: str, version: int, timeout_s: float, console: Console
) -> dict[str, Any]:
    """Poll the version until it is `ready` or `failed` (CliError on timeout)."""
    deadline = time.monotonic() + timeout_s
    with console.status(f"validating {name} v{version}..."):
        while True:
            v = api.json("GET", f"{adapter_path(name)}/versions/{version}")
            if v["status"] in ("ready", "failed"):
                return v
            if time.monotonic() > deadline:
                raise CliError(
                    f"{name} v{version} is still {v['status']!r} after {timeout_s:.0f} s; "
                    f"check later with `loraplex adapters show {name}`"
                )
            time.sleep(0.5)


def push(
    api: ApiClient,
    folder: Path,
    name: str,
    base_model: str,
    *,
    presign_from: int = PRESIGN_FROM,
    wait: bool = True,
    timeout_s: float = 300.0,
    console: Console | None = None,
) -> dict[str, Any]:
    """Upload the folder (presigned when the weights are large) and, with `wait`, return the
    validated version; else the upload's 202 answer."""
    console = console or Console(stderr=True)
    files = adapter_folder(folder)
    if files.size >= presign_from:
        accepted = push_presigned(api, files, name, base_model, console)
    else:
        accepted = push_direct(api, files, name, base_model)
    console.print(f"uploaded {name} v{accepted['version']} ({files.size} bytes)")
    if not wait:
        return accepted
    return wait_for_validation(api, name, int(accepted["version"]), timeout_s, console)
