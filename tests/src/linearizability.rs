//! A linearizability checker for key-value histories (Wing & Gong's search with Lowe's
//! memoization, as in Porcupine), partitioned by key: a history is linearizable iff each
//! key's sub-history is, because keys are independent registers.
//!
//! The model is a register that may be absent: FUSEE's operations (insert, update, upsert,
//! delete, search) and plain read/write registers (`Get`, `Put`, and `Swap` for a
//! read-modify-write, such as a locked update of a Gengar object) are all checked with it.
//!
//! An operation that never returned (its client crashed) may have taken effect at any point
//! after its call, or never: the search tries both.

use std::collections::{HashMap, HashSet};

/// What a client asked for.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Call {
    Get,
    /// Insert or overwrite.
    Put(Vec<u8>),
    Insert(Vec<u8>),
    Update(Vec<u8>),
    Delete,
    /// Read-modify-write: writes the value and returns the one it replaced (`Ret::Value`).
    Swap(Vec<u8>),
    /// Compare-and-set: writes `new` only over `expected` (`Ret::Flag(true)`); otherwise
    /// returns the value it found (`Ret::Value`, `None` if absent).
    Cas {
        expected: Vec<u8>,
        new: Vec<u8>,
    },
    /// Conditional delete: deletes only over `expected` (`Ret::Flag(true)`); otherwise as
    /// [`Call::Cas`].
    DeleteIf(Vec<u8>),
}

impl std::fmt::Display for Call {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let s = |v: &[u8]| String::from_utf8_lossy(v).into_owned();
        match self {
            Call::Get => write!(f, "get"),
            Call::Put(v) => write!(f, "put {}", s(v)),
            Call::Insert(v) => write!(f, "insert {}", s(v)),
            Call::Update(v) => write!(f, "update {}", s(v)),
            Call::Delete => write!(f, "delete"),
            Call::Swap(v) => write!(f, "swap {}", s(v)),
            Call::Cas { expected, new } => write!(f, "cas {} -> {}", s(expected), s(new)),
            Call::DeleteIf(v) => write!(f, "delete-if {}", s(v)),
        }
    }
}

/// Runs `call` on `key` with a FUSEE client and says what it returned in the checker's terms
/// (`Swap` is not a FUSEE operation: it panics).
pub fn apply_fusee(
    client: &dmkit_fusee::Client,
    key: &[u8],
    call: &Call,
) -> dmkit_fusee::Result<Ret> {
    use dmkit_fusee::{DeleteResult, InsertResult, UpdateResult};
    match call {
        Call::Get => client.search(key).map(Ret::Value),
        Call::Put(v) => client.upsert(key, v).map(|()| Ret::Ok),
        Call::Insert(v) => client
            .insert(key, v)
            .map(|r| Ret::Flag(r == InsertResult::Inserted)),
        Call::Update(v) => client
            .update(key, v)
            .map(|r| Ret::Flag(r == UpdateResult::Updated)),
        Call::Delete => client
            .delete(key)
            .map(|r| Ret::Flag(r == DeleteResult::Deleted)),
        Call::Cas { expected, new } => client.compare_and_set(key, expected, new).map(cas_ret),
        Call::DeleteIf(v) => client.delete_if(key, v).map(cas_ret),
        Call::Swap(_) => unreachable!("not a FUSEE operation"),
    }
}

/// A conditional write's result in the checker's terms.
fn cas_ret(r: dmkit_fusee::CasResult) -> Ret {
    match r {
        dmkit_fusee::CasResult::Swapped => Ret::Flag(true),
        dmkit_fusee::CasResult::Mismatch(v) => Ret::Value(Some(v)),
        dmkit_fusee::CasResult::NotFound => Ret::Value(None),
    }
}

/// [`apply_fusee`] through the async API (many may be in flight on one client).
pub async fn apply_fusee_async(
    client: &dmkit_fusee::Client,
    key: &[u8],
    call: &Call,
) -> dmkit_fusee::Result<Ret> {
    use dmkit_fusee::{DeleteResult, InsertResult, UpdateResult};
    match call {
        Call::Get => client.search_async(key).await.map(Ret::Value),
        Call::Put(v) => client.upsert_async(key, v).await.map(|()| Ret::Ok),
        Call::Insert(v) => client
            .insert_async(key, v)
            .await
            .map(|r| Ret::Flag(r == InsertResult::Inserted)),
        Call::Update(v) => client
            .update_async(key, v)
            .await
            .map(|r| Ret::Flag(r == UpdateResult::Updated)),
        Call::Delete => client
            .delete_async(key)
            .await
            .map(|r| Ret::Flag(r == DeleteResult::Deleted)),
        Call::Cas { expected, new } => client
            .compare_and_set_async(key, expected, new)
            .await
            .map(cas_ret),
        Call::DeleteIf(v) => client.delete_if_async(key, v).await.map(cas_ret),
        Call::Swap(_) => unreachable!("not a FUSEE operation"),
    }
}

