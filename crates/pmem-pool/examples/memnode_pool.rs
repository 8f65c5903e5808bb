//! A memory node's pool: create (or reopen) a pool file, hand blocks to two clients, allocate
//! Gengar objects, and report free space, as a memory node would in every reply.
//!
//! ```text
//! cargo run -p dmkit-pmem-pool --example memnode_pool -- /tmp/node0.pool
//! ```

use dmkit_pmem_pool::{Pool, PoolOptions, Result};

fn main() -> Result<()> {
    let path = std::env::args().nth(1).unwrap_or_else(|| {
        std::env::temp_dir()
            .join("dmkit-example.pool")
            .display()
            .to_string()
    });
    let pool = if std::path::Path::new(&path).exists() {
        println!("reopening {path} (recovery runs on open)");
        Pool::open(&path)?
    } else {
        println!("creating {path}");
        Pool::create(&path, 16 << 20, PoolOptions::default().block_size(1 << 20))?
    };
    println!(
        "pool {}: {} blocks of {} bytes on {}, data area {} bytes",
        pool.uuid(),
        pool.block_count(),
        pool.block_size(),
        pool.medium_kind(),
        pool.data_len()
    );

    for client in [1u64, 2] {
        match pool.alloc_block(client) {
            Ok(b) => println!(
                "client {client} got block {b} at offset {:#x}",
                pool.block_offset(b)
            ),
            Err(e) => println!("client {client}: {e}"),
        }
    }
    let obj = pool.alloc_object(200)?;
    println!("object at {:#x}, generation {}", obj.offset, obj.generation);
    pool.free_object(obj.offset)?;
    println!("after free: {}", pool.object_header(obj.offset)?);

    let s = pool.stats();
    println!(
        "{} of {} blocks free, {} live objects, {} bytes free",
        s.free_blocks, s.block_count, s.live_objects, s.free_bytes
    );
    for client in [1u64, 2] {
        println!("client {client} owns {:?}", pool.blocks_owned_by(client));
    }
    Ok(())
}
