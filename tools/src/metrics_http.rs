//! Serving the process's metrics in Prometheus text format at `http://ADDR/metrics`.

use std::net::SocketAddr;

use metrics_exporter_prometheus::PrometheusBuilder;

/// Installs the global metrics recorder and serves it on `addr`. Fails if the address cannot
/// be bound or a recorder is installed already.
pub fn serve(addr: &str) -> Result<SocketAddr, String> {
    let sa: SocketAddr = addr.parse().map_err(|_| {
        format!("invalid metrics address '{addr}': expected host:port such as 127.0.0.1:9100")
    })?;
    // Bind first so a busy port is a clear error here, not a log line from a background task.
    std::net::TcpListener::bind(sa).map_err(|e| format!("cannot serve metrics on {sa}: {e}"))?;
    PrometheusBuilder::new()
        .with_http_listener(sa)
        .install()
        .map_err(|e| format!("cannot serve metrics on {sa}: {e}"))?;
    Ok(sa)
}
