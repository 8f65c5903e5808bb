//! PageRank over an R-MAT graph whose in-edge CSR arrays (offsets, sources, out-degrees) and
//! rank vectors live in the pool, split into objects. Each worker owns a contiguous range of
//! vertices; in every iteration it reads the whole contribution vector (rank / out-degree of
//! every vertex, written by all workers in the previous iteration) and the dangling-mass
//! partials, reads its part of the CSR, and writes its ranks, contributions and partial.
//! Contribution vectors and partials alternate between two buffers, so one iteration reads
//! what the previous one wrote.
//!
//! The result is checked against the same computation in plain Rust (same partition, same
//! summation order: the ranks must be bit-identical).

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

use super::{
    AppError, AppResult, ChunkedArray, Deployment, Outcome, Runner, WriteMode, f64_bytes, f64s,
    share, u32_bytes, u32s,
};

/// A PageRank job.
#[derive(Debug, Clone)]
pub struct PageRankConfig {
    /// 2^scale vertices.
    pub scale: u32,
    /// Edges per vertex (R-MAT edge factor; Graph500 uses 16).
    pub edge_factor: u32,
    pub iterations: u32,
    pub damping: f64,
    pub seed: u64,
}

impl Default for PageRankConfig {
    fn default() -> Self {
        Self {
            scale: 16,
            edge_factor: 16,
            iterations: 10,
            damping: 0.85,
            seed: 42,
        }
    }
}

/// A graph in in-edge CSR form.
#[derive(Debug, Clone)]
pub struct Graph {
    pub vertices: usize,
    /// `in_off[v]..in_off[v + 1]` indexes `in_src` for the in-edges of `v`.
    pub in_off: Vec<u32>,
    pub in_src: Vec<u32>,
    pub out_deg: Vec<u32>,
}

impl Graph {
    pub fn edges(&self) -> usize {
        self.in_src.len()
    }
}

/// An R-MAT graph (a, b, c, d = 0.57, 0.19, 0.19, 0.05) with `edge_factor << scale` edges,
/// self-loops and duplicates kept.
pub fn rmat(scale: u32, edge_factor: u32, seed: u64) -> Graph {
    let n = 1usize << scale;
    let m = n * edge_factor as usize;
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let mut edges = Vec::with_capacity(m);
    for _ in 0..m {
        let (mut src, mut dst) = (0u32, 0u32);
        for bit in (0..scale).rev() {
            let p: f64 = rng.random();
            let (s, d) = if p < 0.57 {
                (0, 0)
            } else if p < 0.76 {
                (0, 1)
            } else if p < 0.95 {
                (1, 0)
            } else {
                (1, 1)
            };
            src |= s << bit;
            dst |= d << bit;
        }
        edges.push((src, dst));
    }
    let mut out_deg = vec![0u32; n];
    let mut in_deg = vec![0u32; n];
    for &(s, d) in &edges {
        out_deg[s as usize] += 1;
        in_deg[d as usize] += 1;
    }
    let mut in_off = vec![0u32; n + 1];
    for v in 0..n {
        in_off[v + 1] = in_off[v] + in_deg[v];
    }
    let mut fill = in_off.clone();
    let mut in_src = vec![0u32; m];
    for &(s, d) in &edges {
        in_src[fill[d as usize] as usize] = s;
        fill[d as usize] += 1;
    }
    Graph {
        vertices: n,
        in_off,
        in_src,
        out_deg,
    }
}

/// One worker's step: new ranks, contributions and dangling partial for `range`.
fn step(
    vertices: usize,
    in_off: &[u32],
    in_src: &[u32],
    out_deg: &[u32],
    contrib: &[f64],
    dangling: f64,
    damping: f64,
) -> (Vec<f64>, Vec<f64>, f64) {
    let n = vertices as f64;
    let base = in_off[0] as usize;
    let mut ranks = Vec::with_capacity(out_deg.len());
    let mut contribs = Vec::with_capacity(out_deg.len());
    let mut partial = 0.0;
    for i in 0..out_deg.len() {
        let (a, b) = (in_off[i] as usize - base, in_off[i + 1] as usize - base);
        let mut s = 0.0;
        for &u in &in_src[a..b] {
            s += contrib[u as usize];
        }
        let r = (1.0 - damping) / n + damping * (s + dangling / n);
        ranks.push(r);
        if out_deg[i] == 0 {
            contribs.push(0.0);
            partial += r;
        } else {
            contribs.push(r / f64::from(out_deg[i]));
        }
    }
    (ranks, contribs, partial)
}

