//! RAII owners of verbs and rdma-cm objects. This module and `post.rs` hold the backend's
//! `unsafe`; everything above them is safe code. Drop order follows the verbs object graph:
//! a QP holds its CQ and PD alive, an MR its PD, a CQ its completion channel.

use std::ffi::CStr;
use std::net::{Ipv4Addr, SocketAddr, SocketAddrV4};
use std::os::raw::c_int;
use std::ptr::{self, NonNull};
use std::sync::Arc;
use std::time::Duration;

use super::sys;
use crate::error::{Error, Result};

fn errno() -> std::io::Error {
    std::io::Error::last_os_error()
}

/// An open device context, as librdmacm opened it (it owns and closes contexts itself).
#[derive(Clone, Copy)]
pub(crate) struct Context(NonNull<sys::ibv_context>);

// SAFETY: an ibv_context is thread-safe per the libibverbs threading model and lives as long
// as the process (librdmacm never closes the contexts it lists).
unsafe impl Send for Context {}
// SAFETY: as above.
unsafe impl Sync for Context {}

impl std::fmt::Debug for Context {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Context({})", self.name())
    }
}

/// What the backend needs to know about a device.
#[derive(Debug, Clone)]
pub(crate) struct DeviceCaps {
    pub ports: u8,
    pub atomics: bool,
    pub max_qp_wr: u32,
    pub max_qp_rd_atom: u32,
}

/// One port's state.
#[derive(Debug, Clone)]
pub(crate) struct PortInfo {
    pub active: bool,
    pub gid_table_len: u32,
}

impl Context {
    /// Every device librdmacm knows, with the contexts its connection ids will use.
    pub fn all() -> Vec<Context> {
        let mut n: c_int = 0;
        // SAFETY: rdma_get_devices writes the count and returns a NULL-terminated array owned
        // by librdmacm (or NULL); we read `n` entries and never free it, so the contexts stay
        // open for the life of the process.
        let list = unsafe { sys::rdma_get_devices(&mut n) };
        if list.is_null() {
            return Vec::new();
        }
        (0..n.max(0) as usize)
            // SAFETY: `list` has `n` valid entries.
            .filter_map(|i| NonNull::new(unsafe { *list.add(i) }))
            .map(Context)
            .collect()
    }

    pub fn from_raw(p: *mut sys::ibv_context) -> Option<Context> {
        NonNull::new(p).map(Context)
    }

    pub fn raw(self) -> *mut sys::ibv_context {
        self.0.as_ptr()
    }

    pub fn name(self) -> String {
        // SAFETY: the context is open, so its device pointer is valid; the name is a
        // NUL-terminated string owned by libibverbs.
        unsafe {
            let dev = (*self.0.as_ptr()).device;
            let n = sys::ibv_get_device_name(dev);
            if n.is_null() {
                return "?".into();
            }
            CStr::from_ptr(n).to_string_lossy().into_owned()
        }
    }

    pub fn caps(self) -> Result<DeviceCaps> {
        let mut a = sys::ibv_device_attr::default();
        // SAFETY: `a` is a valid out-parameter for the open context.
        let rc = unsafe { sys::ibv_query_device(self.raw(), &mut a) };
        if rc != 0 {
            return Err(Error::Connect {
                addr: self.name(),
                reason: format!(
                    "ibv_query_device failed: {}",
                    std::io::Error::from_raw_os_error(rc)
                ),
            });
        }
        Ok(DeviceCaps {
            ports: a.phys_port_cnt,
            atomics: a.atomic_cap != sys::IBV_ATOMIC_NONE,
            max_qp_wr: a.max_qp_wr.max(0) as u32,
            max_qp_rd_atom: a.max_qp_rd_atom.max(0) as u32,
        })
    }

    pub fn port(self, port: u8) -> Result<PortInfo> {
        let mut a = sys::ibv_port_attr::default();
        // SAFETY: `a` is a valid out-parameter; a bad port number is an error return.
        let rc = unsafe { sys::dmkit_ibv_query_port(self.raw(), port, &mut a) };
        if rc != 0 {
            return Err(Error::Connect {
                addr: self.name(),
                reason: format!("device {} has no port {port}", self.name()),
            });
        }
        Ok(PortInfo {
            active: a.state == sys::IBV_PORT_ACTIVE,
            gid_table_len: a.gid_tbl_len.max(0) as u32,
        })
    }

