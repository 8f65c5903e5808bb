//! A pool's blocks as a remote service (feature `verbs`): what a memory node answers when
//! clients ask for blocks by RPC — the first level of two-level memory management, where
//! clients carve objects out of whole blocks themselves (FUSEE). Blocks are owned (an owner id
//! per block, persistent in the pool), so a restarted client finds its blocks again and a
//! replicated block is allocated at the same id on every replica.
//!
//! [`BlockRequest`] is the request (its encoding is the wire format, first byte a [`tag`]);
//! [`serve`] executes one on a pool and encodes the reply, whose first byte is a [`status`].
//! A memory node that serves other RPCs too dispatches on [`BlockRequest::decode`] returning
//! `Some`. The reply decoders ([`decode_block`] and the others) are the client's side.
//!
//! ```
//! use dmkit_pmem_pool::remote::{self, BlockRequest, ServeOptions};
//! use dmkit_pmem_pool::{Pool, PoolOptions};
//!
//! let pool = Pool::create_dram(4 << 20, PoolOptions::default().block_size(64 << 10))?;
//! let opts = ServeOptions::default();
//! // Client 7 asks for a block on stripe 0 of 2, and lists its blocks.
//! let req = BlockRequest::AllocStripe { owner: 7, stride: 2, rem: 0, min: 0, reserve: false };
//! let reply = remote::serve(&pool, &BlockRequest::decode(&req.encode())?.unwrap(), &opts);
//! let block = remote::decode_block(&reply)?;
//! assert_eq!(block % 2, 0);
//! let reply = remote::serve(&pool, &BlockRequest::BlocksOf { owner: 7 }, &opts);
//! assert_eq!(remote::decode_blocks(&reply)?, vec![block]);
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

use dmkit_verbs::wire::{Reader, WireError, Writer};

use crate::{BlockId, Error, Pool};

/// The first byte of a block request.
pub mod tag {
    pub const ALLOC_STRIPE: u8 = 1;
    pub const ALLOC_AT: u8 = 2;
    pub const FREE_BLOCK: u8 = 3;
    pub const BLOCKS_OF: u8 = 4;
    pub const STAT: u8 = 5;
    pub const RESERVE: u8 = 6;
    pub const BLOCK_TABLE: u8 = 10;
    pub const SET_BLOCK: u8 = 11;
}

/// The first byte of a reply.
pub mod status {
    pub const OK: u8 = 0;
    /// The block is someone else's (or, for a free, not the asker's).
    pub const TAKEN: u8 = 1;
    pub const OUT_OF_BLOCKS: u8 = 2;
    pub const FAILED: u8 = 3;
    /// The node does not serve the request now (e.g. its membership is changing): ask again
    /// later.
    pub const REFUSED: u8 = 4;
}

/// "No owner" in [`BlockRequest::SetBlock`].
pub const NO_OWNER: u64 = u64::MAX;

/// A request to a pool's block service.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum BlockRequest {
    /// A free block for `owner` whose id is `rem` modulo `stride` and at least `min` (a
    /// client's stripe of the pool). `reserve`: it may take the blocks kept back for deletes.
    AllocStripe {
        owner: u64,
        stride: u16,
        rem: u16,
        min: u64,
        reserve: bool,
    },
    /// Block `block` for `owner` (a replica mirroring the primary's allocation); already
    /// `owner`'s is fine.
    AllocAt {
        owner: u64,
        block: u64,
        reserve: bool,
    },
    /// Frees `block` if `owner` owns it.
    FreeBlock { owner: u64, block: u64 },
    /// Every block `owner` owns.
    BlocksOf { owner: u64 },
    /// The pool's block size, block count and free blocks.
    Stat,
    /// Blocks `first..first + count` for `owner` (formatting: fixed areas).
    Reserve { owner: u64, first: u64, count: u64 },
    /// Every owned block and its owner (a refill copies it).
    BlockTable,
    /// Makes `owner` (or nobody, [`NO_OWNER`]) the owner of `block`, whoever had it.
    SetBlock { block: u64, owner: u64 },
}

