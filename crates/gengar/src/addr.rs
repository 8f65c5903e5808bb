use std::fmt;

use dmkit_verbs::NodeId;
use dmkit_verbs::wire::Wire;

dmkit_verbs::wire_message! {
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
}

impl GlobalAddr {
    /// A fixed 18-byte encoding, for storing addresses inside objects: its fields in order,
    /// little-endian.
    pub fn to_bytes(&self) -> [u8; 18] {
        let b = Wire::to_bytes(self);
        b.try_into().expect("an address is 18 bytes")
    }

    pub fn from_bytes(b: &[u8; 18]) -> Self {
        <Self as Wire>::from_bytes(b).expect("any 18 bytes are an address")
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
        assert_eq!(&a.to_bytes()[..4], &[1, 2, 0xbc, 0x9a]);
        assert_eq!(a.to_string(), "513:0x123456789abc/g77");
    }
}