    /// The GID at `index` of `port`, or None when the entry is empty or does not exist.
    pub fn gid(self, port: u8, index: u32) -> Option<[u8; 16]> {
        let mut g = sys::ibv_gid::default();
        // SAFETY: `g` is a valid out-parameter; out-of-range indices return an error.
        let rc = unsafe { sys::ibv_query_gid(self.raw(), port, index as c_int, &mut g) };
        // SAFETY: every bit pattern of the union is a valid `[u8; 16]`.
        let raw = unsafe { g.raw };
        (rc == 0 && raw != [0; 16]).then_some(raw)
    }
}

/// The IPv4 address inside an IPv4-mapped GID (RoCE v2), if it is one.
pub(crate) fn gid_ipv4(gid: &[u8; 16]) -> Option<Ipv4Addr> {
    (gid[..10] == [0; 10] && gid[10] == 0xff && gid[11] == 0xff)
        .then(|| Ipv4Addr::new(gid[12], gid[13], gid[14], gid[15]))
}

/// A protection domain.
pub(crate) struct Pd {
    raw: NonNull<sys::ibv_pd>,
    pub ctx: Context,
}

// SAFETY: verbs objects may be used from any thread (libibverbs is thread-safe).
unsafe impl Send for Pd {}
// SAFETY: as above.
unsafe impl Sync for Pd {}

impl std::fmt::Debug for Pd {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Pd({})", self.ctx.name())
    }
}

impl Pd {
    pub fn new(ctx: Context) -> Result<Arc<Pd>> {
        // SAFETY: the context is open.
        let p = unsafe { sys::ibv_alloc_pd(ctx.raw()) };
        let raw = NonNull::new(p).ok_or_else(|| {
            Error::Registration(format!("ibv_alloc_pd on {}: {}", ctx.name(), errno()))
        })?;
        Ok(Arc::new(Pd { raw, ctx }))
    }

    pub fn raw(&self) -> *mut sys::ibv_pd {
        self.raw.as_ptr()
    }
}

impl Drop for Pd {
    fn drop(&mut self) {
        // SAFETY: every MR and QP of this PD holds an Arc to it, so none is left.
        unsafe {
            sys::ibv_dealloc_pd(self.raw.as_ptr());
        }
    }
}

/// The memlock limit in bytes (None = unlimited), for error messages.
pub(crate) fn memlock_limit() -> Option<u64> {
    let mut r = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: `r` is a valid out-parameter.
    let rc = unsafe { libc::getrlimit(libc::RLIMIT_MEMLOCK, &mut r) };
    (rc == 0 && r.rlim_cur != libc::RLIM_INFINITY).then_some(r.rlim_cur)
}

/// A registered memory region. Does not own the memory: its owner keeps the memory alive at
/// least as long as the `Mr` (see `Mr::register`).
pub(crate) struct Mr {
    raw: NonNull<sys::ibv_mr>,
    _pd: Arc<Pd>,
}

// SAFETY: an MR handle is only read (keys) and deregistered once, on drop.
unsafe impl Send for Mr {}
// SAFETY: as above.
unsafe impl Sync for Mr {}

impl std::fmt::Debug for Mr {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Mr(lkey {:#x}, rkey {:#x})", self.lkey(), self.rkey())
    }
}

impl Mr {
    /// Registers `[ptr, ptr + len)` with `access` (IBV_ACCESS_* bits).
    ///
    /// # Safety
    /// The memory must stay mapped until the `Mr` is dropped; the NIC may read and (with
    /// write access) write it at any time meanwhile, so Rust code must only touch it through
    /// atomics or buffers the backend hands out exclusively.
    pub unsafe fn register(pd: &Arc<Pd>, ptr: *mut u8, len: usize, access: u32) -> Result<Mr> {
        // SAFETY: the caller keeps the memory mapped for the MR's life.
        let p = unsafe { sys::dmkit_ibv_reg_mr(pd.raw(), ptr.cast(), len, access as c_int) };
        match NonNull::new(p) {
            Some(raw) => Ok(Mr {
                raw,
                _pd: pd.clone(),
            }),
            None => {
                let e = errno();
                let limit = match memlock_limit() {
                    Some(l) => format!(
                        "{l} bytes (raise it: `ulimit -l unlimited` or LimitMEMLOCK=infinity)"
                    ),
                    None => "unlimited".into(),
                };
                Err(Error::Registration(format!(
                    "registering {len} bytes with RDMA device {} failed: {e}; the memlock limit \
                     is {limit}",
                    pd.ctx.name()
                )))
            }
        }
    }

