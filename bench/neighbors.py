"""`loraplex bench neighbors`: does one tenant slow another? A bystander tenant streams steady
chat requests while an attacker tenant sends, in turn, each attack a tenant can send, then all
of them at once. For each attack, beside the bystander's quiet baseline measured in the same
run (a quiet window just before each attack): the bystander's TTFT p95 over quiet, its
errors, the API process's peak memory growth, the API's CPU over the window (in cores, its
parse process included; beside the quiet window's) and the longest event-loop stall the API
logged (`loop_stall_log_ms`, CPU time on the loop), its own work apart from garbage collection.
The bystander's client runs above the platform's priority and the attacker's client at the
lowest, each in a process and session of its own (the kernel shares a core between sessions
before it ranks threads by nice): each stands for a client on a machine of its own.

Attacks: 4 MB prompts, 200 MB bodies (sent chunked), deeply nested JSON, byte-token floods
(the attacker's adapter pushed onto lone UTF-8 continuation bytes with `logit_bias`),
console sign-in floods, parallel large uploads, and connect-and-leave before the first token.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import multiprocessing
import os
import re
import signal
import socket
import statistics
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
from rich.console import Console

from loraplex.bench.serve import pct
from loraplex.bench.serve_stack import StackInfo, local_stack
from loraplex.platform.embedded.process import die_with_parent
from loraplex.platform.settings import Settings

console = Console(stderr=True)
STALL_LINE = re.compile(
    r"event loop held for ([0-9.]+) ms of CPU by .* \(([0-9.]+) ms of it collecting garbage\)"
)
ATTACKS = (
    "long_prompts",
    "huge_bodies",
    "nested_json",
    "byte_tokens",
    "signin_flood",
    "uploads",
    "leave_early",
)


def pin(pid: int, cores: set[int]) -> None:
    """Move every thread of process `pid` and of its descendants (the replica's engine
    process) onto `cores`."""
    with contextlib.suppress(OSError):
        for task in Path(f"/proc/{pid}/task").iterdir():
            with contextlib.suppress(OSError):
                os.sched_setaffinity(int(task.name), cores)
    for child in children_of(pid):
        pin(child, cores)


def children_of(pid: int) -> list[int]:
    """The processes whose parent is `pid` (from /proc)."""
    out = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        with contextlib.suppress(OSError, ValueError, IndexError):
            # the fields after the command's closing parenthesis: state, ppid, ...
            if int(stat.read_text().rsplit(")", 1)[1].split()[1]) == pid:
                out.append(int(stat.parent.name))
    return out


def split_cores() -> tuple[set[int], set[int]] | None:
    """(cores for the replica, cores for everything else), half each; None on one core."""
    cores = sorted(os.sched_getaffinity(0))
    if len(cores) < 2:
        return None
    half = len(cores) // 2
    return set(cores[half:]), set(cores[:half])


def _raise_priority(nice: int = -10) -> None:
    """Run this (bystander client) thread above the platform's processes: a real bystander's
    client runs on its own machine, so the time its two streams wait for this shared core
    behind the API's work is the bench's, not the platform's (as the attacker's client runs at
    the lowest priority). Needs the right to lower a nice value (root); else it stays at 0."""
    with contextlib.suppress(AttributeError, OSError):
        os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), nice)


def _own_session(nice: int) -> None:
    """Give this (client) process a session of its own, weighted as nice `nice` against the
    platform's. A nice value alone is not enough where the kernel groups tasks by session
    (autogroup, on by default): it then ranks threads only against their own session, and
    each session as a whole gets an equal share of a busy core. Out of the bench's session,
    Ctrl-C no longer reaches it: it dies with the bench instead. A weight above the default
    needs root (else it stays at the default)."""
    die_with_parent(signal.SIGTERM)()
    with contextlib.suppress(OSError):
        os.setsid()
    with contextlib.suppress(OSError):
        Path("/proc/self/autogroup").write_text(str(nice))


def _lowest_priority() -> None:
    """Run this (attacker client) process below everything else on the machine: a session of
    its own at the lowest weight, and nice 19 inside it."""
    _own_session(19)
    os.nice(19)


def cpu_seconds(pid: int) -> float:
    """User and system CPU seconds of process `pid` and its descendants (0 when gone)."""
    total = 0.0
    with contextlib.suppress(OSError, ValueError, IndexError):
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        total = (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    return total + sum(cpu_seconds(child) for child in children_of(pid))


def rss_kib(pid: int) -> int:
    """Resident memory of a process (KiB), 0 when it is gone."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    except OSError:
        return 0
    return 0


