//! `dmkit resp`: the Redis-protocol gateway over a FUSEE client.

use std::path::PathBuf;
use std::sync::Arc;

use dmkit_fusee::{Client, DeleteResult, InsertResult, UpdateResult};
use dmkit_tools::resp::{
    BoxFuture, ByteRange, Cas, Entry, KvBackend, PutMode, RespConfig, RespServer, ScanStep,
    ValueSlice, Version,
};

use crate::CliError;
use crate::cluster_file::ClusterFile;

#[derive(Debug, clap::Args)]
pub struct RespArgs {
    /// Address to listen on for Redis clients (host:port).
    #[arg(long)]
    pub listen: String,
    /// The cluster file.
    #[arg(long)]
    pub cluster: PathBuf,
    /// The FUSEE client id of the gateway.
    #[arg(long, default_value_t = 0xD0_0000)]
    pub client_id: u64,
    /// Serve Prometheus metrics on this address (host:port).
    #[arg(long)]
    pub metrics: Option<String>,
    /// A file holding the password clients must give with AUTH (Redis's `requirepass`; one
    /// line, its trailing newline ignored). Without it, any client is served.
    #[arg(long, conflicts_with = "auth_cluster_secret")]
    pub password_file: Option<PathBuf>,
    /// Clients must AUTH with the cluster secret (the one the memory nodes require: the
    /// cluster file's `secret_file`, DMKIT_SECRET_FILE or DMKIT_SECRET) as the default user's
    /// password, instead of a --password-file.
    #[arg(long)]
    pub auth_cluster_secret: bool,
    /// Active expiry: one step of the sweep that deletes expired keys (one FUSEE index
    /// subtable) every this many milliseconds, or after nine times the last step's duration
    /// (99 times while the last whole round met no key with a deadline)
    /// when that is longer; 0 turns it off (expired keys are then deleted only when read).
    #[arg(long, default_value_t = 100)]
    pub expiry_sweep_ms: u64,
}

/// The password in `path` (its trailing newline ignored): usage errors name the file.
fn read_password(path: &std::path::Path) -> Result<Vec<u8>, CliError> {
    let mut p = std::fs::read(path).map_err(|e| {
        CliError::usage(format!(
            "cannot read --password-file {}: {e}",
            path.display()
        ))
    })?;
    while p.last().is_some_and(|b| *b == b'\n' || *b == b'\r') {
        p.pop();
    }
    if p.is_empty() {
        return Err(CliError::usage(format!(
            "--password-file {} is empty",
            path.display()
        )));
    }
    Ok(p)
}

fn cas(r: dmkit_fusee::CasResult) -> Cas {
    if r == dmkit_fusee::CasResult::Swapped {
        Cas::Swapped
    } else {
        Cas::Changed
    }
}

/// FUSEE behind the RESP gateway.
#[derive(Debug, Clone)]
pub struct FuseeBackend(pub Client);

fn err(e: dmkit_fusee::Error) -> String {
    e.to_string()
}

/// FUSEE's entry as the gateway's: the value moved out, FUSEE's entry (its version) kept as
/// the token a conditional write hands back.
fn entry(mut e: dmkit_fusee::Entry) -> Entry {
    let value = std::mem::take(&mut e.value);
    Entry {
        value,
        expires_at: e.expires_at,
        version: Version::new(e),
    }
}

fn fusee_entry(e: &Entry) -> Result<&dmkit_fusee::Entry, String> {
    e.version
        .get::<dmkit_fusee::Entry>()
        .ok_or_else(|| "an entry read from another backend".to_string())
}

async fn put_entry(
    c: &Client,
    key: &[u8],
    value: &[u8],
    expires_at: Option<u64>,
    mode: PutMode,
) -> Result<bool, String> {
    match (mode, expires_at) {
        (PutMode::Upsert, _) => c.put_async(key, value, expires_at).await.map(|()| true),
        (PutMode::IfAbsent, _) => c
            .insert_with_async(key, value, expires_at)
            .await
            .map(|r| r == InsertResult::Inserted),
        (PutMode::IfPresent, None) => c
            .update_async(key, value)
            .await
            .map(|r| r == UpdateResult::Updated),
        // UPDATE writes no deadline: over exactly the entry read instead.
        (PutMode::IfPresent, Some(_)) => loop {
            let Some(cur) = c.get_async(key).await.map_err(err)? else {
                return Ok(false);
            };
            if c.replace_async(key, &cur, value, expires_at)
                .await
                .map_err(err)?
                == dmkit_fusee::CasResult::Swapped
            {
                return Ok(true);
            }
        },
    }
    .map_err(err)
}

