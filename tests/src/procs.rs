//! Process helpers (being written).
