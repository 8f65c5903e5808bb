//! Deadlines (expiry) and values larger than one object, on an in-process cluster.

use std::time::Duration;

use dmkit_fusee::{
    CasResult, ClientConfig, DeleteResult, Error, InsertResult, LocalCluster, LocalConfig,
    UpdateResult, now_ms,
};

fn cluster(nodes: u16, r: usize, pool_mib: usize) -> LocalCluster {
    let mut cfg = LocalConfig::new(nodes, r);
    cfg.pool_bytes = pool_mib << 20;
    LocalCluster::start(cfg).unwrap()
}

/// Every key a full scan returns (deduplicated, sorted).
fn all_keys(k: &dmkit_fusee::Client) -> Vec<Vec<u8>> {
    let mut keys = Vec::new();
    let mut cursor = 0;
    loop {
        let (mut some, next) = k.scan(cursor).unwrap();
        keys.append(&mut some);
        if next == 0 {
            break;
        }
        cursor = next;
    }
    keys.sort();
    keys.dedup();
    keys
}

/// A full background sweep: how many keys and chunks it deleted.
fn sweep(k: &dmkit_fusee::Client) -> usize {
    let first = k.reclaim_expired(0).unwrap();
    let (mut n, mut cursor) = (first.deleted, first.next);
    while cursor != 0 {
        let step = k.reclaim_expired(cursor).unwrap();
        n += step.deleted;
        cursor = step.next;
    }
    n
}

#[test]
fn an_expired_key_reads_as_absent_and_is_replaced_as_absent() {
    let c = cluster(3, 3, 64);
    let k = c.client(1).unwrap();
    let now = now_ms();
    k.put(b"past", b"v", Some(now - 1)).unwrap();
    assert_eq!(k.search(b"past").unwrap(), None);
    // (Two seconds, not 300 ms: the put and the read must land before the deadline on a
    // loaded CI machine.)
    k.put(b"soon", b"v", Some(now + 2_000)).unwrap();
    let e = k.get(b"soon").unwrap().unwrap();
    assert_eq!(
        (e.value.as_slice(), e.expires_at),
        (&b"v"[..], Some(now + 2_000))
    );
    assert!(e.ttl_ms(now).unwrap() <= 2_000);
    std::thread::sleep(Duration::from_millis(
        (now + 2_050).saturating_sub(now_ms()),
    ));
    assert_eq!(k.get(b"soon").unwrap(), None);
    // INSERT over an expired key succeeds; UPDATE and DELETE of one find nothing.
    k.put(b"x", b"old", Some(now_ms() - 1)).unwrap();
    assert_eq!(k.update(b"x", b"new").unwrap(), UpdateResult::NotFound);
    assert_eq!(k.delete(b"x").unwrap(), DeleteResult::NotFound);
    assert_eq!(k.insert(b"x", b"new").unwrap(), InsertResult::Inserted);
    assert_eq!(k.search(b"x").unwrap().as_deref(), Some(&b"new"[..]));
    // PERSIST-like: replace the exact version with no deadline.
    k.put(b"p", b"v", Some(now_ms() + 60_000)).unwrap();
    let e = k.get(b"p").unwrap().unwrap();
    assert_eq!(k.replace(b"p", &e, b"v", None).unwrap(), CasResult::Swapped);
    assert_eq!(k.get(b"p").unwrap().unwrap().expires_at, None);
    // The old version no longer matches.
    assert_eq!(
        k.replace(b"p", &e, b"w", None).unwrap(),
        CasResult::Mismatch(b"v".to_vec())
    );
    assert_eq!(
        k.delete_entry(b"p", &e).unwrap(),
        CasResult::Mismatch(b"v".to_vec())
    );
    // A value compare ignores the deadline: compare-and-set and delete-if match it.
    k.put(b"c", b"1", Some(now_ms() + 60_000)).unwrap();
    assert_eq!(
        k.compare_and_set(b"c", b"1", b"2").unwrap(),
        CasResult::Swapped
    );
    assert_eq!(k.get(b"c").unwrap().unwrap().expires_at, None);
    k.put(b"d", b"1", Some(now_ms() + 60_000)).unwrap();
    assert_eq!(k.delete_if(b"d", b"1").unwrap(), CasResult::Swapped);
    k.put(b"e", b"1", Some(now_ms() - 1)).unwrap();
    assert_eq!(
        k.compare_and_set(b"e", b"1", b"2").unwrap(),
        CasResult::NotFound
    );
}