impl KvBackend for FuseeBackend {
    fn get(&self, key: &[u8]) -> Result<Option<Vec<u8>>, String> {
        self.0.search(key).map_err(|e| e.to_string())
    }

    fn put(&self, key: &[u8], value: &[u8], mode: PutMode) -> Result<bool, String> {
        let e = |e: dmkit_fusee::Error| e.to_string();
        match mode {
            PutMode::Upsert => self.0.upsert(key, value).map(|()| true).map_err(e),
            PutMode::IfAbsent => {
                Ok(self.0.insert(key, value).map_err(e)? == InsertResult::Inserted)
            }
            PutMode::IfPresent => {
                Ok(self.0.update(key, value).map_err(e)? == UpdateResult::Updated)
            }
        }
    }

    fn delete(&self, key: &[u8]) -> Result<bool, String> {
        Ok(self.0.delete(key).map_err(|e| e.to_string())? == DeleteResult::Deleted)
    }

    fn get_range(&self, key: &[u8], range: ByteRange) -> Result<Option<ValueSlice>, String> {
        let r = self.0.get_range(key, |len| range.of(len));
        r.map(|v| v.map(|v| (v.len, v.bytes))).map_err(err)
    }

    fn get_range_async(
        &self,
        key: Vec<u8>,
        range: ByteRange,
    ) -> Option<BoxFuture<Result<Option<ValueSlice>, String>>> {
        let c = self.0.clone();
        Some(Box::pin(async move {
            let r = c.get_range_async(&key, |len| range.of(len)).await;
            r.map(|v| v.map(|v| (v.len, v.bytes))).map_err(err)
        }))
    }

    fn get_async(
        &self,
        key: Vec<u8>,
    ) -> Option<dmkit_tools::resp::BoxFuture<Result<Option<Vec<u8>>, String>>> {
        let c = self.0.clone();
        Some(Box::pin(async move {
            c.search_async(&key).await.map_err(|e| e.to_string())
        }))
    }

    fn put_async(
        &self,
        key: Vec<u8>,
        value: Vec<u8>,
        mode: PutMode,
    ) -> Option<dmkit_tools::resp::BoxFuture<Result<bool, String>>> {
        let c = self.0.clone();
        Some(Box::pin(async move {
            let e = |e: dmkit_fusee::Error| e.to_string();
            match mode {
                PutMode::Upsert => c.upsert_async(&key, &value).await.map(|()| true).map_err(e),
                PutMode::IfAbsent => {
                    Ok(c.insert_async(&key, &value).await.map_err(e)? == InsertResult::Inserted)
                }
                PutMode::IfPresent => {
                    Ok(c.update_async(&key, &value).await.map_err(e)? == UpdateResult::Updated)
                }
            }
        }))
    }

    fn delete_async(
        &self,
        key: Vec<u8>,
    ) -> Option<dmkit_tools::resp::BoxFuture<Result<bool, String>>> {
        let c = self.0.clone();
        Some(Box::pin(async move {
            Ok(c.delete_async(&key).await.map_err(|e| e.to_string())? == DeleteResult::Deleted)
        }))
    }

    fn compare_and_set(&self, key: &[u8], expected: &[u8], value: &[u8]) -> Result<Cas, String> {
        self.0
            .compare_and_set(key, expected, value)
            .map(cas)
            .map_err(|e| e.to_string())
    }

    fn delete_if(&self, key: &[u8], expected: &[u8]) -> Result<Cas, String> {
        self.0
            .delete_if(key, expected)
            .map(cas)
            .map_err(|e| e.to_string())
    }

