//! The tcp soft NIC: any bytes a client sends are answered or refused, never a panic, and a
//! refused frame touches no memory outside the node's regions. Half the inputs get a valid
//! header around a fuzzed payload, so the batch decoder and executor are reached.
#![no_main]

use std::sync::{Arc, OnceLock};

use dmkit_verbs::tcp::frame::{Kind, encode_header, finish};
use dmkit_verbs::{Access, DramBacking, MemoryNode, NodeId, RKey};
use libfuzzer_sys::fuzz_target;

fn node() -> &'static (MemoryNode, RKey) {
    static NODE: OnceLock<(MemoryNode, RKey)> = OnceLock::new();
    NODE.get_or_init(|| {
        let n = MemoryNode::new(NodeId(0));
        let r = n
            .register(Arc::new(DramBacking::new(4096)), Access::ALL, Some(1 << 40))
            .expect("register");
        n.register(Arc::new(DramBacking::new(64)), Access::REMOTE_READ, Some(1 << 41))
            .expect("register");
        (n, r.rkey)
    })
}

fuzz_target!(|data: &[u8]| {
    let (n, rkey) = node();
    let Some((&mode, rest)) = data.split_first() else {
        return;
    };
    let frame = if mode & 1 == 0 {
        rest.to_vec()
    } else {
        let kind = match mode >> 1 & 3 {
            0 | 1 => Kind::Batch,
            2 => Kind::Rpc,
            _ => Kind::Regions,
        };
        // Patch the fuzzed payload so work requests name the real region now and then.
        let mut payload = rest.to_vec();
        if mode & 0x80 != 0 && payload.len() >= 9 {
            payload[5..9].copy_from_slice(&rkey.0.to_le_bytes());
        }
        let mut out = Vec::new();
        let at = encode_header(&mut out, kind, 1);
        out.extend_from_slice(&payload);
        if finish(&mut out, at).is_err() {
            return;
        }
        out
    };
    let _ = dmkit_verbs::tcp::serve_frame(n, &frame, 1 << 16);
});
