//! Pool images: opening any bytes as a pool (superblock, tables, redo log, object headers)
//! gives a pool or a clear error, never a panic or a wild write. Inputs are edits to a valid
//! image (so the parser gets past the magic) or, now and then, raw bytes.
#![no_main]

use std::sync::OnceLock;

use dmkit_pmem_pool::{DramMedium, Medium, Pool, PoolOptions};
use libfuzzer_sys::fuzz_target;

const LEN: usize = 1 << 20;

fn image() -> &'static Vec<u8> {
    static IMAGE: OnceLock<Vec<u8>> = OnceLock::new();
    IMAGE.get_or_init(|| {
        let dir = std::env::temp_dir().join(format!("dmkit-fuzz-pool-{}", std::process::id()));
        let _ = std::fs::create_dir_all(&dir);
        let path = dir.join("seed.pool");
        let _ = std::fs::remove_file(&path);
        {
            let pool = Pool::create(&path, LEN, PoolOptions::default().block_size(64 << 10))
                .expect("seed pool");
            pool.alloc_blocks(3, 2).expect("blocks");
            pool.alloc_block(9).expect("block");
            for size in [10, 100, 1000] {
                pool.alloc_object(size).expect("object");
            }
        }
        let bytes = std::fs::read(&path).expect("read the seed pool");
        let _ = std::fs::remove_dir_all(&dir);
        bytes
    })
}

fuzz_target!(|data: &[u8]| {
    let Some((&mode, edits)) = data.split_first() else {
        return;
    };
    let mut img = if mode & 1 == 0 {
        image().clone()
    } else {
        vec![0u8; LEN]
    };
    // Edits: (offset u24, value u8) quadruples, or raw bytes at the start.
    if mode & 1 == 0 {
        for e in edits.chunks_exact(4) {
            let off = (usize::from(e[0]) << 16 | usize::from(e[1]) << 8 | usize::from(e[2])) % img.len();
            img[off] = e[3];
        }
    } else {
        let n = edits.len().min(LEN);
        img[..n].copy_from_slice(&edits[..n]);
    }
    let Ok(m) = DramMedium::new(img.len()) else {
        return;
    };
    m.write(0, &img);
    if let Ok(pool) = Pool::open_on(Box::new(m)) {
        let _ = pool.stats();
        let _ = pool.alloc_block(7);
        let _ = pool.alloc_object(100);
    }
});