    fn compare_and_set_async(
        &self,
        key: Vec<u8>,
        expected: Vec<u8>,
        value: Vec<u8>,
    ) -> Option<dmkit_tools::resp::BoxFuture<Result<Cas, String>>> {
        let c = self.0.clone();
        Some(Box::pin(async move {
            c.compare_and_set_async(&key, &expected, &value)
                .await
                .map(cas)
                .map_err(|e| e.to_string())
        }))
    }

    fn delete_if_async(
        &self,
        key: Vec<u8>,
        expected: Vec<u8>,
    ) -> Option<dmkit_tools::resp::BoxFuture<Result<Cas, String>>> {
        let c = self.0.clone();
        Some(Box::pin(async move {
            c.delete_if_async(&key, &expected)
                .await
                .map(cas)
                .map_err(|e| e.to_string())
        }))
    }

    fn scan(&self, cursor: u64) -> Result<ScanStep, String> {
        self.0.scan(cursor).map_err(|e| e.to_string())
    }

    fn scan_async(
        &self,
        cursor: u64,
    ) -> Option<dmkit_tools::resp::BoxFuture<Result<ScanStep, String>>> {
        let c = self.0.clone();
        Some(Box::pin(async move {
            c.scan_async(cursor).await.map_err(|e| e.to_string())
        }))
    }

    fn get_entry(&self, key: &[u8]) -> Result<Option<Entry>, String> {
        self.0.get(key).map(|e| e.map(entry)).map_err(err)
    }

    fn get_entry_async(&self, key: Vec<u8>) -> Option<BoxFuture<Result<Option<Entry>, String>>> {
        let c = self.0.clone();
        Some(Box::pin(async move {
            c.get_async(&key).await.map(|e| e.map(entry)).map_err(err)
        }))
    }

    fn put_entry(
        &self,
        key: &[u8],
        value: &[u8],
        expires_at: Option<u64>,
        mode: PutMode,
    ) -> Result<bool, String> {
        dmkit_verbs::block_on(put_entry(&self.0, key, value, expires_at, mode))
    }

    fn put_entry_async(
        &self,
        key: Vec<u8>,
        value: Vec<u8>,
        expires_at: Option<u64>,
        mode: PutMode,
    ) -> Option<BoxFuture<Result<bool, String>>> {
        let c = self.0.clone();
        Some(Box::pin(async move {
            put_entry(&c, &key, &value, expires_at, mode).await
        }))
    }

    fn replace_entry(
        &self,
        key: &[u8],
        current: &Entry,
        value: &[u8],
        expires_at: Option<u64>,
    ) -> Result<Cas, String> {
        self.0
            .replace(key, fusee_entry(current)?, value, expires_at)
            .map(cas)
            .map_err(err)
    }

    fn replace_entry_async(
        &self,
        key: Vec<u8>,
        current: Entry,
        value: Vec<u8>,
        expires_at: Option<u64>,
    ) -> Option<BoxFuture<Result<Cas, String>>> {
        let c = self.0.clone();
        Some(Box::pin(async move {
            let cur = fusee_entry(&current)?;
            c.replace_async(&key, cur, &value, expires_at)
                .await
                .map(cas)
                .map_err(err)
        }))
    }

    fn delete_entry(&self, key: &[u8], current: &Entry) -> Result<Cas, String> {
        self.0
            .delete_entry(key, fusee_entry(current)?)
            .map(cas)
            .map_err(err)
    }

    fn delete_entry_async(
        &self,
        key: Vec<u8>,
        current: Entry,
    ) -> Option<BoxFuture<Result<Cas, String>>> {
        let c = self.0.clone();
        Some(Box::pin(async move {
            let cur = fusee_entry(&current)?;
            c.delete_entry_async(&key, cur).await.map(cas).map_err(err)
        }))
    }

    fn reclaim_expired(&self, cursor: u64) -> Result<dmkit_fusee::Swept, String> {
        self.0.reclaim_expired(cursor).map_err(err)
    }

    fn reclaim_expired_async(
        &self,
        cursor: u64,
    ) -> Option<BoxFuture<Result<dmkit_fusee::Swept, String>>> {
        let c = self.0.clone();
        Some(Box::pin(async move {
            c.reclaim_expired_async(cursor).await.map_err(err)
        }))
    }