    pub fn lkey(&self) -> u32 {
        // SAFETY: the MR is registered until drop.
        unsafe { (*self.raw.as_ptr()).lkey }
    }

    pub fn rkey(&self) -> u32 {
        // SAFETY: as above.
        unsafe { (*self.raw.as_ptr()).rkey }
    }
}

impl Drop for Mr {
    fn drop(&mut self) {
        // SAFETY: registered in `register`, deregistered once here.
        unsafe {
            sys::ibv_dereg_mr(self.raw.as_ptr());
        }
    }
}

/// A completion queue with its own completion channel (so one thread can block on it).
pub(crate) struct Cq {
    raw: NonNull<sys::ibv_cq>,
    channel: NonNull<sys::ibv_comp_channel>,
}

// SAFETY: libibverbs CQs may be polled from any thread; we poll from one at a time.
unsafe impl Send for Cq {}
// SAFETY: as above.
unsafe impl Sync for Cq {}

impl std::fmt::Debug for Cq {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Cq")
    }
}

impl Cq {
    pub fn new(ctx: Context, depth: u32) -> Result<Arc<Cq>> {
        let fail = |what: &str| Error::Connect {
            addr: ctx.name(),
            reason: format!("{what}: {}", errno()),
        };
        // SAFETY: the context is open.
        let ch = NonNull::new(unsafe { sys::ibv_create_comp_channel(ctx.raw()) })
            .ok_or_else(|| fail("ibv_create_comp_channel"))?;
        // SAFETY: the channel was just created for this context.
        let cq = unsafe {
            sys::ibv_create_cq(ctx.raw(), depth as c_int, ptr::null_mut(), ch.as_ptr(), 0)
        };
        let Some(raw) = NonNull::new(cq) else {
            let e = fail("ibv_create_cq");
            // SAFETY: created above, no CQ uses it.
            unsafe { sys::ibv_destroy_comp_channel(ch.as_ptr()) };
            return Err(e);
        };
        // The channel fd is made non-blocking so the poller can wait with a timeout.
        // SAFETY: fcntl on the channel's own fd.
        unsafe {
            let fd = (*ch.as_ptr()).fd;
            let fl = libc::fcntl(fd, libc::F_GETFL);
            libc::fcntl(fd, libc::F_SETFL, fl | libc::O_NONBLOCK);
        }
        let cq = Cq { raw, channel: ch };
        cq.arm();
        Ok(Arc::new(cq))
    }

    pub fn raw(&self) -> *mut sys::ibv_cq {
        self.raw.as_ptr()
    }

    fn arm(&self) {
        // SAFETY: the CQ is valid; arming is allowed at any time.
        unsafe {
            sys::ibv_req_notify_cq(self.raw(), 0);
        }
    }

    /// Polls up to `out.len()` completions.
    pub fn poll(&self, out: &mut [sys::ibv_wc]) -> Result<usize> {
        // SAFETY: `out` has room for `out.len()` entries.
        let n = unsafe { sys::ibv_poll_cq(self.raw(), out.len() as c_int, out.as_mut_ptr()) };
        if n < 0 {
            return Err(Error::Io(std::io::Error::other("ibv_poll_cq failed")));
        }
        Ok(n as usize)
    }

