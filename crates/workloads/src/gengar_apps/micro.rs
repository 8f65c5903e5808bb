//! The Gengar micro-benchmark's workloads.
//!
//! - **Read mix** ([`run_read_mix`]): every client replays its part of a pre-generated trace
//!   (zipfian 0.99 over objects whose total size is a multiple of the servers' DRAM buffers,
//!   mostly reads) while the servers' hot-object windows run on their own threads. Each read
//!   notes whether it was served from a DRAM copy; the share is taken over the steady part of
//!   the trace (after a warm-up prefix). [`oracle_share`] is what a cache that always held
//!   the truly hottest objects of each server (exact counts of the same trace part, as many
//!   as fit its DRAM buffer) would serve from DRAM.
//! - **Write wait** ([`write_wait`]): the time a writer waits per write, synchronous
//!   (`write`, until NVM has it) against proxied (`write_proxied`, until the call returns).
//!
//! Objects carry a signature (object index and a version) that every read checks, so a read
//! served from a wrong or stale copy fails the run.

use std::time::{Duration, Instant};

use dmkit_gengar::{GengarClient, GlobalAddr, WindowThread};
use dmkit_pmem_pool::{Pool, PoolOptions};
use hdrhistogram::Histogram;
use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

use super::{AppError, AppResult, Deployment, WriteMode};
use crate::ycsb::Zipfian;

/// One access of the trace: an object index and whether it is a write.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Access {
    pub obj: u32,
    pub write: bool,
}

/// Settings of the read mix.
#[derive(Debug, Clone)]
pub struct MicroConfig {
    pub objects: usize,
    pub object_size: usize,
    pub clients: usize,
    /// Accesses per client.
    pub accesses: usize,
    /// Share of writes (the rest are reads).
    pub write_fraction: f64,
    pub theta: f64,
    /// Share of each client's trace that is warm-up (not measured).
    pub warmup: f64,
    /// Hot-object window of the servers (they run on their own threads during the trace).
    pub window: Duration,
    pub seed: u64,
}

impl Default for MicroConfig {
    fn default() -> Self {
        Self {
            objects: 10_000,
            object_size: 1016,
            clients: 4,
            accesses: 50_000,
            write_fraction: 0.05,
            theta: 0.99,
            warmup: 0.3,
            window: Duration::from_millis(50),
            seed: 7,
        }
    }
}

/// Objects of `object_size` bytes a DRAM buffer of `dram_bytes` holds (the server's DRAM pool
/// is set up exactly like this one).
pub fn dram_capacity_objects(dram_bytes: usize, object_size: usize) -> AppResult<usize> {
    let pool = Pool::create_dram(
        dram_bytes.max(1 << 20),
        PoolOptions::default().block_size(64 << 10),
    )
    .map_err(|e| AppError::Setup(e.to_string()))?;
    let mut n = 0;
    while pool.alloc_object(object_size).is_ok() {
        n += 1;
    }
    Ok(n)
}

/// Per client, its trace: zipfian(theta) ranks mapped through a fixed random permutation (so
/// the hot objects are scattered over the servers).
pub fn trace(cfg: &MicroConfig) -> Vec<Vec<Access>> {
    let mut rng = ChaCha8Rng::seed_from_u64(cfg.seed);
    let mut perm: Vec<u32> = (0..cfg.objects as u32).collect();
    perm.shuffle(&mut rng);
    (0..cfg.clients)
        .map(|c| {
            let mut rng = ChaCha8Rng::seed_from_u64(cfg.seed.wrapping_add(1 + c as u64));
            let mut z = Zipfian::new(0, cfg.objects as i64 - 1, cfg.theta);
            (0..cfg.accesses)
                .map(|_| Access {
                    obj: perm[z.next(&mut rng) as usize],
                    write: rng.random::<f64>() < cfg.write_fraction,
                })
                .collect()
        })
        .collect()
}

/// The signature at the start of every object: its index and a version.
fn signature(obj: u32, version: u32) -> [u8; 8] {
    let mut b = [0u8; 8];
    b[..4].copy_from_slice(&obj.to_le_bytes());
    b[4..].copy_from_slice(&version.to_le_bytes());
    b
}

