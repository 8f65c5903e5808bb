use std::time::Duration;

/// What can go wrong when asking for or configuring a lease.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LeaseError {
    /// The object is fenced (about to be freed, promoted or evicted): no new leases until the
    /// fence is lifted, so that waiting for expiry terminates.
    #[error("object {obj} is fenced: no leases are granted until the fence is lifted")]
    Fenced {
        /// The fenced object.
        obj: u64,
    },
    /// A renewal named a lease that the server no longer honours (expired, released or never
    /// granted); the holder must ask for a new grant and re-validate what it cached.
    #[error("holder {holder} holds no live lease on object {obj}")]
    NotHeld {
        /// The holder that asked.
        holder: u64,
        /// The object it asked about.
        obj: u64,
    },
    /// A lease no longer than the clock-skew allowance would already be expired from the
    /// holder's point of view when granted.
    #[error("lease duration {duration:?} is not longer than the clock-skew allowance {skew:?}")]
    TooShort {
        /// The duration asked for.
        duration: Duration,
        /// The table's skew allowance.
        skew: Duration,
    },
    /// A tuner configuration whose bounds are inconsistent.
    #[error("invalid lease tuner configuration: {reason}")]
    InvalidTunerConfig {
        /// Which constraint failed.
        reason: &'static str,
    },
}