fn initial(g: &Graph, range: std::ops::Range<usize>) -> (Vec<f64>, f64) {
    let r = 1.0 / g.vertices as f64;
    let mut partial = 0.0;
    let c = range
        .map(|v| {
            if g.out_deg[v] == 0 {
                partial += r;
                0.0
            } else {
                r / f64::from(g.out_deg[v])
            }
        })
        .collect();
    (c, partial)
}

/// PageRank in plain Rust with the partition and summation order of the pool version.
pub fn reference(g: &Graph, workers: usize, cfg: &PageRankConfig) -> Vec<f64> {
    let mut contrib = Vec::with_capacity(g.vertices);
    let mut partials = Vec::new();
    for i in 0..workers {
        let (c, p) = initial(g, share(g.vertices, i, workers));
        contrib.extend(c);
        partials.push(p);
    }
    let mut ranks = vec![1.0 / g.vertices as f64; g.vertices];
    for _ in 0..cfg.iterations {
        let dangling: f64 = partials.iter().sum();
        let mut next = Vec::with_capacity(g.vertices);
        let mut next_partials = Vec::new();
        for i in 0..workers {
            let r = share(g.vertices, i, workers);
            let e = g.in_off[r.start] as usize..g.in_off[r.end] as usize;
            let (rk, c, p) = step(
                g.vertices,
                &g.in_off[r.start..=r.end],
                &g.in_src[e],
                &g.out_deg[r.clone()],
                &contrib,
                dangling,
                cfg.damping,
            );
            ranks[r].copy_from_slice(&rk);
            next.extend(c);
            next_partials.push(p);
        }
        contrib = next;
        partials = next_partials;
    }
    ranks
}

/// Where the job's arrays live in the pool.
#[derive(Debug, Clone)]
struct Layout {
    in_off: ChunkedArray,
    in_src: ChunkedArray,
    out_deg: ChunkedArray,
    contrib: [ChunkedArray; 2],
    partials: [ChunkedArray; 2],
    ranks: ChunkedArray,
}

/// Generates the graph, loads it into the pool ("load", not part of the job's time), runs the
/// iterations ("iterate") on `workers` clients and checks the ranks.
pub fn run(
    d: &Deployment,
    workers: usize,
    mode: WriteMode,
    cfg: &PageRankConfig,
) -> AppResult<Outcome> {
    let g = rmat(cfg.scale, cfg.edge_factor, cfg.seed);
    run_on(d, &g, workers, mode, cfg)
}