/// Allocates the objects (each with its signature) through one client; placement is the
/// client's (the server with the most free NVM).
pub fn load(d: &Deployment, cfg: &MicroConfig) -> AppResult<Vec<GlobalAddr>> {
    let c = d.client()?;
    let mut body = vec![0u8; cfg.object_size];
    (0..cfg.objects as u32)
        .map(|i| {
            let a = c.alloc(cfg.object_size)?;
            body[..8].copy_from_slice(&signature(i, 0));
            c.write_proxied(a, 0, &body)?;
            Ok(a)
        })
        .collect::<AppResult<Vec<_>>>()
        .and_then(|v| {
            c.flush()?;
            Ok(v)
        })
}

/// The fraction of the measured reads a perfect static cache would serve from DRAM: per
/// server, the `capacity` objects of that server with the most reads in the measured part of
/// the trace.
pub fn oracle_share(
    traces: &[Vec<Access>],
    warmup: f64,
    objs: &[GlobalAddr],
    capacity: usize,
) -> f64 {
    let mut counts = vec![0u64; objs.len()];
    let mut total = 0u64;
    for t in traces {
        for a in &t[(t.len() as f64 * warmup) as usize..] {
            if !a.write {
                counts[a.obj as usize] += 1;
                total += 1;
            }
        }
    }
    let mut per_server: std::collections::BTreeMap<u16, Vec<u64>> = Default::default();
    for (i, c) in counts.iter().enumerate() {
        per_server.entry(objs[i].server.0).or_default().push(*c);
    }
    let hits: u64 = per_server
        .into_values()
        .map(|mut v| {
            v.sort_unstable_by(|a, b| b.cmp(a));
            v.iter().take(capacity).sum::<u64>()
        })
        .sum();
    hits as f64 / total.max(1) as f64
}

/// What one run of the read mix saw (measured part only, except `wall`).
#[derive(Debug)]
pub struct ReadMixOutcome {
    pub reads: u64,
    pub dram_reads: u64,
    pub writes: u64,
    /// Modeled latency of each read (ns of virtual time; empty without a latency model).
    pub read_latency: Histogram<u64>,
    /// Modeled latency of every access, reads and writes.
    pub op_latency: Histogram<u64>,
    /// Wall-clock latency of each read (ns), for backends where time is real (tcp, rdma).
    pub read_wall: Histogram<u64>,
    /// Reads of objects this client held a valid lease on that pointed at a DRAM copy when
    /// the read began: the hot reads Gengar serves in one round trip.
    pub hot_reads: u64,
    /// Round trips those reads took (READ tag: lease RPCs included, were any needed).
    pub hot_read_rtts: u64,
    /// Hot reads that took exactly one round trip.
    pub hot_reads_one_rtt: u64,
    /// Wall-clock latency of the hot reads (ns).
    pub hot_read_wall: Histogram<u64>,
    /// The largest advance of a client's virtual clock over the measured part.
    pub modeled: Duration,
    pub wall: Duration,
    /// Round trips of the measured part, all operations.
    pub round_trips: u64,
    pub promotions: u64,
    pub evictions: u64,
    pub windows: u64,
}

impl ReadMixOutcome {
    pub fn dram_share(&self) -> f64 {
        self.dram_reads as f64 / self.reads.max(1) as f64
    }

    pub fn ops(&self) -> u64 {
        self.reads + self.writes
    }
}

fn hist() -> Histogram<u64> {
    Histogram::new_with_bounds(1, 60_000_000_000, 3).expect("histogram bounds")
}

