use std::fmt;

use dmkit_verbs::NodeId;

/// The global address of a Gengar object: which server, where in its NVM pool, and the
/// generation of the allocation (so a freed and re-allocated slot is never mistaken for the
/// object). Clients share objects by passing these around ([`GlobalAddr::to_bytes`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct GlobalAddr {
    pub server: NodeId,
    /// Offset of the payload in the server's NVM pool data area.
    pub offset: u64,
    pub generation: u32,
    /// The object's size in bytes.
    pub size: u32,
}

impl GlobalAddr {
    /// A fixed 18-byte encoding, for storing addresses inside objects.
    pub fn to_bytes(&self) -> [u8; 18] {
        let mut b = [0u8; 18];
        b[..2].copy_from_slice(&self.server.0.to_le_bytes());
        b[2..10].copy_from_slice(&self.offset.to_le_bytes());
        b[10..14].copy_from_slice(&self.generation.to_le_bytes());
        b[14..].copy_from_slice(&self.size.to_le_bytes());
        b
    }

    pub fn from_bytes(b: &[u8; 18]) -> Self {
        let u = |r: std::ops::Range<usize>| -> u64 {
            let mut x = [0u8; 8];
            x[..r.len()].copy_from_slice(&b[r]);
            u64::from_le_bytes(x)
        };
        GlobalAddr {
            server: NodeId(u(0..2) as u16),
            offset: u(2..10),
            generation: u(10..14) as u32,
            size: u(14..18) as u32,
        }
    }
}

impl fmt::Display for GlobalAddr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{:#x}/g{}", self.server, self.offset, self.generation)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bytes_round_trip() {
        let a = GlobalAddr {
            server: NodeId(513),
            offset: 0x1234_5678_9abc,
            generation: 77,
            size: 4096,
        };
        assert_eq!(GlobalAddr::from_bytes(&a.to_bytes()), a);
        assert_eq!(a.to_string(), "513:0x123456789abc/g77");
    }
}