    fn now_ms(&self) -> u64 {
        self.0.now()
    }

    fn max_value(&self) -> usize {
        // `dmkit kv` and `dmkit resp` build their clients with the default settings.
        static MAX: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
        *MAX.get_or_init(|| dmkit_fusee::ClientConfig::new(0).max_value)
    }

    fn info(&self) -> Vec<(String, String)> {
        let s = self.0.cache_stats();
        vec![
            ("fusee_client_id".into(), self.0.id().to_string()),
            (
                "fusee_memory_nodes".into(),
                self.0.view().nodes.len().to_string(),
            ),
            ("fusee_address_cache_hits".into(), s.hits.to_string()),
            ("fusee_address_cache_misses".into(), s.misses.to_string()),
        ]
    }
}

pub fn run(args: RespArgs) -> Result<(), CliError> {
    let file = ClusterFile::load(&args.cluster).map_err(CliError::usage)?;
    let password = if args.auth_cluster_secret {
        match crate::connect::secret(Some(&file))? {
            Some(s) => Some(s),
            None => {
                return Err(CliError::usage(
                    "--auth-cluster-secret: this cluster has no secret (set secret_file in the \
                     cluster file, DMKIT_SECRET_FILE or DMKIT_SECRET), so there is nothing to \
                     AUTH with: give --password-file instead",
                ));
            }
        }
    } else {
        args.password_file
            .as_deref()
            .map(read_password)
            .transpose()?
    };
    if let Some(m) = &args.metrics {
        let at = crate::metrics_http::serve(m).map_err(CliError::usage)?;
        eprintln!("dmkit resp: metrics at http://{at}/metrics");
    }
    let _lock = crate::kv::lock_id(args.client_id, false)?;
    let client = crate::kv::client(&file, args.client_id)?;
    let with_password = password.is_some();
    let server = RespServer::start(
        &args.listen,
        Arc::new(FuseeBackend(client)),
        RespConfig {
            password,
            expiry_sweep: (args.expiry_sweep_ms > 0)
                .then(|| std::time::Duration::from_millis(args.expiry_sweep_ms)),
            ..RespConfig::default()
        },
    )
    .map_err(|e| CliError::usage(format!("cannot listen on {}: {e}", args.listen)))?;
    eprintln!(
        "dmkit resp: serving Redis clients on {}{}",
        server.local_addr(),
        match (with_password, args.auth_cluster_secret) {
            (true, true) => " (AUTH required: the cluster secret)",
            (true, false) => " (AUTH required)",
            _ => "",
        }
    );
    loop {
        std::thread::park();
    }
}

#[cfg(test)]
mod tests {
    use std::io::{Read, Write};
    use std::net::TcpStream;
    use std::sync::Arc;
    use std::time::{Duration, Instant};

    use dmkit_fusee::{LocalCluster, LocalConfig};
    use dmkit_tools::resp::{RespConfig, RespServer};

    use super::FuseeBackend;

    /// A Redis client that drops mid-pipeline over FUSEE: the other clients are served, the
    /// operations it started finish (nothing is left in flight), and the gateway forgets it.
    #[test]
    fn a_dropped_pipeline_leaves_fusee_with_nothing_in_flight() {
        // Over tcp memory nodes: the connections' in-flight tables are real.
        let cluster = LocalCluster::start_tcp(LocalConfig::new(3, 3)).unwrap();
        let client = cluster.client(9).unwrap();
        let s = RespServer::start(
            "127.0.0.1:0",
            Arc::new(FuseeBackend(client.clone())),
            RespConfig::default(),
        )
        .unwrap();
        {
            let mut c = TcpStream::connect(s.local_addr()).unwrap();
            let mut input = Vec::new();
            for i in 0..200 {
                input.extend_from_slice(format!("SET k{i} v{i}\r\nGET k{i}\r\n").as_bytes());
            }
            c.write_all(&input).unwrap();
        }
        let mut c = TcpStream::connect(s.local_addr()).unwrap();
        c.write_all(b"SET other 1\r\nGET other\r\n").unwrap();
        let want = b"+OK\r\n$1\r\n1\r\n";
        let mut got = Vec::new();
        let mut buf = [0u8; 256];
        while got.len() < want.len() {
            let n = c.read(&mut buf).unwrap();
            assert!(n > 0, "the gateway closed a healthy connection");
            got.extend_from_slice(&buf[..n]);
        }
        assert_eq!(got, want);
        drop(c);
        let t = Instant::now();
        while (s.clients() > 0 || client.endpoint().in_flight() > 0)
            && t.elapsed() < Duration::from_secs(10)
        {
            std::thread::sleep(Duration::from_millis(10));
        }
        assert_eq!(s.clients(), 0);
        assert_eq!(client.endpoint().in_flight(), 0);
        // Every write the dropped client started either happened or not, whole.
        for i in 0..200 {
            let v = client.search(format!("k{i}").as_bytes()).unwrap();
            assert!(
                v.is_none() || v == Some(format!("v{i}").into_bytes()),
                "key k{i}: {v:?}"
            );
        }
    }

