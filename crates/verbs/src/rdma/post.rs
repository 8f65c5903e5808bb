//! Posting work requests: the one place where local memory is handed to the NIC.

use std::mem::MaybeUninit;
use std::os::raw::c_int;
use std::ptr;

use super::sys;
use crate::error::{Error, Result};

/// What a work request does.
#[derive(Debug, Clone, Copy)]
pub(crate) enum WrKind {
    Send,
    Read {
        raddr: u64,
        rkey: u32,
    },
    Write {
        raddr: u64,
        rkey: u32,
    },
    Cas {
        raddr: u64,
        rkey: u32,
        expect: u64,
        swap: u64,
    },
    Faa {
        raddr: u64,
        rkey: u32,
        add: u64,
    },
}

/// One work request with a single local segment.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Wr {
    pub id: u64,
    pub kind: WrKind,
    pub addr: u64,
    pub len: u32,
    pub lkey: u32,
    pub signaled: bool,
    pub inline: bool,
}

/// Posts `wrs` as one linked list: one doorbell.
///
/// # Safety
/// `qp` must be a valid QP. Every local segment must stay valid (and, for READs and atomics,
/// writable and not otherwise accessed) until its work request completes — or, for a list
/// that fails part-way, until the QP is flushed; inline segments only during this call.
pub(crate) unsafe fn post_send(qp: *mut sys::ibv_qp, wrs: &[Wr]) -> Result<()> {
    let n = wrs.len();
    if n == 0 {
        return Ok(());
    }
    crate::record::count_doorbell(n);
    // Small lists (the common case) are built on the stack, and nothing is zeroed that is
    // written afterwards: no allocation and no memset per doorbell.
    const STACK: usize = 8;
    let mut sge_arr = [const { MaybeUninit::<sys::ibv_sge>::uninit() }; STACK];
    let mut wr_arr = [const { MaybeUninit::<sys::ibv_send_wr>::uninit() }; STACK];
    let (mut sge_vec, mut wr_vec) = (Vec::new(), Vec::new());
    let (sges, list): (
        &mut [MaybeUninit<sys::ibv_sge>],
        &mut [MaybeUninit<sys::ibv_send_wr>],
    ) = if n <= STACK {
        (&mut sge_arr[..n], &mut wr_arr[..n])
    } else {
        sge_vec.resize_with(n, MaybeUninit::uninit);
        wr_vec.resize_with(n, MaybeUninit::uninit);
        (&mut sge_vec[..], &mut wr_vec[..])
    };
    let sge_base = sges.as_mut_ptr().cast::<sys::ibv_sge>();
    let base = list.as_mut_ptr().cast::<sys::ibv_send_wr>();
    for (i, w) in wrs.iter().enumerate() {
        sges[i].write(sys::ibv_sge {
            addr: w.addr,
            length: w.len,
            lkey: w.lkey,
        });
        // SAFETY: `i < n`: inside the array of length `n`, which is not moved after this.
        let sg_list = unsafe { sge_base.add(i) };
        let next = if i + 1 < n {
            // SAFETY: `i + 1 < n`: inside the array of length `n`, not moved after this.
            unsafe { base.add(i + 1) }
        } else {
            ptr::null_mut()
        };
        let mut s = sys::ibv_send_wr {
            wr_id: w.id,
            sg_list,
            num_sge: c_int::from(w.len > 0),
            next,
            ..Default::default()
        };
        let mut flags = 0;
        if w.signaled {
            flags |= sys::ibv_send_flags::IBV_SEND_SIGNALED.0;
        }
        if w.inline {
            flags |= sys::ibv_send_flags::IBV_SEND_INLINE.0;
        }
        s.send_flags = flags;
        match w.kind {
            WrKind::Send => s.opcode = sys::IBV_WR_SEND,
            WrKind::Read { raddr, rkey } | WrKind::Write { raddr, rkey } => {
                s.opcode = if matches!(w.kind, WrKind::Read { .. }) {
                    sys::IBV_WR_RDMA_READ
                } else {
                    sys::IBV_WR_RDMA_WRITE
                };
                s.wr.rdma = sys::ibv_send_wr__bindgen_ty_2__bindgen_ty_1 {
                    remote_addr: raddr,
                    rkey,
                };
            }
            WrKind::Cas {
                raddr,
                rkey,
                expect,
                swap,
            } => {
                s.opcode = sys::IBV_WR_ATOMIC_CMP_AND_SWP;
                s.wr.atomic = sys::ibv_send_wr__bindgen_ty_2__bindgen_ty_2 {
                    remote_addr: raddr,
                    compare_add: expect,
                    swap,
                    rkey,
                };
            }
            WrKind::Faa { raddr, rkey, add } => {
                s.opcode = sys::IBV_WR_ATOMIC_FETCH_AND_ADD;
                s.wr.atomic = sys::ibv_send_wr__bindgen_ty_2__bindgen_ty_2 {
                    remote_addr: raddr,
                    compare_add: add,
                    swap: 0,
                    rkey,
                };
            }
        }
        list[i].write(s);
    }
    let mut bad: *mut sys::ibv_send_wr = ptr::null_mut();
    // SAFETY: all `n` entries of both arrays were written above, and every `next` and
    // `sg_list` points into them; they live until the call returns (the NIC copies WQEs).
    // The caller keeps the local buffers valid until completion.
    let rc = unsafe { sys::ibv_post_send(qp, base, &mut bad) };
    if rc != 0 {
        return Err(Error::Io(std::io::Error::other(format!(
            "ibv_post_send failed: {}",
            std::io::Error::from_raw_os_error(rc)
        ))));
    }
    Ok(())
}

/// Posts one receive buffer.
///
/// # Safety
/// `qp` must be valid; `[addr, addr + len)` registered under `lkey`, writable, and not
/// accessed by anyone until its completion is polled (or the QP is reset or destroyed).
pub(crate) unsafe fn post_recv(
    qp: *mut sys::ibv_qp,
    id: u64,
    addr: u64,
    len: u32,
    lkey: u32,
) -> Result<()> {
    let mut sge = sys::ibv_sge {
        addr,
        length: len,
        lkey,
    };
    let mut wr = sys::ibv_recv_wr {
        wr_id: id,
        next: ptr::null_mut(),
        sg_list: &mut sge,
        num_sge: 1,
    };
    let mut bad: *mut sys::ibv_recv_wr = ptr::null_mut();
    // SAFETY: wr and sge live for the call; the caller guarantees the buffer.
    let rc = unsafe { sys::ibv_post_recv(qp, &mut wr, &mut bad) };
    if rc != 0 {
        return Err(Error::Io(std::io::Error::other(format!(
            "ibv_post_recv failed: {}",
            std::io::Error::from_raw_os_error(rc)
        ))));
    }
    Ok(())
}
