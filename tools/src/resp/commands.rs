//! The commands the gateway serves, with the metadata Redis 7 gives for them: one table
//! ([`COMMANDS`]) that answers `COMMAND`, `COMMAND INFO`, `COMMAND DOCS`, `COMMAND COUNT` and
//! `COMMAND LIST` in Redis's reply shapes, checks arity when MULTI queues a command, labels
//! metrics, and is the list docs/OPERATOR.md must name (a test compares them).
//!
//! A command the table does not name is not served ("unknown command"); `COMMAND INFO` answers
//! nil for it and `COMMAND DOCS` leaves it out, as Redis does.

use super::codec::Reply;

/// One command (or a container's subcommand, named `parent|sub`) as COMMAND INFO and
/// COMMAND DOCS describe it.
#[derive(Debug)]
pub struct Spec {
    /// Lower case; a subcommand is `container|sub`.
    pub name: &'static str,
    /// Redis's arity: the exact argument count with the name, or `-n` for at least `n`.
    pub arity: i64,
    /// Command flags (space-separated): `readonly`, `write`, `fast`, ...
    pub flags: &'static str,
    /// First key, last key (negative: from the end) and step, as COMMAND INFO gives them.
    pub keys: (i64, i64, i64),
    /// ACL categories (space-separated, with their `@`).
    pub acl: &'static str,
    /// Tips for clients and proxies (space-separated).
    pub tips: &'static str,
    pub key_specs: &'static [KeySpec],
    pub group: &'static str,
    pub since: &'static str,
    pub summary: &'static str,
    pub complexity: &'static str,
    /// The arguments, in the compact form [`parse_args`] reads: `name:type`, `TOKEN=name:type`,
    /// a pure token `TOKEN`, `[...]` optional, `...` after an argument for several,
    /// `name:(a|b)` one of, `name:{a b}` a block.
    pub args: &'static str,
    /// Deprecated: since which version, and what replaces it.
    pub deprecated: Option<(&'static str, &'static str)>,
}

/// A key specification (Redis 7): which arguments are keys and how they are used.
#[derive(Debug)]
pub struct KeySpec {
    /// A remark on the flags (empty: none).
    pub notes: &'static str,
    pub flags: &'static str,
    /// The first key's argument index (the command name is 0).
    pub index: i64,
    /// The last key, relative to the first (negative: from the end).
    pub lastkey: i64,
    pub keystep: i64,
}

const fn ks(flags: &'static str, index: i64, lastkey: i64, keystep: i64) -> KeySpec {
    KeySpec {
        notes: "",
        flags,
        index,
        lastkey,
        keystep,
    }
}

