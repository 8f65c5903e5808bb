#!/usr/bin/env python3
"""The gateway's compatibility with Redis, command by command: the same everyday commands are
sent to `dmkit resp` and to a real redis-server, through redis-py at its defaults (RESP3) and
through redis-cli (RESP2, one session fed on stdin), and every reply is compared.

Run by tests/tests/resp_redis.rs (the redis tier, .ci/tier-redis.sh):

    compat.py --gateway PORT --redis PORT [--client py|cli|both]

Prints a table (one row per command: whether redis-py and redis-cli saw the same reply from
both servers), the match rate, and the allow-list of deliberate differences with the reason
beside each. Exits non-zero when a command differs and is not in the allow-list, when an
allow-listed command no longer differs (the list must stay true), or when fewer than 90% of the
commands match.

Replies whose values legitimately differ between two servers (TIME, CLIENT ID, INFO's fields,
TTLs counting down) are compared by shape or range, not bytes: the mode beside the command.
"""
import argparse
import re
import subprocess
import sys

# (command, how its replies are compared). Modes:
#   exact       the same reply
#   range LO HI both integers within [LO, HI]
#   shape       the same structure and types (cli: the same text with digits replaced)
#   sorted      the same elements in any order
#   scan        SCAN: the same cursor and the same keys in any order
#   sections    INFO: the same section headers
#   contains T  both contain T
# Commands between MULTI and EXEC/DISCARD are compared one by one through redis-py, and as one
# unit through redis-cli (its session cannot mark the end of a queued command's reply).
COMMANDS = [
    # strings: SET and its options
    ("SET c:s hello", "exact"),
    ("GET c:s", "exact"),
    ("GET c:missing", "exact"),
    ("SET c:s world NX", "exact"),
    ("SET c:s world XX", "exact"),
    ("SET c:none v XX", "exact"),
    ("SET c:s again GET", "exact"),
    ("SET c:new first NX GET", "exact"),
    ("SET c:t v EX 100", "exact"),
    ("TTL c:t", "range 99 100"),
    ("SET c:t v PX 100000", "exact"),
    ("PTTL c:t", "range 99000 100000"),
    ("SET c:t v EXAT 4102444800", "exact"),
    ("EXPIRETIME c:t", "exact"),
    ("SET c:t v PXAT 4102444800000", "exact"),
    ("PEXPIRETIME c:t", "exact"),
    ("SET c:t v2 KEEPTTL", "exact"),
    ("PEXPIRETIME c:t", "exact"),
    ("SET c:t v3", "exact"),
    ("TTL c:t", "exact"),
    ("SET c:t v EX 0", "exact"),
    ("SET c:t v EX abc", "exact"),
    ("SET c:t v NX XX", "exact"),
    ("SET c:t v EX 10 PX 10", "exact"),
    ("SETNX c:nx 1", "exact"),
    ("SETNX c:nx 2", "exact"),
    ("SETEX c:ex 100 v", "exact"),
    ("TTL c:ex", "range 99 100"),
    ("PSETEX c:px 100000 v", "exact"),
    ("PTTL c:px", "range 99000 100000"),
    ("SETEX c:ex 0 v", "exact"),
    ("GETSET c:s newer", "exact"),
    ("GETDEL c:s", "exact"),
    ("GETDEL c:s", "exact"),
    ("SET c:g val", "exact"),
    ("GETEX c:g", "exact"),
    ("GETEX c:g EX 100", "exact"),
    ("TTL c:g", "range 99 100"),
    ("GETEX c:g PX 200000", "exact"),
    ("GETEX c:g EXAT 4102444800", "exact"),
    ("GETEX c:g PXAT 4102444800000", "exact"),
    ("GETEX c:g PERSIST", "exact"),
    ("TTL c:g", "exact"),
    ("GETEX c:g EX 0", "exact"),
    ("MSET c:a 1 c:b 2 c:c 3", "exact"),
    ("MGET c:a c:b c:missing c:c", "exact"),
    ("MSETNX c:m1 1", "exact"),
    ("MSETNX c:m1 2", "exact"),
    ("MSETNX c:m1 1 c:m9 2", "exact"),
    ("EXISTS c:m9", "exact"),
    ("MGET c:missing", "exact"),
    ("SETNX c:nx2 v", "exact"),
    ("GETSET c:fresh2 v", "exact"),
    ("TTL c:fresh2", "exact"),
    # numbers and ranges
    ("INCR c:counter", "exact"),
    ("INCRBY c:counter 10", "exact"),
    ("DECR c:counter", "exact"),
    ("DECRBY c:counter 5", "exact"),
    ("INCRBYFLOAT c:float 1.5", "exact"),
    ("INCRBYFLOAT c:float 0.25", "exact"),
    ("SET c:f 0.2", "exact"),
    ("INCRBYFLOAT c:f 0.1", "exact"),
    ("INCRBY c:counter -3", "exact"),
    ("DECRBY c:counter x", "exact"),
    ("INCRBYFLOAT c:float abc", "exact"),
    ("INCR c:g", "exact"),
    ("SET c:big 9223372036854775807", "exact"),
    ("INCR c:big", "exact"),
    ("APPEND c:ap hello", "exact"),
    ('APPEND c:ap " world"', "exact"),
    ("STRLEN c:ap", "exact"),
    ("STRLEN c:missing", "exact"),
    ("GETRANGE c:ap 0 4", "exact"),
    ("GETRANGE c:ap -5 -1", "exact"),
    ("SUBSTR c:ap 0 2", "exact"),
    ("SETRANGE c:ap 6 WORLD", "exact"),
    ("GET c:ap", "exact"),
    ("GETRANGE c:ap 100 200", "exact"),
    ("SETRANGE c:ap -1 x", "exact"),
    ("SETRANGE c:sr 3 x", "exact"),
    ("GET c:sr", "exact"),
    ('SET c:bin "a\\x00b\\r\\n"', "exact"),
    ("GET c:bin", "exact"),
    ("STRLEN c:bin", "exact"),
    ('SET "" empty', "exact"),
    ('GET ""', "exact"),
    # keys
    ("EXISTS c:a c:b c:missing", "exact"),
    ("DEL c:a c:missing", "exact"),
    ("UNLINK c:b", "exact"),
    ("TOUCH c:c c:missing c:c", "exact"),
    ("EXISTS c:c c:c", "exact"),
    ("DEL c:missing", "exact"),
    ("TYPE c:c", "exact"),
    ("TYPE c:missing", "exact"),
    ("EXPIRE c:c 100", "exact"),
    ("EXPIRE c:c 100 NX", "exact"),
    ("EXPIRE c:c 200 XX", "exact"),
    ("EXPIRE c:c 50 GT", "exact"),
    ("EXPIRE c:c 300 GT", "exact"),
    ("EXPIRE c:c 100 LT", "exact"),
    ("TTL c:c", "range 99 100"),
    ("PEXPIRE c:c 100000", "exact"),
    ("PTTL c:c", "range 99000 100000"),
    ("EXPIREAT c:c 4102444800", "exact"),
    ("PEXPIREAT c:c 4102444800000", "exact"),
    ("EXPIRETIME c:c", "exact"),
    ("PERSIST c:c", "exact"),
    ("PERSIST c:c", "exact"),
    ("TTL c:missing", "exact"),
    ("PTTL c:c", "exact"),
    ("EXPIRE c:missing 10", "exact"),
    ("EXPIRE c:c 10 NX XX", "exact"),
    ("EXPIRE c:c 10 GT LT", "exact"),
    ("SET c:e1 v", "exact"),
    ("EXPIRE c:e1 -1", "exact"),
    ("EXISTS c:e1", "exact"),
    ("SET c:e2 v EXAT 1", "exact"),
    ("GET c:e2", "exact"),
    ("GETEX c:missing EX 10", "exact"),
    ("COPY c:c c:copy", "exact"),
    ("COPY c:c c:copy", "exact"),
    ("COPY c:c c:copy REPLACE", "exact"),
    ("GET c:copy", "exact"),
    ("COPY c:c c:c2 DB 1", "exact"),
    ("RENAME c:copy c:renamed", "exact"),
    ("EXISTS c:copy c:renamed", "exact"),
    ("RENAME c:missing c:x", "exact"),
    ("RENAMENX c:renamed c:c", "exact"),
    ("RENAMENX c:renamed c:fresh", "exact"),
    ("OBJECT ENCODING c:counter", "exact"),
    ("OBJECT ENCODING c:g", "exact"),
    ("OBJECT ENCODING c:ap", "exact"),
    ("DUMP c:c", "exact"),
    ("SCAN 0 MATCH c:m* COUNT 100", "scan"),
    ("KEYS c:m*", "sorted"),
    ("DBSIZE", "exact"),
    ("RANDOMKEY", "shape"),
    # connection and server
    ("PING", "exact"),
    ("PING hello", "exact"),
    ('ECHO "hi there"', "exact"),
    ("SELECT 0", "exact"),
    ("SELECT 1", "exact"),
    ("SELECT 0", "exact"),
    ("TIME", "shape"),
    ("CLIENT ID", "shape"),
    ("CLIENT SETNAME compat", "exact"),
    ("CLIENT GETNAME", "exact"),
    ("CLIENT INFO", "contains name=compat"),
    ("CLIENT LIST", "contains name=compat"),
    ("CLIENT LIST TYPE pubsub", "exact"),
    ("CLIENT SETINFO lib-name compat", "exact"),
    ("CONFIG GET maxclients", "exact"),
    ("CONFIG GET save", "exact"),
    ("CONFIG GET appendonly", "exact"),
    ("CONFIG GET databases", "exact"),
    ("CONFIG SET timeout 0", "exact"),
    ("COMMAND COUNT", "exact"),
    ("COMMAND INFO get", "exact"),
    ("COMMAND INFO nosuchcommand", "exact"),
    ("COMMAND DOCS get", "exact"),
    ("COMMAND LIST FILTERBY pattern getr*", "exact"),
    ("INFO server", "sections"),
    ("INFO clients", "sections"),
    ("INFO stats", "sections"),
    ("INFO", "sections"),
    ("HELLO 3", "shape"),
    # transactions
    ("MULTI", "exact"),
    ("SET c:tx 1", "exact"),
    ("INCR c:tx", "exact"),
    ("GET c:tx", "exact"),
    ("EXEC", "exact"),
    ("MULTI", "exact"),
    ("SET c:tx1 1", "exact"),
    ("SET c:tx2 2", "exact"),
    ("EXEC", "exact"),
    ("EXISTS c:tx1 c:tx2", "exact"),
    ("WATCH c:tx", "exact"),
    ("MULTI", "exact"),
    ("INCR c:tx", "exact"),
    ("EXEC", "exact"),
    ("UNWATCH", "exact"),
    ("DISCARD", "exact"),
    # other types: this store holds strings only
    ("LPUSH c:list a", "exact"),
    ("HSET c:hash f v", "exact"),
    ("FLUSHDB", "exact"),
    ("DBSIZE", "exact"),
]

