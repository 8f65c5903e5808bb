//! The cluster file (TOML) that names the backend, the master, the replication factors and
//! the memory nodes. Keys beyond these may be added; scripts written against these keep
//! working.
//!
//! ```toml
//! backend = "tcp"            # sim | tcp | rdma
//! master = "127.0.0.1:7000"
//! index_replicas = 3
//! data_replicas = 3
//! # optional: secret_file = "/etc/dmkit/secret", index_mib = 16
//! [[memnode]]
//! id = 0
//! addr = "127.0.0.1:7100"
//! ```

use std::path::{Path, PathBuf};

use serde::Deserialize;

use crate::Backend;

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MemnodeEntry {
    pub id: u16,
    pub addr: String,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
struct Raw {
    backend: String,
    master: Option<String>,
    index_replicas: usize,
    data_replicas: usize,
    #[serde(default)]
    secret_file: Option<PathBuf>,
    #[serde(default)]
    index_mib: Option<u64>,
    #[serde(default)]
    memnode: Vec<MemnodeEntry>,
}

/// A parsed, checked cluster file.
#[derive(Debug, Clone)]
pub struct ClusterFile {
    pub backend: Backend,
    pub master: Option<String>,
    pub index_replicas: usize,
    pub data_replicas: usize,
    pub secret_file: Option<PathBuf>,
    pub index_mib: u64,
    pub memnodes: Vec<MemnodeEntry>,
}

impl ClusterFile {
    /// Reads and checks `path`; every error names the file and what is wrong.
    pub fn load(path: &Path) -> Result<ClusterFile, String> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| format!("cannot read cluster file {}: {e}", path.display()))?;
        Self::parse(&text).map_err(|e| format!("cluster file {}: {e}", path.display()))
    }

    pub fn parse(text: &str) -> Result<ClusterFile, String> {
        let raw: Raw = toml::from_str(text).map_err(|e| e.to_string().trim().replace('\n', " "))?;
        let backend = match raw.backend.as_str() {
            "sim" => Backend::Sim,
            "tcp" => Backend::Tcp,
            "rdma" => Backend::Rdma,
            b => return Err(format!("backend '{b}' is not one of sim, tcp, rdma")),
        };
        if raw.memnode.is_empty() && backend != Backend::Sim {
            return Err("no [[memnode]] entries".into());
        }
        let mut ids: Vec<_> = raw.memnode.iter().map(|m| m.id).collect();
        ids.sort_unstable();
        if ids.windows(2).any(|w| w[0] == w[1]) {
            return Err("two [[memnode]] entries share an id".into());
        }
        for m in &raw.memnode {
            if !m.addr.contains(':') {
                return Err(format!(
                    "memnode {}: address '{}' is not host:port",
                    m.id, m.addr
                ));
            }
        }
        let n = raw.memnode.len().max(1);
        if raw.index_replicas == 0 || raw.index_replicas > n.min(5) {
            return Err(format!(
                "index_replicas = {} must be within 1..={}",
                raw.index_replicas,
                n.min(5)
            ));
        }
        if raw.data_replicas == 0 || raw.data_replicas > n {
            return Err(format!(
                "data_replicas = {} must be within 1..={n}",
                raw.data_replicas
            ));
        }
        Ok(ClusterFile {
            backend,
            master: raw.master,
            index_replicas: raw.index_replicas,
            data_replicas: raw.data_replicas,
            secret_file: raw.secret_file,
            index_mib: raw.index_mib.unwrap_or(16),
            memnodes: raw.memnode,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const GOOD: &str = r#"
backend = "tcp"
master = "127.0.0.1:7000"
index_replicas = 2
data_replicas = 2
[[memnode]]
id = 0
addr = "127.0.0.1:7100"
[[memnode]]
id = 1
addr = "127.0.0.1:7101"
"#;

    #[test]
    fn parses_the_documented_format() {
        let c = ClusterFile::parse(GOOD).unwrap();
        assert_eq!(c.backend, Backend::Tcp);
        assert_eq!(c.memnodes.len(), 2);
        assert_eq!(c.index_replicas, 2);
    }

    #[test]
    fn bad_files_say_what_is_wrong() {
        let e = ClusterFile::parse(&GOOD.replace("\"tcp\"", "\"udp\"")).unwrap_err();
        assert!(e.contains("udp"), "{e}");
        let e = ClusterFile::parse(&GOOD.replace("index_replicas = 2", "index_replicas = 3"))
            .unwrap_err();
        assert!(e.contains("index_replicas"), "{e}");
        let e = ClusterFile::parse(&GOOD.replace("id = 1", "id = 0")).unwrap_err();
        assert!(e.contains("share an id"), "{e}");
        let e = ClusterFile::parse(&GOOD.replace("7101\"", "7101\"\nport = 3")).unwrap_err();
        assert!(e.contains("port"), "{e}");
        let e = ClusterFile::parse("backend = ").unwrap_err();
        assert!(!e.is_empty());
        let e = ClusterFile::parse(&GOOD.replace("127.0.0.1:7101", "localhost")).unwrap_err();
        assert!(e.contains("host:port"), "{e}");
    }
}