    /// Waits until the CQ has (probably) new completions or `timeout` passes, then re-arms.
    /// Callers poll after it either way, so a missed event only costs `timeout`.
    pub fn wait(&self, timeout: Duration) {
        // SAFETY: the channel is valid; its fd is ours to poll.
        let fd = unsafe { (*self.channel.as_ptr()).fd };
        let mut pfd = libc::pollfd {
            fd,
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: one valid pollfd.
        let n = unsafe {
            libc::poll(
                &mut pfd,
                1,
                timeout.as_millis().min(i32::MAX as u128) as i32,
            )
        };
        if n > 0 {
            let mut cq: *mut sys::ibv_cq = ptr::null_mut();
            let mut ctx: *mut std::os::raw::c_void = ptr::null_mut();
            // SAFETY: non-blocking get on our channel; on success the event is acked once.
            unsafe {
                if sys::ibv_get_cq_event(self.channel.as_ptr(), &mut cq, &mut ctx) == 0 {
                    sys::ibv_ack_cq_events(cq, 1);
                }
            }
        }
        self.arm();
    }
}

impl Drop for Cq {
    fn drop(&mut self) {
        // SAFETY: QPs using this CQ hold an Arc to it, so they are destroyed; every event
        // taken from the channel was acked in `wait`.
        unsafe {
            sys::ibv_destroy_cq(self.raw.as_ptr());
            sys::ibv_destroy_comp_channel(self.channel.as_ptr());
        }
    }
}

/// An rdma-cm event channel, non-blocking, so its reader can stop.
pub(crate) struct EventChannel(NonNull<sys::rdma_event_channel>);

// SAFETY: an event channel is used by one reader thread at a time.
unsafe impl Send for EventChannel {}
// SAFETY: as above; the raw pointer is only read.
unsafe impl Sync for EventChannel {}

impl std::fmt::Debug for EventChannel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("EventChannel")
    }
}

/// An eventfd a thread waiting on an [`EventChannel`] watches too: [`Waker::wake`] ends its
/// wait at once (so the wait itself can be long: no timed wake-ups while idle).
#[derive(Debug)]
pub(crate) struct Waker(std::os::fd::OwnedFd);

impl Waker {
    pub fn new() -> Result<Waker> {
        // SAFETY: eventfd returns a new descriptor or -1.
        let fd = unsafe { libc::eventfd(0, libc::EFD_NONBLOCK | libc::EFD_CLOEXEC) };
        if fd < 0 {
            return Err(Error::Io(std::io::Error::last_os_error()));
        }
        // SAFETY: `fd` is a fresh descriptor nothing else owns.
        Ok(Waker(unsafe {
            <std::os::fd::OwnedFd as std::os::fd::FromRawFd>::from_raw_fd(fd)
        }))
    }

    fn fd(&self) -> libc::c_int {
        std::os::fd::AsRawFd::as_raw_fd(&self.0)
    }

    /// Ends every wait on it, now and later (it stays readable).
    pub fn wake(&self) {
        let one: u64 = 1;
        // SAFETY: writes the 8 bytes of a live u64 to our own eventfd.
        unsafe {
            libc::write(self.fd(), (&one as *const u64).cast(), 8);
        }
    }
}

/// One rdma-cm event, copied out (and acked).
#[derive(Debug, Clone, Copy)]
pub(crate) struct CmEvent {
    pub kind: u32,
    pub status: i32,
    pub id: *mut sys::rdma_cm_id,
}

impl EventChannel {
    pub fn new() -> Result<Arc<EventChannel>> {
        // SAFETY: creates a fresh channel.
        let p = unsafe { sys::rdma_create_event_channel() };
        let ch = NonNull::new(p).ok_or_else(|| Error::Connect {
            addr: "rdma-cm".into(),
            reason: format!(
                "cannot open the rdma-cm event channel ({}): is rdma_ucm loaded and \
                 /dev/infiniband/rdma_cm accessible?",
                errno()
            ),
        })?;
        // SAFETY: fcntl on the channel's own fd.
        unsafe {
            let fd = (*ch.as_ptr()).fd;
            let fl = libc::fcntl(fd, libc::F_GETFL);
            libc::fcntl(fd, libc::F_SETFL, fl | libc::O_NONBLOCK);
        }
        Ok(Arc::new(EventChannel(ch)))
    }

    pub fn raw(&self) -> *mut sys::rdma_event_channel {
        self.0.as_ptr()
    }

    /// The next event, or None after `timeout`. For CONNECT_REQUEST events `id` is a new id
    /// the caller owns.
    pub fn next(&self, timeout: Duration) -> Option<CmEvent> {
        self.next_or_woken(timeout, None)
    }

