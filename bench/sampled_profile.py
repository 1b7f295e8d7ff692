"""Where a benchmark's own process spends its time, sampled by py-spy
while a chosen part runs (the coordinator's rounds, not its set-up), and
summarised as the functions that were running (self) and the functions
they were called from (inclusive), in percent of the samples.

    with SampledProfile(path) as profile:   # py-spy attached to this process
        ... the part to profile ...
    profile.print_summary()

py-spy samples from outside (`py-spy record --pid`), so the profiled code
runs at its own speed, unlike under cProfile.  Without py-spy (pip install
py-spy) the summary says so and the benchmark runs on."""

import collections
import os
import re
import shutil
import signal
import subprocess
import time

RATE = 400            # samples per second
START_WAIT = 2.0      # py-spy attaches before the part starts
_LINE = re.compile(r":\d+\)$")


class SampledProfile:
    def __init__(self, path, rate=RATE):
        self.path = str(path)
        self.rate = rate
        self.spy = None
        self.missing = shutil.which("py-spy") is None

    def __enter__(self):
        if self.missing:
            return self
        self.spy = subprocess.Popen(
            ["py-spy", "record", "--nonblocking", "-r", str(self.rate), "-f", "raw",
             "-o", self.path, "--pid", str(os.getpid())],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        time.sleep(START_WAIT)   # its first sample is after it attached
        return self

    def __exit__(self, *exc):
        if self.spy is not None:
            self.spy.send_signal(signal.SIGINT)   # it writes its file and ends
            self.spy.wait(60)
        return False

    def stacks(self):
        """[(frames outermost first, samples)]; line numbers dropped."""
        found = []
        with open(self.path) as raw:
            for line in raw:
                stack, _, count = line.rstrip().rpartition(" ")
                if stack and count.isdigit():
                    found.append(([_LINE.sub(")", f) for f in stack.split(";")], int(count)))
        return found

    def print_summary(self, top=25, within=None):
        """The top functions by self and by inclusive samples; within: only
        the samples whose stack passes through a function of that name
        (e.g. the event loop's, leaving out py-spy's idle ones)."""
        if self.missing:
            print("  (no profile: py-spy is not installed)")
            return
        try:
            stacks = self.stacks()
        except OSError as exc:
            print(f"  (no profile: {exc.strerror})")
            return
        if within:
            stacks = [(frames, n) for frames, n in stacks if any(within in f for f in frames)]
        total = sum(n for _, n in stacks) or 1
        own, inclusive = collections.Counter(), collections.Counter()
        for frames, n in stacks:
            own[frames[-1]] += n
            for frame in set(frames):
                inclusive[frame] += n
        print(f"  {total} samples at {self.rate}/s ({self.path})")
        for title, counter in (("self", own), ("inclusive", inclusive)):
            print(f"  -- {title}")
            # frames under every sample (the event loop's own) say nothing
            shown = [(f, n) for f, n in counter.most_common() if n < total][:top]
            for frame, n in shown:
                print(f"  {100 * n / total:5.1f}%  {frame}")
