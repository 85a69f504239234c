"""Every known copy of each adapter version: version key -> its sources, one per (tenant, place).

Two tenants that upload the same bytes get the same version key (one host/device copy, one
prefix-cache identity) but keep their own objects. Keeping only the first tenant's location
would break the second tenant's adapter as soon as the first deletes its copy and the version
is evicted. So a key keeps one source per (tenant, location); a fetch tries the most recently
requested (or last working) copy first and falls back to the others; a copy that failed moves
to the back, so a deleted copy costs at most one failed read per fetch until it ages out.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterator
from pathlib import Path

from loraplex.platform.engine.lora.sources import DirSource, ObjectSource

Source = ObjectSource | DirSource
# A key keeps at most this many copies (tenants sharing identical bytes); the oldest goes.
MAX_COPIES_PER_KEY = 64


def _place(source: Source) -> tuple[str | None, str]:
    """Who owns a copy and where it lives."""
    if isinstance(source, ObjectSource):
        return source.tenant, "s3:" + source.ref.object_prefix
    return source.tenant, "dir:" + str(Path(source.path))


class SourceMap:
    """Version key -> the sources that hold it, most recently requested last."""

    def __init__(self, max_copies: int = MAX_COPIES_PER_KEY) -> None:
        self._by_key: dict[str, OrderedDict[tuple[str | None, str], Source]] = {}
        self.max_copies = max_copies

    def add(self, source: Source) -> None:
        """Remember `source` for its key as the copy to try first."""
        copies = self._by_key.setdefault(source.key, OrderedDict())
        place = _place(source)
        copies.pop(place, None)
        copies[place] = source
        while len(copies) > self.max_copies:
            copies.popitem(last=False)

    def copies(self, key: str) -> list[Source]:
        """The sources of `key`, the one to try first first."""
        return list(reversed(self._by_key.get(key, {}).values()))

    def _move(self, source: Source, *, first: bool) -> None:
        copies = self._by_key.get(source.key)
        place = _place(source)
        if copies is not None and place in copies:
            copies.move_to_end(place, last=first)

    def fetch(self, key: str) -> tuple[Source, bytes, bytes]:
        """Both files of `key` from the first copy that has them (a failing copy goes to the
        back, the working one to the front); raises the first copy's error when none has them."""
        candidates = self.copies(key)
        if not candidates:
            raise KeyError(f"no source for adapter {key[:12]}")
        first_error: BaseException | None = None
        for source in candidates:
            try:
                cfg, weights = source.fetch()
            except Exception as exc:  # noqa: BLE001 - try the next copy, report the first
                self._move(source, first=False)
                first_error = first_error or exc
            else:
                self._move(source, first=True)
                return source, cfg, weights
        assert first_error is not None
        raise first_error

    def __contains__(self, key: object) -> bool:
        return key in self._by_key

    def __iter__(self) -> Iterator[str]:
        return iter(self._by_key)

    def __len__(self) -> int:
        return len(self._by_key)