impl BlockRequest {
    /// The wire form.
    pub fn encode(&self) -> Vec<u8> {
        match *self {
            Self::AllocStripe {
                owner,
                stride,
                rem,
                min,
                reserve,
            } => Writer::new()
                .u8(tag::ALLOC_STRIPE)
                .u64(owner)
                .u16(stride)
                .u16(rem)
                .u64(min)
                .u8(u8::from(reserve))
                .finish(),
            Self::AllocAt {
                owner,
                block,
                reserve,
            } => Writer::new()
                .u8(tag::ALLOC_AT)
                .u64(owner)
                .u64(block)
                .u8(u8::from(reserve))
                .finish(),
            Self::FreeBlock { owner, block } => Writer::new()
                .u8(tag::FREE_BLOCK)
                .u64(owner)
                .u64(block)
                .finish(),
            Self::BlocksOf { owner } => Writer::new().u8(tag::BLOCKS_OF).u64(owner).finish(),
            Self::Stat => Writer::new().u8(tag::STAT).finish(),
            Self::Reserve {
                owner,
                first,
                count,
            } => Writer::new()
                .u8(tag::RESERVE)
                .u64(owner)
                .u64(first)
                .u64(count)
                .finish(),
            Self::BlockTable => Writer::new().u8(tag::BLOCK_TABLE).finish(),
            Self::SetBlock { block, owner } => Writer::new()
                .u8(tag::SET_BLOCK)
                .u64(block)
                .u64(owner)
                .finish(),
        }
    }

    /// The request `req` encodes; `None` when its first byte is not a block request's tag
    /// (another service's request). A malformed block request is an error.
    pub fn decode(req: &[u8]) -> Result<Option<Self>, WireError> {
        let mut r = Reader::new(req);
        let Ok(kind) = r.u8() else {
            return Ok(None);
        };
        // A request's optional last byte: 1 = it may use the reserve.
        let reserve = |r: &mut Reader<'_>| -> Result<bool, WireError> {
            Ok(r.remaining() > 0 && r.u8()? != 0)
        };
        let req = match kind {
            tag::ALLOC_STRIPE => Self::AllocStripe {
                owner: r.u64()?,
                stride: r.u16()?,
                rem: r.u16()?,
                min: r.u64()?,
                reserve: reserve(&mut r)?,
            },
            tag::ALLOC_AT => Self::AllocAt {
                owner: r.u64()?,
                block: r.u64()?,
                reserve: reserve(&mut r)?,
            },
            tag::FREE_BLOCK => Self::FreeBlock {
                owner: r.u64()?,
                block: r.u64()?,
            },
            tag::BLOCKS_OF => Self::BlocksOf { owner: r.u64()? },
            tag::STAT => Self::Stat,
            tag::RESERVE => Self::Reserve {
                owner: r.u64()?,
                first: r.u64()?,
                count: r.u64()?,
            },
            tag::BLOCK_TABLE => Self::BlockTable,
            tag::SET_BLOCK => Self::SetBlock {
                block: r.u64()?,
                owner: r.u64()?,
            },
            _ => return Ok(None),
        };
        r.finish()?;
        Ok(Some(req))
    }

    /// Whether the request hands out or frees blocks for a client (what a node refuses while
    /// it must keep its block table still).
    pub fn allocates(&self) -> bool {
        matches!(
            self,
            Self::AllocStripe { .. } | Self::AllocAt { .. } | Self::FreeBlock { .. }
        )
    }

    /// A short name of the request's kind (metric labels).
    pub fn kind(&self) -> &'static str {
        match self {
            Self::AllocStripe { .. } => "alloc_stripe",
            Self::AllocAt { .. } => "alloc_at",
            Self::FreeBlock { .. } => "free_block",
            Self::BlocksOf { .. } => "blocks_of",
            Self::Stat => "stat",
            Self::Reserve { .. } => "reserve",
            Self::BlockTable => "block_table",
            Self::SetBlock { .. } => "set_block",
        }
    }
}

/// How [`serve`] hands out blocks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct ServeOptions {
    /// Free blocks kept back for requests with `reserve` set (a full pool must still take
    /// deletes, which write small objects: without a reserve nothing could be deleted to make
    /// room). `None`: 1/64 of the pool's blocks, between 2 and 64.
    pub reserve_blocks: Option<usize>,
}

/// The reply to a request the node does not serve now (`why` travels to the client).
pub fn refused(why: &str) -> Vec<u8> {
    Writer::new()
        .u8(status::REFUSED)
        .bytes(why.as_bytes())
        .finish()
}

fn failed(e: Error) -> Vec<u8> {
    let code = match e {
        Error::OutOfBlocks { .. } => status::OUT_OF_BLOCKS,
        Error::BlockTaken { .. } => status::TAKEN,
        _ => status::FAILED,
    };
    Writer::new()
        .u8(code)
        .bytes(e.to_string().as_bytes())
        .finish()
}

fn ok() -> Vec<u8> {
    Writer::new().u8(status::OK).finish()
}

