use std::fmt;

/// A memory node's id within a cluster.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct NodeId(pub u16);

impl fmt::Display for NodeId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)
    }
}

/// The remote key of a registered memory region. Unpredictable per registration: knowing one
/// region's rkey tells nothing about another's.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct RKey(pub u32);

impl fmt::Display for RKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:#010x}", self.0)
    }
}

/// A remote pointer: which node, which region (by rkey), which address inside it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct RemoteAddr {
    pub node: NodeId,
    pub rkey: RKey,
    pub addr: u64,
}

impl RemoteAddr {
    pub const fn new(node: NodeId, rkey: RKey, addr: u64) -> Self {
        Self { node, rkey, addr }
    }

    /// The same region, `off` bytes further.
    #[must_use]
    pub const fn add(self, off: u64) -> Self {
        Self {
            addr: self.addr + off,
            ..self
        }
    }
}

impl fmt::Display for RemoteAddr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "node {} rkey {} @ {:#x}",
            self.node, self.rkey, self.addr
        )
    }
}

/// Which one-sided verbs a region admits.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Access(u8);

impl Access {
    pub const NONE: Access = Access(0);
    pub const REMOTE_READ: Access = Access(1);
    pub const REMOTE_WRITE: Access = Access(2);
    pub const REMOTE_ATOMIC: Access = Access(4);
    pub const ALL: Access = Access(7);

    pub const fn contains(self, other: Access) -> bool {
        self.0 & other.0 == other.0
    }
    pub const fn bits(self) -> u8 {
        self.0
    }
    pub const fn from_bits(bits: u8) -> Access {
        Access(bits & 7)
    }
}

impl std::ops::BitOr for Access {
    type Output = Access;
    fn bitor(self, rhs: Access) -> Access {
        Access(self.0 | rhs.0)
    }
}

/// The medium behind a region: it decides durability and, in the sim latency model, cost.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Media {
    /// Volatile memory.
    Dram,
    /// Persistent memory (a pmem pool): durable writes persist before they complete.
    Nvm,
}

/// A region's name (at most [`RegionName::MAX`] bytes of printable ASCII; empty: unnamed),
/// so that layers find their regions by what they are ("fusee.pool", "gengar.dram") rather
/// than by where they are.
#[derive(Clone, Copy, Default, PartialEq, Eq, Hash)]
pub struct RegionName {
    len: u8,
    bytes: [u8; RegionName::MAX],
}

impl RegionName {
    /// The longest name.
    pub const MAX: usize = 15;

    /// `name`, if it is at most [`RegionName::MAX`] bytes of printable ASCII.
    pub fn new(name: &str) -> Option<Self> {
        let b = name.as_bytes();
        if b.len() > Self::MAX || !b.iter().all(|c| c.is_ascii_graphic()) {
            return None;
        }
        let mut bytes = [0; Self::MAX];
        bytes[..b.len()].copy_from_slice(b);
        Some(Self {
            len: b.len() as u8,
            bytes,
        })
    }

    /// The name ("" when unnamed).
    pub fn as_str(&self) -> &str {
        // (Only printable ASCII gets in: `new` and the wire decoders check it.)
        std::str::from_utf8(&self.bytes[..usize::from(self.len)]).unwrap_or("")
    }

    /// Whether the region has no name.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
}

impl std::fmt::Debug for RegionName {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{:?}", self.as_str())
    }
}

impl std::fmt::Display for RegionName {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// What a client knows about one registered region of a memory node.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RegionDesc {
    pub node: NodeId,
    /// What the region is (see [`crate::MemoryNode::register_named`]); empty when unnamed.
    pub name: RegionName,
    pub rkey: RKey,
    /// The region's first remote address. Stable across restarts when the node registers it
    /// with a fixed base (pools do), so pointers stored in remote memory stay valid.
    pub base: u64,
    pub len: u64,
    pub access: Access,
    pub media: Media,
}

impl RegionDesc {
    /// The remote pointer `off` bytes into the region.
    pub const fn at(&self, off: u64) -> RemoteAddr {
        RemoteAddr::new(self.node, self.rkey, self.base + off)
    }

    pub const fn contains(&self, addr: u64, len: u64) -> bool {
        addr >= self.base && len <= self.len && addr - self.base <= self.len - len
    }
}