/// What it got back.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Ret {
    Value(Option<Vec<u8>>),
    Ok,
    /// Insert: inserted (true) or already there (false); Update/Delete: found (true) or not.
    Flag(bool),
}

/// One operation of a history: called at `call`, returned `ret` at `end` (logical clock
/// ticks from one shared counter); `ret = None` if it never returned.
#[derive(Debug, Clone)]
pub struct Event {
    pub key: Vec<u8>,
    pub call: Call,
    pub ret: Option<Ret>,
    pub start: u64,
    pub end: u64,
}

/// The register's state.
type State = Option<Vec<u8>>;

/// Applies `call` to `s`: the new state and what a correct store returns.
fn step(s: &State, call: &Call) -> (State, Ret) {
    match call {
        Call::Get => (s.clone(), Ret::Value(s.clone())),
        Call::Put(v) => (Some(v.clone()), Ret::Ok),
        Call::Insert(v) => match s {
            Some(_) => (s.clone(), Ret::Flag(false)),
            None => (Some(v.clone()), Ret::Flag(true)),
        },
        Call::Update(v) => match s {
            Some(_) => (Some(v.clone()), Ret::Flag(true)),
            None => (None, Ret::Flag(false)),
        },
        Call::Delete => match s {
            Some(_) => (None, Ret::Flag(true)),
            None => (None, Ret::Flag(false)),
        },
        Call::Swap(v) => (Some(v.clone()), Ret::Value(s.clone())),
        Call::Cas { expected, new } => match s {
            Some(v) if v == expected => (Some(new.clone()), Ret::Flag(true)),
            _ => (s.clone(), Ret::Value(s.clone())),
        },
        Call::DeleteIf(expected) => match s {
            Some(v) if v == expected => (None, Ret::Flag(true)),
            _ => (s.clone(), Ret::Value(s.clone())),
        },
    }
}

/// Why a history is not linearizable.
#[derive(Debug, Clone)]
pub struct Violation {
    pub key: Vec<u8>,
    pub events: Vec<Event>,
}

impl std::fmt::Display for Violation {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        writeln!(
            f,
            "key {:?}: no linearization of these {} operations:",
            String::from_utf8_lossy(&self.key),
            self.events.len()
        )?;
        let mut events = self.events.clone();
        events.sort_by_key(|e| e.start);
        let s = |v: &[u8]| String::from_utf8_lossy(v).into_owned();
        for e in &events {
            let call = e.call.to_string();
            let ret = match &e.ret {
                None => "(no reply: crashed)".to_string(),
                Some(Ret::Value(None)) => "none".to_string(),
                Some(Ret::Value(Some(v))) => s(v),
                Some(Ret::Ok) => "ok".to_string(),
                Some(Ret::Flag(b)) => b.to_string(),
            };
            let end = if e.end == u64::MAX {
                "inf".to_string()
            } else {
                e.end.to_string()
            };
            writeln!(f, "  [{:>6}, {:>6}] {call} -> {ret}", e.start, end)?;
        }
        Ok(())
    }
}

/// Checks every key's sub-history; `initial` gives keys' states before the history.
pub fn check(history: &[Event], initial: &HashMap<Vec<u8>, Vec<u8>>) -> Result<(), Violation> {
    let mut by_key: HashMap<&[u8], Vec<Event>> = HashMap::new();
    for e in history {
        by_key.entry(&e.key).or_default().push(e.clone());
    }
    for (key, events) in by_key {
        let init = initial.get(key).cloned();
        if !check_key(&events, init) {
            return Err(Violation {
                key: key.to_vec(),
                events,
            });
        }
    }
    Ok(())
}