/// Every command served. (Summaries, arities, flags and key specs are Redis 7's, so that
/// clients that probe with COMMAND see what they expect.)
#[rustfmt::skip]
pub const COMMANDS: &[Spec] = &[
    Spec { name: "get", arity: 2, flags: "readonly fast", keys: (1, 1, 1), acl: "@read @string @fast", tips: "",
        key_specs: &[ks("RO access", 1, 0, 1)], group: "string", since: "1.0.0",
        summary: "Get the value of a key",
        complexity: "O(1)",
        args: "key:key", deprecated: None },
    Spec { name: "set", arity: -3, flags: "write denyoom", keys: (1, 1, 1), acl: "@write @string @slow", tips: "",
        key_specs: &[KeySpec { notes: "RW and ACCESS due to the optional `GET` argument", ..ks("RW access update variable_flags", 1, 0, 1) }], group: "string", since: "1.0.0",
        summary: "Set the string value of a key",
        complexity: "O(1)",
        args: "key:key value:string [condition:(NX|XX)] [GET] [expiration:(EX=seconds:integer|PX=milliseconds:integer|EXAT=unix-time-seconds:unix-time|PXAT=unix-time-milliseconds:unix-time|KEEPTTL)]", deprecated: None },
    Spec { name: "setex", arity: 4, flags: "write denyoom", keys: (1, 1, 1), acl: "@write @string @slow", tips: "",
        key_specs: &[ks("OW update", 1, 0, 1)], group: "string", since: "2.0.0",
        summary: "Set the value and expiration of a key",
        complexity: "O(1)",
        args: "key:key seconds:integer value:string", deprecated: None },
    Spec { name: "psetex", arity: 4, flags: "write denyoom", keys: (1, 1, 1), acl: "@write @string @slow", tips: "",
        key_specs: &[ks("OW update", 1, 0, 1)], group: "string", since: "2.6.0",
        summary: "Set the value and expiration in milliseconds of a key",
        complexity: "O(1)",
        args: "key:key milliseconds:integer value:string", deprecated: None },
    Spec { name: "setnx", arity: 3, flags: "write denyoom fast", keys: (1, 1, 1), acl: "@write @string @fast", tips: "",
        key_specs: &[ks("OW insert", 1, 0, 1)], group: "string", since: "1.0.0",
        summary: "Set the value of a key, only if the key does not exist",
        complexity: "O(1)",
        args: "key:key value:string", deprecated: None },
    Spec { name: "getset", arity: 3, flags: "write denyoom fast", keys: (1, 1, 1), acl: "@write @string @fast", tips: "",
        key_specs: &[ks("RW access update", 1, 0, 1)], group: "string", since: "1.0.0",
        summary: "Set the string value of a key and return its old value",
        complexity: "O(1)",
        args: "key:key value:string", deprecated: Some(("6.2.0", "`SET` with the `!GET` argument")) },
    Spec { name: "getdel", arity: 2, flags: "write fast", keys: (1, 1, 1), acl: "@write @string @fast", tips: "",
        key_specs: &[ks("RW access delete", 1, 0, 1)], group: "string", since: "6.2.0",
        summary: "Get the value of a key and delete the key",
        complexity: "O(1)",
        args: "key:key", deprecated: None },
    Spec { name: "getex", arity: -2, flags: "write fast", keys: (1, 1, 1), acl: "@write @string @fast", tips: "",
        key_specs: &[KeySpec { notes: "RW and UPDATE because it changes the TTL", ..ks("RW access update", 1, 0, 1) }], group: "string", since: "6.2.0",
        summary: "Get the value of a key and optionally set its expiration",
        complexity: "O(1)",
        args: "key:key [expiration:(EX=seconds:integer|PX=milliseconds:integer|EXAT=unix-time-seconds:unix-time|PXAT=unix-time-milliseconds:unix-time|PERSIST)]", deprecated: None },
    Spec { name: "mget", arity: -2, flags: "readonly fast", keys: (1, -1, 1), acl: "@read @string @fast", tips: "request_policy:multi_shard",
        key_specs: &[ks("RO access", 1, -1, 1)], group: "string", since: "1.0.0",
        summary: "Get the values of all the given keys",
        complexity: "O(N) where N is the number of keys to retrieve.",
        args: "key:key...", deprecated: None },
    Spec { name: "mset", arity: -3, flags: "write denyoom", keys: (1, -1, 2), acl: "@write @string @slow", tips: "request_policy:multi_shard response_policy:all_succeeded",
        key_specs: &[ks("OW update", 1, -1, 2)], group: "string", since: "1.0.1",
        summary: "Set multiple keys to multiple values",
        complexity: "O(N) where N is the number of keys to set.",
        args: "key_value:{key:key value:string}...", deprecated: None },
    Spec { name: "msetnx", arity: -3, flags: "write denyoom", keys: (1, -1, 2), acl: "@write @string @slow", tips: "request_policy:multi_shard response_policy:agg_min",
        key_specs: &[ks("OW insert", 1, -1, 2)], group: "string", since: "1.0.1",
        summary: "Set multiple keys to multiple values, only if none of the keys exist",
        complexity: "O(N) where N is the number of keys to set.",
        args: "key_value:{key:key value:string}...", deprecated: None },
    Spec { name: "incr", arity: 2, flags: "write denyoom fast", keys: (1, 1, 1), acl: "@write @string @fast", tips: "",
        key_specs: &[ks("RW access update", 1, 0, 1)], group: "string", since: "1.0.0",
        summary: "Increment the integer value of a key by one",
        complexity: "O(1)",
        args: "key:key", deprecated: None },
    Spec { name: "decr", arity: 2, flags: "write denyoom fast", keys: (1, 1, 1), acl: "@write @string @fast", tips: "",
        key_specs: &[ks("RW access update", 1, 0, 1)], group: "string", since: "1.0.0",
        summary: "Decrement the integer value of a key by one",
        complexity: "O(1)",
        args: "key:key", deprecated: None },
    Spec { name: "incrby", arity: 3, flags: "write denyoom fast", keys: (1, 1, 1), acl: "@write @string @fast", tips: "",
        key_specs: &[ks("RW access update", 1, 0, 1)], group: "string", since: "1.0.0",
        summary: "Increment the integer value of a key by the given amount",
        complexity: "O(1)",
        args: "key:key increment:integer", deprecated: None },
    Spec { name: "decrby", arity: 3, flags: "write denyoom fast", keys: (1, 1, 1), acl: "@write @string @fast", tips: "",
        key_specs: &[ks("RW access update", 1, 0, 1)], group: "string", since: "1.0.0",
        summary: "Decrement the integer value of a key by the given number",
        complexity: "O(1)",
        args: "key:key decrement:integer", deprecated: None },
    Spec { name: "incrbyfloat", arity: 3, flags: "write denyoom fast", keys: (1, 1, 1), acl: "@write @string @fast", tips: "",
        key_specs: &[ks("RW access update", 1, 0, 1)], group: "string", since: "2.6.0",
        summary: "Increment the float value of a key by the given amount",
        complexity: "O(1)",
        args: "key:key increment:double", deprecated: None },
    Spec { name: "append", arity: 3, flags: "write denyoom fast", keys: (1, 1, 1), acl: "@write @string @fast", tips: "",
        key_specs: &[ks("RW insert", 1, 0, 1)], group: "string", since: "2.0.0",
        summary: "Append a value to a key",
        complexity: "O(1)",
        args: "key:key value:string", deprecated: None },
    Spec { name: "strlen", arity: 2, flags: "readonly fast", keys: (1, 1, 1), acl: "@read @string @fast", tips: "",
        key_specs: &[ks("RO", 1, 0, 1)], group: "string", since: "2.2.0",
        summary: "Get the length of the value stored in a key",
        complexity: "O(1)",
        args: "key:key", deprecated: None },
    Spec { name: "getrange", arity: 4, flags: "readonly", keys: (1, 1, 1), acl: "@read @string @slow", tips: "",
        key_specs: &[ks("RO access", 1, 0, 1)], group: "string", since: "2.4.0",
        summary: "Get a substring of the string stored at a key",
        complexity: "O(N) where N is the length of the returned string.",
        args: "key:key start:integer end:integer", deprecated: None },
    Spec { name: "substr", arity: 4, flags: "readonly", keys: (1, 1, 1), acl: "@read @string @slow", tips: "",
        key_specs: &[ks("RO access", 1, 0, 1)], group: "string", since: "1.0.0",
        summary: "Get a substring of the string stored at a key",
        complexity: "O(N) where N is the length of the returned string.",
        args: "key:key start:integer end:integer", deprecated: Some(("2.0.0", "`GETRANGE`")) },
    Spec { name: "setrange", arity: 4, flags: "write denyoom", keys: (1, 1, 1), acl: "@write @string @slow", tips: "",
        key_specs: &[ks("RW update", 1, 0, 1)], group: "string", since: "2.2.0",
        summary: "Overwrite part of a string at key starting at the specified offset",
        complexity: "O(M) with M being the length of the value argument.",
        args: "key:key offset:integer value:string", deprecated: None },
    Spec { name: "del", arity: -2, flags: "write", keys: (1, -1, 1), acl: "@keyspace @write @slow", tips: "request_policy:multi_shard response_policy:agg_sum",
        key_specs: &[ks("RM delete", 1, -1, 1)], group: "generic", since: "1.0.0",
        summary: "Delete a key",
        complexity: "O(N) where N is the number of keys that will be removed.",
        args: "key:key...", deprecated: None },
    Spec { name: "unlink", arity: -2, flags: "write fast", keys: (1, -1, 1), acl: "@keyspace @write @fast", tips: "request_policy:multi_shard response_policy:agg_sum",
        key_specs: &[ks("RM delete", 1, -1, 1)], group: "generic", since: "4.0.0",
        summary: "Delete a key asynchronously in another thread. Otherwise it is just as DEL, but non blocking.",
        complexity: "O(N) where N is the number of keys that will be removed.",
        args: "key:key...", deprecated: None },
    Spec { name: "exists", arity: -2, flags: "readonly fast", keys: (1, -1, 1), acl: "@keyspace @read @fast", tips: "request_policy:multi_shard response_policy:agg_sum",
        key_specs: &[ks("RO", 1, -1, 1)], group: "generic", since: "1.0.0",
        summary: "Determine if a key exists",
        complexity: "O(N) where N is the number of keys to check.",
        args: "key:key...", deprecated: None },
    Spec { name: "type", arity: 2, flags: "readonly fast", keys: (1, 1, 1), acl: "@keyspace @read @fast", tips: "",
        key_specs: &[ks("RO", 1, 0, 1)], group: "generic", since: "1.0.0",
        summary: "Determine the type stored at key",
        complexity: "O(1)",
        args: "key:key", deprecated: None },
    Spec { name: "scan", arity: -2, flags: "readonly", keys: (0, 0, 0), acl: "@keyspace @read @slow", tips: "nondeterministic_output request_policy:special",
        key_specs: &[], group: "generic", since: "2.8.0",
        summary: "Incrementally iterate the keys space",
        complexity: "O(1) for every call. O(N) for a complete iteration.",
        args: "cursor:integer [MATCH=pattern:pattern] [COUNT=count:integer] [TYPE=type:string]", deprecated: None },
    Spec { name: "keys", arity: 2, flags: "readonly", keys: (0, 0, 0), acl: "@keyspace @read @slow @dangerous", tips: "request_policy:all_shards nondeterministic_output_order",
        key_specs: &[], group: "generic", since: "1.0.0",
        summary: "Find all keys matching the given pattern",
        complexity: "O(N) with N being the number of keys in the database.",
        args: "pattern:pattern", deprecated: None },
    Spec { name: "dbsize", arity: 1, flags: "readonly fast", keys: (0, 0, 0), acl: "@keyspace @read @fast", tips: "request_policy:all_shards response_policy:agg_sum",
        key_specs: &[], group: "server", since: "1.0.0",
        summary: "Return the number of keys in the selected database",
        complexity: "O(1)",
        args: "", deprecated: None },
    Spec { name: "randomkey", arity: 1, flags: "readonly", keys: (0, 0, 0), acl: "@keyspace @read @slow", tips: "request_policy:all_shards nondeterministic_output",
        key_specs: &[], group: "generic", since: "1.0.0",
        summary: "Return a random key from the keyspace",
        complexity: "O(1)",
        args: "", deprecated: None },
    Spec { name: "expire", arity: -3, flags: "write fast", keys: (1, 1, 1), acl: "@keyspace @write @fast", tips: "",
        key_specs: &[ks("RW update", 1, 0, 1)], group: "generic", since: "1.0.0",
        summary: "Set a key's time to live in seconds",
        complexity: "O(1)",
        args: "key:key seconds:integer [condition:(NX|XX|GT|LT)]", deprecated: None },
    Spec { name: "pexpire", arity: -3, flags: "write fast", keys: (1, 1, 1), acl: "@keyspace @write @fast", tips: "",
        key_specs: &[ks("RW update", 1, 0, 1)], group: "generic", since: "2.6.0",
        summary: "Set a key's time to live in milliseconds",
        complexity: "O(1)",
        args: "key:key milliseconds:integer [condition:(NX|XX|GT|LT)]", deprecated: None },
    Spec { name: "expireat", arity: -3, flags: "write fast", keys: (1, 1, 1), acl: "@keyspace @write @fast", tips: "",
        key_specs: &[ks("RW update", 1, 0, 1)], group: "generic", since: "1.2.0",
        summary: "Set the expiration for a key as a UNIX timestamp",
        complexity: "O(1)",
        args: "key:key unix-time-seconds:unix-time [condition:(NX|XX|GT|LT)]", deprecated: None },
    Spec { name: "pexpireat", arity: -3, flags: "write fast", keys: (1, 1, 1), acl: "@keyspace @write @fast", tips: "",
        key_specs: &[ks("RW update", 1, 0, 1)], group: "generic", since: "2.6.0",
        summary: "Set the expiration for a key as a UNIX timestamp specified in milliseconds",
        complexity: "O(1)",
        args: "key:key unix-time-milliseconds:unix-time [condition:(NX|XX|GT|LT)]", deprecated: None },
    Spec { name: "ttl", arity: 2, flags: "readonly fast", keys: (1, 1, 1), acl: "@keyspace @read @fast", tips: "nondeterministic_output",
        key_specs: &[ks("RO access", 1, 0, 1)], group: "generic", since: "1.0.0",
        summary: "Get the time to live for a key in seconds",
        complexity: "O(1)",
        args: "key:key", deprecated: None },
    Spec { name: "pttl", arity: 2, flags: "readonly fast", keys: (1, 1, 1), acl: "@keyspace @read @fast", tips: "nondeterministic_output",
        key_specs: &[ks("RO access", 1, 0, 1)], group: "generic", since: "2.6.0",
        summary: "Get the time to live for a key in milliseconds",
        complexity: "O(1)",
        args: "key:key", deprecated: None },
    Spec { name: "expiretime", arity: 2, flags: "readonly fast", keys: (1, 1, 1), acl: "@keyspace @read @fast", tips: "",
        key_specs: &[ks("RO access", 1, 0, 1)], group: "generic", since: "7.0.0",
        summary: "Get the expiration Unix timestamp for a key",
        complexity: "O(1)",
        args: "key:key", deprecated: None },
    Spec { name: "pexpiretime", arity: 2, flags: "readonly fast", keys: (1, 1, 1), acl: "@keyspace @read @fast", tips: "",
        key_specs: &[ks("RO access", 1, 0, 1)], group: "generic", since: "7.0.0",
        summary: "Get the expiration Unix timestamp for a key in milliseconds",
        complexity: "O(1)",
        args: "key:key", deprecated: None },
    Spec { name: "persist", arity: 2, flags: "write fast", keys: (1, 1, 1), acl: "@keyspace @write @fast", tips: "",
        key_specs: &[ks("RW update", 1, 0, 1)], group: "generic", since: "2.2.0",
        summary: "Remove the expiration from a key",
        complexity: "O(1)",
        args: "key:key", deprecated: None },
    Spec { name: "rename", arity: 3, flags: "write", keys: (1, 2, 1), acl: "@keyspace @write @slow", tips: "",
        key_specs: &[ks("RW access delete", 1, 0, 1), ks("OW update", 2, 0, 1)], group: "generic", since: "1.0.0",
        summary: "Rename a key",
        complexity: "O(1)",
        args: "key:key newkey:key", deprecated: None },
    Spec { name: "renamenx", arity: 3, flags: "write fast", keys: (1, 2, 1), acl: "@keyspace @write @fast", tips: "",
        key_specs: &[ks("RW access delete", 1, 0, 1), ks("OW insert", 2, 0, 1)], group: "generic", since: "1.0.0",
        summary: "Rename a key, only if the new key does not exist",
        complexity: "O(1)",
        args: "key:key newkey:key", deprecated: None },
    Spec { name: "copy", arity: -3, flags: "write denyoom", keys: (1, 2, 1), acl: "@keyspace @write @slow", tips: "",
        key_specs: &[ks("RO access", 1, 0, 1), ks("OW update", 2, 0, 1)], group: "generic", since: "6.2.0",
        summary: "Copy a key",
        complexity: "O(1) for string values.",
        args: "source:key destination:key [DB=destination-db:integer] [REPLACE]", deprecated: None },
    Spec { name: "touch", arity: -2, flags: "readonly fast", keys: (1, -1, 1), acl: "@keyspace @read @fast", tips: "request_policy:multi_shard response_policy:agg_sum",
        key_specs: &[ks("RO", 1, -1, 1)], group: "generic", since: "3.2.1",
        summary: "Alters the last access time of a key(s). Returns the number of existing keys specified.",
        complexity: "O(N) where N is the number of keys that will be touched.",
        args: "key:key...", deprecated: None },
    Spec { name: "object", arity: -2, flags: "", keys: (0, 0, 0), acl: "@slow", tips: "",
        key_specs: &[], group: "generic", since: "2.2.3",
        summary: "A container for object introspection commands",
        complexity: "Depends on subcommand.",
        args: "", deprecated: None },
    Spec { name: "object|encoding", arity: 3, flags: "readonly", keys: (2, 2, 1), acl: "@keyspace @read @slow", tips: "nondeterministic_output",
        key_specs: &[ks("RO", 2, 0, 1)], group: "generic", since: "2.2.3",
        summary: "Inspect the internal encoding of a Redis object",
        complexity: "O(1)",
        args: "key:key", deprecated: None },
    Spec { name: "ping", arity: -1, flags: "fast", keys: (0, 0, 0), acl: "@fast @connection", tips: "request_policy:all_shards response_policy:all_succeeded",
        key_specs: &[], group: "connection", since: "1.0.0",
        summary: "Ping the server",
        complexity: "O(1)",
        args: "[message:string]", deprecated: None },
    Spec { name: "echo", arity: 2, flags: "loading stale fast", keys: (0, 0, 0), acl: "@fast @connection", tips: "",
        key_specs: &[], group: "connection", since: "1.0.0",
        summary: "Echo the given string",
        complexity: "O(1)",
        args: "message:string", deprecated: None },
    Spec { name: "quit", arity: -1, flags: "noscript loading stale fast no_auth allow_busy", keys: (0, 0, 0), acl: "@fast @connection", tips: "",
        key_specs: &[], group: "connection", since: "1.0.0",
        summary: "Close the connection",
        complexity: "O(1)",
        args: "", deprecated: None },
    Spec { name: "info", arity: -1, flags: "loading stale", keys: (0, 0, 0), acl: "@slow @dangerous", tips: "nondeterministic_output request_policy:all_shards response_policy:special",
        key_specs: &[], group: "server", since: "1.0.0",
        summary: "Get information and statistics about the server",
        complexity: "O(1)",
        args: "[section:string...]", deprecated: None },
    Spec { name: "command", arity: -1, flags: "loading stale", keys: (0, 0, 0), acl: "@slow @connection", tips: "nondeterministic_output_order",
        key_specs: &[], group: "server", since: "2.8.13",
        summary: "Get array of Redis command details",
        complexity: "O(N) where N is the total number of Redis commands",
        args: "", deprecated: None },
    Spec { name: "command|info", arity: -2, flags: "loading stale", keys: (0, 0, 0), acl: "@slow @connection", tips: "nondeterministic_output_order",
        key_specs: &[], group: "server", since: "2.8.13",
        summary: "Get array of specific Redis command details, or all when no argument is given.",
        complexity: "O(N) where N is the number of commands to look up",
        args: "[command-name:string...]", deprecated: None },
    Spec { name: "command|count", arity: 2, flags: "loading stale", keys: (0, 0, 0), acl: "@slow @connection", tips: "",
        key_specs: &[], group: "server", since: "2.8.13",
        summary: "Get total number of Redis commands",
        complexity: "O(1)",
        args: "", deprecated: None },
    Spec { name: "command|list", arity: -2, flags: "loading stale", keys: (0, 0, 0), acl: "@slow @connection", tips: "nondeterministic_output_order",
        key_specs: &[], group: "server", since: "7.0.0",
        summary: "Get an array of Redis command names",
        complexity: "O(N) where N is the total number of Redis commands",
        args: "[FILTERBY=filterby:(MODULE=module-name:string|ACLCAT=category:string|PATTERN=pattern:pattern)]", deprecated: None },
    Spec { name: "command|docs", arity: -2, flags: "loading stale", keys: (0, 0, 0), acl: "@slow @connection", tips: "nondeterministic_output_order",
        key_specs: &[], group: "server", since: "7.0.0",
        summary: "Get array of specific Redis command documentation",
        complexity: "O(N) where N is the number of commands to look up",
        args: "[command-name:string...]", deprecated: None },
    Spec { name: "config", arity: -2, flags: "", keys: (0, 0, 0), acl: "@slow", tips: "",
        key_specs: &[], group: "server", since: "2.0.0",
        summary: "A container for server configuration commands",
        complexity: "Depends on subcommand.",
        args: "", deprecated: None },
    Spec { name: "config|get", arity: -3, flags: "admin noscript loading stale", keys: (0, 0, 0), acl: "@admin @slow @dangerous", tips: "",
        key_specs: &[], group: "server", since: "2.0.0",
        summary: "Get the values of configuration parameters",
        complexity: "O(N) when N is the number of configuration parameters provided",
        args: "parameter:{parameter:string}...", deprecated: None },
    Spec { name: "config|resetstat", arity: 2, flags: "admin noscript loading stale", keys: (0, 0, 0), acl: "@admin @slow @dangerous", tips: "",
        key_specs: &[], group: "server", since: "2.0.0",
        summary: "Reset the stats returned by INFO",
        complexity: "O(1)",
        args: "", deprecated: None },
    Spec { name: "config|set", arity: -4, flags: "admin noscript loading stale", keys: (0, 0, 0), acl: "@admin @slow @dangerous", tips: "request_policy:all_nodes response_policy:all_succeeded",
        key_specs: &[], group: "server", since: "2.0.0",
        summary: "Set configuration parameters to the given values",
        complexity: "O(N) when N is the number of configuration parameters provided",
        args: "parameter_value:{parameter:string value:string}...", deprecated: None },
    Spec { name: "select", arity: 2, flags: "loading stale fast", keys: (0, 0, 0), acl: "@fast @connection", tips: "",
        key_specs: &[], group: "connection", since: "1.0.0",
        summary: "Change the selected database for the current connection",
        complexity: "O(1)",
        args: "index:integer", deprecated: None },
    Spec { name: "time", arity: 1, flags: "loading stale fast", keys: (0, 0, 0), acl: "@fast", tips: "nondeterministic_output",
        key_specs: &[], group: "server", since: "2.6.0",
        summary: "Return the current server time",
        complexity: "O(1)",
        args: "", deprecated: None },
    Spec { name: "flushdb", arity: -1, flags: "write", keys: (0, 0, 0), acl: "@keyspace @write @slow @dangerous", tips: "request_policy:all_shards response_policy:all_succeeded",
        key_specs: &[], group: "server", since: "1.0.0",
        summary: "Remove all keys from the current database",
        complexity: "O(N) where N is the number of keys in the selected database",
        args: "[async:(ASYNC|SYNC)]", deprecated: None },
    Spec { name: "flushall", arity: -1, flags: "write", keys: (0, 0, 0), acl: "@keyspace @write @slow @dangerous", tips: "request_policy:all_shards response_policy:all_succeeded",
        key_specs: &[], group: "server", since: "1.0.0",
        summary: "Remove all keys from all databases",
        complexity: "O(N) where N is the total number of keys in all databases",
        args: "[async:(ASYNC|SYNC)]", deprecated: None },
    Spec { name: "hello", arity: -1, flags: "noscript loading stale fast no_auth allow_busy", keys: (0, 0, 0), acl: "@fast @connection", tips: "",
        key_specs: &[], group: "connection", since: "6.0.0",
        summary: "Handshake with Redis",
        complexity: "O(1)",
        args: "[arguments:{protover:integer [AUTH=username_password:{username:string password:string}] [SETNAME=clientname:string]}]", deprecated: None },
    Spec { name: "auth", arity: -2, flags: "noscript loading stale fast no_auth allow_busy", keys: (0, 0, 0), acl: "@fast @connection", tips: "",
        key_specs: &[], group: "connection", since: "1.0.0",
        summary: "Authenticate to the server",
        complexity: "O(N) where N is the number of passwords defined for the user",
        args: "[username:string] password:string", deprecated: None },
    Spec { name: "client", arity: -2, flags: "", keys: (0, 0, 0), acl: "@slow", tips: "",
        key_specs: &[], group: "connection", since: "2.4.0",
        summary: "A container for client connection commands",
        complexity: "Depends on subcommand.",
        args: "", deprecated: None },
    Spec { name: "client|setname", arity: 3, flags: "noscript loading stale", keys: (0, 0, 0), acl: "@slow @connection", tips: "",
        key_specs: &[], group: "connection", since: "2.6.9",
        summary: "Set the current connection name",
        complexity: "O(1)",
        args: "connection-name:string", deprecated: None },
    Spec { name: "client|info", arity: 2, flags: "noscript loading stale", keys: (0, 0, 0), acl: "@slow @connection", tips: "nondeterministic_output",
        key_specs: &[], group: "connection", since: "6.2.0",
        summary: "Returns information about the current client connection.",
        complexity: "O(1)",
        args: "", deprecated: None },
    Spec { name: "client|getname", arity: 2, flags: "noscript loading stale", keys: (0, 0, 0), acl: "@slow @connection", tips: "",
        key_specs: &[], group: "connection", since: "2.6.9",
        summary: "Get the current connection name",
        complexity: "O(1)",
        args: "", deprecated: None },
    Spec { name: "client|id", arity: 2, flags: "noscript loading stale", keys: (0, 0, 0), acl: "@slow @connection", tips: "",
        key_specs: &[], group: "connection", since: "5.0.0",
        summary: "Returns the client ID for the current connection",
        complexity: "O(1)",
        args: "", deprecated: None },
    Spec { name: "client|list", arity: -2, flags: "admin noscript loading stale", keys: (0, 0, 0), acl: "@admin @slow @dangerous @connection", tips: "nondeterministic_output",
        key_specs: &[], group: "connection", since: "2.4.0",
        summary: "Get the list of client connections",
        complexity: "O(N) where N is the number of client connections",
        args: "[TYPE=normal_master_replica_pubsub:(NORMAL|MASTER|REPLICA|PUBSUB)] [ID=id:{client-id:integer...}]", deprecated: None },
    Spec { name: "client|setinfo", arity: 4, flags: "noscript loading stale", keys: (0, 0, 0), acl: "@slow @connection", tips: "request_policy:all_nodes response_policy:all_succeeded",
        key_specs: &[], group: "connection", since: "7.2.0",
        summary: "Set client or connection specific info",
        complexity: "O(1)",
        args: "attr:(LIB-NAME=libname:string|LIB-VER=libver:string)", deprecated: None },
    Spec { name: "reset", arity: 1, flags: "noscript loading stale fast no_auth allow_busy", keys: (0, 0, 0), acl: "@fast @connection", tips: "",
        key_specs: &[], group: "connection", since: "6.2.0",
        summary: "Reset the connection",
        complexity: "O(1)",
        args: "", deprecated: None },
    Spec { name: "multi", arity: 1, flags: "noscript loading stale fast allow_busy", keys: (0, 0, 0), acl: "@fast @transaction", tips: "",
        key_specs: &[], group: "transactions", since: "1.2.0",
        summary: "Mark the start of a transaction block",
        complexity: "O(1)",
        args: "", deprecated: None },
    Spec { name: "exec", arity: 1, flags: "noscript loading stale skip_slowlog", keys: (0, 0, 0), acl: "@slow @transaction", tips: "",
        key_specs: &[], group: "transactions", since: "1.2.0",
        summary: "Execute all commands issued after MULTI",
        complexity: "Depends on commands in the transaction",
        args: "", deprecated: None },
    Spec { name: "discard", arity: 1, flags: "noscript loading stale fast allow_busy", keys: (0, 0, 0), acl: "@fast @transaction", tips: "",
        key_specs: &[], group: "transactions", since: "2.0.0",
        summary: "Discard all commands issued after MULTI",
        complexity: "O(N), when N is the number of queued commands",
        args: "", deprecated: None },
    Spec { name: "watch", arity: -2, flags: "noscript loading stale fast allow_busy", keys: (1, -1, 1), acl: "@fast @transaction", tips: "",
        key_specs: &[ks("RO", 1, -1, 1)], group: "transactions", since: "2.2.0",
        summary: "Watch the given keys to determine execution of the MULTI/EXEC block",
        complexity: "O(1) for every key.",
        args: "key:key...", deprecated: None },
    Spec { name: "unwatch", arity: 1, flags: "noscript loading stale fast allow_busy", keys: (0, 0, 0), acl: "@fast @transaction", tips: "",
        key_specs: &[], group: "transactions", since: "2.2.0",
        summary: "Forget about all watched keys",
        complexity: "O(1)",
        args: "", deprecated: None },
];