#[test]
fn the_background_sweep_deletes_expired_keys_and_frees_their_space() {
    let c = cluster(2, 2, 64);
    let k = c.client(1).unwrap();
    // (Two seconds: the 200 puts and the first scan must fit before the deadline on a
    // loaded CI machine; 200 ms did not always.)
    let soon = now_ms() + 2_000;
    for i in 0..200 {
        let deadline = (i % 2 == 0).then_some(soon);
        k.put(format!("k{i}").as_bytes(), b"value", deadline)
            .unwrap();
    }
    let live = all_keys(&k).len();
    if now_ms() < soon {
        assert_eq!(live, 200);
    }
    std::thread::sleep(Duration::from_millis(soon.saturating_sub(now_ms()) + 50));
    // Expired keys are gone from scans at once, and from the index after a sweep.
    assert_eq!(all_keys(&k).len(), 100);
    k.flush().unwrap();
    k.reclaim().unwrap();
    let free_before = k.free_objects();
    assert_eq!(sweep(&k), 100);
    assert_eq!(sweep(&k), 0);
    assert_eq!(all_keys(&k).len(), 100);
    // Their objects are free again (freed by the deletes, taken back by the owner).
    k.flush().unwrap();
    k.reclaim().unwrap();
    let free_after = k.free_objects();
    assert!(
        free_after >= free_before + 100,
        "{free_before} free objects before the sweep, {free_after} after"
    );
    // The sweep on the client's background task does the same, unasked.
    for i in 0..50 {
        k.put(format!("t{i}").as_bytes(), b"value", Some(now_ms() + 100))
            .unwrap();
    }
    k.start_expiry_sweep(Duration::from_millis(5));
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    loop {
        std::thread::sleep(Duration::from_millis(200));
        let mut cfg = ClientConfig::new(9);
        cfg.clock_skew_ms = -3_600_000;
        // An hour behind: it still sees expired keys unless they are deleted.
        let behind = c.client_with(cfg).unwrap();
        if all_keys(&behind).len() == 100 {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the background sweep did not run"
        );
    }
}

#[test]
fn clock_skew_moves_expiry_by_the_skew_and_no_more() {
    let c = cluster(3, 3, 64);
    let writer = c.client(1).unwrap();
    let mut ahead = ClientConfig::new(2);
    ahead.clock_skew_ms = 2_000;
    let ahead = c.client_with(ahead).unwrap();
    let mut behind = ClientConfig::new(3);
    behind.clock_skew_ms = -2_000;
    let behind = c.client_with(behind).unwrap();
    let d = now_ms() + 1_000;
    writer.put(b"a", b"v", Some(d)).unwrap();
    writer.put(b"b", b"v", Some(d)).unwrap();
    // A clock 2 s ahead sees both expired now, 1 s before the deadline...
    assert_eq!(ahead.search(b"a").unwrap(), None);
    // ...and deleted the one it read: for everyone it is gone (expiry may come early by the
    // largest skew ahead).
    assert_eq!(behind.search(b"a").unwrap(), None);
    assert_eq!(writer.search(b"a").unwrap(), None);
    // A clock 2 s behind still reads the other after the deadline (late by its skew)...
    std::thread::sleep(Duration::from_millis(d.saturating_sub(now_ms()) + 100));
    assert_eq!(writer.search(b"b").unwrap(), None);
    assert!(now_ms() > d);
    let late = behind.get(b"b").unwrap();
    // (the writer's read deleted it: a reader whose clock is on time ends the skew window)
    assert_eq!(late, None);
    writer.put(b"b", b"v", Some(now_ms() + 200)).unwrap();
    std::thread::sleep(Duration::from_millis(300));
    assert_eq!(
        behind.search(b"b").unwrap().as_deref(),
        Some(&b"v"[..]),
        "a clock 2 s behind reads the key until its own clock passes the deadline"
    );
    // ...but never past the deadline plus its skew.
    std::thread::sleep(Duration::from_millis(2_000));
    assert_eq!(behind.search(b"b").unwrap(), None);
}