# Deliberate differences: command -> why the gateway answers otherwise (docs/OPERATOR.md
# lists them too). A command here must differ; one that differs and is not here fails.
ALLOWED = {
    "MSETNX c:m1 1 c:m9 2": "MSETNX over several keys cannot be one atomic step on this store: refused with an error (Redis answers 0 here: c:m1 exists), nothing set",
    "COPY c:c c:c2 DB 1": "one database (db 0): DB 1 is out of range",
    "SELECT 1": "one database (db 0): SELECT 1 is out of range",
    "OBJECT ENCODING c:ap": "the encoding is derived from the value (int, embstr up to 44 bytes, raw), not from how it was written (Redis makes an APPENDed string raw)",
    "DUMP c:c": "DUMP/RESTORE (Redis's RDB serialization) are not served",
    "CLIENT SETINFO lib-name compat": "the gateway speaks Redis 7.2 (CLIENT SETINFO, which redis-py sends); the redis-server here is 7.0",
    "CONFIG GET databases": "one database",
    "CONFIG SET timeout 0": "CONFIG SET changes nothing on this store and says so",
    "COMMAND COUNT": "counts the commands the gateway serves, not Redis's 240",
    "INFO": "only the sections this store has (server, clients, stats, replication, backend)",
    "EXEC": "a transaction over several keys is refused whole (EXECABORT), nothing applied",
    "EXISTS c:tx1 c:tx2": "follows from the refused transaction: nothing was applied",
    "LPUSH c:list a": "strings only: other types' commands are unknown commands",
    "HSET c:hash f v": "strings only: other types' commands are unknown commands",
}
# EXEC appears three times; only the one closing the two-key transaction differs.
ALLOWED_AT = {"EXEC": 2}