/// Executes `req` on `pool` and encodes the reply (first byte a [`status`]).
pub fn serve(pool: &Pool, req: &BlockRequest, opts: &ServeOptions) -> Vec<u8> {
    let kept = opts
        .reserve_blocks
        .unwrap_or_else(|| (pool.block_count() / 64).clamp(2, 64));
    let short_of_blocks = |reserve: bool| {
        let free = pool.free_blocks();
        (!reserve && free <= kept).then(|| {
            Writer::new()
                .u8(status::OUT_OF_BLOCKS)
                .bytes(
                    format!(
                        "out of space: {free} free block(s), kept for deletes (delete keys to make room)"
                    )
                    .as_bytes(),
                )
                .finish()
        })
    };
    match *req {
        BlockRequest::AllocStripe {
            owner,
            stride,
            rem,
            min,
            reserve,
        } => {
            if let Some(full) = short_of_blocks(reserve) {
                return full;
            }
            let stride = u64::from(stride.max(1));
            match pool.alloc_block_where(owner, |b| b.0 >= min && b.0 % stride == u64::from(rem)) {
                Ok(b) => Writer::new().u8(status::OK).u64(b.0).finish(),
                Err(e) => failed(e),
            }
        }
        BlockRequest::AllocAt {
            owner,
            block,
            reserve,
        } => {
            if pool.block_owner(BlockId(block)) == Some(owner) {
                // Already mirrored for this owner (a refill copied the table first).
                return ok();
            }
            if let Some(full) = short_of_blocks(reserve) {
                return full;
            }
            match pool.alloc_block_at(BlockId(block), owner) {
                Ok(()) => ok(),
                Err(e) => failed(e),
            }
        }
        BlockRequest::FreeBlock { owner, block } => {
            if pool.block_owner(BlockId(block)) != Some(owner) {
                Writer::new().u8(status::TAKEN).finish()
            } else {
                match pool.free_block(BlockId(block)) {
                    Ok(()) => ok(),
                    Err(e) => failed(e),
                }
            }
        }
        BlockRequest::BlocksOf { owner } => {
            let blocks = pool.blocks_owned_by(owner);
            let mut w = Writer::new().u8(status::OK).u32(blocks.len() as u32);
            for b in blocks {
                w = w.u64(b.0);
            }
            w.finish()
        }
        BlockRequest::Stat => Writer::new()
            .u8(status::OK)
            .u64(pool.block_size() as u64)
            .u64(pool.block_count() as u64)
            .u64(pool.free_blocks() as u64)
            .finish(),
        BlockRequest::Reserve {
            owner,
            first,
            count,
        } => {
            for b in first..first.saturating_add(count) {
                if let Err(e) = pool.alloc_block_at(BlockId(b), owner) {
                    return failed(e);
                }
            }
            ok()
        }
        BlockRequest::BlockTable => {
            let all: Vec<_> = (0..pool.block_count() as u64)
                .filter_map(|b| pool.block_owner(BlockId(b)).map(|o| (b, o)))
                .collect();
            let mut w = Writer::new().u8(status::OK).u32(all.len() as u32);
            for (b, o) in all {
                w = w.u64(b).u64(o);
            }
            w.finish()
        }
        BlockRequest::SetBlock { block, owner } => {
            let b = BlockId(block);
            let cur = pool.block_owner(b);
            if cur == (owner != NO_OWNER).then_some(owner) {
                return ok();
            }
            if cur.is_some()
                && let Err(e) = pool.free_block(b)
            {
                return failed(e);
            }
            if owner != NO_OWNER
                && let Err(e) = pool.alloc_block_at(b, owner)
            {
                return failed(e);
            }
            ok()
        }
    }
}

/// A memory node serving `pool`: its data area is the node's one region (NVM when the pool is
/// persistent), and its RPCs are the block service ([`serve`], default options). Serve it with
/// any verbs backend.
pub fn memory_node(
    id: dmkit_verbs::NodeId,
    pool: std::sync::Arc<Pool>,
) -> Result<std::sync::Arc<dmkit_verbs::MemoryNode>, dmkit_verbs::Error> {
    let node = std::sync::Arc::new(dmkit_verbs::MemoryNode::new(id));
    let backing = crate::verbs::verbs_backing(&pool);
    node.register(std::sync::Arc::new(backing), dmkit_verbs::Access::ALL, None)?;
    node.set_rpc_handler(std::sync::Arc::new(
        move |_: &dmkit_verbs::Peer, req: &[u8]| match BlockRequest::decode(req) {
            Ok(Some(r)) => Ok(serve(&pool, &r, &ServeOptions::default())),
            Ok(None) => Err("not a block request".to_string()),
            Err(e) => Err(format!("malformed block request: {e}")),
        },
    ));
    Ok(node)
}