#[test]
fn large_values_round_trip_and_leave_no_chunks_behind() {
    let c = cluster(2, 2, 96);
    let k = c.client(1).unwrap();
    let v: Vec<u8> = (0..1_000_000u32).map(|i| (i * 31 % 251) as u8).collect();
    assert_eq!(k.insert(b"big", &v).unwrap(), InsertResult::Inserted);
    assert_eq!(k.search(b"big").unwrap().unwrap(), v);
    assert_eq!(k.insert(b"big", b"x").unwrap(), InsertResult::AlreadyExists);
    // Another client reads it whole; scans show the key, not its chunks.
    assert_eq!(c.client(2).unwrap().search(b"big").unwrap().unwrap(), v);
    assert_eq!(all_keys(&k), vec![b"big".to_vec()]);
    // Overwritten by a large value, a small one, a large one with a deadline; compared and
    // swapped; deleted: no chunk is left (a sweep with no grace finds no orphan).
    let w: Vec<u8> = v.iter().rev().copied().collect();
    k.upsert(b"big", &w).unwrap();
    assert_eq!(k.search(b"big").unwrap().unwrap(), w);
    assert_eq!(k.update(b"big", b"small").unwrap(), UpdateResult::Updated);
    k.put(b"big", &v, Some(now_ms() + 60_000)).unwrap();
    assert_eq!(
        k.compare_and_set(b"big", &v, &w).unwrap(),
        CasResult::Swapped
    );
    assert_eq!(k.search(b"big").unwrap().unwrap(), w);
    assert_eq!(
        k.compare_and_set(b"big", &v, b"no").unwrap(),
        CasResult::Mismatch(w.clone())
    );
    assert_eq!(k.delete(b"big").unwrap(), DeleteResult::Deleted);
    assert_eq!(k.search(b"big").unwrap(), None);
    let mut cfg = ClientConfig::new(3);
    cfg.orphan_grace = Duration::ZERO;
    let sweeper = c.client_with(cfg).unwrap();
    assert_eq!(sweep(&sweeper), 0, "chunks left behind");
    assert!(all_keys(&k).is_empty());
}

#[test]
fn a_64_mib_value_round_trips() {
    let c = cluster(2, 1, 160);
    let k = c.client(1).unwrap();
    let v: Vec<u8> = (0..64u32 << 20).map(|i| (i ^ (i >> 9)) as u8).collect();
    k.upsert(b"huge", &v).unwrap();
    assert!(k.search(b"huge").unwrap().unwrap() == v);
    assert_eq!(k.delete(b"huge").unwrap(), DeleteResult::Deleted);
}

#[test]
fn too_large_values_and_reserved_keys_are_refused_before_anything_is_written() {
    let c = cluster(2, 2, 64);
    let mut cfg = ClientConfig::new(1);
    cfg.max_value = 100_000;
    let k = c.client_with(cfg).unwrap();
    k.upsert(b"k", b"old").unwrap();
    let e = k.upsert(b"k", &vec![7u8; 100_001]).unwrap_err();
    assert!(
        matches!(
            e,
            Error::ValueTooLarge {
                len: 100_001,
                max: 100_000
            }
        ),
        "{e}"
    );
    assert!(e.to_string().contains("maximum"), "{e}");
    assert_eq!(k.search(b"k").unwrap().as_deref(), Some(&b"old"[..]));
    assert!(k.insert(b"n", &vec![7u8; 200_000]).is_err());
    assert_eq!(k.search(b"n").unwrap(), None);
    let reserved = [dmkit_fusee::value::CHUNK_PREFIX, b"x"].concat();
    for r in [
        k.upsert(&reserved, b"v").map(|_| ()),
        k.search(&reserved).map(|_| ()),
        k.delete(&reserved).map(|_| ()),
    ] {
        assert!(matches!(r, Err(Error::ReservedKey { .. })), "{r:?}");
    }
    // A writer too slow for the orphan grace gives up and leaves nothing.
    let mut cfg = ClientConfig::new(2);
    cfg.orphan_grace = Duration::ZERO;
    let slow = c.client_with(cfg).unwrap();
    let e = slow.upsert(b"k", &vec![1u8; 50_000]).unwrap_err();
    assert!(e.to_string().contains("grace"), "{e}");
    assert_eq!(k.search(b"k").unwrap().as_deref(), Some(&b"old"[..]));
    assert_eq!(sweep(&slow), 0);
}