/// The command (or `container|sub`) named `name`, any case (a hash lookup: every command
/// the gateway receives is looked up).
pub fn lookup(name: &[u8]) -> Option<&'static Spec> {
    lookup_indexed(name).map(|(_, c)| c)
}

/// [`lookup`], with the command's position in [`COMMANDS`] (for tables beside it).
pub fn lookup_indexed(name: &[u8]) -> Option<(usize, &'static Spec)> {
    static BY_NAME: std::sync::LazyLock<std::collections::HashMap<&'static [u8], usize>> =
        std::sync::LazyLock::new(|| {
            COMMANDS
                .iter()
                .enumerate()
                .map(|(i, c)| (c.name.as_bytes(), i))
                .collect()
        });
    let mut buf = [0u8; 40];
    let lower = buf.get_mut(..name.len())?;
    lower.copy_from_slice(name);
    lower.make_ascii_lowercase();
    BY_NAME.get(&*lower).map(|&i| (i, &COMMANDS[i]))
}

/// Whether `name` (lower case) is a container of subcommands (CONFIG, CLIENT, COMMAND, …).
pub fn is_container(name: &str) -> bool {
    static CONTAINERS: std::sync::LazyLock<std::collections::HashSet<&'static str>> =
        std::sync::LazyLock::new(|| {
            COMMANDS
                .iter()
                .filter_map(|c| c.name.split_once('|').map(|(parent, _)| parent))
                .collect()
        });
    CONTAINERS.contains(name)
}

