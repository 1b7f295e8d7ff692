"""The coordinator's name service: a job-wide key-value store its
processes use to find each other's new ids, claim shared things and count
themselves into barriers of their own (docs/PROTOCOL.md)."""

import asyncio
import heapq
import itertools

# name-service keys that live for one checkpoint: open files and sockets,
# shared memory, System V and message queue claims, thawed stopped
# processes, ptys' claims (a job checkpointed 1,000 times keeps none of them)
SPENT_BY_NEXT_CHECKPOINT = ("file:", "sock:", "shm:", "sysv:", "mq:", "stopped:", "backlog:",
                            "pty:")


class NameService:
    """The job's keys and values, and the requests that read and change them."""

    def __init__(self):
        self.values = {}
        # requests waiting, by the key they wait for: a PUT wakes its own
        # key's waiters, not every waiter of the job (a restart's thousands
        # of cross-host connections each wait for one key)
        self._arrivals = {}               # key -> {future}: until it is put
        self._counts = {}                 # key -> heap of (count, n, future): until it reaches count
        self._dead = {}                   # key -> entries of its heap whose waiter timed out
        self._order = itertools.count()

    def forget_spent(self):
        """The claims and marks of earlier checkpoints (a job checkpointed
        for days must not keep them all)."""
        self.values = {k: v for k, v in self.values.items()
                       if not k.startswith(SPENT_BY_NEXT_CHECKPOINT)}

    def put(self, key, value):
        self.values[key] = value
        for future in self._arrivals.pop(key, ()):
            if not future.done():
                future.set_result(None)
        waiting = self._counts.get(key)
        if waiting:
            count = self._count(key)
            while waiting and waiting[0][0] <= count:
                future = heapq.heappop(waiting)[2]
                if not future.done():
                    future.set_result(None)
                elif self._dead.get(key):
                    self._dead[key] -= 1
            if not waiting:
                del self._counts[key]
                self._dead.pop(key, None)

    @staticmethod
    async def _until(future, deadline):
        """Whether future was set before the loop's time reached deadline."""
        left = deadline - asyncio.get_running_loop().time()
        if left > 0:
            try:
                await asyncio.wait_for(future, left)
                return True
            except asyncio.TimeoutError:
                pass
        return False

    def _drop_waiter(self, key, future):
        """A counter's waiter that timed out.  Every waiter of a long barrier
        may time out at once (AWAIT is asked in slices of seconds): its entry
        is only cancelled, and the heap is compacted when most of it is
        cancelled entries, so that dropping them all stays linear."""
        future.cancel()
        waiting = self._counts.get(key)
        if waiting is None:
            return
        dead = self._dead.get(key, 0) + 1
        if dead * 2 > len(waiting):
            waiting[:] = [entry for entry in waiting if not entry[2].done()]
            heapq.heapify(waiting)
            dead = 0
        if waiting:
            self._dead[key] = dead
        else:
            self._counts.pop(key, None)
            self._dead.pop(key, None)

    async def _arrival(self, key, deadline):
        """Until key is put; False if the deadline came first."""
        future = asyncio.get_running_loop().create_future()
        waiting = self._arrivals.setdefault(key, set())
        waiting.add(future)
        try:
            return await self._until(future, deadline)
        finally:
            waiting.discard(future)
            if not waiting and self._arrivals.get(key) is waiting:
                del self._arrivals[key]

    def forget_checkpoint(self, number):
        """Keys `<plugin>:<number>:...` belong to one checkpoint: an attempt
        that failed must not leave its counters to the next one, which gets
        the same number."""
        infix = f":{number}:"
        self.values = {k: v for k, v in self.values.items()
                       if infix not in k or k.index(infix) != k.find(":")}

    def _count(self, key):
        try:
            return int(self.values.get(key, "0"))
        except ValueError:
            return 0

    async def _await_count(self, seconds, key, n):
        """A barrier of the processes that count themselves in with INCR:
        each waiter is woken once, when the count reaches its n."""
        loop = asyncio.get_running_loop()
        if self._count(key) < n:
            future = loop.create_future()
            heapq.heappush(self._counts.setdefault(key, []), (n, next(self._order), future))
            if not await self._until(future, loop.time() + seconds):
                self._drop_waiter(key, future)
        count = self._count(key)
        return f"VAL {count}" if count >= n else f"NONE {count}"

    async def answer(self, word, rest):
        """The answer to one name-service request (docs/PROTOCOL.md)."""
        if word == "PUT":
            key, _, value = rest.partition(" ")
            self.put(key, value)
            return "OK"
        if word == "MPUT":  # k1 v1 k2 v2 ...: many ids in one round trip
            fields = rest.split()
            for key, value in zip(fields[0::2], fields[1::2]):
                self.put(key, value)
            return "OK"
        if word == "CLAIM":  # PUT unless taken: the first process wins
            key, _, value = rest.partition(" ")
            if key not in self.values:
                self.put(key, value)
            owner = self.values[key]
            return "OK" if owner == value else f"VAL {owner}"
        if word == "GET":
            value = self.values.get(rest.strip())
            return "NONE" if value is None else f"VAL {value}"
        if word == "INCR":  # a counter: processes count themselves in
            key = rest.strip()
            try:
                count = int(self.values.get(key, "0")) + 1
            except ValueError:
                return f"ERR {key} is not a counter"
            self.put(key, str(count))
            return f"VAL {count}"
        if word == "AWAIT":  # AWAIT seconds key n: until counter key reaches n
            fields = rest.split()
            if len(fields) != 3:
                return "ERR malformed AWAIT"
            return await self._await_count(float(fields[0]), fields[1], int(fields[2]))
        # MWAIT seconds k1 k2 ...: every value, once all are there
        fields = rest.split()
        if not fields:
            return "NONE"
        deadline = asyncio.get_running_loop().time() + float(fields[0])
        keys = fields[1:]
        # one missing key at a time, each waited for on its own
        missing = [k for k in keys if k not in self.values]
        while missing:
            arrived = await self._arrival(missing[0], deadline)
            # a key may have been forgotten since it came (a new checkpoint)
            missing = [k for k in keys if k not in self.values]
            if missing and not arrived:
                return "NONE " + " ".join(missing)
        return "VAL " + " ".join(self.values[k] for k in keys)
