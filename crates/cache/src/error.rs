/// Configurations the cache components refuse.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum CacheError {
    /// A count-min sketch needs `0 < epsilon < 1` and `0 < delta < 1`.
    #[error(
        "invalid sketch error bound: epsilon {epsilon}, delta {delta} (both must lie in (0, 1))"
    )]
    InvalidErrorBound {
        /// Relative error asked for.
        epsilon: f64,
        /// Failure probability asked for.
        delta: f64,
    },
    /// A capacity or count that must be positive was zero.
    #[error("{what} must be positive")]
    Zero {
        /// Which setting.
        what: &'static str,
    },
    /// A ratio or weight outside its range.
    #[error("{what} = {value} is out of range")]
    OutOfRange {
        /// Which setting.
        what: &'static str,
        /// The value given.
        value: f64,
    },
    /// Bytes that are not a report (see [`crate::AccessReport::from_bytes`]).
    #[error("malformed access report: {what}")]
    Malformed {
        /// What did not fit.
        what: &'static str,
    },
}