/// The top-level commands (those COMMAND COUNT counts).
pub fn top_level() -> impl Iterator<Item = &'static Spec> {
    COMMANDS.iter().filter(|c| !c.name.contains('|'))
}

/// The subcommands of container `name`.
fn subcommands(name: &str) -> impl Iterator<Item = &'static Spec> + '_ {
    COMMANDS.iter().filter(move |c| {
        c.name
            .split_once('|')
            .is_some_and(|(parent, _)| parent == name)
    })
}

/// Whether `argc` arguments (the name included) fit `arity`.
pub fn arity_fits(arity: i64, argc: usize) -> bool {
    let argc = argc as i64;
    if arity >= 0 {
        argc == arity
    } else {
        argc >= -arity
    }
}

fn bulk(s: &str) -> Reply {
    Reply::Bulk(s.as_bytes().to_vec())
}

fn words(s: &'static str) -> Reply {
    Reply::Set(
        s.split_whitespace()
            .map(|w| Reply::Simple(w.into()))
            .collect(),
    )
}

fn key_spec(k: &KeySpec) -> Reply {
    let mut m = Vec::with_capacity(4);
    if !k.notes.is_empty() {
        m.push((bulk("notes"), bulk(k.notes)));
    }
    m.extend([
        (bulk("flags"), words(k.flags)),
        (
            bulk("begin_search"),
            Reply::Map(vec![
                (bulk("type"), bulk("index")),
                (
                    bulk("spec"),
                    Reply::Map(vec![(bulk("index"), Reply::Integer(k.index))]),
                ),
            ]),
        ),
        (
            bulk("find_keys"),
            Reply::Map(vec![
                (bulk("type"), bulk("range")),
                (
                    bulk("spec"),
                    Reply::Map(vec![
                        (bulk("lastkey"), Reply::Integer(k.lastkey)),
                        (bulk("keystep"), Reply::Integer(k.keystep)),
                        (bulk("limit"), Reply::Integer(0)),
                    ]),
                ),
            ]),
        ),
    ]);
    Reply::Map(m)
}