class Bystander:
    """Steady streamed chat requests from another tenant, sent from a process of its own (a
    session above the platform's weight: see `_own_session`); TTFT and errors per window."""

    def __init__(self, url: str, key: str, model: str, streams: int, nice: int = -10) -> None:
        self.url, self.key, self.model, self.streams = url, key, model, streams
        self.nice = nice
        self._proc: Any = None
        self._stop: Any = None
        self._results: Any = None

    def _loop(self, stop: Any, ttfts: list[float], errors: list[int]) -> None:
        body = {
            "model": self.model,
            "messages": [{"role": "user", "content": "tell me a story"}],
            "max_tokens": 16,
            "stream": True,
        }
        headers = {"Authorization": f"Bearer {self.key}"}
        _raise_priority(self.nice)
        with httpx.Client(timeout=60) as client:
            while not stop.is_set():
                started = time.monotonic()
                try:
                    with client.stream(
                        "POST", f"{self.url}/v1/chat/completions", json=body, headers=headers
                    ) as resp:
                        if resp.status_code != 200:
                            errors.append(resp.status_code)
                            continue
                        first = None
                        for line in resp.iter_lines():
                            if first is None and line.startswith("data: {"):
                                first = time.monotonic() - started
                        if first is None:
                            errors.append(0)
                        else:
                            ttfts.append(first)
                except httpx.HTTPError:
                    errors.append(0)
                time.sleep(0.05)

    def _serve(self, stop: Any, results: Any) -> None:
        """In the bystander's process: the streams until `stop`, then their TTFTs and error
        count back through `results`."""
        _own_session(self.nice)
        ttfts: list[float] = []
        errors: list[int] = []
        threads = [
            threading.Thread(target=self._loop, args=(stop, ttfts, errors))
            for _ in range(self.streams)
        ]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        results.send((ttfts, len(errors)))

    def start(self) -> None:
        """Start the streams (in a process of their own)."""
        ctx = multiprocessing.get_context("fork")
        self._stop = ctx.Event()
        self._results, theirs = ctx.Pipe(duplex=False)
        self._proc = ctx.Process(target=self._serve, args=(self._stop, theirs), daemon=True)
        self._proc.start()
        theirs.close()

    def stop(self) -> tuple[list[float], int]:
        """Stop; the window's TTFTs and error count."""
        self._stop.set()
        if not self._results.poll(120):
            raise RuntimeError("the bystander's process did not report its window")
        ttfts, errors = self._results.recv()
        self._proc.join(60)
        self._results.close()
        return list(ttfts), int(errors)


def _raw(url: str, head: bytes) -> socket.socket:
    host, port = url.removeprefix("http://").split(":")
    sock = socket.create_connection((host, int(port)), timeout=10)
    sock.sendall(head)
    return sock


