//! The wire format of the `tcp` backend. Every frame is a 16-byte header — magic `b"DM"`,
//! version, kind, payload length (u32 LE), request id (u64 LE) — and a payload. A batch of
//! work requests travels as one frame and is answered by one frame.
//!
//! Decoding never trusts the peer: lengths are checked against the frame, counts against
//! limits, and any inconsistency is an error (the connection is then closed).

use std::io::{self, Read, Write};

use crate::types::{Access, Media, NodeId, RKey, RegionDesc, RegionName};

pub const MAGIC: [u8; 2] = *b"DM";
pub const VERSION: u8 = 2;
pub const HEADER_LEN: usize = 16;
/// Work requests in one batch frame, at most.
pub const MAX_BATCH_OPS: usize = 1 << 16;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum Kind {
    Hello = 1,
    Auth = 2,
    Welcome = 3,
    Batch = 4,
    BatchResp = 5,
    Rpc = 6,
    RpcResp = 7,
    Regions = 8,
    RegionsResp = 9,
    Error = 10,
}

impl Kind {
    fn from_u8(v: u8) -> Option<Kind> {
        Some(match v {
            1 => Kind::Hello,
            2 => Kind::Auth,
            3 => Kind::Welcome,
            4 => Kind::Batch,
            5 => Kind::BatchResp,
            6 => Kind::Rpc,
            7 => Kind::RpcResp,
            8 => Kind::Regions,
            9 => Kind::RegionsResp,
            10 => Kind::Error,
            _ => return None,
        })
    }
}

/// Opcodes of work requests inside a batch frame.
pub mod op {
    pub const READ: u8 = 1;
    pub const WRITE: u8 = 2;
    pub const WRITE_DURABLE: u8 = 3;
    pub const CAS: u8 = 4;
    pub const FAA: u8 = 5;
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Header {
    pub kind: Kind,
    pub len: u32,
    pub req_id: u64,
}

/// Why a frame could not be decoded.
#[derive(Debug, thiserror::Error)]
pub enum FrameError {
    #[error("bad magic {0:02x?}")]
    Magic([u8; 2]),
    #[error("unsupported protocol version {got} (this side speaks {VERSION})")]
    Version { got: u8 },
    #[error("unknown frame kind {0}")]
    Kind(u8),
    #[error("frame of {len} bytes exceeds the limit of {max}")]
    TooLong { len: usize, max: usize },
    #[error("malformed {what}")]
    Malformed { what: &'static str },
    #[error(transparent)]
    Io(#[from] io::Error),
}

pub fn encode_header(out: &mut Vec<u8>, kind: Kind, req_id: u64) -> usize {
    let at = out.len();
    out.extend_from_slice(&MAGIC);
    out.push(VERSION);
    out.push(kind as u8);
    out.extend_from_slice(&0u32.to_le_bytes());
    out.extend_from_slice(&req_id.to_le_bytes());
    at
}

/// Patches the payload length of the frame whose header starts at `at`.
pub fn finish(out: &mut [u8], at: usize) -> Result<(), FrameError> {
    let len = out.len() - at - HEADER_LEN;
    let l = u32::try_from(len).map_err(|_| FrameError::TooLong {
        len,
        max: u32::MAX as usize,
    })?;
    out[at + 4..at + 8].copy_from_slice(&l.to_le_bytes());
    Ok(())
}

pub fn decode_header(h: &[u8; HEADER_LEN], max: usize) -> Result<Header, FrameError> {
    if h[0..2] != MAGIC {
        return Err(FrameError::Magic([h[0], h[1]]));
    }
    if h[2] != VERSION {
        return Err(FrameError::Version { got: h[2] });
    }
    let kind = Kind::from_u8(h[3]).ok_or(FrameError::Kind(h[3]))?;
    let len = u32::from_le_bytes(h[4..8].try_into().expect("4 bytes"));
    if len as usize > max {
        return Err(FrameError::TooLong {
            len: len as usize,
            max,
        });
    }
    Ok(Header {
        kind,
        len,
        req_id: u64::from_le_bytes(h[8..16].try_into().expect("8 bytes")),
    })
}

/// Reads one frame into `buf` (resized to the payload). `Ok(None)` on a clean EOF between
/// frames.
pub fn read_frame(
    r: &mut impl Read,
    buf: &mut Vec<u8>,
    max: usize,
) -> Result<Option<Header>, FrameError> {
    let mut h = [0u8; HEADER_LEN];
    let mut got = 0;
    while got < HEADER_LEN {
        match r.read(&mut h[got..]) {
            Ok(0) if got == 0 => return Ok(None),
            Ok(0) => return Err(io::Error::from(io::ErrorKind::UnexpectedEof).into()),
            Ok(n) => got += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e.into()),
        }
    }
    let hdr = decode_header(&h, max)?;
    buf.clear();
    buf.resize(hdr.len as usize, 0);
    r.read_exact(buf)?;
    Ok(Some(hdr))
}

pub fn write_frame(w: &mut impl Write, kind: Kind, req_id: u64, payload: &[u8]) -> io::Result<()> {
    let mut out = Vec::with_capacity(HEADER_LEN + payload.len());
    let at = encode_header(&mut out, kind, req_id);
    out.extend_from_slice(payload);
    finish(&mut out, at).map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e))?;
    w.write_all(&out)?;
    w.flush()
}

