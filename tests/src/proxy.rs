//! A loopback TCP relay that can be cut and healed: a network partition for process tests
//! that have no network namespaces.
//!
//! Everything that reaches a process through the relay's address stops moving while the
//! relay is cut — bytes already sent stay in the relay (as in a network that drops and later
//! retransmits), new connections are accepted but carry nothing — and moves again, in order,
//! when it is healed. Nothing is reset: a peer learns of the cut only from its own timeouts,
//! as it would across a real partition.
//!
//! ```
//! use std::io::{Read, Write};
//! let echo = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
//! let target = echo.local_addr().unwrap().to_string();
//! std::thread::spawn(move || {
//!     let (mut s, _) = echo.accept().unwrap();
//!     let mut b = [0u8; 4];
//!     s.read_exact(&mut b).unwrap();
//!     s.write_all(&b).unwrap();
//! });
//! let relay = dmkit_tests::proxy::Relay::start(&target);
//! let mut c = std::net::TcpStream::connect(relay.addr()).unwrap();
//! c.write_all(b"ping").unwrap();
//! let mut b = [0u8; 4];
//! c.read_exact(&mut b).unwrap();
//! assert_eq!(&b, b"ping");
//! ```

use std::io::{Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use parking_lot::{Condvar, Mutex};

#[derive(Default)]
struct Gate {
    cut: Mutex<bool>,
    healed: Condvar,
}

impl Gate {
    /// Blocks while the relay is cut.
    fn pass(&self) {
        let mut cut = self.cut.lock();
        while *cut {
            self.healed.wait(&mut cut);
        }
    }
}

/// A relay from a loopback address of its own to `target`.
pub struct Relay {
    addr: String,
    gate: Arc<Gate>,
    stop: Arc<AtomicBool>,
    streams: Arc<Mutex<Vec<TcpStream>>>,
}

impl Relay {
    /// Listens on a free loopback port and relays every connection to `target`.
    pub fn start(target: &str) -> Relay {
        Self::start_on("127.0.0.1:0", target)
    }

    /// Listens on `listen` and relays every connection to `target`.
    pub fn start_on(listen: &str, target: &str) -> Relay {
        let l = TcpListener::bind(listen).unwrap_or_else(|e| panic!("bind {listen}: {e}"));
        let addr = l.local_addr().expect("its address").to_string();
        let gate = Arc::new(Gate::default());
        let stop = Arc::new(AtomicBool::new(false));
        let streams: Arc<Mutex<Vec<TcpStream>>> = Arc::default();
        let (g, s, st, target) = (
            gate.clone(),
            stop.clone(),
            streams.clone(),
            target.to_string(),
        );
        std::thread::spawn(move || {
            for inbound in l.incoming() {
                if s.load(Ordering::SeqCst) {
                    return;
                }
                let Ok(inbound) = inbound else { continue };
                let g = g.clone();
                let st = st.clone();
                let target = target.clone();
                std::thread::spawn(move || {
                    // A connection made across a cut waits for the heal to reach the target.
                    g.pass();
                    let Ok(outbound) = TcpStream::connect(&target) else {
                        let _ = inbound.shutdown(Shutdown::Both);
                        return;
                    };
                    let _ = inbound.set_nodelay(true);
                    let _ = outbound.set_nodelay(true);
                    let pairs = [
                        (inbound.try_clone(), outbound.try_clone()),
                        (outbound.try_clone(), inbound.try_clone()),
                    ];
                    {
                        let mut all = st.lock();
                        all.extend(inbound.try_clone());
                        all.extend(outbound.try_clone());
                    }
                    for (from, to) in pairs {
                        let (Ok(from), Ok(to)) = (from, to) else {
                            continue;
                        };
                        let g = g.clone();
                        std::thread::spawn(move || pump(from, to, &g));
                    }
                });
            }
        });
        Relay {
            addr,
            gate,
            stop,
            streams,
        }
    }

    /// The address to connect to instead of the target's.
    pub fn addr(&self) -> &str {
        &self.addr
    }

    /// Stops carrying bytes (both ways, every connection, new ones too).
    pub fn cut(&self) {
        *self.gate.cut.lock() = true;
    }

    /// Carries bytes again: what was held goes through, in order.
    pub fn heal(&self) {
        *self.gate.cut.lock() = false;
        self.gate.healed.notify_all();
    }

    /// Whether the relay is cut.
    pub fn is_cut(&self) -> bool {
        *self.gate.cut.lock()
    }
}

/// Copies `from` to `to` until either closes, holding every chunk while the gate is shut.
fn pump(mut from: TcpStream, mut to: TcpStream, gate: &Gate) {
    let mut buf = vec![0u8; 64 << 10];
    loop {
        // Checked before reading too, so that a cut relay leaves bytes in the kernel's buffers
        // (the sender's writes back up, as on a link that carries nothing).
        gate.pass();
        let n = match from.read(&mut buf) {
            Ok(0) | Err(_) => break,
            Ok(n) => n,
        };
        gate.pass();
        if to.write_all(&buf[..n]).is_err() {
            break;
        }
    }
    let _ = to.shutdown(Shutdown::Write);
    let _ = from.shutdown(Shutdown::Read);
}

impl std::fmt::Debug for Relay {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Relay")
            .field("addr", &self.addr)
            .field("cut", &self.is_cut())
            .finish()
    }
}

impl Drop for Relay {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        self.heal();
        // Wake the accept loop, then close every relayed connection.
        let _ = TcpStream::connect_timeout(
            &self.addr.parse().expect("a socket address"),
            Duration::from_millis(200),
        );
        for s in self.streams.lock().drain(..) {
            let _ = s.shutdown(Shutdown::Both);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn echo() -> String {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let a = l.local_addr().unwrap().to_string();
        std::thread::spawn(move || {
            for s in l.incoming() {
                let Ok(mut s) = s else { continue };
                std::thread::spawn(move || {
                    let mut b = [0u8; 1024];
                    while let Ok(n) = s.read(&mut b) {
                        if n == 0 || s.write_all(&b[..n]).is_err() {
                            break;
                        }
                    }
                });
            }
        });
        a
    }

    #[test]
    fn a_cut_holds_bytes_and_a_heal_delivers_them_in_order() {
        let r = Relay::start(&echo());
        let mut c = TcpStream::connect(r.addr()).unwrap();
        c.set_read_timeout(Some(Duration::from_millis(300)))
            .unwrap();
        let mut b = [0u8; 3];
        c.write_all(b"one").unwrap();
        c.read_exact(&mut b).unwrap();
        assert_eq!(&b, b"one");
        r.cut();
        assert!(r.is_cut());
        c.write_all(b"two").unwrap();
        let mut one = [0u8; 1];
        assert!(c.read(&mut one).is_err(), "a cut relay carried bytes");
        // A connection made during the cut carries nothing either.
        let mut c2 = TcpStream::connect(r.addr()).unwrap();
        c2.set_read_timeout(Some(Duration::from_millis(300)))
            .unwrap();
        c2.write_all(b"new").unwrap();
        assert!(c2.read(&mut one).is_err(), "a cut relay carried bytes");
        r.heal();
        c.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        c.read_exact(&mut b).unwrap();
        assert_eq!(&b, b"two");
        c2.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        c2.read_exact(&mut b).unwrap();
        assert_eq!(&b, b"new");
    }
}