    fn say(c: &mut TcpStream, what: &[u8], lines: usize) -> String {
        c.write_all(what).unwrap();
        let mut got = Vec::new();
        let mut buf = [0u8; 8192];
        while got.windows(2).filter(|w| w == b"\r\n").count() < lines {
            let n = c.read(&mut buf).unwrap();
            assert!(n > 0, "closed");
            got.extend_from_slice(&buf[..n]);
        }
        String::from_utf8_lossy(&got).into_owned()
    }

    /// Deadlines over FUSEE: TTL counts down, an expired key reads as absent, and the
    /// gateway's sweep deletes the expired keys nobody reads (INFO counts them). PERSIST and
    /// KEEPTTL keep the value; an EXPIRE never undoes a write between its read and its write.
    #[test]
    fn expiry_over_fusee() {
        let cluster = LocalCluster::start_tcp(LocalConfig::new(3, 3)).unwrap();
        let client = cluster.client(12).unwrap();
        let s = RespServer::start(
            "127.0.0.1:0",
            Arc::new(FuseeBackend(client.clone())),
            RespConfig {
                expiry_sweep: Some(Duration::from_millis(5)),
                ..RespConfig::default()
            },
        )
        .unwrap();
        let mut c = TcpStream::connect(s.local_addr()).unwrap();
        c.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
        assert_eq!(
            say(
                &mut c,
                b"SET a 1 PX 100\r\nSET b 2 EX 100\r\nSET c 3 KEEPTTL\r\nPERSIST b\r\nTTL b\r\nSETEX d 100 4\r\nTTL d\r\nEXPIRE d 200 GT\r\nTTL d\r\n",
                9
            ),
            "+OK\r\n+OK\r\n+OK\r\n:1\r\n:-1\r\n+OK\r\n:100\r\n:1\r\n:200\r\n"
        );
        for i in 0..20 {
            say(&mut c, format!("SET gone{i} x PX 50\r\n").as_bytes(), 1);
        }
        std::thread::sleep(Duration::from_millis(300));
        let t = std::time::Instant::now();
        loop {
            let info = say(&mut c, b"INFO\r\n", 3);
            std::thread::sleep(Duration::from_millis(50));
            let mut rest = vec![0u8; 65536];
            c.set_read_timeout(Some(Duration::from_millis(100)))
                .unwrap();
            let n = c.read(&mut rest).unwrap_or(0);
            c.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
            let info = format!("{info}{}", String::from_utf8_lossy(&rest[..n]));
            let expired: u64 = info
                .split("expired_keys:")
                .nth(1)
                .and_then(|r| r.split_whitespace().next())
                .and_then(|n| n.parse().ok())
                .unwrap_or(0);
            // a and the 20 others: nobody read them, the sweep took them.
            if expired >= 21 {
                break;
            }
            assert!(t.elapsed() < Duration::from_secs(20), "{info}");
        }
        assert_eq!(
            say(&mut c, b"GET a\r\nEXISTS b c d gone1\r\nDBSIZE\r\n", 3),
            "$-1\r\n:3\r\n:3\r\n"
        );
    }

