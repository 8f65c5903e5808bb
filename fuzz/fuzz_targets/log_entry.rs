//! KV objects with their embedded log entry: any bytes decode to an object or nothing, and a
//! decoded object re-encodes to bytes that decode to the same object.
#![no_main]

use dmkit_fusee::object::{self, Addr, Op};
use dmkit_verbs::NodeId;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let at = Addr {
        node: NodeId(1),
        offset: 4096,
    };
    let Some(o) = object::decode(data, at) else {
        return;
    };
    let Some(op) = Op::from_u8(o.log.op) else {
        return;
    };
    let bytes = object::encode(&o.key, &o.value, o.log.next, o.log.prev, o.generation, op)
        .expect("a decoded object re-encodes");
    let again = object::decode(&bytes, at).expect("re-encoded object decodes");
    assert_eq!((again.key, again.value), (o.key, o.value));
});