/// COMMAND INFO's entry for `c`: name, arity, flags, first key, last key, step, ACL
/// categories, tips, key specs, subcommands.
pub fn info(c: &Spec) -> Reply {
    let subs = if c.name.contains('|') {
        Vec::new()
    } else {
        subcommands(c.name).map(info).collect()
    };
    Reply::Array(vec![
        bulk(c.name),
        Reply::Integer(c.arity),
        words(c.flags),
        Reply::Integer(c.keys.0),
        Reply::Integer(c.keys.1),
        Reply::Integer(c.keys.2),
        words(c.acl),
        Reply::Set(c.tips.split_whitespace().map(bulk).collect()),
        Reply::Set(c.key_specs.iter().map(key_spec).collect()),
        Reply::Set(subs),
    ])
}

/// COMMAND DOCS's map for `c`: summary, since, group, complexity, (deprecation),
/// arguments, subcommands.
pub fn docs(c: &Spec) -> Reply {
    let mut m = vec![
        (bulk("summary"), bulk(c.summary)),
        (bulk("since"), bulk(c.since)),
        (bulk("group"), bulk(c.group)),
        (bulk("complexity"), bulk(c.complexity)),
    ];
    if let Some((since, by)) = c.deprecated {
        m.push((bulk("doc_flags"), words("deprecated")));
        m.push((bulk("deprecated_since"), bulk(since)));
        m.push((bulk("replaced_by"), bulk(by)));
    }
    let args = parse_args(c.args);
    if !args.is_empty() {
        m.push((
            bulk("arguments"),
            Reply::Array(args.iter().map(Arg::reply).collect()),
        ));
    }
    if !c.name.contains('|') {
        let subs: Vec<(Reply, Reply)> = subcommands(c.name)
            .map(|s| (bulk(s.name), docs(s)))
            .collect();
        if !subs.is_empty() {
            m.push((bulk("subcommands"), Reply::Map(subs)));
        }
    }
    Reply::Map(m)
}

