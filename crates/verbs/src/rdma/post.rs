//! Posting work requests: the one place where local memory is handed to the NIC.

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
    if wrs.is_empty() {
        return Ok(());
    }
    // Small lists (the common case) are built on the stack: no allocation per doorbell.
    const STACK: usize = 8;
    let mut sge_arr = [sys::ibv_sge::default(); STACK];
    let mut wr_arr = [sys::ibv_send_wr::default(); STACK];
    let (mut sge_vec, mut wr_vec) = (Vec::new(), Vec::new());
    let (sges, list): (&mut [sys::ibv_sge], &mut [sys::ibv_send_wr]) = if wrs.len() <= STACK {
        (&mut sge_arr[..wrs.len()], &mut wr_arr[..wrs.len()])
    } else {
        sge_vec.resize(wrs.len(), sys::ibv_sge::default());
        wr_vec.resize(wrs.len(), sys::ibv_send_wr::default());
        (&mut sge_vec[..], &mut wr_vec[..])
    };
    for (sge, w) in sges.iter_mut().zip(wrs) {
        *sge = sys::ibv_sge {
            addr: w.addr,
            length: w.len,
            lkey: w.lkey,
        };
    }
    for (i, w) in wrs.iter().enumerate() {
        let mut s = sys::ibv_send_wr {
            wr_id: w.id,
            sg_list: &mut sges[i],
            num_sge: c_int::from(w.len > 0),
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
        list[i] = s;
    }
    let base = list.as_mut_ptr();
    for i in 0..list.len() - 1 {
        // SAFETY: `i + 1 < list.len()`; the list is not reallocated after this point.
        list[i].next = unsafe { base.add(i + 1) };
    }
    let mut bad: *mut sys::ibv_send_wr = ptr::null_mut();
    // SAFETY: the list and its segments live until the call returns (the NIC copies WQEs);
    // the caller keeps the local buffers valid until completion.
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