/// A cursor over a payload that fails instead of panicking.
#[derive(Debug)]
pub struct Cursor<'a> {
    buf: &'a [u8],
    pos: usize,
    what: &'static str,
}

impl<'a> Cursor<'a> {
    pub fn new(buf: &'a [u8], what: &'static str) -> Self {
        Self { buf, pos: 0, what }
    }

    fn bad(&self) -> FrameError {
        FrameError::Malformed { what: self.what }
    }

    pub fn bytes(&mut self, n: usize) -> Result<&'a [u8], FrameError> {
        let end = self.pos.checked_add(n).ok_or_else(|| self.bad())?;
        let s = self.buf.get(self.pos..end).ok_or_else(|| self.bad())?;
        self.pos = end;
        Ok(s)
    }

    pub fn u8(&mut self) -> Result<u8, FrameError> {
        Ok(self.bytes(1)?[0])
    }
    pub fn u16(&mut self) -> Result<u16, FrameError> {
        Ok(u16::from_le_bytes(self.bytes(2)?.try_into().expect("2")))
    }
    pub fn u32(&mut self) -> Result<u32, FrameError> {
        Ok(u32::from_le_bytes(self.bytes(4)?.try_into().expect("4")))
    }
    pub fn u64(&mut self) -> Result<u64, FrameError> {
        Ok(u64::from_le_bytes(self.bytes(8)?.try_into().expect("8")))
    }
    pub fn rest(&mut self) -> &'a [u8] {
        let s = &self.buf[self.pos..];
        self.pos = self.buf.len();
        s
    }
    pub fn remaining(&self) -> usize {
        self.buf.len() - self.pos
    }
    /// Fails unless the whole payload was consumed.
    pub fn end(&self) -> Result<(), FrameError> {
        if self.pos == self.buf.len() {
            Ok(())
        } else {
            Err(self.bad())
        }
    }
}

pub fn encode_regions(out: &mut Vec<u8>, regions: &[RegionDesc]) {
    out.extend_from_slice(&(regions.len() as u32).to_le_bytes());
    for r in regions {
        out.extend_from_slice(&r.rkey.0.to_le_bytes());
        out.extend_from_slice(&r.base.to_le_bytes());
        out.extend_from_slice(&r.len.to_le_bytes());
        out.push(r.access.bits());
        out.push(match r.media {
            Media::Dram => 0,
            Media::Nvm => 1,
        });
        let name = r.name.as_str().as_bytes();
        out.push(name.len() as u8);
        out.extend_from_slice(name);
    }
}

