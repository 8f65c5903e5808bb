//! A tiny little-endian codec for RPC messages: frontends encode their requests with
//! [`Writer`] and decode replies with [`Reader`], which fails instead of panicking on short or
//! malformed input (replies come from the network). Messages declared with
//! [`wire_message!`](crate::wire_message) are [`Wire`]: encoded and decoded from one
//! declaration.

pub use crate::message::Wire;

/// Appends little-endian values to a buffer.
#[derive(Debug, Default, Clone)]
pub struct Writer {
    buf: Vec<u8>,
}

impl Writer {
    pub fn new() -> Self {
        Self::default()
    }

    /// A writer whose message starts with `tag` (the message kind).
    pub fn tagged(tag: u8) -> Self {
        Self { buf: vec![tag] }
    }

    pub fn u8(mut self, v: u8) -> Self {
        self.buf.push(v);
        self
    }
    pub fn u16(mut self, v: u16) -> Self {
        self.buf.extend_from_slice(&v.to_le_bytes());
        self
    }
    pub fn u32(mut self, v: u32) -> Self {
        self.buf.extend_from_slice(&v.to_le_bytes());
        self
    }
    pub fn u64(mut self, v: u64) -> Self {
        self.buf.extend_from_slice(&v.to_le_bytes());
        self
    }
    /// A length-prefixed (u32) byte string.
    pub fn bytes(mut self, v: &[u8]) -> Self {
        self.buf.extend_from_slice(&(v.len() as u32).to_le_bytes());
        self.buf.extend_from_slice(v);
        self
    }
    /// `v`'s wire format (see [`Wire`]).
    pub fn put<T: Wire>(self, v: &T) -> Self {
        v.put(self)
    }
    /// Bytes as they are (no length): an encoding that knows its own end, or the rest of a
    /// message.
    pub fn raw(mut self, v: &[u8]) -> Self {
        self.buf.extend_from_slice(v);
        self
    }
    pub fn finish(self) -> Vec<u8> {
        self.buf
    }
}

/// The input ended early or held something impossible.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("malformed message: {0}")]
pub struct WireError(pub &'static str);

/// Reads little-endian values; every read is bounds-checked.
#[derive(Debug, Clone)]
pub struct Reader<'a> {
    buf: &'a [u8],
    pos: usize,
}

impl<'a> Reader<'a> {
    pub fn new(buf: &'a [u8]) -> Self {
        Self { buf, pos: 0 }
    }

    fn take(&mut self, n: usize) -> Result<&'a [u8], WireError> {
        let end = self
            .pos
            .checked_add(n)
            .ok_or(WireError("length overflow"))?;
        let s = self.buf.get(self.pos..end).ok_or(WireError("truncated"))?;
        self.pos = end;
        Ok(s)
    }

    pub fn u8(&mut self) -> Result<u8, WireError> {
        Ok(self.take(1)?[0])
    }
    pub fn u16(&mut self) -> Result<u16, WireError> {
        Ok(u16::from_le_bytes(
            self.take(2)?.try_into().expect("2 bytes"),
        ))
    }
    pub fn u32(&mut self) -> Result<u32, WireError> {
        Ok(u32::from_le_bytes(
            self.take(4)?.try_into().expect("4 bytes"),
        ))
    }
    pub fn u64(&mut self) -> Result<u64, WireError> {
        Ok(u64::from_le_bytes(
            self.take(8)?.try_into().expect("8 bytes"),
        ))
    }
    /// A length-prefixed (u32) byte string.
    pub fn bytes(&mut self) -> Result<&'a [u8], WireError> {
        let n = self.u32()? as usize;
        self.take(n)
    }
    /// One value in its wire format (see [`Wire`]).
    pub fn get<T: Wire>(&mut self) -> Result<T, WireError> {
        T::get(self)
    }
    /// Everything not read yet (the reader is then at the end).
    pub fn rest(&mut self) -> &'a [u8] {
        let rest = &self.buf[self.pos..];
        self.pos = self.buf.len();
        rest
    }
    /// Bytes not read yet.
    pub fn remaining(&self) -> usize {
        self.buf.len() - self.pos
    }
    /// Fails unless everything was read.
    pub fn finish(&self) -> Result<(), WireError> {
        if self.pos == self.buf.len() {
            Ok(())
        } else {
            Err(WireError("trailing bytes"))
        }
    }
}

/// `b` as a hex dump, 16 bytes a line with offsets and ASCII: the form the format snapshots
/// (insta) of every crate pin on-media and wire bytes in.
///
/// ```
/// let d = dmkit_verbs::wire::hex_dump(b"dmkit\x00");
/// assert_eq!(d, format!("00000000  {:<47}  |dmkit.|\n", "64 6d 6b 69 74 00"));
/// ```
pub fn hex_dump(b: &[u8]) -> String {
    use std::fmt::Write as _;
    let mut s = String::new();
    for (i, line) in b.chunks(16).enumerate() {
        let hex: Vec<String> = line.iter().map(|x| format!("{x:02x}")).collect();
        let ascii: String = line
            .iter()
            .map(|&c| if c.is_ascii_graphic() { c as char } else { '.' })
            .collect();
        let _ = writeln!(s, "{:08x}  {:<47}  |{ascii}|", i * 16, hex.join(" "));
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips_and_refuses_truncation() {
        let m = Writer::tagged(9)
            .u16(7)
            .u32(8)
            .u64(9)
            .bytes(b"abc")
            .finish();
        let mut r = Reader::new(&m);
        assert_eq!(r.u8(), Ok(9));
        assert_eq!(r.u16(), Ok(7));
        assert_eq!(r.u32(), Ok(8));
        assert_eq!(r.u64(), Ok(9));
        assert_eq!(r.bytes(), Ok(&b"abc"[..]));
        assert!(r.finish().is_ok());
        let mut r = Reader::new(&m[..m.len() - 1]);
        r.u8().unwrap();
        r.u16().unwrap();
        r.u32().unwrap();
        r.u64().unwrap();
        assert!(r.bytes().is_err());
        let lying = Writer::new().u32(u32::MAX).finish();
        assert!(Reader::new(&lying).bytes().is_err());
    }
}