class Attacker:
    """The attacks, each a function run in a loop by several threads until told to stop."""

    def __init__(self, info: StackInfo, key: str, model: str, byte_token: int, upload_mb: int):
        self.url, self.key, self.model = info[0], key, model
        self.byte_token = byte_token
        self.upload_mb = upload_mb
        # Bodies built once: the attacker's client shares this machine, and its own CPU
        # (4 MB of JSON per request) would be counted against the platform.
        long_prompt = "word " * (780 * 1024)  # ~3.9 MB: under the body limit, past the context
        self._long_body = json.dumps({"model": model, "prompt": long_prompt, "max_tokens": 4})
        self._leave_body = json.dumps(
            {"model": model, "prompt": "word " * 1500, "max_tokens": 64, "stream": True}
        ).encode()

    def _headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.key}", "Content-Type": "application/json"}

    def long_prompts(self, client: httpx.Client) -> None:
        client.post(f"{self.url}/v1/completions", content=self._long_body, headers=self._headers())

    def huge_bodies(self, client: httpx.Client) -> None:
        head = (
            f"POST /v1/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {self.key}\r\n"
            "Content-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n"
        ).encode()
        chunk = b"a" * (1 << 20)
        with _raw(self.url, head) as sock:
            try:
                for _ in range(200):  # 200 MB unless the server cuts it off
                    sock.sendall(b"%x\r\n%s\r\n" % (len(chunk), chunk))
            except OSError:
                pass

    def nested_json(self, client: httpx.Client) -> None:
        client.post(
            f"{self.url}/v1/chat/completions", content=b"[" * 100_000, headers=self._headers()
        )

    def byte_tokens(self, client: httpx.Client) -> None:
        body = {
            "model": self.model,
            "prompt": "x",
            "max_tokens": 1500,
            "logit_bias": {str(self.byte_token): 100},
            "stream": True,
        }
        with client.stream(
            "POST", f"{self.url}/v1/completions", json=body, headers=self._headers()
        ) as resp:
            for _ in resp.iter_bytes():
                pass

    def signin_flood(self, client: httpx.Client) -> None:
        page = client.get(f"{self.url}/console/sign-in")
        found = re.search(r'name="csrf_token" value="([^"]+)"', page.text)
        token = found.group(1) if found else ""
        client.post(
            f"{self.url}/console/sign-in",
            data={"email": "owner@example.com", "password": "wrong", "csrf_token": token},
        )

    def uploads(self, client: httpx.Client) -> None:
        size = self.upload_mb << 20
        head = (
            f"POST /v1/adapters HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {self.key}\r\n"
            "Content-Type: multipart/form-data; boundary=b\r\n"
            f"Content-Length: {size}\r\n\r\n"
        ).encode()
        chunk = b"\0" * (1 << 20)
        with _raw(self.url, head) as sock:
            try:
                for _ in range(self.upload_mb):
                    sock.sendall(chunk)
            except OSError:
                pass

    def leave_early(self, client: httpx.Client) -> None:
        head = (
            f"POST /v1/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {self.key}\r\n"
            "Content-Type: application/json\r\n"
        ).encode()
        body = self._leave_body
        with _raw(self.url, head + b"Content-Length: %d\r\n\r\n" % len(body) + body):
            time.sleep(0.02)  # gone before the first token

    def _threads(self, names: list[str], threads: int, stop: Any) -> None:
        """In the attacker's own process: `threads` threads per attack, each repeating it
        until `stop` is set. The process runs at the lowest priority: on this one machine its
        own CPU (building 4 MB prompts, pushing 200 MB bodies) would otherwise be measured as
        the platform's; a real attacker's client runs on its own machine."""
        _lowest_priority()

        def loop(fn: Callable[[httpx.Client], None]) -> None:
            with httpx.Client(timeout=30) as client:
                while not stop.is_set():
                    with contextlib.suppress(httpx.HTTPError, OSError):
                        fn(client)

        started = [
            threading.Thread(target=loop, args=(getattr(self, name),))
            for name in names
            for _ in range(threads)
        ]
        for t in started:
            t.start()
        for t in started:
            t.join()

    def run(self, names: list[str], threads: int, stop: Any) -> list[Any]:
        """Start the attacks in a process of their own; returns it, to join once `stop` is
        set."""
        if not names:
            return []
        proc = multiprocessing.get_context("fork").Process(
            target=self._threads, args=(names, threads, stop), daemon=True
        )
        proc.start()
        return [proc]


def _stalls_since(log: Path, offset: int) -> tuple[tuple[float, float], int]:
    """The longest loop stall the API logged after byte `offset` of its log (its own work,
    and garbage collection that ran inside a callback), and the log's end."""
    try:
        data = log.read_bytes()
    except OSError:
        return (0.0, 0.0), offset
    work, gc_pause = 0.0, 0.0
    for m in STALL_LINE.finditer(data[offset:].decode(errors="replace")):
        total, collecting = float(m.group(1)), float(m.group(2))
        work, gc_pause = max(work, total - collecting), max(gc_pause, collecting)
    return (work, gc_pause), len(data)