    /// [`EventChannel::next`], also ending (with `None`) as soon as `waker` is woken.
    pub fn next_or_woken(&self, timeout: Duration, waker: Option<&Waker>) -> Option<CmEvent> {
        // SAFETY: the channel is valid.
        let fd = unsafe { (*self.0.as_ptr()).fd };
        let watch = |fd| libc::pollfd {
            fd,
            events: libc::POLLIN,
            revents: 0,
        };
        let mut pfds = [watch(fd), watch(waker.map_or(-1, Waker::fd))];
        let count = if waker.is_some() { 2 } else { 1 };
        // SAFETY: `count` valid pollfds (a negative fd is ignored by poll).
        let n = unsafe {
            libc::poll(
                pfds.as_mut_ptr(),
                count,
                timeout.as_millis().min(i32::MAX as u128) as i32,
            )
        };
        if n <= 0 || pfds[0].revents & libc::POLLIN == 0 {
            return None;
        }
        let mut ev: *mut sys::rdma_cm_event = ptr::null_mut();
        // SAFETY: non-blocking get; on success we copy what we need and ack the event once.
        unsafe {
            if sys::rdma_get_cm_event(self.0.as_ptr(), &mut ev) != 0 || ev.is_null() {
                return None;
            }
            let e = CmEvent {
                kind: (*ev).event,
                status: (*ev).status,
                id: (*ev).id,
            };
            sys::rdma_ack_cm_event(ev);
            Some(e)
        }
    }

    /// Waits for an event of kind `want` on `id`, failing on any other event for it.
    pub fn expect(&self, id: *mut sys::rdma_cm_id, want: u32, timeout: Duration) -> Result<()> {
        let deadline = std::time::Instant::now() + timeout;
        loop {
            let left = deadline.saturating_duration_since(std::time::Instant::now());
            if left.is_zero() {
                return Err(Error::Connect {
                    addr: String::new(),
                    reason: format!("timed out waiting for {}", event_name(want)),
                });
            }
            let Some(e) = self.next(left.min(Duration::from_millis(100))) else {
                continue;
            };
            if e.id != id {
                continue;
            }
            if e.kind == want {
                return Ok(());
            }
            return Err(Error::Connect {
                addr: String::new(),
                reason: format!(
                    "got {} (status {}) while waiting for {}",
                    event_name(e.kind),
                    e.status,
                    event_name(want)
                ),
            });
        }
    }
}

impl Drop for EventChannel {
    fn drop(&mut self) {
        // SAFETY: all ids on this channel are destroyed before it (they hold an Arc to it).
        unsafe { sys::rdma_destroy_event_channel(self.0.as_ptr()) }
    }
}

pub(crate) fn event_name(kind: u32) -> &'static str {
    match kind {
        sys::RDMA_CM_EVENT_ADDR_RESOLVED => "ADDR_RESOLVED",
        sys::RDMA_CM_EVENT_ADDR_ERROR => "ADDR_ERROR (no RDMA device has a route to that address)",
        sys::RDMA_CM_EVENT_ROUTE_RESOLVED => "ROUTE_RESOLVED",
        sys::RDMA_CM_EVENT_ROUTE_ERROR => "ROUTE_ERROR",
        sys::RDMA_CM_EVENT_CONNECT_REQUEST => "CONNECT_REQUEST",
        sys::RDMA_CM_EVENT_CONNECT_ERROR => "CONNECT_ERROR",
        sys::RDMA_CM_EVENT_UNREACHABLE => "UNREACHABLE",
        sys::RDMA_CM_EVENT_REJECTED => "REJECTED (no memory node listening there?)",
        sys::RDMA_CM_EVENT_ESTABLISHED => "ESTABLISHED",
        sys::RDMA_CM_EVENT_DISCONNECTED => "DISCONNECTED",
        sys::RDMA_CM_EVENT_DEVICE_REMOVAL => "DEVICE_REMOVAL",
        sys::RDMA_CM_EVENT_TIMEWAIT_EXIT => "TIMEWAIT_EXIT",
        _ => "other rdma-cm event",
    }
}

pub(crate) fn sockaddr_v4(a: SocketAddrV4) -> libc::sockaddr_in {
    libc::sockaddr_in {
        sin_family: libc::AF_INET as libc::sa_family_t,
        sin_port: a.port().to_be(),
        sin_addr: libc::in_addr {
            s_addr: u32::from(*a.ip()).to_be(),
        },
        sin_zero: [0; 8],
    }
}

pub(crate) fn v4(addr: SocketAddr) -> Result<SocketAddrV4> {
    match addr {
        SocketAddr::V4(a) => Ok(a),
        SocketAddr::V6(_) => Err(Error::InvalidArgument(format!(
            "{addr}: the rdma backend supports IPv4 (RoCE v2 / IPoIB) addresses only"
        ))),
    }
}

/// QP settings the backend chooses.
#[derive(Debug, Clone, Copy)]
pub(crate) struct QpSizes {
    pub send: u32,
    pub recv: u32,
    pub inline: u32,
}

