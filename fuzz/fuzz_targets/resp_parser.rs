//! The RESP2 parser: any bytes parse to a command, "need more", or a protocol error.
#![no_main]

use dmkit_tools::resp::codec::{Limits, parse_command};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let limits = Limits {
        max_args: 1024,
        max_bulk: 1 << 16,
        max_inline: 1 << 12,
    };
    let mut rest = data;
    while let Ok(Some((_, used))) = parse_command(rest, &limits) {
        assert!(used > 0 && used <= rest.len());
        rest = &rest[used..];
    }
});