/// The search for one key. Events that never returned end at +infinity.
fn check_key(events: &[Event], init: State) -> bool {
    let n = events.len();
    assert!(n <= 128, "at most 128 operations per key");
    let end = |i: usize| {
        if events[i].ret.is_some() {
            events[i].end
        } else {
            u64::MAX
        }
    };
    let mut seen: HashSet<(u128, State)> = HashSet::new();
    // Depth-first over (linearized set, state); a pending op may also be dropped (never
    // took effect), which counts as linearizing it without changing the state.
    let mut stack: Vec<(u128, State)> = vec![(0, init)];
    let full: u128 = if n == 128 {
        u128::MAX
    } else {
        (1u128 << n) - 1
    };
    while let Some((done, state)) = stack.pop() {
        if done == full {
            return true;
        }
        if !seen.insert((done, state.clone())) {
            continue;
        }
        // Only operations called before every remaining one returned can go next.
        let horizon = (0..n)
            .filter(|i| done & (1 << i) == 0)
            .map(end)
            .min()
            .unwrap_or(u64::MAX);
        for (i, e) in events.iter().enumerate() {
            if done & (1 << i) != 0 || e.start > horizon {
                continue;
            }
            let (next, want) = step(&state, &e.call);
            match &e.ret {
                Some(r) if *r == want => stack.push((done | 1 << i, next)),
                Some(_) => {}
                None => {
                    stack.push((done | 1 << i, next));
                    stack.push((done | 1 << i, state.clone()));
                }
            }
        }
    }
    false
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ev(call: Call, ret: Option<Ret>, start: u64, end: u64) -> Event {
        Event {
            key: b"k".to_vec(),
            call,
            ret,
            start,
            end,
        }
    }

    fn v(s: &str) -> Vec<u8> {
        s.as_bytes().to_vec()
    }

    #[test]
    fn sequential_history_is_linearizable() {
        let h = vec![
            ev(Call::Put(v("a")), Some(Ret::Ok), 0, 1),
            ev(Call::Get, Some(Ret::Value(Some(v("a")))), 2, 3),
            ev(Call::Delete, Some(Ret::Flag(true)), 4, 5),
            ev(Call::Get, Some(Ret::Value(None)), 6, 7),
        ];
        assert!(check(&h, &HashMap::new()).is_ok());
    }

    #[test]
    fn stale_read_after_a_completed_write_is_caught() {
        let h = vec![
            ev(Call::Put(v("a")), Some(Ret::Ok), 0, 1),
            ev(Call::Put(v("b")), Some(Ret::Ok), 2, 3),
            ev(Call::Get, Some(Ret::Value(Some(v("a")))), 4, 5),
        ];
        let e = check(&h, &HashMap::new()).unwrap_err();
        assert!(e.to_string().contains("no linearization"));
    }

    #[test]
    fn concurrent_operations_may_take_either_order() {
        let h = vec![
            ev(Call::Put(v("a")), Some(Ret::Ok), 0, 10),
            ev(Call::Put(v("b")), Some(Ret::Ok), 1, 9),
            ev(Call::Get, Some(Ret::Value(Some(v("a")))), 11, 12),
        ];
        assert!(check(&h, &HashMap::new()).is_ok());
        let two_inserts = vec![
            ev(Call::Insert(v("a")), Some(Ret::Flag(true)), 0, 10),
            ev(Call::Insert(v("b")), Some(Ret::Flag(true)), 1, 9),
        ];
        assert!(check(&two_inserts, &HashMap::new()).is_err());
    }

    #[test]
    fn read_modify_writes_must_chain() {
        // Two increments from 0 that both read 0: one update was lost.
        let lost = vec![
            ev(Call::Put(v("0")), Some(Ret::Ok), 0, 1),
            ev(Call::Swap(v("1")), Some(Ret::Value(Some(v("0")))), 2, 10),
            ev(Call::Swap(v("1")), Some(Ret::Value(Some(v("0")))), 3, 9),
        ];
        assert!(check(&lost, &HashMap::new()).is_err());
        let chained = vec![
            ev(Call::Put(v("0")), Some(Ret::Ok), 0, 1),
            ev(Call::Swap(v("1")), Some(Ret::Value(Some(v("0")))), 2, 10),
            ev(Call::Swap(v("2")), Some(Ret::Value(Some(v("1")))), 3, 9),
            ev(Call::Get, Some(Ret::Value(Some(v("2")))), 11, 12),
        ];
        assert!(check(&chained, &HashMap::new()).is_ok());
        // A read cannot see a value before the swap that wrote it was called.
        let early = vec![
            ev(Call::Get, Some(Ret::Value(Some(v("1")))), 0, 1),
            ev(Call::Swap(v("1")), Some(Ret::Value(None)), 2, 3),
        ];
        assert!(check(&early, &HashMap::new()).is_err());
    }

    #[test]
    fn a_crashed_operation_may_or_may_not_have_happened() {
        let maybe = |seen: &str| {
            vec![
                ev(Call::Put(v("a")), Some(Ret::Ok), 0, 1),
                ev(Call::Put(v("b")), None, 2, 0),
                ev(Call::Get, Some(Ret::Value(Some(v(seen)))), 5, 6),
            ]
        };
        assert!(check(&maybe("a"), &HashMap::new()).is_ok());
        assert!(check(&maybe("b"), &HashMap::new()).is_ok());
        assert!(check(&maybe("c"), &HashMap::new()).is_err());
        // But it cannot take effect, be overwritten... and come back.
        let flicker = vec![
            ev(Call::Put(v("b")), None, 0, 0),
            ev(Call::Get, Some(Ret::Value(Some(v("b")))), 1, 2),
            ev(Call::Get, Some(Ret::Value(None)), 3, 4),
            ev(Call::Get, Some(Ret::Value(Some(v("b")))), 5, 6),
        ];
        assert!(check(&flicker, &HashMap::new()).is_err());
    }
}