/// An rdma-cm id with (optionally) its RC queue pair. Destroys the QP, then the id.
pub(crate) struct CmId {
    raw: NonNull<sys::rdma_cm_id>,
    has_qp: bool,
    _channel: Arc<EventChannel>,
    _cq: Option<Arc<Cq>>,
    _pd: Option<Arc<Pd>>,
}

// SAFETY: rdma-cm ids and QPs may be used from any thread; posting is serialized by callers.
unsafe impl Send for CmId {}
// SAFETY: as above.
unsafe impl Sync for CmId {}

impl std::fmt::Debug for CmId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("CmId")
    }
}

impl CmId {
    pub fn new(channel: &Arc<EventChannel>) -> Result<CmId> {
        let mut id: *mut sys::rdma_cm_id = ptr::null_mut();
        // SAFETY: valid channel and out-parameter.
        let rc = unsafe {
            sys::rdma_create_id(channel.raw(), &mut id, ptr::null_mut(), sys::RDMA_PS_TCP)
        };
        if rc != 0 {
            return Err(Error::Connect {
                addr: "rdma-cm".into(),
                reason: format!("rdma_create_id: {}", errno()),
            });
        }
        // SAFETY: rdma_create_id succeeded, so `id` is valid and ours.
        Ok(unsafe { Self::adopt(id, channel) })
    }

    /// Takes ownership of an id rdma-cm created (a CONNECT_REQUEST's).
    ///
    /// # Safety
    /// `id` must be valid, on `channel`, and owned by nobody else.
    pub unsafe fn adopt(id: *mut sys::rdma_cm_id, channel: &Arc<EventChannel>) -> CmId {
        CmId {
            // SAFETY: the caller passes a valid id.
            raw: unsafe { NonNull::new_unchecked(id) },
            has_qp: false,
            _channel: channel.clone(),
            _cq: None,
            _pd: None,
        }
    }

    pub fn raw(&self) -> *mut sys::rdma_cm_id {
        self.raw.as_ptr()
    }

    pub fn context(&self) -> Option<Context> {
        // SAFETY: the id is valid; `verbs` is set once the id is bound to a device.
        Context::from_raw(unsafe { (*self.raw()).verbs })
    }

    pub fn qp(&self) -> *mut sys::ibv_qp {
        // SAFETY: the id is valid.
        unsafe { (*self.raw()).qp }
    }

    fn check(rc: c_int, what: &str) -> Result<()> {
        if rc != 0 {
            return Err(Error::Connect {
                addr: String::new(),
                reason: format!("{what}: {}", errno()),
            });
        }
        Ok(())
    }

    pub fn bind(&self, addr: SocketAddrV4) -> Result<()> {
        let mut sa = sockaddr_v4(addr);
        // SAFETY: a valid sockaddr_in, read during the call.
        let rc = unsafe { sys::rdma_bind_addr(self.raw(), (&raw mut sa).cast()) };
        Self::check(
            rc,
            &format!("rdma_bind_addr({addr}) (is it an address of an RDMA device?)"),
        )
    }

    pub fn listen(&self, backlog: i32) -> Result<()> {
        // SAFETY: the id is bound.
        Self::check(
            unsafe { sys::rdma_listen(self.raw(), backlog) },
            "rdma_listen",
        )
    }

    pub fn resolve_addr(
        &self,
        src: Option<SocketAddrV4>,
        dst: SocketAddrV4,
        ms: i32,
    ) -> Result<()> {
        let mut d = sockaddr_v4(dst);
        let mut s = src.map(sockaddr_v4);
        let sp = s
            .as_mut()
            .map_or(ptr::null_mut(), |s| (s as *mut libc::sockaddr_in).cast());
        // SAFETY: valid sockaddrs (or NULL source), read during the call.
        let rc = unsafe { sys::rdma_resolve_addr(self.raw(), sp, (&raw mut d).cast(), ms) };
        Self::check(rc, "rdma_resolve_addr")
    }

    pub fn resolve_route(&self, ms: i32) -> Result<()> {
        // SAFETY: the address is resolved.
        Self::check(
            unsafe { sys::rdma_resolve_route(self.raw(), ms) },
            "rdma_resolve_route",
        )
    }

