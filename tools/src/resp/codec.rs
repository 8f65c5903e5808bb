//! RESP2, the Redis serialization protocol: parsing client commands (arrays of bulk strings,
//! and inline commands as redis-cli and telnet send them) and writing replies.
//!
//! The parser is incremental (it reports "need more bytes" rather than blocking) and never
//! trusts lengths: arrays and bulk strings are bounded by [`Limits`].

use std::fmt;

/// Bounds on what a client may send.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    /// Most elements in one command.
    pub max_args: usize,
    /// Longest bulk string (key or value).
    pub max_bulk: usize,
    /// Longest inline command line.
    pub max_inline: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            max_args: 1 << 20,
            max_bulk: 64 << 20,
            max_inline: 64 << 10,
        }
    }
}

/// Why the input is not RESP. The connection should get `-ERR Protocol error: ...` and close.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProtocolError(pub String);

impl fmt::Display for ProtocolError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Protocol error: {}", self.0)
    }
}

impl std::error::Error for ProtocolError {}

/// A parsed command (its arguments) and the bytes it took, or `None` for "need more".
pub type Parsed = Option<(Vec<Vec<u8>>, usize)>;

/// Parses one command from the front of `buf`. `Ok(Some((args, used)))` when a whole command
/// is there, `Ok(None)` when more bytes are needed. An empty inline line yields no arguments.
pub fn parse_command(buf: &[u8], limits: &Limits) -> Result<Parsed, ProtocolError> {
    if buf.is_empty() {
        return Ok(None);
    }
    if buf[0] != b'*' {
        return parse_inline(buf, limits);
    }
    let Some((n, mut pos)) = read_int_line(buf, 1, limits.max_inline)? else {
        return Ok(None);
    };
    if n < 0 {
        // A null array: nothing to run.
        return Ok(Some((Vec::new(), pos)));
    }
    let n = n as usize;
    if n > limits.max_args {
        return Err(ProtocolError(format!("invalid multibulk length {n}")));
    }
    let mut args = Vec::with_capacity(n.min(1024));
    for _ in 0..n {
        match buf.get(pos) {
            None => return Ok(None),
            Some(b'$') => {}
            Some(c) => {
                return Err(ProtocolError(format!(
                    "expected '$', got '{}'",
                    char::from(*c).escape_default()
                )));
            }
        }
        let Some((len, start)) = read_int_line(buf, pos + 1, limits.max_inline)? else {
            return Ok(None);
        };
        if len < 0 || len as usize > limits.max_bulk {
            return Err(ProtocolError(format!("invalid bulk length {len}")));
        }
        let end = start + len as usize;
        if buf.len() < end + 2 {
            return Ok(None);
        }
        if &buf[end..end + 2] != b"\r\n" {
            return Err(ProtocolError("bulk string not terminated by CRLF".into()));
        }
        args.push(buf[start..end].to_vec());
        pos = end + 2;
    }
    Ok(Some((args, pos)))
}

/// Reads a decimal integer terminated by CRLF starting at `at`; returns it and the position
/// after the CRLF.
fn read_int_line(buf: &[u8], at: usize, max: usize) -> Result<Option<(i64, usize)>, ProtocolError> {
    let rest = &buf[at.min(buf.len())..];
    let Some(nl) = rest.iter().position(|b| *b == b'\n') else {
        if rest.len() > max {
            return Err(ProtocolError("too big count line".into()));
        }
        return Ok(None);
    };
    if nl == 0 || rest[nl - 1] != b'\r' {
        return Err(ProtocolError("count line not terminated by CRLF".into()));
    }
    let s =
        std::str::from_utf8(&rest[..nl - 1]).map_err(|_| ProtocolError("invalid count".into()))?;
    let n: i64 = s
        .parse()
        .map_err(|_| ProtocolError(format!("invalid count '{}'", s.escape_default())))?;
    Ok(Some((n, at + nl + 1)))
}