    /// MGET, MSET, DEL and EXISTS over many keys go out as one write per memory node per
    /// round: the keys' operations run together, and their verbs (each key's its own batch,
    /// so one key's fault stops no other) share each node's doorbell — one system call and
    /// its segments, answered by one write.
    #[test]
    fn multi_key_commands_send_one_frame_per_node_per_round() {
        const KEYS: usize = 64;
        let cluster = LocalCluster::start_tcp(LocalConfig::new(3, 3)).unwrap();
        let client = cluster.client(11).unwrap();
        let s = RespServer::start(
            "127.0.0.1:0",
            Arc::new(FuseeBackend(client.clone())),
            RespConfig::default(),
        )
        .unwrap();
        let mut c = TcpStream::connect(s.local_addr()).unwrap();
        c.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
        let mut call = |cmd: Vec<String>, reply_prefix: &[u8], reply_len: usize| {
            let mut req = format!("*{}\r\n", cmd.len());
            for a in &cmd {
                req.push_str(&format!("${}\r\n{a}\r\n", a.len()));
            }
            c.write_all(req.as_bytes()).unwrap();
            let mut got = Vec::new();
            let mut buf = [0u8; 4096];
            while got.len() < reply_len {
                let n = c.read(&mut buf).unwrap();
                assert!(n > 0, "the gateway closed the connection");
                got.extend_from_slice(&buf[..n]);
            }
            assert!(
                got.starts_with(reply_prefix),
                "{}",
                String::from_utf8_lossy(&got)
            );
            got
        };
        let writes = || cluster.tcp.iter().map(|t| t.traffic().writes).sum::<u64>();
        let rounds = || client.endpoint().stats().total().round_trips;
        let keys: Vec<String> = (0..KEYS).map(|i| format!("key{i:02}")).collect();
        // A first write of each key takes blocks and grows nothing later: warm up.
        let mut mset = vec!["MSET".to_string()];
        for k in &keys {
            mset.push(k.clone());
            mset.push(format!("v-{k}"));
        }
        call(mset.clone(), b"+OK", 5);
        client.flush().unwrap();

        let check = |what: &str, f0: u64, r0: u64, f1: u64, r1: u64| {
            let (writes, rounds) = (f1 - f0, r1 - r0);
            // Each key's round trips are counted; the nodes' writes are shared: about one
            // per node (3) per round of the slowest key (and the background cleanup's),
            // with slack for a round split in two by a late completion.
            let per_key_rounds = (rounds as f64 / KEYS as f64).ceil();
            assert!(
                writes as f64 <= 2.0 * 3.0 * (per_key_rounds + 1.0),
                "{what}: {writes} response writes for {rounds} round trips of {KEYS} keys"
            );
            eprintln!("{what}: {rounds} round trips of {KEYS} keys in {writes} response writes");
        };
        let (f0, r0) = (writes(), rounds());
        let reply_len: usize = keys
            .iter()
            .map(|k| {
                let v = format!("v-{k}").len();
                format!("${v}\r\n").len() + v + 2
            })
            .sum::<usize>()
            + 5;
        let got = call(
            std::iter::once("MGET".to_string())
                .chain(keys.iter().cloned())
                .collect(),
            b"*64\r\n",
            reply_len,
        );
        for k in &keys {
            let want = format!("v-{k}");
            assert!(got.windows(want.len()).any(|w| w == want.as_bytes()), "{k}");
        }
        check("MGET", f0, r0, writes(), rounds());
        let (f0, r0) = (writes(), rounds());
        call(
            std::iter::once("EXISTS".to_string())
                .chain(keys.iter().cloned())
                .collect(),
            b":64",
            5,
        );
        check("EXISTS", f0, r0, writes(), rounds());
        let (f0, r0) = (writes(), rounds());
        call(mset, b"+OK", 5);
        check("MSET", f0, r0, writes(), rounds());
        let (f0, r0) = (writes(), rounds());
        call(
            std::iter::once("DEL".to_string())
                .chain(keys.iter().cloned())
                .collect(),
            b":64",
            5,
        );
        check("DEL", f0, r0, writes(), rounds());
    }
}
