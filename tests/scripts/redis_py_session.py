#!/usr/bin/env python3
"""One application session with redis-py at its defaults (the newest release opens with
HELLO 3), run against `dmkit resp` and against a real redis-server by
tests/tests/resp_redis.rs: both must print the same lines.

Usage: redis_py_session.py PORT
"""
import sys

import redis

port = int(sys.argv[1])
r = redis.Redis(host="127.0.0.1", port=port, client_name="session")
r.delete("py:a", "py:b", "py:c", "", "py:bin", "py:n", "py:s")


def show(label, value):
    print(f"{label}: {value!r}")


show("protocol", r.connection_pool.connection_kwargs.get("protocol"))
show("ping", r.ping())
show("set", r.set("py:a", "1"))
show("get", r.get("py:a"))
show("get missing", r.get("py:missing"))
show("set nx existing", r.set("py:a", "2", nx=True))
show("set xx missing", r.set("py:b", "2", xx=True))
show("setnx", r.setnx("py:b", "2"))
show("mset", r.mset({"py:c": "3", "py:a": "4"}))
show("mget", r.mget("py:a", "py:b", "py:c", "py:missing"))
show("exists", r.exists("py:a", "py:b", "py:missing"))
show("empty key set", r.set("", "empty"))
show("empty key get", r.get(""))
show("binary value", r.set("py:bin", b"\x00\xff\r\n") and r.get("py:bin"))
show("client name", r.client_getname())
show("client setname", r.client_setname("renamed"))
show("client name again", r.client_getname())
show("echo", r.echo("hi"))
show("time is a pair", len(r.time()))
show("select 0", r.select(0) if hasattr(r, "select") else True)
p = r.pipeline()  # transaction=True: MULTI/EXEC around one command
p.set("py:a", "5")
show("transaction of one command", p.execute())
p = r.pipeline()  # a transaction of several commands on one key: one atomic step
p.set("py:n", "10")
p.incr("py:n")
p.get("py:n")
show("transaction on one key", p.execute())
r.delete("py:n")


def add_one(pipe):
    # The optimistic-transaction idiom: WATCH, read, MULTI, write, EXEC (redis-py retries
    # when EXEC is aborted).
    cur = int(pipe.get("py:w") or 0)
    pipe.multi()
    pipe.set("py:w", cur + 1)


show("watch transaction", r.transaction(add_one, "py:w"))
show("watched value", r.get("py:w"))
r.delete("py:w")
p = r.pipeline(transaction=False)
p.set("py:b", "6")
p.get("py:b")
p.delete("py:c")
show("pipeline", p.execute())
show("delete", r.delete("py:a", "py:b", "py:missing"))
show("get after delete", r.get("py:a"))
show("incr", r.incr("py:n"))
show("incrby", r.incrby("py:n", 41))
show("decrby", r.decrby("py:n", 2))
show("incrbyfloat", r.incrbyfloat("py:n", 0.5))
show("append", r.append("py:s", "hello"))
show("append again", r.append("py:s", " world"))
show("strlen", r.strlen("py:s"))
show("getrange", r.getrange("py:s", 0, 4))
show("setrange", r.setrange("py:s", 6, "WORLD"))
show("getset", r.getset("py:s", "v2"))
show("set get", r.set("py:s", "v3", get=True))
show("getdel", r.getdel("py:s"))
show("getdel again", r.getdel("py:s"))
try:
    r.incr("py:bin")
except redis.ResponseError as e:
    show("incr of a non-number", str(e))
try:
    r.execute_command("NOSUCHCOMMAND")
except redis.ResponseError as e:
    show("unknown command error", str(e).split(",")[0])
r.delete("", "py:bin", "py:n")
r.mset({"py:k1": "1", "py:k2": "2", "py:other": "3"})
show("dbsize", r.dbsize())
show("keys", sorted(r.keys("py:k*")))
show("scan_iter", sorted(r.scan_iter(match="py:k*", count=2)))
show("type", (r.type("py:k1"), r.type("py:nope")))
show("randomkey is a key", r.randomkey() in (b"py:k1", b"py:k2", b"py:other"))
show("flushdb", r.flushdb())
show("dbsize after flushdb", r.dbsize())