pub fn decode_regions(c: &mut Cursor<'_>, node: NodeId) -> Result<Vec<RegionDesc>, FrameError> {
    let n = c.u32()? as usize;
    // Each entry is at least 23 bytes: refuse counts the payload cannot hold before allocating.
    if n > c.remaining() / 23 {
        return Err(FrameError::Malformed {
            what: "region table",
        });
    }
    let mut v = Vec::with_capacity(n);
    for _ in 0..n {
        let rkey = RKey(c.u32()?);
        let base = c.u64()?;
        let len = c.u64()?;
        let access = Access::from_bits(c.u8()?);
        let media = match c.u8()? {
            0 => Media::Dram,
            1 => Media::Nvm,
            _ => {
                return Err(FrameError::Malformed {
                    what: "region media",
                });
            }
        };
        let name_len = usize::from(c.u8()?);
        let name = std::str::from_utf8(c.bytes(name_len)?)
            .ok()
            .and_then(RegionName::new)
            .ok_or(FrameError::Malformed {
                what: "region name",
            })?;
        if base.checked_add(len).is_none() {
            return Err(FrameError::Malformed {
                what: "region bounds",
            });
        }
        v.push(RegionDesc {
            node,
            name,
            rkey,
            base,
            len,
            access,
            media,
        });
    }
    Ok(v)
}

#[cfg(test)]
pub(crate) use crate::wire::hex_dump;

#[cfg(test)]
mod tests {
    use super::*;

    /// The 16-byte header of every frame kind (req id 0x0102030405060708, a 3-byte payload),
    /// and a region table. A change here is a protocol change: bump [`VERSION`].
    #[test]
    fn frame_header_bytes_are_pinned() {
        let kinds = [
            Kind::Hello,
            Kind::Auth,
            Kind::Welcome,
            Kind::Batch,
            Kind::BatchResp,
            Kind::Rpc,
            Kind::RpcResp,
            Kind::Regions,
            Kind::RegionsResp,
            Kind::Error,
        ];
        let mut s = String::new();
        for k in kinds {
            let f = encode_frame(k, 0x0102_0304_0506_0708, b"abc");
            s.push_str(&format!("{k:?}\n{}", hex_dump(&f)));
        }
        insta::assert_snapshot!(s);
    }

    #[test]
    fn region_table_bytes_are_pinned() {
        let regions = [
            RegionDesc {
                node: NodeId(3),
                name: RegionName::new("fusee.pool").unwrap(),
                rkey: RKey(0x1122_3344),
                base: 1 << 40,
                len: 64 << 20,
                access: Access::ALL,
                media: Media::Nvm,
            },
            RegionDesc {
                node: NodeId(3),
                name: RegionName::default(),
                rkey: RKey(7),
                base: 0x1000,
                len: 4096,
                access: Access::REMOTE_READ,
                media: Media::Dram,
            },
        ];
        let mut p = Vec::new();
        encode_regions(&mut p, &regions);
        let f = encode_frame(Kind::RegionsResp, 9, &p);
        insta::assert_snapshot!(hex_dump(&f));
    }

    #[test]
    fn header_round_trips_and_rejects_garbage() {
        let mut out = Vec::new();
        let at = encode_header(&mut out, Kind::Rpc, 42);
        out.extend_from_slice(b"abc");
        finish(&mut out, at).unwrap();
        let h: [u8; HEADER_LEN] = out[..HEADER_LEN].try_into().unwrap();
        let hdr = decode_header(&h, 1024).unwrap();
        assert_eq!((hdr.kind, hdr.len, hdr.req_id), (Kind::Rpc, 3, 42));
        let mut bad = h;
        bad[2] = 9;
        assert!(matches!(
            decode_header(&bad, 1024),
            Err(FrameError::Version { got: 9 })
        ));
        let mut bad = h;
        bad[0] = b'X';
        assert!(matches!(
            decode_header(&bad, 1024),
            Err(FrameError::Magic(_))
        ));
        assert!(matches!(
            decode_header(&h, 2),
            Err(FrameError::TooLong { .. })
        ));
        let mut bad = h;
        bad[3] = 200;
        assert!(matches!(
            decode_header(&bad, 1024),
            Err(FrameError::Kind(200))
        ));
    }

    #[test]
    fn region_table_with_a_lying_count_is_refused() {
        let mut p = Vec::new();
        p.extend_from_slice(&u32::MAX.to_le_bytes());
        let mut c = Cursor::new(&p, "regions");
        assert!(decode_regions(&mut c, NodeId(0)).is_err());
    }
}

