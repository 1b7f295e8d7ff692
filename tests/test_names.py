"""The coordinator's name service under many waiters (ckpt/names.py): a
restart's cross-host connections each wait for one key, a counter barrier
for one count; every request gets its answer and none is left waiting."""

import asyncio
import random

from ckpt.names import NameService


def test_many_waiters_each_get_their_keys_and_none_is_left():
    async def scenario():
        ns = NameService()
        keys = [f"sock:1:{i}" for i in range(500)]
        # each waits for two keys: its own and its neighbour's
        waits = [asyncio.ensure_future(ns.answer("MWAIT", f"10 {keys[i]} {keys[(i + 1) % 500]}"))
                 for i in range(500)]
        counted = [asyncio.ensure_future(ns.answer("AWAIT", f"10 ready {n}")) for n in (1, 250, 500)]
        late = asyncio.ensure_future(ns.answer("AWAIT", "0.05 ready 501"))
        missing = asyncio.ensure_future(ns.answer("MWAIT", "0.05 sock:1:0 nobody"))
        await asyncio.sleep(0)
        order = list(range(500))
        random.Random(33).shuffle(order)
        for i in order:
            assert await ns.answer("PUT", f"{keys[i]} v{i}") == "OK"
            assert await ns.answer("INCR", "ready") is not None
        answers = await asyncio.gather(*waits)
        assert answers == [f"VAL v{i} v{(i + 1) % 500}" for i in range(500)]
        assert await asyncio.gather(*counted) == ["VAL 500"] * 3
        assert await late == "NONE 500"
        assert await missing == "NONE nobody"
        assert ns._arrivals == {} and ns._counts == {}
    asyncio.run(asyncio.wait_for(scenario(), 30))


def test_a_key_forgotten_before_its_waiter_ran_is_waited_for_again():
    async def scenario():
        ns = NameService()
        waiting = asyncio.ensure_future(ns.answer("MWAIT", "5 file:2:a file:2:b"))
        await asyncio.sleep(0)
        await ns.answer("PUT", "file:2:a 1")
        ns.forget_checkpoint(2)        # an attempt that failed: its keys go
        await asyncio.sleep(0.01)
        assert not waiting.done()
        await ns.answer("MPUT", "file:2:a 3 file:2:b 4")
        assert await waiting == "VAL 3 4"
    asyncio.run(asyncio.wait_for(scenario(), 30))


def test_a_barriers_waiters_timing_out_together_are_dropped_and_later_ones_still_wake():
    """Every waiter of a long barrier asks again after its slice: thousands
    time out at once, none is left behind, and the next round's waiters are
    woken when the count is reached (counted, not timed)."""
    async def scenario():
        ns = NameService()
        first = [asyncio.ensure_future(ns.answer("AWAIT", "0.01 fence 5000")) for _ in range(5000)]
        assert await asyncio.gather(*first) == ["NONE 0"] * 5000
        assert ns._counts == {} and ns._dead == {}
        again = [asyncio.ensure_future(ns.answer("AWAIT", "10 fence 3")) for _ in range(100)]
        short = [asyncio.ensure_future(ns.answer("AWAIT", "0.01 fence 3")) for _ in range(100)]
        assert await asyncio.gather(*short) == ["NONE 0"] * 100
        for _ in range(3):
            await ns.answer("INCR", "fence")
        assert await asyncio.gather(*again) == ["VAL 3"] * 100
        assert ns._counts == {} and ns._dead == {}
    asyncio.run(asyncio.wait_for(scenario(), 30))


def test_a_checkpoints_claims_are_gone_by_the_next_so_the_store_does_not_grow():
    """Counted by checkpoint number: the keys each checkpoint's shims claim
    (the formats of native/shim/state/*.c and the coordinator's stopped
    keys) are forgotten when the next one starts, so the store holds as
    many keys at checkpoint 100 as at checkpoint 1 (a restart epoch's keys,
    such as the ib plugin's, stay)."""
    per_checkpoint = ("file:{n}:h1:42", "sock:{n}:h1:7", "sock:ready:h1:{n}", "shm:{n}:h1",
                      "sysv:{n}:h1", "mq:{n}:h1:9", "stopped:{n}:h1:100", "backlog:{n}:h1:5",
                      "pty:{n}:h1:3")
    names = NameService()
    names.put("ib:1:lid:5", "17")
    sizes = {}
    for n in range(1, 101):
        names.forget_spent()                     # as each checkpoint starts
        for key in per_checkpoint:
            names.put(key.format(n=n), "1")
        sizes[n] = len(names.values)
    assert sizes[1] == sizes[10] == sizes[100] == len(per_checkpoint) + 1
    assert names.values["ib:1:lid:5"] == "17"