fn parse_inline(buf: &[u8], limits: &Limits) -> Result<Parsed, ProtocolError> {
    let Some(nl) = buf.iter().position(|b| *b == b'\n') else {
        if buf.len() > limits.max_inline {
            return Err(ProtocolError("too big inline request".into()));
        }
        return Ok(None);
    };
    let line = &buf[..nl];
    let line = line.strip_suffix(b"\r").unwrap_or(line);
    let mut args = Vec::new();
    let mut cur = Vec::new();
    let mut quote: Option<u8> = None;
    let mut in_arg = false;
    let mut i = 0;
    while i < line.len() {
        let c = line[i];
        match quote {
            Some(q) if c == q => {
                quote = None;
            }
            Some(b'"') if c == b'\\' && i + 1 < line.len() => {
                i += 1;
                cur.push(match line[i] {
                    b'n' => b'\n',
                    b'r' => b'\r',
                    b't' => b'\t',
                    other => other,
                });
            }
            Some(_) => cur.push(c),
            None if c == b'"' || c == b'\'' => {
                quote = Some(c);
                in_arg = true;
            }
            None if c == b' ' || c == b'\t' => {
                if in_arg {
                    args.push(std::mem::take(&mut cur));
                    in_arg = false;
                }
            }
            None => {
                cur.push(c);
                in_arg = true;
            }
        }
        i += 1;
    }
    if quote.is_some() {
        return Err(ProtocolError("unbalanced quotes in request".into()));
    }
    if in_arg {
        args.push(cur);
    }
    if args.len() > limits.max_args {
        return Err(ProtocolError("too many arguments".into()));
    }
    Ok(Some((args, nl + 1)))
}

/// A reply to a client.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Reply {
    /// `+OK`
    Simple(String),
    /// `-ERR ...` (the text includes the error prefix, e.g. "ERR", "WRONGTYPE").
    Error(String),
    Integer(i64),
    Bulk(Vec<u8>),
    /// `$-1` (RESP3: `_`)
    Nil,
    Array(Vec<Reply>),
    /// `*-1` (RESP3: `_`): EXEC of a transaction a WATCHed key's change aborted.
    NilArray,
    /// A map (RESP3 `%`; RESP2 sends its keys and values as one flat array, as Redis does).
    Map(Vec<(Reply, Reply)>),
    /// A set (RESP3 `~`; RESP2 an array), as COMMAND INFO's flags are.
    Set(Vec<Reply>),
}

impl Reply {
    pub fn ok() -> Reply {
        Reply::Simple("OK".into())
    }

    /// `-ERR <msg>`.
    pub fn err(msg: impl fmt::Display) -> Reply {
        Reply::Error(format!("ERR {msg}"))
    }

    /// Appends the RESP2 wire form to `out`.
    pub fn encode(&self, out: &mut Vec<u8>) {
        self.encode_as(out, false);
    }

