//! Pool images: opening any bytes as a pool (superblock, tables, redo log) gives a pool or a
//! clear error, never a panic or a wild write.
#![no_main]

use dmkit_pmem_pool::{DramMedium, Medium, Pool};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    // A pool of 64 KiB blocks needs some room; pad the input into a fixed-size image.
    let len = 1 << 20;
    let Ok(m) = DramMedium::new(len) else {
        return;
    };
    m.write(0, &data[..data.len().min(len)]);
    if let Ok(pool) = Pool::open_on(Box::new(m)) {
        let _ = pool.stats();
        let _ = pool.alloc_block(7);
        let _ = pool.alloc_object(100);
    }
});