def _tenant(url: str, admin_key: str, name: str, limits: dict[str, int]) -> str:
    headers = {"Authorization": f"Bearer {admin_key}"}
    t = httpx.post(
        f"{url}/admin/v1/tenants", headers=headers, json={"name": name, **limits}, timeout=30
    )
    t.raise_for_status()
    k = httpx.post(
        f"{url}/admin/v1/tenants/{t.json()['id']}/api-keys",
        headers=headers,
        json={"name": "attacker"},
        timeout=30,
    )
    k.raise_for_status()
    return str(k.json()["key"])


def _byte_token(model_dir: Path) -> int:
    from loraplex.platform.tokenizing import load_tokenizer

    tok = load_tokenizer(model_dir)
    for tid in range(tok.vocab_size):
        raw = tok.token_bytes(tid)
        if len(raw) == 1 and 0x80 <= raw[0] < 0xC0:
            return tid
    raise RuntimeError("the model's vocabulary has no lone continuation-byte token")


def _window(
    info: StackInfo, bystander: Bystander, attacker: Attacker, names: list[str], args: Any
) -> tuple[list[float], int, float, float]:
    """One window: the bystander streams while `names` attack (none: a quiet window); its
    TTFTs, errors, the API's peak memory growth (MiB) and the API's CPU (its parse process
    included) over the window, in cores."""
    stop = multiprocessing.get_context("fork").Event()
    api = info.api_pid or 0
    base_rss = rss_kib(api) if api else 0
    peak = base_rss
    cpu0 = cpu_seconds(api) if api else 0.0
    bystander.start()
    threads = attacker.run(names, args.attack_threads, stop)
    start = time.monotonic()
    end = start + args.seconds
    while time.monotonic() < end:
        peak = max(peak, rss_kib(api) if api else 0)
        time.sleep(0.1)
    stop.set()
    ttfts, errors = bystander.stop()
    cores = ((cpu_seconds(api) if api else 0.0) - cpu0) / (time.monotonic() - start)
    for t in threads:
        t.join(timeout=60)
    time.sleep(1.0)  # let the replica drain before the next window
    return ttfts, errors, (peak - base_rss) / 1024, cores


def measure(info: StackInfo, args: argparse.Namespace) -> dict[str, float]:
    """For each attack (and all at once): a quiet window, then the attack; the RESULT
    values, each attack against the quiet window just before it (the machine drifts)."""
    url = info[0]
    # The attacker is an ordinary tenant: the platform's default limits (the bench stack
    # lifts them for everyone else), so what it can do is what any tenant could.
    defaults = Settings()
    limits = {
        "requests_per_minute": defaults.rate_limit_rpm,
        "tokens_per_minute": defaults.rate_limit_tpm,
    }
    attacker = Attacker(
        info, _tenant(url, info.admin_key, "attacker", limits), "demo",
        _byte_token(info.model_dir), args.upload_mb,
    )  # fmt: skip
    bystander = Bystander(url, info[1], "bench-0", args.streams, args.bystander_nice)
    out: dict[str, float] = {}
    _, log_offset = _stalls_since(info.api_log, 0)
    singles = [[a] for a in args.attacks] if args.each else []
    windows = singles + ([list(args.attacks)] if args.all_at_once else [])
    for names in windows:
        label = names[0] if len(names) == 1 else "all"
        rounds = []
        for round_ in range(args.rounds):
            console.print(f"quiet, then attack: {label} (round {round_ + 1} of {args.rounds})")
            calm = _window(info, bystander, attacker, [], args)
            _, log_offset = _stalls_since(info.api_log, log_offset)
            attacked = _window(info, bystander, attacker, names, args)
            stalls, log_offset = _stalls_since(info.api_log, log_offset)
            rounds.append((calm, attacked, stalls))
        # Pooled over the rounds: TTFTs, errors and CPU of both windows; growth and stalls of
        # the attack windows, at their worst.
        quiet = [t for calm, _, _ in rounds for t in calm[0]]
        ttfts = [t for _, attacked, _ in rounds for t in attacked[0]]
        errors = sum(calm[1] + attacked[1] for calm, attacked, _ in rounds)
        growth = max(attacked[2] for _, attacked, _ in rounds)
        cores = statistics.fmean(attacked[3] for _, attacked, _ in rounds)
        quiet_cores = statistics.fmean(calm[3] for calm, _, _ in rounds)
        stall = max(stalls[0] for _, _, stalls in rounds)
        gc_pause = max(stalls[1] for _, _, stalls in rounds)
        quiet_p95 = pct(quiet, 95)
        out[f"{label}_quiet_ttft_p95_ms"] = quiet_p95 * 1000
        out[f"{label}_bystander_ttft_p95_over_quiet"] = pct(ttfts, 95) / quiet_p95
        out[f"{label}_bystander_errors"] = float(errors)
        out[f"{label}_api_peak_rss_growth_mb"] = growth
        out[f"{label}_api_cpu_cores"] = cores
        out[f"{label}_quiet_api_cpu_cores"] = quiet_cores
        out[f"{label}_loop_stall_max_ms"] = stall
        out[f"{label}_gc_pause_max_ms"] = gc_pause
    return out