    /// Appends the wire form to `out`: RESP3 (after `HELLO 3`) or RESP2.
    pub fn encode_as(&self, out: &mut Vec<u8>, resp3: bool) {
        match self {
            Reply::Simple(s) => {
                out.push(b'+');
                out.extend(s.bytes().filter(|b| *b != b'\r' && *b != b'\n'));
                out.extend_from_slice(b"\r\n");
            }
            Reply::Error(s) => {
                out.push(b'-');
                out.extend(
                    s.bytes()
                        .map(|b| if b == b'\r' || b == b'\n' { b' ' } else { b }),
                );
                out.extend_from_slice(b"\r\n");
            }
            Reply::Integer(i) => {
                out.extend_from_slice(format!(":{i}\r\n").as_bytes());
            }
            Reply::Bulk(b) => {
                out.extend_from_slice(format!("${}\r\n", b.len()).as_bytes());
                out.extend_from_slice(b);
                out.extend_from_slice(b"\r\n");
            }
            Reply::Nil if resp3 => out.extend_from_slice(b"_\r\n"),
            Reply::Nil => out.extend_from_slice(b"$-1\r\n"),
            Reply::NilArray if resp3 => out.extend_from_slice(b"_\r\n"),
            Reply::NilArray => out.extend_from_slice(b"*-1\r\n"),
            Reply::Array(items) => {
                out.extend_from_slice(format!("*{}\r\n", items.len()).as_bytes());
                for i in items {
                    i.encode_as(out, resp3);
                }
            }
            Reply::Set(items) => {
                let kind = if resp3 { '~' } else { '*' };
                out.extend_from_slice(format!("{kind}{}\r\n", items.len()).as_bytes());
                for i in items {
                    i.encode_as(out, resp3);
                }
            }
            Reply::Map(pairs) => {
                if resp3 {
                    out.extend_from_slice(format!("%{}\r\n", pairs.len()).as_bytes());
                } else {
                    out.extend_from_slice(format!("*{}\r\n", pairs.len() * 2).as_bytes());
                }
                for (k, v) in pairs {
                    k.encode_as(out, resp3);
                    v.encode_as(out, resp3);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(b: &[u8]) -> Result<Parsed, ProtocolError> {
        parse_command(b, &Limits::default())
    }

    #[test]
    fn parses_multibulk_and_reports_incomplete_input() {
        let cmd = b"*3\r\n$3\r\nSET\r\n$1\r\nk\r\n$5\r\nvalue\r\n";
        let (args, used) = parse(cmd).unwrap().unwrap();
        assert_eq!(
            args,
            vec![b"SET".to_vec(), b"k".to_vec(), b"value".to_vec()]
        );
        assert_eq!(used, cmd.len());
        for cut in 0..cmd.len() {
            assert_eq!(parse(&cmd[..cut]).unwrap(), None, "cut at {cut}");
        }
        // Pipelined: two commands back to back.
        let two = [&cmd[..], b"*1\r\n$4\r\nPING\r\n"].concat();
        let (_, used) = parse(&two).unwrap().unwrap();
        assert_eq!(
            parse(&two[used..]).unwrap().unwrap().0,
            vec![b"PING".to_vec()]
        );
    }

    #[test]
    fn parses_inline_commands_with_quotes() {
        let (args, used) = parse(b"set \"a b\" 'c d' e\\x\r\nrest").unwrap().unwrap();
        assert_eq!(
            args,
            vec![
                b"set".to_vec(),
                b"a b".to_vec(),
                b"c d".to_vec(),
                b"e\\x".to_vec()
            ]
        );
        assert_eq!(used, 21);
        assert_eq!(parse(b"\r\n").unwrap().unwrap().0, Vec::<Vec<u8>>::new());
        assert!(parse(b"get \"unterminated\r\n").is_err());
    }

    #[test]
    fn refuses_lying_lengths() {
        assert!(parse(b"*abc\r\n").is_err());
        assert!(parse(b"*99999999999\r\n").is_err());
        assert!(parse(b"*1\r\n$-5\r\n").is_err());
        assert!(parse(b"*1\r\n$999999999999\r\n").is_err());
        assert!(parse(b"*1\r\n+x\r\n").is_err());
        assert!(parse(b"*1\r\n$1\r\nab\r\n").is_err());
        assert!(parse(b"*1\n").is_err());
        let small = Limits {
            max_inline: 8,
            ..Limits::default()
        };
        assert!(parse_command(b"aaaaaaaaaaaaaaaaaaaaaa", &small).is_err());
    }

    #[test]
    fn encodes_resp3_nulls_and_maps() {
        let r = Reply::Array(vec![
            Reply::Nil,
            Reply::Map(vec![(Reply::Bulk(b"k".to_vec()), Reply::Integer(1))]),
            Reply::Set(vec![Reply::Simple("fast".into())]),
        ]);
        let (mut v2, mut v3) = (Vec::new(), Vec::new());
        r.encode(&mut v2);
        r.encode_as(&mut v3, true);
        assert_eq!(v2, b"*3\r\n$-1\r\n*2\r\n$1\r\nk\r\n:1\r\n*1\r\n+fast\r\n");
        assert_eq!(v3, b"*3\r\n_\r\n%1\r\n$1\r\nk\r\n:1\r\n~1\r\n+fast\r\n");
    }

    #[test]
    fn encodes_replies() {
        let mut out = Vec::new();
        Reply::Array(vec![
            Reply::ok(),
            Reply::err("bad\r\nthing"),
            Reply::Integer(-3),
            Reply::Bulk(b"v".to_vec()),
            Reply::Nil,
        ])
        .encode(&mut out);
        assert_eq!(
            out,
            b"*5\r\n+OK\r\n-ERR bad  thing\r\n:-3\r\n$1\r\nv\r\n$-1\r\n"
        );
    }
}