/// Replays `traces` (one client each) on `d` with the servers' windows running every
/// `cfg.window`; writes in `mode` (proxied writes are flushed at the end). Every read checks
/// the object's signature.
pub fn run_read_mix(
    d: &Deployment,
    objs: &[GlobalAddr],
    traces: &[Vec<Access>],
    mode: WriteMode,
    cfg: &MicroConfig,
) -> AppResult<ReadMixOutcome> {
    let clients: Vec<GengarClient> = traces
        .iter()
        .map(|_| d.client())
        .collect::<AppResult<_>>()?;
    let stat = |f: fn(&dmkit_gengar::ServerStats) -> &std::sync::atomic::AtomicU64| -> u64 {
        d.servers
            .iter()
            .map(|s| f(s.stats()).load(std::sync::atomic::Ordering::Relaxed))
            .sum()
    };
    let before = (
        stat(|s| &s.promotions),
        stat(|s| &s.evictions),
        stat(|s| &s.windows),
    );
    let windows: Vec<WindowThread> = d
        .servers
        .iter()
        .map(|s| s.spawn_windows(cfg.window))
        .collect();
    let t0 = Instant::now();
    let parts = std::thread::scope(|s| {
        let hs: Vec<_> = clients
            .iter()
            .zip(traces)
            .enumerate()
            .map(|(ci, (c, t))| s.spawn(move || replay(c, ci, objs, t, mode, cfg)))
            .collect();
        hs.into_iter()
            .map(|h| h.join().unwrap_or(Err(AppError::Panicked)))
            .collect::<AppResult<Vec<_>>>()
    });
    let wall = t0.elapsed();
    drop(windows);
    let parts = parts?;
    let mut out = ReadMixOutcome {
        reads: 0,
        dram_reads: 0,
        writes: 0,
        read_latency: hist(),
        op_latency: hist(),
        read_wall: hist(),
        hot_reads: 0,
        hot_read_rtts: 0,
        hot_reads_one_rtt: 0,
        hot_read_wall: hist(),
        modeled: Duration::ZERO,
        wall,
        round_trips: 0,
        promotions: stat(|s| &s.promotions) - before.0,
        evictions: stat(|s| &s.evictions) - before.1,
        windows: stat(|s| &s.windows) - before.2,
    };
    for p in parts {
        out.reads += p.reads;
        out.dram_reads += p.dram_reads;
        out.writes += p.writes;
        out.read_latency.add(&p.read_latency).expect("same bounds");
        out.op_latency.add(&p.op_latency).expect("same bounds");
        out.read_wall.add(&p.read_wall).expect("same bounds");
        out.hot_read_wall
            .add(&p.hot_read_wall)
            .expect("same bounds");
        out.hot_reads += p.hot_reads;
        out.hot_read_rtts += p.hot_read_rtts;
        out.hot_reads_one_rtt += p.hot_reads_one_rtt;
        out.modeled = out.modeled.max(p.modeled);
        out.round_trips += p.round_trips;
    }
    Ok(out)
}

struct Part {
    reads: u64,
    dram_reads: u64,
    writes: u64,
    read_latency: Histogram<u64>,
    op_latency: Histogram<u64>,
    read_wall: Histogram<u64>,
    hot_reads: u64,
    hot_read_rtts: u64,
    hot_reads_one_rtt: u64,
    hot_read_wall: Histogram<u64>,
    modeled: Duration,
    round_trips: u64,
}

fn round_trips(c: &GengarClient) -> u64 {
    use dmkit_gengar::tags;
    let s = c.endpoint().stats();
    [tags::READ, tags::WRITE, tags::LOCK, tags::REPORT]
        .iter()
        .map(|t| s.tag(t).round_trips)
        .sum()
}

