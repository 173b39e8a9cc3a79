"""A sampling profiler for a benchmark's own process, threads included (cProfile sees one thread):
every ``interval`` s it reads every thread's stack (``sys._current_frames``) and counts, for each
function on a stack whose innermost frame is not waiting (a lock, a sleep, a socket, a select), one
sample inclusive and, for the innermost project frame, one sample exclusive. Wall-clock samples of
running threads: on a loaded machine a rough split of CPU, enough to see where a cost lives."""

from __future__ import annotations

import sys
import threading
from collections import Counter

WAITING = {"wait", "sleep", "acquire", "select", "poll", "recv", "recv_into", "accept", "read", "readinto",
           "_wait_for_tstate_lock", "join", "get", "epoll", "_recv", "sock_recv", "run_forever", "_run_once"}  # fmt: skip


class Sampler:
    def __init__(self, interval: float = 0.005, root: str = "/work") -> None:
        self.interval, self.root = interval, root
        self.inclusive: Counter[str] = Counter()
        self.own: Counter[str] = Counter()
        self.samples = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="sampler", daemon=True)

    def __enter__(self) -> Sampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def _run(self) -> None:
        me = threading.get_ident()
        while not self._stop.wait(self.interval):
            for tid, frame in sys._current_frames().items():
                if tid == me or frame.f_code.co_name in WAITING:
                    continue
                self.samples += 1
                seen, first_own = set(), None
                f = frame
                while f is not None:
                    code = f.f_code
                    key = f"{code.co_filename.rsplit('/', 2)[-2:][-1]}:{code.co_name}"
                    if code.co_filename.startswith(self.root) and "/.venv/" not in code.co_filename:
                        key = f"{code.co_filename.removeprefix(self.root)}:{code.co_name}"
                        first_own = first_own or key
                    if key not in seen:
                        self.inclusive[key] += 1
                        seen.add(key)
                    f = f.f_back
                self.own[first_own or "(library only)"] += 1

    def report(self, top: int = 40) -> str:
        lines = [f"{self.samples} samples of running threads"]
        lines += [f"{n:7d} incl  {k}" for k, n in self.inclusive.most_common(top)]
        lines += [f"{n:7d} own   {k}" for k, n in self.own.most_common(top // 2)]
        return "\n".join(lines)