def _at_least_one(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError("must be at least 1")
    return value


def build_parser() -> argparse.ArgumentParser:
    """The benchmark's options."""
    p = argparse.ArgumentParser(prog="loraplex bench neighbors", description=__doc__)
    p.add_argument("--seconds", type=float, default=10.0, help="length of each window")
    p.add_argument(
        "--rounds",
        type=_at_least_one,
        default=3,
        help="quiet and attack windows alternate this many times per attack, their TTFTs "
        "pooled: one window's p95 rests on its ~8 slowest of ~160 requests, and on this "
        "2-core VM it read 1.16-1.50 over six windows of the same code and stack",
    )
    p.add_argument("--streams", type=int, default=2, help="the bystander's concurrent streams")
    p.add_argument("--attack-threads", type=int, default=3, help="threads per attack")
    p.add_argument("--bystander-nice", type=int, default=-10,
                   help="the bystander's client's weight as a nice value (0: the platform's)")  # fmt: skip
    p.add_argument("--upload-mb", type=int, default=512, help="size of each attacking upload")
    p.add_argument("--attacks", nargs="+", default=list(ATTACKS), choices=ATTACKS)
    p.add_argument("--no-all-at-once", dest="all_at_once", action="store_false")
    p.add_argument(
        "--only-all-at-once",
        dest="each",
        action="store_false",
        help="skip the windows of one attack each (the attacks together only)",
    )
    p.add_argument("--stall-ms", type=float, default=20.0, help="API loop stalls logged past")
    p.add_argument("--keep-logs", type=Path, help="copy the stack's logs here at the end")
    p.add_argument(
        "--shared-cores",
        dest="isolate_replica",
        action="store_false",
        help="let the replica share cores with the API and the clients (default: its own half)",
    )
    return p


def main(argv: list[str]) -> int:
    """Entry point of `loraplex bench neighbors`."""
    parser = build_parser()
    args = parser.parse_args(argv)
    if not (args.each or args.all_at_once):
        parser.error("--only-all-at-once and --no-all-at-once leave no window to measure")
    overrides: dict[str, Any] = {"loop_stall_log_ms": args.stall_ms}
    split = split_cores() if args.isolate_replica else None
    engine: dict[str, Any] = {}
    if split is not None:
        # The replica gets cores of its own, as it would get its own GPU node; the API, the
        # services and the clients (this process's children) share the rest.
        os.sched_setaffinity(0, split[1])  # children start here and inherit it
        engine["cpu_threads"] = len(split[0])
        console.print(f"replica on cores {sorted(split[0])}, the rest on {sorted(split[1])}")
    with local_stack(1, args.keep_logs, overrides, engine) as info:
        if split is not None and info.replica_pid is not None:
            pin(info.replica_pid, split[0])
        results = measure(info, args)
    for name, value in results.items():
        print(f"RESULT neighbors.{name}={value:.4g}")
    return 0
