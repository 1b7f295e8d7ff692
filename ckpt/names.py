"""The coordinator's name service: a job-wide key-value store its
processes use to find each other's new ids, claim shared things and count
themselves into barriers of their own (docs/PROTOCOL.md)."""

import asyncio

# name-service keys that live for one checkpoint: open files and sockets,
# shared memory, System V and message queue claims, thawed stopped processes
SPENT_BY_NEXT_CHECKPOINT = ("file:", "sock:", "shm:", "sysv:", "mq:", "stopped:", "backlog:")


class NameService:
    """The job's keys and values, and the requests that read and change them."""

    def __init__(self):
        self.values = {}
        self._changed = asyncio.Event()   # set, and replaced, by every change

    def forget_spent(self):
        """The claims and marks of earlier checkpoints (a job checkpointed
        for days must not keep them all)."""
        self.values = {k: v for k, v in self.values.items()
                       if not k.startswith(SPENT_BY_NEXT_CHECKPOINT)}

    def put(self, key, value):
        self.values[key] = value
        self._changed.set()
        self._changed = asyncio.Event()

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
        """A barrier of the processes that count themselves in with INCR."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + seconds
        while self._count(key) < n:
            left = deadline - loop.time()
            if left <= 0:
                return f"NONE {self._count(key)}"
            try:
                await asyncio.wait_for(self._changed.wait(), left)
            except asyncio.TimeoutError:
                pass
        return f"VAL {self._count(key)}"

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
        while not all(k in self.values for k in keys):
            left = deadline - asyncio.get_running_loop().time()
            if left <= 0:
                return "NONE " + " ".join(k for k in keys if k not in self.values)
            try:
                await asyncio.wait_for(self._changed.wait(), left)
            except asyncio.TimeoutError:
                pass
        return "VAL " + " ".join(self.values[k] for k in keys)