/// Why a remote allocation failed.
#[derive(Debug, thiserror::Error)]
pub enum AllocError {
    #[error("an object of {0} bytes is larger than the largest size class")]
    TooLarge(usize),
    #[error("block request: {0}")]
    Verbs(#[from] dmkit_verbs::Error),
    #[error(transparent)]
    Reply(#[from] ReplyError),
}

/// A client's objects in remote pools: blocks fetched from the nodes' block services (one RPC
/// per block, the nodes in turn), carved into objects by size class locally
/// ([`crate::slabs`]). An object is `(node, offset in the node's pool region)`.
#[derive(Debug)]
pub struct RemoteSlabs {
    owner: u64,
    block_size: u64,
    min_block: u64,
    nodes: Vec<dmkit_verbs::NodeId>,
    lists: parking_lot::Mutex<crate::slabs::SlabLists<(dmkit_verbs::NodeId, u64)>>,
}

impl RemoteSlabs {
    /// Slabs of client `owner` over the pools of `nodes` (blocks of `block_size` bytes; blocks
    /// below `min_block` are never handed out — e.g. reserved for an index).
    pub fn new(
        owner: u64,
        block_size: u64,
        min_block: u64,
        nodes: Vec<dmkit_verbs::NodeId>,
    ) -> Self {
        Self {
            owner,
            block_size,
            min_block,
            nodes,
            lists: parking_lot::Mutex::new(crate::slabs::SlabLists::new()),
        }
    }

    /// A free object for `len` bytes, fetching a block through `ep` when its class ran dry.
    pub fn alloc(
        &self,
        ep: &dmkit_verbs::Endpoint,
        len: usize,
    ) -> Result<(dmkit_verbs::NodeId, u64), AllocError> {
        let class = crate::slabs::class_of(len).ok_or(AllocError::TooLarge(len))?;
        loop {
            let mut lists = self.lists.lock();
            if let Some((o, _)) = lists.pop(class) {
                return Ok(o.addr);
            }
            let node = self.nodes[lists.blocks.len() % self.nodes.len()];
            drop(lists);
            let req = BlockRequest::AllocStripe {
                owner: self.owner,
                stride: 1,
                rem: 0,
                min: self.min_block,
                reserve: false,
            };
            let id = BlockClient::new(ep, "pmem_pool.blocks")
                .alloc(node, &req)
                .map_err(|e| match e {
                    RequestError::Verbs(e) => AllocError::Verbs(e),
                    RequestError::Reply(e) => AllocError::Reply(e),
                })?;
            let block = crate::slabs::OwnedBlock { id, class };
            (self.lists.lock()).add_block(self.block_size, block, |off| (node, off));
        }
    }

    /// Lists an object of `len` bytes free again (this client's own free).
    pub fn free(&self, node: dmkit_verbs::NodeId, offset: u64, len: usize) {
        if let Some(class) = crate::slabs::class_of(len) {
            self.lists.lock().push(class, (node, offset), 0);
        }
    }

    /// Free objects listed, over every class.
    pub fn free_objects(&self) -> usize {
        self.lists.lock().total()
    }
}

/// What [`reclaim_async`] does to each freed object before its bit is cleared: write `byte`
/// at `offset` in it, durably (a mark that tells a recovering owner the object is free, so a
/// crash between the reclaim and the object's reuse cannot bring it back as live), and read
/// its first `read_len` bytes (a header: say, the generation it was last used at).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ReclaimMark {
    pub offset: u64,
    pub byte: u8,
    pub read_len: usize,
}

/// An object [`reclaim_async`] took back: its class, where it is (a node, an offset in the
/// node's region) and its first [`ReclaimMark::read_len`] bytes, read before the mark.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reclaimed {
    pub class: usize,
    pub node: dmkit_verbs::NodeId,
    pub offset: u64,
    pub head: Vec<u8>,
}

