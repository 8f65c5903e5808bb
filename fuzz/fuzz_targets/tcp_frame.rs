//! The tcp soft NIC: any bytes a client sends are answered or refused, never a panic, and a
//! refused frame touches no memory outside the node's regions.
#![no_main]

use std::sync::{Arc, OnceLock};

use dmkit_verbs::{Access, DramBacking, MemoryNode, NodeId};
use libfuzzer_sys::fuzz_target;

fn node() -> &'static MemoryNode {
    static NODE: OnceLock<MemoryNode> = OnceLock::new();
    NODE.get_or_init(|| {
        let n = MemoryNode::new(NodeId(0));
        n.register(Arc::new(DramBacking::new(4096)), Access::ALL, Some(1 << 40))
            .expect("register");
        n.register(Arc::new(DramBacking::new(64)), Access::REMOTE_READ, Some(1 << 41))
            .expect("register");
        n
    })
}

fuzz_target!(|data: &[u8]| {
    let _ = dmkit_verbs::tcp::serve_frame(node(), data, 1 << 16);
});