    /// Sets the RC ACK timeout exponent (4.096 µs × 2^t per retry).
    pub fn set_ack_timeout(&self, t: u8) {
        let mut v = t;
        // SAFETY: option value is a u8 as librdmacm documents for ACK_TIMEOUT.
        unsafe {
            sys::rdma_set_option(
                self.raw(),
                sys::RDMA_OPTION_ID as c_int,
                sys::RDMA_OPTION_ID_ACK_TIMEOUT as c_int,
                (&raw mut v).cast(),
                1,
            );
        }
    }

    /// Creates the RC QP of this id on `pd`, both queues on `cq`.
    pub fn create_qp(&mut self, pd: &Arc<Pd>, cq: &Arc<Cq>, sizes: QpSizes) -> Result<u32> {
        let mut attr = sys::ibv_qp_init_attr {
            send_cq: cq.raw(),
            recv_cq: cq.raw(),
            cap: sys::ibv_qp_cap {
                max_send_wr: sizes.send,
                max_recv_wr: sizes.recv,
                max_send_sge: 1,
                max_recv_sge: 1,
                max_inline_data: sizes.inline,
            },
            qp_type: sys::IBV_QPT_RC,
            sq_sig_all: 0,
            ..Default::default()
        };
        // SAFETY: the id is bound to pd's device; attr is valid for the call.
        let rc = unsafe { sys::rdma_create_qp(self.raw(), pd.raw(), &mut attr) };
        if rc != 0 {
            return Err(Error::Connect {
                addr: pd.ctx.name(),
                reason: format!("rdma_create_qp: {}", errno()),
            });
        }
        self.has_qp = true;
        self._cq = Some(cq.clone());
        self._pd = Some(pd.clone());
        Ok(attr.cap.max_inline_data)
    }

    fn conn_param(resources: u8, private: &[u8]) -> sys::rdma_conn_param {
        sys::rdma_conn_param {
            private_data: private.as_ptr().cast(),
            private_data_len: private.len() as u8,
            responder_resources: resources,
            initiator_depth: resources,
            retry_count: 7,
            // 7 = retry forever on RNR: a receiver short of buffers slows the sender down.
            rnr_retry_count: 7,
            ..Default::default()
        }
    }

    pub fn connect(&self, resources: u8) -> Result<()> {
        let mut p = Self::conn_param(resources, &[]);
        // SAFETY: the QP exists; `p` is valid for the call.
        Self::check(
            unsafe { sys::rdma_connect(self.raw(), &mut p) },
            "rdma_connect",
        )
    }

    pub fn accept(&self, resources: u8) -> Result<()> {
        let mut p = Self::conn_param(resources, &[]);
        // SAFETY: as above.
        Self::check(
            unsafe { sys::rdma_accept(self.raw(), &mut p) },
            "rdma_accept",
        )
    }

    pub fn reject(&self) {
        // SAFETY: a connect request's id; no private data.
        unsafe {
            sys::rdma_reject(self.raw(), ptr::null(), 0);
        }
    }

    pub fn disconnect(&self) {
        // SAFETY: valid id; disconnecting twice is harmless (returns an error we ignore).
        unsafe {
            sys::rdma_disconnect(self.raw());
        }
    }

    /// Moves the QP to the error state: outstanding work requests complete with flush errors.
    pub fn qp_to_error(&self) {
        if !self.has_qp {
            return;
        }
        let mut a = sys::ibv_qp_attr {
            qp_state: sys::IBV_QPS_ERR,
            ..Default::default()
        };
        // SAFETY: valid QP; ERR is reachable from every state.
        unsafe {
            sys::ibv_modify_qp(
                self.qp(),
                &mut a,
                sys::ibv_qp_attr_mask::IBV_QP_STATE.0 as c_int,
            );
        }
    }

    /// Saves the QP's connected state and moves it to RESET, where it drops every packet
    /// (the peer's requests go unanswered and it retries). See `restore`.
    pub fn suspend(&self) -> Result<Box<sys::ibv_qp_attr>> {
        let mut a = Box::<sys::ibv_qp_attr>::default();
        let mut init = sys::ibv_qp_init_attr::default();
        let mask = saved_mask();
        // SAFETY: valid QP and out-parameters.
        let rc = unsafe { sys::ibv_query_qp(self.qp(), &mut *a, mask as c_int, &mut init) };
        Self::check(rc, "ibv_query_qp")?;
        let mut r = sys::ibv_qp_attr {
            qp_state: sys::IBV_QPS_RESET,
            ..Default::default()
        };
        // SAFETY: valid QP; RESET is reachable from every state.
        let rc = unsafe {
            sys::ibv_modify_qp(
                self.qp(),
                &mut r,
                sys::ibv_qp_attr_mask::IBV_QP_STATE.0 as c_int,
            )
        };
        Self::check(rc, "ibv_modify_qp(RESET)")?;
        Ok(a)
    }