fn replay(
    c: &GengarClient,
    ci: usize,
    objs: &[GlobalAddr],
    t: &[Access],
    mode: WriteMode,
    cfg: &MicroConfig,
) -> AppResult<Part> {
    let warm = (t.len() as f64 * cfg.warmup) as usize;
    let mut p = Part {
        reads: 0,
        dram_reads: 0,
        writes: 0,
        read_latency: hist(),
        op_latency: hist(),
        read_wall: hist(),
        hot_reads: 0,
        hot_read_rtts: 0,
        hot_reads_one_rtt: 0,
        hot_read_wall: hist(),
        modeled: Duration::ZERO,
        round_trips: 0,
    };
    let read_rtts = || {
        c.endpoint()
            .stats()
            .tag(dmkit_gengar::tags::READ)
            .round_trips
    };
    let (mut v0, mut rt0) = (c.endpoint().virtual_now(), round_trips(c));
    let mut version = 0u32;
    for (i, a) in t.iter().enumerate() {
        if i == warm {
            v0 = c.endpoint().virtual_now();
            rt0 = round_trips(c);
        }
        let addr = objs[a.obj as usize];
        let s = c.endpoint().virtual_now();
        if a.write {
            // The signature stays the object's; the version says which client wrote last.
            version = version.wrapping_add(1);
            let sig = signature(a.obj, (ci as u32) << 24 | (version & 0xff_ffff));
            match mode {
                WriteMode::Sync => c.write(addr, 0, &sig)?,
                WriteMode::Proxied => {
                    c.write_proxied(addr, 0, &sig)?;
                }
            }
        } else {
            let hot = c.has_lease(addr) && c.cached_in_dram(addr);
            let (w0, r0) = (Instant::now(), read_rtts());
            let b = c.read(addr)?;
            let (wall, rtts) = (w0.elapsed(), read_rtts() - r0);
            if b.len() != addr.size as usize || b[..4] != a.obj.to_le_bytes() {
                return Err(AppError::Corrupt(format!(
                    "object {} read as object {}",
                    a.obj,
                    u32::from_le_bytes(b[..4].try_into().expect("4 bytes"))
                )));
            }
            if i >= warm {
                p.reads += 1;
                p.dram_reads += u64::from(c.cached_in_dram(addr));
                let _ = p
                    .read_latency
                    .record((c.endpoint().virtual_now() - s).as_nanos() as u64);
                let _ = p.read_wall.record(wall.as_nanos() as u64);
                if hot {
                    p.hot_reads += 1;
                    p.hot_read_rtts += rtts;
                    p.hot_reads_one_rtt += u64::from(rtts == 1);
                    let _ = p.hot_read_wall.record(wall.as_nanos() as u64);
                }
            }
        }
        if i >= warm {
            p.writes += u64::from(a.write);
            let _ = p
                .op_latency
                .record((c.endpoint().virtual_now() - s).as_nanos() as u64);
        }
    }
    c.flush()?;
    p.modeled = c.endpoint().virtual_now() - v0;
    p.round_trips = round_trips(c) - rt0;
    Ok(p)
}

/// Records of the writer's log object in [`write_wait`] (the object fits one 64 KiB slot).
pub const LOG_RECORDS: usize = 255;

/// The writer's wait per write, by mode (ns per call, until the call returned).
#[derive(Debug)]
pub struct WriteWait {
    /// Synchronous `write`, back to back.
    pub sync: Histogram<u64>,
    /// `write_proxied` back to back: the writer outpaces the server, so this includes the
    /// back-pressure of bounded staging and of the connection.
    pub proxied: Histogram<u64>,
    /// Time the proxied rounds took to drain after their last call returned (`flush`).
    pub drain: Duration,
    /// Round trips per write (lease renewals included; a proxied write counts one).
    pub sync_rtts: f64,
    pub proxied_rtts: f64,
}