/// An owner takes back, in one batch, the objects of its blocks that anyone freed (one FAA
/// each on its block's free bitmap, [`crate::slabs::free_bit`]). `blocks`: each owned block
/// and the region (on the node where its bitmap is kept) it is read in; blocks of
/// `block_size` bytes. Three round trips, one batch per node each: read the bitmaps; read
/// each freed object's head and write its [`ReclaimMark`] durably; then clear exactly the
/// bits seen (an FAA subtracting them, so frees that landed meanwhile stay set) — only once
/// the marks are durable, so a power cut never leaves an object neither marked nor freed.
/// Returns the objects taken back; list them free again.
///
/// ```
/// use dmkit_pmem_pool::remote::{ReclaimMark, reclaim_async};
/// use dmkit_pmem_pool::slabs::{OwnedBlock, block_image, class_of, free_bit};
/// use dmkit_verbs::sim::SimCluster;
///
/// let (cluster, regions) = SimCluster::with_dram_nodes(1, 1 << 20)?;
/// let (ep, region, bs) = (cluster.endpoint(9)?, regions[0], 64 << 10);
/// // Block 2 holds 128-byte objects; someone frees the one at `obj` with one FAA.
/// let class = class_of(128).unwrap();
/// ep.write("setup", region.at(2 * bs), &block_image(bs, class, 7))?;
/// let obj = 2 * bs + 4096;
/// let (word, bit) = free_bit(bs, obj, 128).unwrap();
/// ep.faa("free", region.at(word), bit)?;
/// // The owner reclaims: marks byte 8 of each freed object, reads its first 16 bytes.
/// let mark = ReclaimMark { offset: 8, byte: 0xff, read_len: 16 };
/// let blocks = [(region, OwnedBlock { id: 2, class })];
/// let back = dmkit_verbs::block_on(reclaim_async(&ep, "reclaim", bs, &blocks, mark))?;
/// assert_eq!((back.len(), back[0].offset), (1, obj));
/// assert_eq!(ep.read("check", region.at(obj + 8), 1)?, vec![0xff]);
/// // The bit is clear again: a second reclaim finds nothing.
/// assert!(dmkit_verbs::block_on(reclaim_async(&ep, "reclaim", bs, &blocks, mark))?.is_empty());
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub async fn reclaim_async(
    ep: &dmkit_verbs::Endpoint,
    tag: dmkit_verbs::Tag,
    block_size: u64,
    blocks: &[(dmkit_verbs::RegionDesc, crate::slabs::OwnedBlock)],
    mark: ReclaimMark,
) -> Result<Vec<Reclaimed>, dmkit_verbs::Error> {
    use crate::slabs::{BLOCK_HEADER, BlockGeometry};
    let mut by_node: std::collections::BTreeMap<_, Vec<_>> = Default::default();
    for (region, b) in blocks {
        by_node.entry(region.node).or_default().push((*region, *b));
    }
    // Round 1: the bitmaps.
    let mut batches = Vec::new();
    let mut plan = Vec::new();
    for (node, blocks) in &by_node {
        let mut b = ep.batch(*node);
        let mut p = Vec::new();
        for (region, blk) in blocks {
            let g = BlockGeometry::new(block_size, blk.class);
            let bitmap = region.at(blk.id * block_size + BLOCK_HEADER);
            p.push((*region, *blk, g, b.read(bitmap, g.bitmap_len())));
        }
        batches.push(b);
        plan.push(p);
    }
    let bitmaps = ep.execute_many_async(tag, batches).await;
    // Round 2 marks and reads the freed objects; round 3 clears their bits.
    let (mut marks, mut clears, mut found) = (Vec::new(), Vec::new(), Vec::new());
    for (res, p) in bitmaps.into_iter().zip(plan) {
        let res = res?;
        let node = p[0].0.node;
        let (mut b, mut clear, mut items) = (ep.batch(node), ep.batch(node), Vec::new());
        for (region, blk, g, idx) in p {
            for (w, chunk) in res.read(idx).chunks(8).enumerate() {
                let word = u64::from_le_bytes(chunk.try_into().expect("8 bytes"));
                if word == 0 {
                    continue;
                }
                for i in g.freed_in_word(w, word) {
                    let off = blk.id * block_size + g.object_offset(i);
                    let head = b.read(region.at(off), mark.read_len);
                    b.write_durable(region.at(off + mark.offset), &[mark.byte]);
                    items.push((blk.class, off, head));
                }
                let at = region.at(blk.id * block_size + BLOCK_HEADER + w as u64 * 8);
                clear.faa(at, 0u64.wrapping_sub(word));
            }
        }
        if !items.is_empty() {
            marks.push(b);
            clears.push(clear);
            found.push((node, items));
        }
    }
    let mut heads = Vec::new();
    for r in ep.execute_many_async(tag, marks).await {
        heads.push(r?);
    }
    for r in ep.execute_many_async(tag, clears).await {
        r?;
    }
    let mut out = Vec::new();
    for (res, (node, items)) in heads.into_iter().zip(found) {
        for (class, offset, head) in items {
            let head = res.read(head).to_vec();
            out.push(Reclaimed {
                class,
                node,
                offset,
                head,
            });
        }
    }
    Ok(out)
}