/// An argument as COMMAND DOCS describes it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Arg {
    pub name: String,
    pub kind: String,
    pub token: Option<String>,
    pub key_spec_index: Option<i64>,
    pub optional: bool,
    pub multiple: bool,
    pub args: Vec<Arg>,
}

impl Arg {
    fn reply(&self) -> Reply {
        let mut m = vec![
            (bulk("name"), bulk(&self.name)),
            (bulk("type"), bulk(&self.kind)),
        ];
        if let Some(i) = self.key_spec_index {
            m.push((bulk("key_spec_index"), Reply::Integer(i)));
        }
        if let Some(t) = &self.token {
            m.push((bulk("token"), bulk(t)));
        }
        let mut flags = Vec::new();
        if self.optional {
            flags.push(Reply::Simple("optional".into()));
        }
        if self.multiple {
            flags.push(Reply::Simple("multiple".into()));
        }
        if !flags.is_empty() {
            m.push((bulk("flags"), Reply::Set(flags)));
        }
        if !self.args.is_empty() {
            m.push((
                bulk("arguments"),
                Reply::Array(self.args.iter().map(Arg::reply).collect()),
            ));
        }
        Reply::Map(m)
    }
}

/// Reads the table's compact argument form (see [`Spec::args`]); what it cannot read ends
/// the list (a test reads every entry of the table whole).
pub fn parse_args(s: &str) -> Vec<Arg> {
    let mut p = ArgParser {
        s: s.as_bytes(),
        at: 0,
        keys: 0,
    };
    let out = p.list(None);
    out.unwrap_or_default()
}