/// One writer appending `size`-byte records round-robin to a log object of [`LOG_RECORDS`]
/// records (its lease is renewed inside the measured calls when it expires), `n` writes per
/// mode in alternating rounds (so a noisy machine moves both modes) of `burst` writes back to
/// back: synchronous `write`, then `write_proxied` followed by a `flush` (not counted as
/// wait). The longer the burst, the more a proxied writer outpaces the server and waits for
/// its drain (back-pressure, and lease renewals queued behind its own writes).
pub fn write_wait(d: &Deployment, n: usize, size: usize, burst: usize) -> AppResult<WriteWait> {
    let c = d.client()?;
    let log = c.alloc(size * LOG_RECORDS)?;
    let data = vec![0x5au8; size];
    c.write(log, 0, &vec![0u8; size * LOG_RECORDS])?;
    let mut w = WriteWait {
        sync: hist(),
        proxied: hist(),
        drain: Duration::ZERO,
        sync_rtts: 0.0,
        proxied_rtts: 0.0,
    };
    let rts = || {
        c.endpoint()
            .stats()
            .tag(dmkit_gengar::tags::WRITE)
            .round_trips
    };
    let (mut sync_rt, mut proxied_rt) = (0, 0);
    let per = burst.clamp(1, n.max(1));
    let rounds = n.div_ceil(per);
    let at = |i: usize| (i % LOG_RECORDS) * size;
    for _ in 0..rounds {
        let r0 = rts();
        for i in 0..per {
            let s = Instant::now();
            c.write(log, at(i), &data)?;
            let _ = w.sync.record(s.elapsed().as_nanos() as u64);
        }
        let r1 = rts();
        for i in 0..per {
            let s = Instant::now();
            c.write_proxied(log, at(i), &data)?;
            let _ = w.proxied.record(s.elapsed().as_nanos() as u64);
        }
        sync_rt += r1 - r0;
        proxied_rt += rts() - r1;
        let s = Instant::now();
        c.flush()?;
        w.drain += s.elapsed();
    }
    w.sync_rtts = sync_rt as f64 / (per * rounds) as f64;
    w.proxied_rtts = proxied_rt as f64 / (per * rounds) as f64;
    Ok(w)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gengar_apps::DeploymentConfig;
    use dmkit_gengar::ServerConfig;
    use dmkit_verbs::NodeId;

    fn addr(server: u16, i: u64) -> GlobalAddr {
        GlobalAddr {
            server: NodeId(server),
            offset: i * 64,
            generation: 1,
            size: 8,
        }
    }

    #[test]
    fn the_oracle_caches_each_servers_most_read_objects() {
        let objs = [addr(0, 1), addr(0, 2), addr(1, 3), addr(1, 4)];
        let r = |obj| Access { obj, write: false };
        // Warm-up (first half) is not counted; writes are not reads.
        let w = |obj| Access { obj, write: true };
        let t = vec![r(1), r(1), r(1), r(1), r(1), r(0), r(0), r(1), r(2), w(3)];
        // Measured reads: 0, 0, 1, 2 — one slot per server: obj 0 (2 reads) and obj 2 (1).
        assert!((oracle_share(std::slice::from_ref(&t), 0.5, &objs, 1) - 3.0 / 4.0).abs() < 1e-9);
        assert!((oracle_share(&[t], 0.5, &objs, 2) - 1.0).abs() < 1e-9);
    }

    #[test]
    fn traces_are_deterministic_and_skewed() {
        let cfg = MicroConfig {
            objects: 1000,
            clients: 2,
            accesses: 20_000,
            ..MicroConfig::default()
        };
        let (a, b) = (trace(&cfg), trace(&cfg));
        assert_eq!(a, b);
        let mut counts = vec![0u32; cfg.objects];
        for x in a.iter().flatten() {
            counts[x.obj as usize] += 1;
        }
        counts.sort_unstable_by(|x, y| y.cmp(x));
        let top: u32 = counts[..100].iter().sum();
        assert!(
            top > 20_000,
            "top 10% of objects got {top} of 40000 accesses"
        );
    }

    #[test]
    fn a_small_read_mix_promotes_hot_objects_and_checks_every_read() {
        let cfg = MicroConfig {
            objects: 2000,
            clients: 2,
            accesses: 6000,
            window: Duration::from_millis(5),
            ..MicroConfig::default()
        };
        let d = Deployment::sim(
            &DeploymentConfig {
                servers: 2,
                nvm_bytes: 8 << 20,
                server: ServerConfig {
                    dram_bytes: 1 << 20,
                    ..ServerConfig::default()
                },
                ..DeploymentConfig::default()
            },
            false,
        )
        .unwrap();
        let objs = load(&d, &cfg).unwrap();
        let traces = trace(&cfg);
        let out = run_read_mix(&d, &objs, &traces, WriteMode::Proxied, &cfg).unwrap();
        assert!(out.reads > 7000, "{out:?}");
        assert!(out.promotions > 0, "{out:?}");
        assert!(out.dram_reads > 0, "{out:?}");
        assert!(dram_capacity_objects(1 << 20, 1016).unwrap() > 900);
    }
}