/// Why a block request sent with [`BlockClient`] failed: the RPC, or the reply (refused with
/// a status, or malformed).
#[derive(Debug, thiserror::Error)]
pub enum RequestError {
    #[error("block request: {0}")]
    Verbs(#[from] dmkit_verbs::Error),
    #[error(transparent)]
    Reply(#[from] ReplyError),
}

impl RequestError {
    /// The status the node refused the request with, if it did.
    pub fn refusal(&self) -> Option<&Refusal> {
        match self {
            Self::Reply(ReplyError::Refused(r)) => Some(r),
            _ => None,
        }
    }
}

/// The client's side of the block service: sends [`BlockRequest`]s to memory nodes by RPC
/// (its verbs counted under its tag) and decodes the replies; a reply that is not
/// [`status::OK`] is a [`RequestError`] carrying the node's status and message.
///
/// ```
/// use std::sync::Arc;
/// use dmkit_pmem_pool::remote::{self, BlockClient, BlockRequest, status};
/// use dmkit_pmem_pool::{Pool, PoolOptions};
/// use dmkit_verbs::NodeId;
/// use dmkit_verbs::sim::{SimCluster, SimConfig};
///
/// let cluster = SimCluster::new(SimConfig::default());
/// let pool = Arc::new(Pool::create_dram(4 << 20, PoolOptions::default().block_size(64 << 10))?);
/// cluster.add_node(remote::memory_node(NodeId(0), pool)?);
/// let ep = cluster.endpoint(1)?;
/// let blocks = BlockClient::new(&ep, "my_store.blocks");
/// let (block_size, count, _free) = blocks.stat(NodeId(0))?;
/// assert_eq!(block_size, 64 << 10);
/// let b = blocks.alloc(NodeId(0), &BlockRequest::AllocStripe { owner: 7, stride: 1, rem: 0, min: 1, reserve: false })?;
/// assert_eq!(blocks.blocks_of(NodeId(0), 7)?, vec![b]);
/// // Not the owner's: refused with a status.
/// let e = blocks.done(NodeId(0), &BlockRequest::FreeBlock { owner: 8, block: b }).unwrap_err();
/// assert_eq!(e.refusal().map(|r| r.status), Some(status::TAKEN));
/// blocks.done(NodeId(0), &BlockRequest::FreeBlock { owner: 7, block: b })?;
/// assert_eq!(blocks.block_table(NodeId(0))?, vec![]);
/// assert!(count > 1);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug, Clone, Copy)]
pub struct BlockClient<'a> {
    ep: &'a dmkit_verbs::Endpoint,
    tag: dmkit_verbs::Tag,
}

impl<'a> BlockClient<'a> {
    /// Requests through `ep`, tagged `tag`.
    pub fn new(ep: &'a dmkit_verbs::Endpoint, tag: dmkit_verbs::Tag) -> Self {
        Self { ep, tag }
    }

    /// The reply to `req` from `node`, whatever its status (for callers that act on it).
    pub async fn send_async(
        &self,
        node: dmkit_verbs::NodeId,
        req: &BlockRequest,
    ) -> Result<Vec<u8>, dmkit_verbs::Error> {
        self.ep.rpc_async(self.tag, node, &req.encode()).await
    }

    /// `req` sent to `node`; the reply must be OK ([`BlockRequest::AllocAt`],
    /// [`BlockRequest::FreeBlock`], [`BlockRequest::Reserve`], [`BlockRequest::SetBlock`]).
    pub async fn done_async(
        &self,
        node: dmkit_verbs::NodeId,
        req: &BlockRequest,
    ) -> Result<(), RequestError> {
        decode_ok(&self.send_async(node, req).await?)?;
        Ok(())
    }

    /// [`BlockClient::done_async`], blocking.
    pub fn done(&self, node: dmkit_verbs::NodeId, req: &BlockRequest) -> Result<(), RequestError> {
        dmkit_verbs::block_on(self.done_async(node, req))
    }

    /// The block an allocation ([`BlockRequest::AllocStripe`]) got on `node`.
    pub async fn alloc_async(
        &self,
        node: dmkit_verbs::NodeId,
        req: &BlockRequest,
    ) -> Result<u64, RequestError> {
        Ok(decode_block(&self.send_async(node, req).await?)?)
    }