/// A connection's receive buffer: bytes read from the socket, cut into whole frames. Every
/// frame already received is taken before the next read, so a peer's burst of frames is
/// handled (and answered) together.
#[derive(Debug)]
pub(crate) struct RxBuf {
    /// Always initialized to its length; `start..end` holds bytes not yet taken.
    buf: Vec<u8>,
    start: usize,
    end: usize,
    /// The size it starts with and returns to after a large frame.
    chunk: usize,
}

impl RxBuf {
    pub(crate) fn new(chunk: usize) -> Self {
        Self {
            buf: vec![0; chunk],
            start: 0,
            end: 0,
            chunk,
        }
    }

    /// The next whole frame received: its header and where its payload lies (valid until the
    /// next read). `Ok(None)` when the rest of a frame has not arrived yet.
    pub(crate) fn next(
        &mut self,
        max: usize,
    ) -> Result<Option<(Header, std::ops::Range<usize>)>, FrameError> {
        let have = &self.buf[self.start..self.end];
        let Some(h) = have.get(..HEADER_LEN) else {
            return Ok(None);
        };
        let hdr = decode_header(h.try_into().expect("HEADER_LEN bytes"), max)?;
        let end = HEADER_LEN + hdr.len as usize;
        if have.len() < end {
            return Ok(None);
        }
        let at = self.start + HEADER_LEN;
        self.start += end;
        Ok(Some((hdr, at..at + hdr.len as usize)))
    }

    pub(crate) fn bytes(&self, r: std::ops::Range<usize>) -> &[u8] {
        &self.buf[r]
    }

    /// Whether bytes of an unfinished frame are buffered.
    pub(crate) fn partial(&self) -> bool {
        self.start < self.end
    }

    /// Reads once from `stream` (waiting until it is readable): the bytes read, 0 at EOF.
    pub(crate) async fn fill(&mut self, stream: &tokio::net::TcpStream) -> io::Result<usize> {
        // Move what is left of an unfinished frame to the front, then make room.
        if self.start > 0 {
            self.buf.copy_within(self.start..self.end, 0);
            self.end -= self.start;
            self.start = 0;
        }
        if self.end == self.buf.len() {
            // A frame larger than the buffer: grow (by doubling) until it fits.
            let grown = (self.buf.len() * 2).max(4096);
            self.buf.resize(grown, 0);
        } else if self.buf.len() > 4 * self.chunk && self.end <= self.chunk {
            // The large frame is gone: give the memory back.
            self.buf.truncate(self.chunk);
            self.buf.shrink_to_fit();
        }
        let room = self.buf.len() - self.end;
        loop {
            stream.readable().await?;
            let mut got = 0;
            let r = stream.try_io(tokio::io::Interest::READABLE, || {
                let n = io::Read::read(
                    &mut &*socket2::SockRef::from(stream),
                    &mut self.buf[self.end..],
                )?;
                got = n;
                if n > 0 && n < room {
                    // A short read emptied the socket: tell the runtime it is not readable
                    // now (as a failed read would, with the readiness seen before this
                    // read, so data that arrived since is not missed), which saves the
                    // read that would only say so.
                    return Err(io::ErrorKind::WouldBlock.into());
                }
                Ok(n)
            });
            match r {
                Ok(n) => {
                    self.end += n;
                    return Ok(n);
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock && got > 0 => {
                    self.end += got;
                    return Ok(got);
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => continue,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(e),
            }
        }
    }
}

/// Writes all of `bytes` to a tokio stream shared by reference.
pub(crate) async fn write_all(stream: &tokio::net::TcpStream, mut bytes: &[u8]) -> io::Result<()> {
    while !bytes.is_empty() {
        stream.writable().await?;
        match stream.try_write(bytes) {
            Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
            Ok(n) => bytes = &bytes[n..],
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

/// One whole frame, encoded.
pub(crate) fn encode_frame(kind: Kind, req_id: u64, payload: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(HEADER_LEN + payload.len());
    let at = encode_header(&mut out, kind, req_id);
    out.extend_from_slice(payload);
    // Handshake frames are small: their length always fits.
    let _ = finish(&mut out, at);
    out
}