struct ArgParser<'a> {
    s: &'a [u8],
    at: usize,
    /// Key arguments seen so far: the next one's key spec index.
    keys: i64,
}

impl ArgParser<'_> {
    fn peek(&self) -> Option<u8> {
        self.s.get(self.at).copied()
    }

    fn eat(&mut self, c: u8) -> bool {
        if self.peek() == Some(c) {
            self.at += 1;
            true
        } else {
            false
        }
    }

    fn word(&mut self) -> Option<String> {
        let start = self.at;
        while let Some(c) = self.peek() {
            if c.is_ascii_alphanumeric() || c == b'-' || c == b'_' {
                self.at += 1;
            } else {
                break;
            }
        }
        (self.at > start).then(|| String::from_utf8_lossy(&self.s[start..self.at]).into_owned())
    }

    /// Arguments separated by spaces (or `|` inside a one-of) up to `end` (or the end).
    fn list(&mut self, end: Option<u8>) -> Option<Vec<Arg>> {
        let sep = if end == Some(b')') { b'|' } else { b' ' };
        let mut out = Vec::new();
        loop {
            match self.peek() {
                None if end.is_none() => return Some(out),
                None => return None,
                Some(c) if Some(c) == end => {
                    self.at += 1;
                    return Some(out);
                }
                _ => {}
            }
            if !out.is_empty() && !self.eat(sep) {
                return None;
            }
            out.push(self.item()?);
        }
    }

    fn item(&mut self) -> Option<Arg> {
        let optional = self.eat(b'[');
        let first = self.word()?;
        let (token, name) = if self.eat(b'=') {
            (Some(first), self.word()?)
        } else {
            (None, first)
        };
        let mut a = if self.eat(b':') {
            let (kind, args) = if self.eat(b'(') {
                ("oneof".to_string(), self.list(Some(b')'))?)
            } else if self.eat(b'{') {
                ("block".to_string(), self.list(Some(b'}'))?)
            } else {
                (self.word()?, Vec::new())
            };
            Arg {
                name,
                kind,
                token,
                key_spec_index: None,
                optional,
                multiple: false,
                args,
            }
        } else {
            // A pure token: its name is the token in lower case.
            Arg {
                name: name.to_ascii_lowercase(),
                kind: "pure-token".into(),
                token: Some(name),
                key_spec_index: None,
                optional,
                multiple: false,
                args: Vec::new(),
            }
        };
        if a.kind == "key" {
            a.key_spec_index = Some(self.keys);
            self.keys += 1;
        }
        if self.s[self.at..].starts_with(b"...") {
            self.at += 3;
            a.multiple = true;
        }
        if optional && !self.eat(b']') {
            return None;
        }
        Some(a)
    }
}