    /// Brings a suspended QP back to RTS with the saved attributes, expecting the PSN it
    /// expected when suspended, so the peer's retransmissions are accepted.
    pub fn restore(&self, saved: &sys::ibv_qp_attr) -> Result<()> {
        use sys::*;
        let steps: [(u32, u32); 3] = [
            (
                IBV_QPS_INIT,
                (ibv_qp_attr_mask::IBV_QP_STATE
                    | ibv_qp_attr_mask::IBV_QP_PKEY_INDEX
                    | ibv_qp_attr_mask::IBV_QP_PORT
                    | ibv_qp_attr_mask::IBV_QP_ACCESS_FLAGS)
                    .0,
            ),
            (
                IBV_QPS_RTR,
                (ibv_qp_attr_mask::IBV_QP_STATE
                    | ibv_qp_attr_mask::IBV_QP_AV
                    | ibv_qp_attr_mask::IBV_QP_PATH_MTU
                    | ibv_qp_attr_mask::IBV_QP_DEST_QPN
                    | ibv_qp_attr_mask::IBV_QP_RQ_PSN
                    | ibv_qp_attr_mask::IBV_QP_MAX_DEST_RD_ATOMIC
                    | ibv_qp_attr_mask::IBV_QP_MIN_RNR_TIMER)
                    .0,
            ),
            (
                IBV_QPS_RTS,
                (ibv_qp_attr_mask::IBV_QP_STATE
                    | ibv_qp_attr_mask::IBV_QP_TIMEOUT
                    | ibv_qp_attr_mask::IBV_QP_RETRY_CNT
                    | ibv_qp_attr_mask::IBV_QP_RNR_RETRY
                    | ibv_qp_attr_mask::IBV_QP_SQ_PSN
                    | ibv_qp_attr_mask::IBV_QP_MAX_QP_RD_ATOMIC)
                    .0,
            ),
        ];
        for (state, mask) in steps {
            let mut a = *saved;
            a.qp_state = state;
            // SAFETY: valid QP; the attributes were read from this QP by `suspend`.
            let rc = unsafe { ibv_modify_qp(self.qp(), &mut a, mask as c_int) };
            Self::check(rc, "ibv_modify_qp(restore)")?;
        }
        Ok(())
    }
}

fn saved_mask() -> u32 {
    use sys::*;
    (ibv_qp_attr_mask::IBV_QP_STATE
        | ibv_qp_attr_mask::IBV_QP_PKEY_INDEX
        | ibv_qp_attr_mask::IBV_QP_PORT
        | ibv_qp_attr_mask::IBV_QP_ACCESS_FLAGS
        | ibv_qp_attr_mask::IBV_QP_AV
        | ibv_qp_attr_mask::IBV_QP_PATH_MTU
        | ibv_qp_attr_mask::IBV_QP_DEST_QPN
        | ibv_qp_attr_mask::IBV_QP_RQ_PSN
        | ibv_qp_attr_mask::IBV_QP_MAX_DEST_RD_ATOMIC
        | ibv_qp_attr_mask::IBV_QP_MIN_RNR_TIMER
        | ibv_qp_attr_mask::IBV_QP_TIMEOUT
        | ibv_qp_attr_mask::IBV_QP_RETRY_CNT
        | ibv_qp_attr_mask::IBV_QP_RNR_RETRY
        | ibv_qp_attr_mask::IBV_QP_SQ_PSN
        | ibv_qp_attr_mask::IBV_QP_MAX_QP_RD_ATOMIC)
        .0
}

impl Drop for CmId {
    fn drop(&mut self) {
        // SAFETY: the QP (if any) was created on this id; destroy it, then the id. CQ and PD
        // Arcs are released after (field drop order), so they outlive the QP.
        unsafe {
            if self.has_qp {
                sys::rdma_destroy_qp(self.raw());
            }
            sys::rdma_destroy_id(self.raw());
        }
    }
}