fn is_crash(e: &Error) -> bool {
    matches!(e, Error::Verbs(dmkit_verbs::Error::ClientCrashed { .. }))
        || e.to_string().contains("crashed")
}

#[test]
fn a_large_write_cut_by_a_crash_is_whole_or_not_there_and_leaves_nothing() {
    let mut cfg = LocalConfig::new(3, 2);
    cfg.block_size = 128 << 10;
    let c = LocalCluster::start(cfg).unwrap();
    let before = vec![1u8; 40_000];
    let after = vec![2u8; 40_000];
    let mut sweeper = ClientConfig::new(2);
    sweeper.orphan_grace = Duration::ZERO;
    let sweeper = c.client_with(sweeper).unwrap();
    let mut outcomes = [0usize; 2];
    for (step, n) in (3..260).step_by(11).enumerate() {
        let id = 10 + step as u64;
        let key = format!("big-{id}");
        let w = c.client(id).unwrap();
        w.upsert(key.as_bytes(), &before).unwrap();
        w.flush().unwrap();
        c.sim.crash_client_after(id, n);
        let acked = match w.upsert(key.as_bytes(), &after) {
            Ok(()) => true,
            Err(e) => {
                assert!(is_crash(&e), "crash at {n}: failed otherwise: {e}");
                false
            }
        };
        let _ = w.flush();
        drop(w);
        let (rec, _) = c.recover(id).unwrap();
        rec.flush().unwrap();
        let now = sweeper.search(key.as_bytes()).unwrap().unwrap();
        if acked {
            assert!(now == after, "crash at {n}: acknowledged but lost");
        } else {
            assert!(now == after || now == before, "crash at {n}: half written");
        }
        outcomes[usize::from(now == after)] += 1;
        // What the crash left (chunks no manifest names) the sweep takes; the value stays.
        sweep(&sweeper);
        assert!(sweeper.search(key.as_bytes()).unwrap().unwrap() == now);
        // Deleted, nothing of the crashed client's is left in use.
        assert_eq!(
            sweeper.delete(key.as_bytes()).unwrap(),
            DeleteResult::Deleted
        );
        sweeper.flush().unwrap();
        rec.reclaim().unwrap();
        let total: u64 = rec
            .owned_block_classes()
            .iter()
            .map(|class| dmkit_fusee::alloc::BlockGeometry::new(c.view.block_size, *class).objects)
            .sum();
        assert_eq!(
            rec.free_objects() as u64,
            total,
            "crash at {n}: objects of the crashed client leaked"
        );
    }
    assert!(outcomes[0] > 0 && outcomes[1] > 0, "{outcomes:?}");
}

/// Bytes `k`'s endpoint brought back from the memory nodes while `f` ran.
fn bytes_in(k: &dmkit_fusee::Client, f: impl FnOnce()) -> u64 {
    let total = || -> u64 {
        let s = k.endpoint().stats().snapshot();
        s.iter().map(|(_, t)| t.bytes_in).sum()
    };
    let before = total();
    f();
    total() - before
}