fn glob(pat: &[u8], s: &[u8]) -> bool {
    super::glob_match(pat, s)
}

/// `COMMAND [COUNT | INFO [name ...] | DOCS [name ...] | LIST [FILTERBY ...]]`.
pub fn command(argv: &[Vec<u8>]) -> Reply {
    let Some(sub) = argv.first() else {
        return Reply::Array(top_level().map(info).collect());
    };
    let rest = &argv[1..];
    match sub.to_ascii_lowercase().as_slice() {
        b"count" if rest.is_empty() => Reply::Integer(top_level().count() as i64),
        b"info" if rest.is_empty() => Reply::Array(top_level().map(info).collect()),
        b"info" => Reply::Array(
            rest.iter()
                .map(|n| lookup(n).map_or(Reply::Nil, info))
                .collect(),
        ),
        b"docs" if rest.is_empty() => {
            Reply::Map(top_level().map(|c| (bulk(c.name), docs(c))).collect())
        }
        b"docs" => {
            let mut out: Vec<(Reply, Reply)> = Vec::new();
            for n in rest {
                if let Some(c) = lookup(n) {
                    out.push((bulk(c.name), docs(c)));
                }
            }
            Reply::Map(out)
        }
        b"list" => {
            let keep: Box<dyn Fn(&Spec) -> bool> = match rest {
                [] => Box::new(|_| true),
                [f, kind, v] if f.eq_ignore_ascii_case(b"filterby") => {
                    let v = v.clone();
                    match kind.to_ascii_lowercase().as_slice() {
                        // No modules here.
                        b"module" => Box::new(|_| false),
                        b"aclcat" => Box::new(move |c: &Spec| {
                            c.acl.split_whitespace().any(|a| {
                                a.trim_start_matches('@')
                                    .as_bytes()
                                    .eq_ignore_ascii_case(&v)
                            })
                        }),
                        b"pattern" => Box::new(move |c: &Spec| {
                            glob(&v.to_ascii_lowercase(), c.name.as_bytes())
                        }),
                        _ => return Reply::err("syntax error"),
                    }
                }
                _ => return Reply::err("syntax error"),
            };
            Reply::Array(
                COMMANDS
                    .iter()
                    .filter(|c| keep(c))
                    .map(|c| bulk(c.name))
                    .collect(),
            )
        }
        b"count" => Reply::err("wrong number of arguments for 'command|count' command"),
        _ => Reply::err(format!(
            "unknown subcommand '{}'. Try COMMAND HELP.",
            String::from_utf8_lossy(sub)
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The compact form of every argument list, written back: what the parser read is what
    /// the table says.
    fn show(args: &[Arg]) -> String {
        let one = |a: &Arg| {
            let mut s = match (a.kind.as_str(), &a.token) {
                ("pure-token", Some(t)) if a.name == t.to_ascii_lowercase() => t.clone(),
                _ => {
                    let mut s = a
                        .token
                        .as_ref()
                        .map(|t| format!("{t}="))
                        .unwrap_or_default();
                    s.push_str(&a.name);
                    s.push(':');
                    match a.kind.as_str() {
                        "oneof" => {
                            let inner: Vec<String> = a
                                .args
                                .iter()
                                .map(|x| show(std::slice::from_ref(x)))
                                .collect();
                            s.push_str(&format!("({})", inner.join("|")));
                        }
                        "block" => s.push_str(&format!("{{{}}}", show(&a.args))),
                        k => s.push_str(k),
                    }
                    s
                }
            };
            if a.multiple {
                s.push_str("...");
            }
            if a.optional {
                s = format!("[{s}]");
            }
            s
        };
        args.iter().map(one).collect::<Vec<_>>().join(" ")
    }

    #[test]
    fn containers_are_the_commands_with_subcommands() {
        for name in ["config", "client", "command", "object"] {
            assert!(is_container(name), "{name}");
        }
        for name in ["get", "set", "config|get", "nosuchcommand"] {
            assert!(!is_container(name), "{name}");
        }
    }

    #[test]
    fn every_argument_list_of_the_table_reads_whole() {
        for c in COMMANDS {
            assert_eq!(show(&parse_args(c.args)), c.args, "{}", c.name);
        }
    }

    #[test]
    fn every_key_argument_has_a_key_spec() {
        for c in COMMANDS {
            let mut n = 0;
            fn count(args: &[Arg], n: &mut usize) {
                for a in args {
                    if a.kind == "key" {
                        *n += 1;
                    }
                    count(&a.args, n);
                }
            }
            count(&parse_args(c.args), &mut n);
            assert_eq!(n, c.key_specs.len(), "{}", c.name);
            assert_eq!(c.key_specs.is_empty(), c.keys == (0, 0, 0), "{}", c.name);
        }
    }

    #[test]
    fn names_are_unique_lower_case_and_subcommands_have_their_container() {
        for (i, c) in COMMANDS.iter().enumerate() {
            assert_eq!(c.name, c.name.to_ascii_lowercase());
            assert!(
                COMMANDS[..i].iter().all(|o| o.name != c.name),
                "{} twice",
                c.name
            );
            if let Some((parent, _)) = c.name.split_once('|') {
                assert!(lookup(parent.as_bytes()).is_some(), "{}", c.name);
            }
            assert!(!c.summary.is_empty() && !c.since.is_empty() && !c.group.is_empty());
        }
    }

    #[test]
    fn bad_argument_lists_read_as_far_as_they_go() {
        for bad in ["key:", "[key:key", "a:(b|c", "a:{b", "=x", "a:b]", "a::b"] {
            let _ = parse_args(bad);
        }
        assert_eq!(parse_args("key:key value:string").len(), 2);
    }
}
