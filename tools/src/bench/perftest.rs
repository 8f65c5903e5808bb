//! Running perftest (`ib_read_lat`, `ib_write_bw`, `ib_atomic_bw`) on the same device in the
//! same run, as the baseline of the rdma verbs bench, and reading its reports.

use std::process::{Command, Stdio};
use std::time::Duration;

/// Which device and how to reach it.
#[derive(Debug, Clone)]
pub struct Target {
    pub device: String,
    pub port: u8,
    pub gid_index: u32,
    pub ip: String,
}

/// Runs `tool ARGS` as a server in the background and again as the client of `ip`; returns
/// the client's stdout. A failed pair is run once more (perftest's connection set-up, `-R`
/// above all, fails now and then on an emulated device) before the error is returned.
pub fn run_pair(tool: &str, t: &Target, args: &[String], tcp_port: u16) -> Result<String, String> {
    run_pair_once(tool, t, args, tcp_port).or_else(|first| {
        std::thread::sleep(Duration::from_secs(1));
        run_pair_once(tool, t, args, tcp_port)
            .map_err(|second| format!("{second} (and before that: {first})"))
    })
}

fn run_pair_once(tool: &str, t: &Target, args: &[String], tcp_port: u16) -> Result<String, String> {
    let mut common = vec![
        "-d".to_string(),
        t.device.clone(),
        "-i".into(),
        t.port.to_string(),
        "-x".into(),
        t.gid_index.to_string(),
        "-F".into(),
        "-p".into(),
        tcp_port.to_string(),
    ];
    common.extend_from_slice(args);
    let mut server = Command::new(tool)
        .args(&common)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .map_err(|e| format!("cannot run {tool} (install Debian's perftest): {e}"))?;
    std::thread::sleep(Duration::from_millis(1500));
    let out = Command::new(tool)
        .args(&common)
        .arg(&t.ip)
        .output()
        .map_err(|e| format!("cannot run {tool}: {e}"));
    let _ = server.kill();
    let _ = server.wait();
    let out = out?;
    if !out.status.success() {
        return Err(format!(
            "{tool} failed: {}",
            String::from_utf8_lossy(&out.stderr)
                .lines()
                .last()
                .unwrap_or("")
        ));
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// The data row of a perftest report: the first line whose first field is the message size.
fn data_row(report: &str, size: usize) -> Option<Vec<f64>> {
    report.lines().find_map(|l| {
        let f: Vec<&str> = l.split_whitespace().collect();
        (f.first() == Some(&size.to_string().as_str()))
            .then(|| f.iter().filter_map(|x| x.parse::<f64>().ok()).collect())
    })
}

/// `ib_read_lat`: the typical (median) latency in microseconds.
#[cfg_attr(not(feature = "rdma"), allow(dead_code))]
pub fn typical_latency_us(report: &str, size: usize) -> Option<f64> {
    // #bytes #iterations t_min t_max t_typical t_avg t_stdev 99% 99.9%
    data_row(report, size).and_then(|r| r.get(4).copied())
}

/// `ib_write_bw` / `ib_atomic_bw`: the message rate in operations per second.
pub fn msg_rate_per_sec(report: &str, size: usize) -> Option<f64> {
    // #bytes #iterations BW_peak BW_average MsgRate[Mpps]
    data_row(report, size)
        .and_then(|r| r.get(4).copied())
        .map(|m| m * 1e6)
}

#[cfg(test)]
mod tests {
    use super::*;

    const LAT: &str = "\
---------------------------------------------------------------------------------------
 #bytes #iterations    t_min[usec]    t_max[usec]  t_typical[usec]    t_avg[usec]    t_stdev[usec]   99% percentile[usec]   99.9% percentile[usec] 
 64      1000          402.11         1650.20      611.54             640.02         88.50           990.13                 1600.11
---------------------------------------------------------------------------------------
";
    const BW: &str = "\
 #bytes     #iterations    BW peak[MB/sec]    BW average[MB/sec]   MsgRate[Mpps]
 64         5000             1.95               1.80                 0.029512
";

    #[test]
    fn reads_perftest_reports() {
        assert_eq!(typical_latency_us(LAT, 64), Some(611.54));
        assert_eq!(msg_rate_per_sec(BW, 64), Some(29512.0));
        assert_eq!(msg_rate_per_sec(BW, 8), None);
        assert_eq!(typical_latency_us("garbage", 64), None);
    }
}