def split(cmd):
    """A command line into its arguments (double quotes with \\x.. \\r \\n \\\\ escapes)."""
    out, cur, i, quoted, any_ = [], bytearray(), 0, False, False
    b = cmd.encode()
    while i < len(b):
        c = b[i : i + 1]
        if quoted:
            if c == b'"':
                quoted = False
            elif c == b"\\":
                n = b[i + 1 : i + 2]
                if n == b"x":
                    cur += bytes([int(b[i + 2 : i + 4], 16)])
                    i += 3
                else:
                    cur += {b"n": b"\n", b"r": b"\r", b"t": b"\t"}.get(n, n)
                    i += 1
            else:
                cur += c
        elif c == b'"':
            quoted, any_ = True, True
        elif c == b" ":
            if cur or any_:
                out.append(bytes(cur))
            cur, any_ = bytearray(), False
        else:
            cur += c
        i += 1
    if cur or any_:
        out.append(bytes(cur))
    return out


def shape(v):
    if isinstance(v, dict):
        return {str(k): shape(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [shape(x) for x in v]
    if isinstance(v, (set, frozenset)):
        return sorted(str(shape(x)) for x in v)
    if isinstance(v, Exception):
        return ("error", str(v))
    return type(v).__name__


def as_text(v):
    if isinstance(v, bytes):
        return v.decode("latin1")
    return str(v)


def same_py(mode, a, b):
    """Whether redis-py's two replies match under `mode`."""
    kind, _, arg = mode.partition(" ")
    if isinstance(a, Exception) or isinstance(b, Exception):
        return type(a) is type(b) and str(a) == str(b)
    if kind == "exact":
        return a == b
    if kind == "range":
        lo, hi = map(int, arg.split())
        return all(isinstance(x, int) and lo <= x <= hi for x in (a, b))
    if kind == "shape":
        return shape(a) == shape(b)
    if kind == "sorted":
        return sorted(a) == sorted(b)
    if kind == "scan":
        return a[0] == b[0] and sorted(a[1]) == sorted(b[1])
    if kind == "sections":
        # redis-py parses INFO into one dict of fields, without the section headers: compare
        # which sections are there by a field each has.
        if isinstance(a, bytes) and isinstance(b, bytes):
            return same_cli(mode, a.decode("latin1"), b.decode("latin1"))
        marks = ("redis_version", "connected_clients", "total_commands_processed", "role")
        return isinstance(a, dict) and isinstance(b, dict) and all(
            (m in a) == (m in b) for m in marks
        )
    if kind == "contains":
        return arg in as_text(a) and arg in as_text(b)
    raise ValueError(mode)


def same_cli(mode, a, b):
    """Whether redis-cli's two outputs (text) match under `mode`."""
    kind, _, arg = mode.partition(" ")
    if kind == "exact":
        return a == b
    if kind == "range":
        lo, hi = map(int, arg.split())
        nums = [re.fullmatch(r"\(integer\) (-?\d+)", x) for x in (a, b)]
        return all(m and lo <= int(m.group(1)) <= hi for m in nums)
    if kind == "shape":
        norm = lambda t: re.sub(r"\d+", "N", re.sub(r'"[^"]*"', '"S"', t))
        return norm(a) == norm(b)
    if kind in ("sorted", "scan"):
        items = lambda t: sorted(re.sub(r"^\s*\d+\) ", "", l) for l in t.splitlines())
        return items(a) == items(b)
    if kind == "sections":
        heads = lambda t: sorted(re.findall(r"^# (\w+)", t, re.M))
        return heads(a) == heads(b)
    if kind == "contains":
        return arg in a and arg in b
    raise ValueError(mode)


def run_py(port):
    import redis

    r = redis.Redis(host="127.0.0.1", port=port)
    r.flushall()
    out = []
    for cmd, _ in COMMANDS:
        try:
            out.append(r.execute_command(*split(cmd)))
        except redis.RedisError as e:
            out.append(e)
    return out


MARK = "@@compat-reply@@"


def cli_quote(arg):
    if arg and all(33 <= c < 127 and c not in b'"\\' for c in arg):
        return arg.decode()
    return '"' + "".join(
        chr(c) if 32 <= c < 127 and c not in b'"\\' else "\\x%02x" % c for c in arg
    ) + '"'


def run_cli(port):
    """One redis-cli session on stdin; an ECHO of a marker after each command (or after each
    MULTI ... EXEC block) splits its output into replies."""
    lines, units, in_multi = ["FLUSHALL", f'ECHO "{MARK}"'], [], False
    for i, (cmd, _) in enumerate(COMMANDS):
        lines.append(" ".join(cli_quote(a) for a in split(cmd)))
        name = cmd.split()[0].upper()
        if name == "MULTI":
            in_multi, start = True, i
        elif name in ("EXEC", "DISCARD") and in_multi:
            in_multi = False
            units.append(list(range(start, i + 1)))
            lines.append(f'ECHO "{MARK}"')
        elif not in_multi:
            units.append([i])
            lines.append(f'ECHO "{MARK}"')
    p = subprocess.run(
        ["redis-cli", "-h", "127.0.0.1", "-p", str(port), "--no-raw"],
        input="\n".join(lines) + "\n",
        capture_output=True,
        text=True,
        errors="replace",
        timeout=120,
    )
    if p.returncode != 0:
        sys.exit(f"redis-cli against port {port} failed: {p.stderr}")
    parts = re.split(r'^(?:\d+# )?"' + re.escape(MARK) + '"$\n?', p.stdout, flags=re.M)
    parts = parts[1:]  # FLUSHALL's
    # A block's replies are compared at its EXEC (or DISCARD); its other commands only
    # through redis-py.
    out = [""] * len(COMMANDS)
    for unit, text in zip(units, parts):
        out[unit[-1]] = text.rstrip("\n")
    if len(parts) < len(units):
        sys.exit(f"redis-cli against port {port}: {len(parts)} replies for {len(units)} commands:\n{p.stdout}")
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--gateway", type=int, required=True)
    ap.add_argument("--redis", type=int, required=True)
    ap.add_argument("--client", choices=["py", "cli", "both"], default="both")
    a = ap.parse_args()
    clients = ["py", "cli"] if a.client == "both" else [a.client]
    seen = {}
    results = {}
    for c in clients:
        run = run_py if c == "py" else run_cli
        results[c] = (run(a.redis), run(a.gateway))
    n = len(COMMANDS)
    rows, matched, allowed, failing, stale = [], 0, 0, [], []
    for i, (cmd, mode) in enumerate(COMMANDS):
        seen[cmd] = seen.get(cmd, 0) + 1
        verdicts = []
        for c in clients:
            rd, gw = results[c]
            ok = (same_py if c == "py" else same_cli)(mode, rd[i], gw[i])
            verdicts.append((c, ok, rd[i], gw[i]))
        is_allowed = cmd in ALLOWED and ALLOWED_AT.get(cmd, seen[cmd]) == seen[cmd]
        if all(ok for _, ok, _, _ in verdicts):
            matched += 1
            status = "match"
            if is_allowed:
                stale.append(cmd)
        elif is_allowed:
            allowed += 1
            status = "allowed"
        else:
            failing.append((cmd, verdicts))
            status = "MISMATCH"
        cols = "  ".join(f"{c}:{'=' if ok else 'x'}" for c, ok, _, _ in verdicts)
        rows.append(f"{i + 1:4}  {status:9} {cols}  {cmd}  [{mode}]")
    print("\n".join(rows))
    rate = 100.0 * matched / n
    print(f"\n{n} commands, {matched} match redis-server ({rate:.1f}%), "
          f"{allowed} allowed differences, {len(failing)} unexpected, clients: {', '.join(clients)}")
    print("\nDeliberate differences (allow-list):")
    for cmd, why in ALLOWED.items():
        print(f"  {cmd}: {why}")
    for cmd, verdicts in failing:
        print(f"\nUNEXPECTED DIFFERENCE: {cmd}")
        for c, ok, rd, gw in verdicts:
            if not ok:
                print(f"  {c}: redis-server {rd!r}\n  {' ' * len(c)}  gateway      {gw!r}")
    for cmd in stale:
        print(f"\nSTALE ALLOW-LIST ENTRY: {cmd} now matches redis-server; remove it")
    if failing or stale or rate < 90.0:
        sys.exit(1)


if __name__ == "__main__":
    main()