    /// [`BlockClient::alloc_async`], blocking.
    pub fn alloc(
        &self,
        node: dmkit_verbs::NodeId,
        req: &BlockRequest,
    ) -> Result<u64, RequestError> {
        dmkit_verbs::block_on(self.alloc_async(node, req))
    }

    /// The blocks `owner` owns on `node`.
    pub fn blocks_of(
        &self,
        node: dmkit_verbs::NodeId,
        owner: u64,
    ) -> Result<Vec<u64>, RequestError> {
        let reply =
            dmkit_verbs::block_on(self.send_async(node, &BlockRequest::BlocksOf { owner }))?;
        Ok(decode_blocks(&reply)?)
    }

    /// `node`'s (block size, block count, free blocks).
    pub fn stat(&self, node: dmkit_verbs::NodeId) -> Result<(u64, u64, u64), RequestError> {
        let reply = dmkit_verbs::block_on(self.send_async(node, &BlockRequest::Stat))?;
        Ok(decode_stat(&reply)?)
    }

    /// `node`'s owned blocks and their owners.
    pub fn block_table(&self, node: dmkit_verbs::NodeId) -> Result<Vec<(u64, u64)>, RequestError> {
        let reply = dmkit_verbs::block_on(self.send_async(node, &BlockRequest::BlockTable))?;
        Ok(decode_table(&reply)?)
    }
}

/// A reply that was not [`status::OK`]: its status and message.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("block service status {status}: {message}")]
pub struct Refusal {
    pub status: u8,
    pub message: String,
}

/// Why a reply could not be used: refused, or malformed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ReplyError {
    #[error(transparent)]
    Refused(#[from] Refusal),
    #[error("malformed block-service reply: {0}")]
    Malformed(#[from] WireError),
}

/// The body of an OK reply, or the refusal it carries.
pub fn ok_body(reply: &[u8]) -> Result<Reader<'_>, ReplyError> {
    let mut r = Reader::new(reply);
    let st = r.u8()?;
    if st == status::OK {
        return Ok(r);
    }
    let message = r
        .bytes()
        .map(|b| String::from_utf8_lossy(b).into_owned())
        .unwrap_or_default();
    Err(Refusal {
        status: st,
        message,
    }
    .into())
}

/// An OK reply with no body (the requests that only change the table).
pub fn decode_ok(reply: &[u8]) -> Result<(), ReplyError> {
    ok_body(reply)?.finish()?;
    Ok(())
}

/// The block an [`BlockRequest::AllocStripe`] reply hands out.
pub fn decode_block(reply: &[u8]) -> Result<u64, ReplyError> {
    let mut r = ok_body(reply)?;
    let b = r.u64()?;
    r.finish()?;
    Ok(b)
}

/// The blocks a [`BlockRequest::BlocksOf`] reply lists.
pub fn decode_blocks(reply: &[u8]) -> Result<Vec<u64>, ReplyError> {
    let mut r = ok_body(reply)?;
    let n = r.u32()?;
    let blocks = (0..n).map(|_| r.u64()).collect::<Result<Vec<_>, _>>()?;
    r.finish()?;
    Ok(blocks)
}

/// A [`BlockRequest::Stat`] reply: (block size, block count, free blocks).
pub fn decode_stat(reply: &[u8]) -> Result<(u64, u64, u64), ReplyError> {
    let mut r = ok_body(reply)?;
    let s = (r.u64()?, r.u64()?, r.u64()?);
    r.finish()?;
    Ok(s)
}

/// A [`BlockRequest::BlockTable`] reply: (block, owner) pairs.
pub fn decode_table(reply: &[u8]) -> Result<Vec<(u64, u64)>, ReplyError> {
    let mut r = ok_body(reply)?;
    let n = r.u32()?;
    let t = (0..n)
        .map(|_| Ok((r.u64()?, r.u64()?)))
        .collect::<Result<Vec<_>, WireError>>()?;
    r.finish()?;
    Ok(t)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::PoolOptions;

    fn pool() -> Pool {
        Pool::create_dram(4 << 20, PoolOptions::default().block_size(64 << 10)).unwrap()
    }

    #[test]
    fn requests_round_trip_through_their_wire_form() {
        let all = [
            BlockRequest::AllocStripe {
                owner: 1,
                stride: 3,
                rem: 2,
                min: 5,
                reserve: true,
            },
            BlockRequest::AllocAt {
                owner: 1,
                block: 9,
                reserve: false,
            },
            BlockRequest::FreeBlock { owner: 1, block: 9 },
            BlockRequest::BlocksOf { owner: 1 },
            BlockRequest::Stat,
            BlockRequest::Reserve {
                owner: 2,
                first: 0,
                count: 3,
            },
            BlockRequest::BlockTable,
            BlockRequest::SetBlock {
                block: 4,
                owner: NO_OWNER,
            },
        ];
        for req in all {
            assert_eq!(BlockRequest::decode(&req.encode()).unwrap(), Some(req));
        }
        assert_eq!(BlockRequest::decode(&[99, 1, 2]).unwrap(), None);
        assert_eq!(BlockRequest::decode(&[]).unwrap(), None);
        assert!(BlockRequest::decode(&[tag::ALLOC_AT, 1]).is_err());
        // (Requests of older clients carry no reserve byte.)
        let old = Writer::new().u8(tag::ALLOC_AT).u64(1).u64(2).finish();
        assert!(matches!(
            BlockRequest::decode(&old).unwrap(),
            Some(BlockRequest::AllocAt { reserve: false, .. })
        ));
    }

    #[test]
    fn the_reserve_is_kept_for_requests_that_may_use_it() {
        let p = pool();
        let opts = ServeOptions {
            reserve_blocks: Some(2),
        };
        let alloc = |reserve| BlockRequest::AllocStripe {
            owner: 1,
            stride: 1,
            rem: 0,
            min: 0,
            reserve,
        };
        let mut got = 0;
        while decode_block(&serve(&p, &alloc(false), &opts)).is_ok() {
            got += 1;
        }
        assert_eq!(p.free_blocks(), 2);
        let Err(ReplyError::Refused(r)) = decode_block(&serve(&p, &alloc(false), &opts)) else {
            panic!("not refused");
        };
        assert_eq!(r.status, status::OUT_OF_BLOCKS);
        assert!(decode_block(&serve(&p, &alloc(true), &opts)).is_ok());
        let blocks =
            decode_blocks(&serve(&p, &BlockRequest::BlocksOf { owner: 1 }, &opts)).unwrap();
        assert_eq!(blocks.len(), got + 1);
        let (_, count, free) = decode_stat(&serve(&p, &BlockRequest::Stat, &opts)).unwrap();
        assert_eq!(free, 1);
        assert!(count as usize > got);
    }

    #[test]
    fn ok_replies_decode_and_refusals_carry_their_status() {
        assert_eq!(decode_ok(&[status::OK]), Ok(()));
        assert!(matches!(
            decode_ok(&[status::OK, 1]),
            Err(ReplyError::Malformed(_))
        ));
        let Err(ReplyError::Refused(r)) = decode_ok(&refused("membership changing")) else {
            panic!("not refused");
        };
        assert_eq!(
            (r.status, r.message.as_str()),
            (status::REFUSED, "membership changing")
        );
        let e = RequestError::from(ReplyError::Refused(r.clone()));
        assert_eq!(e.refusal(), Some(&r));
        assert_eq!(
            RequestError::from(dmkit_verbs::Error::NoSuchNode(dmkit_verbs::NodeId(1))).refusal(),
            None
        );
    }

    #[test]
    fn frees_and_owner_changes_check_the_owner() {
        let p = pool();
        let o = ServeOptions::default();
        let b = decode_block(&serve(
            &p,
            &BlockRequest::AllocStripe {
                owner: 5,
                stride: 1,
                rem: 0,
                min: 3,
                reserve: false,
            },
            &o,
        ))
        .unwrap();
        assert!(b >= 3);
        let not_yours = serve(&p, &BlockRequest::FreeBlock { owner: 6, block: b }, &o);
        assert_eq!(not_yours[0], status::TAKEN);
        assert_eq!(
            serve(&p, &BlockRequest::SetBlock { block: b, owner: 6 }, &o)[0],
            status::OK
        );
        assert_eq!(
            decode_table(&serve(&p, &BlockRequest::BlockTable, &o)).unwrap(),
            vec![(b, 6)]
        );
        assert_eq!(
            serve(
                &p,
                &BlockRequest::AllocAt {
                    owner: 6,
                    block: b,
                    reserve: false
                },
                &o
            )[0],
            status::OK,
            "already the owner's"
        );
        assert_eq!(
            serve(&p, &BlockRequest::FreeBlock { owner: 6, block: b }, &o)[0],
            status::OK
        );
        assert!(
            decode_table(&serve(&p, &BlockRequest::BlockTable, &o))
                .unwrap()
                .is_empty()
        );
    }
}