#[test]
fn a_range_of_a_large_value_reads_only_the_chunks_it_spans() {
    let c = cluster(2, 2, 96);
    let k = c.client(1).unwrap();
    let v: Vec<u8> = (0..1_000_000u32).map(|i| (i * 31 % 251) as u8).collect();
    assert_eq!(k.insert(b"big", &v).unwrap(), InsertResult::Inserted);
    let len = v.len() as u64;
    let whole = bytes_in(&k, || assert!(k.search(b"big").unwrap().unwrap() == v));
    // The length alone: the manifest, no chunk.
    let only_len = bytes_in(&k, || {
        let r = k.get_range(b"big", |_| 0..0).unwrap().unwrap();
        assert_eq!((r.len, r.bytes.len()), (len, 0));
    });
    assert!(only_len < 4096, "the length read {only_len} bytes");
    // A 32 KB slice: the chunks it spans (three of about 16 KB), not the 62 others.
    let chunk = 16_000u64;
    let across = bytes_in(&k, || {
        let r = k
            .get_range(b"big", |_| 3 * chunk..5 * chunk)
            .unwrap()
            .unwrap();
        assert!(r.bytes == v[3 * chunk as usize..5 * chunk as usize]);
    });
    assert!(
        across < whole / 5,
        "a 32 KB slice read {across} bytes, the whole value {whole}"
    );
    // Every range is the value's bytes there, clamped: from the end, past the end, empty,
    // reversed, one byte, all of it (then the whole value's checksum is checked too).
    let cases = [
        (len - 10, len + 100),
        (len + 5, len + 10),
        (7, 7),
        (9, 3),
        (123_456, 123_457),
        (0, len),
        (65_530, 200_001),
    ];
    for (a, b) in cases {
        let r = k.get_range(b"big", |l| a.min(l)..b).unwrap().unwrap();
        let end = b.min(len);
        let start = a.min(len).min(end);
        assert!(r.bytes == v[start as usize..end as usize], "range {a}..{b}");
        assert_eq!(r.len, len);
    }
    // A small value, an absent key, an expired one.
    k.upsert(b"small", b"hello world").unwrap();
    let r = k.get_range(b"small", |l| l - 5..l).unwrap().unwrap();
    assert_eq!((r.len, r.bytes.as_slice()), (11, &b"world"[..]));
    assert_eq!(k.get_range(b"absent", |_| 0..1).unwrap(), None);
    k.put(b"gone", &v, Some(now_ms() - 1)).unwrap();
    assert_eq!(k.get_range(b"gone", |_| 0..1).unwrap(), None);
    // A rewritten value is read as the new one, never spliced with the old one's chunks.
    let w: Vec<u8> = v.iter().map(|b| b ^ 0xff).collect();
    k.upsert(b"big", &w).unwrap();
    let r = c
        .client(2)
        .unwrap()
        .get_range(b"big", |_| 10..20)
        .unwrap()
        .unwrap();
    assert_eq!(r.bytes, w[10..20]);
}

/// A range read while another client rewrites the value, large and small in turn: every read
/// is one version's bytes, with that version's length — never the old manifest's length with
/// the new value's bytes, nor chunks of two versions.
#[test]
fn ranges_read_during_rewrites_are_of_one_version() {
    let c = cluster(2, 2, 128);
    let (w, r) = (c.client(1).unwrap(), c.client(2).unwrap());
    // Version k: 200 000 + k bytes (small every fifth time: 100 + k), every byte k.
    let version = |k: u8| {
        let len = if k % 5 == 0 { 100 } else { 200_000 } + usize::from(k);
        vec![k; len]
    };
    w.upsert(b"v", &version(1)).unwrap();
    let done = std::sync::atomic::AtomicBool::new(false);
    std::thread::scope(|s| {
        s.spawn(|| {
            for k in 2..40u8 {
                w.upsert(b"v", &version(k)).unwrap();
            }
            done.store(true, std::sync::atomic::Ordering::SeqCst);
        });
        let (mut reads, mut seen) = (0, std::collections::BTreeSet::new());
        while !done.load(std::sync::atomic::Ordering::SeqCst) || reads < 10 {
            let from = (reads * 7919) % 200_000;
            let got = r.get_range(b"v", |_| from..from + 40_000).unwrap().unwrap();
            let k = (got.len % 100_000 % 100) as u8;
            assert_eq!(
                got.len as usize,
                version(k).len(),
                "a length no version has"
            );
            let end = (from + 40_000).min(got.len);
            assert_eq!(got.bytes.len() as u64, end.saturating_sub(from));
            assert!(
                got.bytes.iter().all(|b| *b == k),
                "bytes of another version"
            );
            seen.insert(k);
            reads += 1;
        }
        eprintln!("{reads} reads saw {} versions", seen.len());
    });
}