/// [`run`] on a given graph.
pub fn run_on(
    d: &Deployment,
    g: &Graph,
    workers: usize,
    mode: WriteMode,
    cfg: &PageRankConfig,
) -> AppResult<Outcome> {
    let workers = workers.max(1);
    let mut runner = Runner::new(d, workers, mode)?;
    let c0 = &runner.clients[0];
    let n = g.vertices;
    let l = Layout {
        in_off: ChunkedArray::alloc(c0, n + 1, 4)?,
        in_src: ChunkedArray::alloc(c0, g.edges().max(1), 4)?,
        out_deg: ChunkedArray::alloc(c0, n, 4)?,
        contrib: [
            ChunkedArray::alloc(c0, n, 8)?,
            ChunkedArray::alloc(c0, n, 8)?,
        ],
        partials: [
            ChunkedArray::alloc(c0, workers, 8)?,
            ChunkedArray::alloc(c0, workers, 8)?,
        ],
        ranks: ChunkedArray::alloc(c0, n, 8)?,
    };
    // Load: each worker writes its share of the CSR and the initial contributions.
    runner.phase("load", |w| {
        let r = share(n, w.index, w.workers);
        let (lo, hi) = (r.start, r.end);
        let off_hi = if w.index + 1 == w.workers { hi + 1 } else { hi };
        l.in_off.write(w, lo, &u32_bytes(&g.in_off[lo..off_hi]))?;
        let e = g.in_off[lo] as usize..g.in_off[hi] as usize;
        l.in_src.write(w, e.start, &u32_bytes(&g.in_src[e]))?;
        l.out_deg.write(w, lo, &u32_bytes(&g.out_deg[r.clone()]))?;
        let (c, p) = initial(g, r);
        l.contrib[0].write(w, lo, &f64_bytes(&c))?;
        l.partials[0].write(w, w.index, &p.to_le_bytes())?;
        Ok(())
    })?;
    for it in 0..cfg.iterations as usize {
        let (src, dst) = (it % 2, (it + 1) % 2);
        runner.phase(&format!("iterate-{it}"), |w| {
            let c = w.client;
            let dangling: f64 = f64s(&l.partials[src].read(c, 0..w.workers)?).iter().sum();
            let contrib = f64s(&l.contrib[src].read(c, 0..n)?);
            let r = share(n, w.index, w.workers);
            let in_off = u32s(&l.in_off.read(c, r.start..r.end + 1)?);
            let e = in_off[0] as usize..in_off[in_off.len() - 1] as usize;
            let in_src = u32s(&l.in_src.read(c, e)?);
            let out_deg = u32s(&l.out_deg.read(c, r.clone())?);
            if in_src.iter().any(|&u| u as usize >= n) {
                return Err(AppError::Corrupt("an edge source out of range".into()));
            }
            let (ranks, contribs, partial) = step(
                n,
                &in_off,
                &in_src,
                &out_deg,
                &contrib,
                dangling,
                cfg.damping,
            );
            l.ranks.write(w, r.start, &f64_bytes(&ranks))?;
            l.contrib[dst].write(w, r.start, &f64_bytes(&contribs))?;
            l.partials[dst].write(w, w.index, &partial.to_le_bytes())?;
            Ok(())
        })?;
    }
    let got = f64s(&l.ranks.read(&runner.clients[0], 0..n)?);
    let want = reference(g, workers, cfg);
    check(&got, &want, cfg.iterations)?;
    let mut out = runner.outcome(g.edges() as u64 * u64::from(cfg.iterations));
    out.notes.push(("edges".into(), g.edges().to_string()));
    out.notes.push(("vertices".into(), n.to_string()));
    Ok(out)
}

fn check(got: &[f64], want: &[f64], iterations: u32) -> AppResult<()> {
    if iterations == 0 {
        return Ok(());
    }
    if got.len() != want.len() {
        return Err(AppError::Mismatch(format!(
            "{} ranks, expected {}",
            got.len(),
            want.len()
        )));
    }
    for (v, (a, b)) in got.iter().zip(want).enumerate() {
        if a.to_bits() != b.to_bits() {
            return Err(AppError::Mismatch(format!(
                "rank of vertex {v} is {a:e} in the pool, {b:e} computed in one process"
            )));
        }
    }
    let sum: f64 = want.iter().sum();
    if (sum - 1.0).abs() > 1e-6 {
        return Err(AppError::Mismatch(format!("ranks sum to {sum}, not 1")));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gengar_apps::DeploymentConfig;

    #[test]
    fn pagerank_in_the_pool_matches_one_process() {
        let d = Deployment::sim(&DeploymentConfig::default(), false).unwrap();
        let cfg = PageRankConfig {
            scale: 12,
            edge_factor: 8,
            iterations: 4,
            ..Default::default()
        };
        for mode in [WriteMode::Sync, WriteMode::Proxied] {
            let out = run(&d, 3, mode, &cfg).unwrap();
            assert_eq!(out.ops, (8 << 12) * 4);
        }
    }

    #[test]
    fn rmat_is_skewed_and_complete() {
        let g = rmat(10, 16, 1);
        assert_eq!(g.edges(), 16 << 10);
        assert_eq!(*g.in_off.last().unwrap() as usize, g.edges());
        let max_in = (0..g.vertices)
            .map(|v| g.in_off[v + 1] - g.in_off[v])
            .max()
            .unwrap();
        assert!(
            max_in > 100,
            "R-MAT should have hubs (max in-degree {max_in})"
        );
    }
}
